"""No host synchronisation in a training step that does not log: real steps of every task, built by the CLI with
every default callback (the non-finite guard, throughput, progress lines, checkpoints), with torch's reads of a
tensor's value patched to record each call (on a GPU each one waits for the device)."""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loops import fetchers
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

from lightformer.training.callbacks import NonFiniteLossError, NonFiniteLossGuard
from lightformer.training.progress import ProgressBar, ProgressLog
from tiny_runs import build, events_of, task_args

# Every read of a tensor's value to the host that Python code can make (a C++ kernel's own read, e.g. a boolean
# mask's nonzero, is invisible here: torch.cuda.set_sync_debug_mode sees those on a GPU).
OTHER_TASKS = ("vision", "mlm", "classify", "t5", "image_text", "igpt", "contrastive")
READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


def caller() -> str:
    """Where the read was asked: the innermost frame outside torch and this file, as 'path:line'."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("test_no_host_sync.py"):
            return f"{'/'.join(Path(frame.filename).parts[-3:])}:{frame.lineno}"
    return "?"


class SyncRecorder(Callback):
    """The host reads of each training step (``advance`` of the epoch loop and its ``on_advance_end``, without the
    loader's own work), by step, and which steps wrote their logs."""

    def __init__(self) -> None:
        self.step: int | None = None  # the step being run; None between steps and outside training
        self.paused = False
        self.reads: dict[int, list[str]] = {}
        self.logged: dict[int, bool] = {}

    def record(self, name: str) -> None:
        if self.step is not None and not self.paused:
            self.reads.setdefault(self.step, []).append(f"{name} in {caller()}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.logged[self.step] = trainer._logger_connector.should_update_logs


@pytest.fixture
def recorder(monkeypatch):
    """A ``SyncRecorder`` fed by every host read of ``READS`` and ``torch.cuda.synchronize`` (patched)."""
    recorder = SyncRecorder()

    def recording(name, original):
        def read(*args, **kwargs):
            recorder.record(name)
            return original(*args, **kwargs)

        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, recording(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", recording("torch.cuda.synchronize", torch.cuda.synchronize))
    monkeypatch.setattr(torch.cuda.Event, "synchronize", recording("Event.synchronize", torch.cuda.Event.synchronize))

    advance, advance_end = _TrainingEpochLoop.advance, _TrainingEpochLoop.on_advance_end

    def stepping(loop, data_fetcher):
        recorder.step = loop.trainer.global_step
        return advance(loop, data_fetcher)

    def stepped(loop, data_fetcher):
        try:
            return advance_end(loop, data_fetcher)
        finally:
            recorder.step = None

    def loading(original):
        def fetch(self, *args, **kwargs):  # the loader runs on the host (a worker, on a GPU machine)
            recorder.paused = True
            try:
                return original(self, *args, **kwargs)
            finally:
                recorder.paused = False

        return fetch

    monkeypatch.setattr(_TrainingEpochLoop, "advance", stepping)
    monkeypatch.setattr(_TrainingEpochLoop, "on_advance_end", stepped)
    monkeypatch.setattr(fetchers._DataFetcher, "__next__", loading(fetchers._DataFetcher.__next__))
    monkeypatch.setattr(fetchers._PrefetchDataFetcher, "__next__", loading(fetchers._PrefetchDataFetcher.__next__))
    return recorder


@pytest.mark.parametrize(  # the two, the progress bar, and every other task
    "task, bar", [("lm", False), ("translation", False), ("lm", True), *((task, False) for task in OTHER_TASKS)]
)
def test_steps_that_do_not_log_read_nothing_back(task, bar, tmp_path, recorder):
    """Between the first logging step and the next, no training step reads a tensor's value on the host: the
    non-finite guard checks on the device, the throughput counts stay there and the clock is read at logging; the
    progress lines (or the progress bar, which shows the loss) read only then too."""
    args = [*task_args(task, tmp_path), "--trainer.max_steps=12", "--trainer.log_every_n_steps=5",
            "--trainer.limit_val_batches=0", "--trainer.max_epochs=100"]  # fmt: skip
    if bar:
        args += ["--trainer.enable_progress_bar=true", "--trainer.callbacks+=lightformer.training.progress.ProgressBar"]
    cli = build(args, recorder)
    assert any(isinstance(callback, NonFiniteLossGuard) for callback in cli.trainer.callbacks)
    assert any(isinstance(callback, ProgressBar if bar else ProgressLog) for callback in cli.trainer.callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if bar:
        assert cli.trainer.progress_bar_callback.get_metrics(cli.trainer, cli.model)["train/loss"] > 0
    assert cli.trainer.global_step == 12
    logging = sorted(step for step, logged in recorder.logged.items() if logged)
    assert logging[:2] == [4, 9], recorder.logged  # steps 5 and 10 (counted from 1) write their logs
    quiet = range(logging[0] + 1, logging[1])
    assert {step: recorder.reads[step] for step in quiet if step in recorder.reads} == {}
    assert recorder.reads.get(logging[0]), "the logging step reads its values: the recorder sees reads"


class TargetTokens(Callback):
    """The target tokens of each training batch, by step (read here, on the host, for the test only)."""

    def __init__(self) -> None:
        self.by_step: dict[int, int] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self.by_step[trainer.global_step + 1] = int((batch["tgt"][:, 1:] != pl_module.pad_id).sum())


def test_throughput_read_at_logging_counts_the_tokens_of_its_window(tmp_path):
    """The items/s a logging step writes, over its batches/s, is the mean target-token count of its window's batches
    after the first (Lightning's meter): the counts kept on the device and read later are the batches' own."""
    throughput = {"class_path": "lightformer.training.callbacks.Throughput", "init_args": {"window_size": 3}}
    args = [*task_args("translation", tmp_path), "--trainer.max_steps=9", "--trainer.log_every_n_steps=4",
            "--trainer.limit_val_batches=0", f"--trainer.callbacks+={json.dumps(throughput)}"]  # fmt: skip
    tokens = TargetTokens()
    cli = build(args, tokens)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    _, events = events_of(tmp_path, "ding_de_en")
    items = {e.step: e.value for e in events.Scalars("velocity/train/device/items_per_sec")}
    batches = {e.step: e.value for e in events.Scalars("velocity/train/device/batches_per_sec")}
    assert sorted(items) == [3, 7]  # the logging steps: batches 4 and 8 (counted from 1)
    for step in items:
        expected = (tokens.by_step[step] + tokens.by_step[step + 1]) / 2  # batches 3 and 4, 7 and 8
        assert items[step] / batches[step] == pytest.approx(expected, rel=1e-4)


class NanLoss(Callback):
    """The model's output layer made NaN before step ``step``'s forward pass: its loss is NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.lm_head.weight.fill_(float("nan"))


@pytest.mark.parametrize("every", [None, 1])
def test_a_non_finite_loss_is_read_late_by_default_and_nothing_is_saved_after_it(every, tmp_path):
    """By default the guard reads its device-side check at the logging steps (here every 10th) and before anything is
    saved: a NaN loss at step 6 stops the run at step 8, where a checkpoint was due and is not written, naming step
    6; with ``check_every_n_steps=1`` it stops at step 6, before the update. The last checkpoint is step 4's."""
    overrides = tmp_path / "checkpoint_often.yaml"
    overrides.write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {every_n_train_steps: 4, monitor: null, filename: '{step}'}\n"
    )
    guard = [] if every is None else ["--trainer.callbacks+=lightformer.training.callbacks.NonFiniteLossGuard",
                                      f"--trainer.callbacks.check_every_n_steps={every}"]  # fmt: skip
    args = [*task_args("lm", tmp_path), f"--config={overrides}", *guard, "--trainer.max_steps=30",
            "--trainer.log_every_n_steps=10", "--trainer.limit_val_batches=0"]  # fmt: skip
    cli = build(args, NanLoss(step=6))
    with pytest.raises(NonFiniteLossError) as error:
        cli.trainer.fit(cli.model, cli.datamodule)
    message = str(error.value)
    assert "training loss is nan at global step 6" in message
    if every is None:
        assert "the guard read it at step 8" in message and "the checkpoint was not written" in message
    else:
        assert "the guard read it" not in message and "before the update" in message
    saved = sorted(int(p.stem.split("=")[1]) for p in (tmp_path / "runs").rglob("step=*.ckpt"))
    assert saved == [4]


class FakeEvent:
    """A CUDA event on the CPU: the time it was recorded, read only through ``elapsed_time`` (as a real one)."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.recorded: float | None = None

    def record(self) -> None:
        self.recorded = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.recorded - self.recorded) * 1e3  # milliseconds


def test_the_throughput_of_a_gpu_run_is_timed_by_events_read_at_logging(tmp_path, monkeypatch):
    """The GPU's code path of ``Throughput`` (its ``StepClock`` marks are events, turned into seconds only when
    read) through a fit that validates twice and logs every third step: curves logged, none from a stale clock."""
    from lightformer.training import callbacks

    class EventClock(callbacks.StepClock):
        def __init__(self, device: torch.device) -> None:
            super().__init__(torch.device("cuda"))

    monkeypatch.setattr(callbacks, "StepClock", EventClock)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    throughput = {"class_path": "lightformer.training.callbacks.Throughput", "init_args": {"window_size": 2}}
    args = [*task_args("lm", tmp_path), "--trainer.max_steps=9", "--trainer.log_every_n_steps=3",
            "--trainer.val_check_interval=4", "--trainer.limit_val_batches=2",
            f"--trainer.callbacks+={json.dumps(throughput)}"]  # fmt: skip
    cli = build(args)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (monitor,) = [c for c in cli.trainer.callbacks if isinstance(c, callbacks.Throughput)]
    assert isinstance(monitor._clock, EventClock) and all(isinstance(t, float) for t in monitor._t0s.values())
    _, events = events_of(tmp_path, "austen_char")
    tokens = {e.step: e.value for e in events.Scalars("velocity/train/device/items_per_sec")}
    batches = {e.step: e.value for e in events.Scalars("velocity/train/device/batches_per_sec")}
    assert sorted(tokens) == [2, 5, 8] and all(value > 0 for value in tokens.values())
    assert all(tokens[step] == pytest.approx(8 * 16 * batches[step]) for step in tokens)  # 8 windows of 16 tokens
