"""What ``lightformer.training.internals`` relies on in Lightning, torch and LitData, pinned on real objects: a test
here fails, naming the function, when an upgrade renames or changes the private attribute or method that function uses.

Most run on one tiny ``Trainer`` fit (Lightning's ``BoringModel``, four steps on CPU) that records what the functions
return at the moments lightformer calls them, beside what Lightning then did (the steps it logged at, the checkpoint
it wrote). The last tests pin the private hooks that lightformer's subclasses override (they cannot be moved into a
function), and that the public replacements of private helpers still match them.
"""

from __future__ import annotations

import inspect
import random
import warnings
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ThroughputMonitor
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from torch.utils.data import DataLoader

from lightformer.data.preparation.prepare import REMOTE_SCHEMES, _random_state_kept, object_store
from lightformer.training import internals


class Recorder(Logger):
    """A logger that keeps every ``log_metrics`` call: (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append((step, dict(metrics)))

    def steps_of(self, name: str) -> list[int | None]:
        return [step for step, metrics in self.logged if name in metrics]

    def values_of(self, name: str) -> list[float]:
        return [metrics[name] for _, metrics in self.logged if name in metrics]


class Tiny(BoringModel):
    flops_per_batch = 1_000_000  # what ThroughputMonitor's FLOP/s and MFU count

    def training_step(self, batch, batch_idx):
        self.log("batch", float(batch_idx))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.log("val", 1.0)
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self.log("tested", 1.0)
        return super().test_step(batch, batch_idx)


class Probe(Callback):
    """Calls the functions at the moments lightformer does, and keeps what they returned."""

    def __init__(self, checkpoint: ModelCheckpoint) -> None:
        self.checkpoint = checkpoint
        self.updates: dict[int, bool] = {}  # batch index → should_update_logs at its on_train_batch_end
        self.validation_steps: list[int] = []  # logging_step at each validation's end
        self.skips: dict[str, bool] = {}

    def on_train_start(self, trainer, pl_module) -> None:
        self.skips["at the start"] = internals.skips_saving(self.checkpoint, trainer)
        self.on_train_epoch_end = internals.saves_on_train_epoch_end(self.checkpoint, trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.updates[batch_idx] = internals.should_update_logs(trainer)
        if trainer.global_step == 2:
            self.skips["before saving"] = internals.skips_saving(self.checkpoint, trainer)
            internals.save_last_checkpoint(self.checkpoint, trainer)
            self.skips["after saving"] = internals.skips_saving(self.checkpoint, trainer)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        self.validation_steps.append(internals.logging_step(trainer))


class PeakFlops(ThroughputMonitor):
    """ThroughputMonitor with its meters' peak set after its setup, as ``lightformer.training.callbacks.Throughput``
    does."""

    def setup(self, trainer, pl_module, stage) -> None:
        super().setup(trainer, pl_module, stage)
        self.meters = internals.throughput_meters(self)
        for meter in self.meters:
            meter.available_flops = 1e12


@dataclass
class Fit:
    trainer: L.Trainer
    model: Tiny
    recorder: Recorder
    probe: Probe
    checkpoint: ModelCheckpoint
    monitor: PeakFlops


def quiet_trainer(root: Path, **options) -> L.Trainer:
    return L.Trainer(
        default_root_dir=root, accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, **options,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fit(tmp_path_factory) -> Fit:
    """Four training steps, a validation after the second and the fourth, logs written every second step, a
    ModelCheckpoint that would save every 5th step (so never by itself before the end) and a ThroughputMonitor."""
    root = tmp_path_factory.mktemp("fit")
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, save_top_k=0, every_n_train_steps=5)
    recorder, probe, monitor = Recorder(), Probe(checkpoint), PeakFlops(batch_size_fn=len, window_size=2)
    trainer = quiet_trainer(
        root, max_steps=4, limit_train_batches=4, limit_val_batches=1, val_check_interval=2, log_every_n_steps=2,
        logger=recorder, callbacks=[probe, checkpoint, monitor],
    )  # fmt: skip
    model = Tiny()
    with warnings.catch_warnings():  # ThroughputMonitor: no FLOPs known for a CPU
        warnings.simplefilter("ignore")
        trainer.fit(model)
    return Fit(trainer, model, recorder, probe, checkpoint, monitor)


# --- the trainer and its loops ----------------------------------------------------------------------------------------


def test_attached_trainer_is_none_until_a_trainer_runs_the_module(fit):
    assert internals.attached_trainer(Tiny()) is None
    assert internals.attached_trainer(fit.model) is fit.trainer


def test_logging_step_is_the_step_a_validations_metrics_are_logged_at(fit):
    assert fit.probe.validation_steps == [1, 3]  # validation runs before the batch that ends the interval counts
    assert fit.recorder.steps_of("val") == fit.probe.validation_steps
    assert internals.logging_step(fit.trainer) == 4


def test_set_logging_step_makes_a_test_log_its_metrics_at_that_step(tmp_path):
    class TestedAt7(Tiny):
        def on_test_start(self) -> None:
            internals.set_logging_step(self.trainer, 7)

    recorder = Recorder()
    trainer = quiet_trainer(tmp_path, limit_test_batches=1, logger=recorder)
    trainer.test(TestedAt7(), verbose=False)
    assert recorder.steps_of("tested") == [7]
    assert internals.logging_step(trainer) == 7


def test_should_update_logs_is_true_on_exactly_the_training_steps_whose_logs_are_written(fit):
    assert fit.probe.updates == {0: False, 1: True, 2: False, 3: True}  # log_every_n_steps=2
    assert fit.recorder.values_of("batch") == [1.0, 3.0]


class StatefulLoader(DataLoader):
    """A loader Lightning saves and restores the state of (it has ``state_dict`` and ``load_state_dict``)."""

    def __init__(self) -> None:
        super().__init__(RandomDataset(32, 16), batch_size=2)
        self.loaded: list[dict] = []

    def state_dict(self) -> dict:
        return {"position": 7}

    def load_state_dict(self, state: dict) -> None:
        self.loaded.append(state)


class Planned(BoringModel):
    """Asks for ``estimated_stepping_batches`` in ``configure_optimizers``, as a schedule fitted to the run does: the
    loaders are then built before a resumed checkpoint is restored."""

    def configure_optimizers(self):
        assert self.trainer.estimated_stepping_batches > 0
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> StatefulLoader:
        return StatefulLoader()

    def on_train_start(self) -> None:
        self.before = list(self.trainer.train_dataloader.loaded)
        internals.hand_over_loader_states(self.trainer)
        self.handed_over = list(self.trainer.train_dataloader.loaded)
        internals.hand_over_loader_states(self.trainer)  # a second call: nothing
        self.handed_over_twice = list(self.trainer.train_dataloader.loaded)


def test_hand_over_loader_states_gives_a_resumed_runs_loader_its_saved_state_once(tmp_path):
    class SaveAt2(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == 2:
                trainer.save_checkpoint(tmp_path / "at2.ckpt")

    # max_epochs: estimated_stepping_batches builds the loaders only when it counts epochs
    options = {"max_epochs": 1, "limit_val_batches": 0, "logger": False, "enable_checkpointing": False}
    quiet_trainer(tmp_path, max_steps=3, callbacks=[SaveAt2()], **options).fit(Planned())
    fresh = Planned()
    quiet_trainer(tmp_path, max_steps=3, **options).fit(fresh)
    assert fresh.handed_over == [], "a run that is not resumed has no state to hand over"
    resumed = Planned()
    quiet_trainer(tmp_path, max_steps=3, **options).fit(resumed, ckpt_path=tmp_path / "at2.ckpt")
    assert resumed.before == [], "Lightning now hands the states over itself: hand_over_loader_states may go"
    assert resumed.handed_over == resumed.handed_over_twice == [{"position": 7}]


# --- ModelCheckpoint --------------------------------------------------------------------------------------------------


def test_every_n_train_steps_is_the_argument_or_0():
    assert internals.every_n_train_steps(ModelCheckpoint(every_n_train_steps=5)) == 5
    assert internals.every_n_train_steps(ModelCheckpoint()) == 0  # every epoch
    assert internals.every_n_train_steps(ModelCheckpoint(every_n_epochs=2)) == 0


def test_saves_on_train_epoch_end_follows_the_argument_or_how_the_run_validates(fit):
    assert fit.probe.on_train_epoch_end is False  # validation every 2 batches: it saves at validation's end
    assert internals.saves_on_train_epoch_end(ModelCheckpoint(save_on_train_epoch_end=True), fit.trainer) is True
    assert internals.saves_on_train_epoch_end(ModelCheckpoint(save_on_train_epoch_end=False), fit.trainer) is False


def test_skips_saving_and_save_last_checkpoint_write_last_ckpt_at_this_step_once(fit):
    assert fit.probe.skips == {"at the start": True, "before saving": False, "after saving": True}
    last = Path(fit.checkpoint.last_model_path)
    assert last.name == "last.ckpt" and last.is_file()
    assert torch.load(last, weights_only=True)["global_step"] == 2


# --- ThroughputMonitor ------------------------------------------------------------------------------------------------


def test_throughput_meters_are_what_computes_the_logged_curves_and_their_mfu(fit):
    from lightning.fabric.utilities.throughput import Throughput

    meters = fit.monitor.meters
    assert len(meters) == 2 and all(isinstance(meter, Throughput) for meter in meters)  # training, validation
    assert all(meter.available_flops == 1e12 for meter in internals.throughput_meters(fit.monitor))
    mfu = fit.recorder.values_of("train/device/mfu")  # none without a peak: Lightning knows no CPU's
    assert mfu and all(value > 0 for value in mfu)


def test_throughput_monitor_has_the_parts_lightformers_throughput_replaces():
    """``lightformer.training.callbacks.Throughput`` overrides ``ThroughputMonitor._start``, ``_update`` (whose
    ``torch.cuda.synchronize()`` after every batch it removes), ``_compute`` and ``on_validation_end`` (which reads
    ``_t0s`` and the meters' ``_time`` as seconds), and keeps the counts in ``_lengths``, ``_samples``, ``_batches``
    by stage; a Lightning upgrade that renames or reshapes them fails here."""
    import inspect

    monitor = ThroughputMonitor(batch_size_fn=len)
    assert {"_t0s", "_lengths", "_samples", "_batches", "_throughputs"} <= set(vars(monitor))
    assert list(inspect.signature(ThroughputMonitor._update).parameters) == [
        "self", "trainer", "pl_module", "batch", "iter_num"]  # fmt: skip
    assert list(inspect.signature(ThroughputMonitor._compute).parameters) == ["self", "trainer", "iter_num"]
    assert "torch.cuda.synchronize()" in inspect.getsource(ThroughputMonitor._update)
    assert "self._t0s[stage] = time.perf_counter()" in inspect.getsource(ThroughputMonitor._start)
    source = inspect.getsource(ThroughputMonitor.on_validation_end)
    assert "self._t0s[RunningStage.TRAINING] +=" in source and "._time" in source


# --- TensorBoardLogger and SummaryWriter ------------------------------------------------------------------------------


def test_opened_writer_is_the_loggers_writer_and_forget_writer_makes_it_open_a_new_one(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="run", version=0, default_hp_metric=False)
    assert internals.opened_writer(logger) is None
    writer = logger.experiment
    assert internals.opened_writer(logger) is writer
    logger.finalize("success")
    internals.forget_writer(logger)
    assert internals.opened_writer(logger) is None
    assert logger.experiment is not writer
    logger.finalize("success")


def test_event_file_writer_writes_summaries_into_the_writers_own_events_file(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import scalar

    writer = SummaryWriter(str(tmp_path))
    file_writer = internals.event_file_writer(writer)
    assert file_writer is internals.event_file_writer(writer) and file_writer.get_logdir() == writer.log_dir
    file_writer.add_summary(scalar("pinned", 2.5), 3)
    writer.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1, "it wrote into a file of its own"
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(event.step, event.value) for event in events.Scalars("pinned")] == [(3, 2.5)]
    reopened = internals.event_file_writer(writer)
    assert reopened is not file_writer, "a closed writer's file writer is not reopened"
    writer.close()


# --- torch: optimizers ------------------------------------------------------------------------------------------------


def test_step_unscales_gradients_is_true_for_fused_optimizers_which_gradscaler_lets_unscale():
    parameters = [torch.nn.Parameter(torch.zeros(2))]
    assert internals.step_unscales_gradients(torch.optim.AdamW(parameters, fused=True))
    assert not internals.step_unscales_gradients(torch.optim.AdamW(parameters))
    assert not internals.step_unscales_gradients(torch.optim.SGD(parameters, lr=0.1))
    assert "_step_supports_amp_scaling" in inspect.getsource(torch.amp.GradScaler.step)


# --- LitData ----------------------------------------------------------------------------------------------------------


def test_samples_yielded_counts_the_samples_a_streaming_loader_handed_out(tmp_path):
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(tmp_path), chunk_size=4)
    for i in range(8):
        writer.add_item(i, {"x": i})
    writer.done()
    writer.merge()
    loader = StreamingDataLoader(StreamingDataset(str(tmp_path)), batch_size=2, num_workers=0)
    assert internals.samples_yielded(loader) == 0
    batches = iter(loader)
    next(batches), next(batches)
    assert internals.samples_yielded(loader) == 4 == loader.state_dict()["num_samples_yielded"]


# --- private hooks that lightformer's subclasses override, and public replacements of private helpers -----------------


def test_dataloader_iterators_draw_from_the_loaders_index_sampler():
    """``lightformer.data.loading.sampling.ResumableDataLoader`` overrides ``DataLoader._index_sampler``."""

    class Reversed(DataLoader):
        @property
        def _index_sampler(self):
            return list(reversed(list(super()._index_sampler)))

    assert [int(x) for x in Reversed(torch.arange(4), batch_size=None)] == [3, 2, 1, 0]
    assert [batch.tolist() for batch in Reversed(torch.arange(4), batch_size=2)] == [[2, 3], [0, 1]]


def test_rich_progress_bar_titles_the_training_bar_with_get_train_description():
    """``lightformer.training.progress.ProgressBar`` overrides
    ``RichProgressBar._get_train_description(current_epoch)``."""
    from lightning.pytorch.callbacks import RichProgressBar

    assert list(inspect.signature(RichProgressBar._get_train_description).parameters) == ["self", "current_epoch"]
    assert "self._get_train_description(" in inspect.getsource(RichProgressBar.on_train_epoch_start)


@pytest.mark.parametrize("scheme", REMOTE_SCHEMES)
def test_object_store_is_the_client_litdata_itself_uses_for_the_scheme(scheme, monkeypatch):
    """``prepare.object_store`` picks LitData's public provider classes by scheme, as LitData's ``_get_fs_provider``
    does (what it used before)."""
    from litdata.streaming.fs_provider import _get_fs_provider

    if scheme == "gs":
        pytest.importorskip("google.cloud.storage")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    url = f"{scheme}://bucket/prefix"
    assert type(object_store(url)) is type(_get_fs_provider(url))


def test_preparation_leaves_every_random_generator_as_it_was():
    """``prepare._random_state_kept`` (public torch, NumPy and Python calls; it was Lightning's private
    ``_collect_rng_states`` and ``_set_rng_states``)."""

    def draw() -> tuple:
        return torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()

    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    expected = draw()
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    with _random_state_kept():
        assert draw() == expected
        draw()
    assert draw() == expected
