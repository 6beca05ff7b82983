"""Callbacks of every run: what keeps it safe (atomic checkpoint files, a ``last.ckpt`` that is really the last,
exact resume of random state and of epoch-end checkpoints, a stop on non-finite values) and what shows its speed
(throughput and MFU).

``python -m lightformer fit`` installs them all (see ``lightformer.cli.main``); with the Python API, pass
``plugins=[AtomicCheckpointIO()]`` and ``callbacks=[ModelCheckpoint(save_last=True), NonFiniteLossGuard(),
RandomStateCheckpoint(), ResumeAfterEpochEnd(), Throughput()]`` to the ``Trainer``. ``LateDropout`` is a part of a
recipe that a config adds to ``trainer.callbacks``.
"""

from __future__ import annotations

import errno
import os
import random
import resource
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from fsspec.utils import get_protocol
from lightning.pytorch import callbacks
from lightning.pytorch.callbacks import Callback, ThroughputMonitor
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from timm.layers import DropPath
from torch import Tensor, nn

from lightformer.io.files import atomic_open, remove_orphaned_temporary_files
from lightformer.nn import Dropout, MultiHeadAttention, TokenDropout
from lightformer.training import internals, peaks

MIB = 2**20


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary file in the same folder, synced to disk, then renamed over the target.

    A crash or ``kill -9`` in the middle of a save leaves the previous checkpoint intact (Lightning's own
    writer stages the file in the system's temporary folder and moves it, which is a copy, not a rename, when
    that folder is on another file system). Loading is always ``torch.load(weights_only=True)``: a checkpoint
    can hold tensors, numbers, strings and containers of them, never objects whose unpickling runs code.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if not is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        try:
            with atomic_open(path) as f:
                torch.save(checkpoint, f)
        except (OSError, RuntimeError) as error:  # torch's zip writer reports a full disk as a RuntimeError
            folder = Path(path).parent
            full = getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error)
            free = shutil.disk_usage(folder).free / MIB
            if not full and not write_refused(error) and free > 16:
                raise
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            if full or free <= 16:
                cause = f"disk full: the checkpoint {path} could not be written ({free:.0f} MiB free in {folder})"
            elif limit != resource.RLIM_INFINITY:
                cause = (f"the checkpoint {path} could not be written: the file system stopped the write, as this "
                         f"process may write files of at most {limit:,} bytes (`ulimit -f`; {free:.0f} MiB free in "
                         f"{folder})")  # fmt: skip
            else:
                cause = (f"the checkpoint {path} could not be written: the file system stopped the write with "
                         f"{free:.0f} MiB free in {folder} (a disk quota, or a limit on a file's size)")  # fmt: skip
            raise OSError(
                errno.ENOSPC,
                f"{cause}; no half-written file is left, and any previous checkpoint there is intact. Free some space "
                "(or raise the limit), or write "
                "checkpoints elsewhere (trainer.logger.init_args.save_dir, or the checkpoint callback's dirpath), then "
                "resume with --ckpt_path <the last checkpoint>",
            ) from None
        directory = os.open(Path(path).parent, os.O_RDONLY)  # make the rename itself durable
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict:
        return super().load_checkpoint(path, map_location=map_location, weights_only=True)


class ModelCheckpoint(callbacks.ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` with a ``last.ckpt`` that always holds the latest state, and checks at start.

    With ``save_last``, Lightning 2.6 rewrites ``last.ckpt`` only when a top-k checkpoint is saved, that is when the
    monitored metric improves: a run whose metric stopped improving kept a stale ``last.ckpt``, and resuming "from
    the last checkpoint" silently threw work away. Here every checkpoint event of this callback (each validation, or
    each epoch end when saving per epoch, every ``every_n_train_steps``) and the end of training write it.

    Before training it also removes the temporary files that a run killed mid-save left in its folder, and refuses
    to start when the folder is not writable or lacks the space for two checkpoints (the new file is written beside
    the old one). The arguments are Lightning's.
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (trainer.is_global_zero and self.dirpath and is_local(self.dirpath)):
            return
        resumed = [Path(trainer.ckpt_path).parent] if trainer.ckpt_path and Path(trainer.ckpt_path).is_file() else []
        for folder in {Path(self.dirpath), *resumed}:  # a resumed run may write into another folder
            for orphan in remove_orphaned_temporary_files(folder):
                rank_zero_info(f"removed {orphan}, the unfinished write of an interrupted run")
        check_checkpoint_folder(Path(self.dirpath), pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        every = internals.every_n_train_steps(self)
        if every >= 1 and trainer.global_step % every == 0:
            self._write_last(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if internals.saves_on_train_epoch_end(self, trainer):
            self._write_last(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not internals.saves_on_train_epoch_end(self, trainer):
            self._write_last(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._write_last(trainer)

    def _write_last(self, trainer: L.Trainer) -> None:
        """Write ``last.ckpt`` unless nothing is asked or this step was saved already (top-k saves write it too):
        ``skips_saving`` is True then, as it is outside fit, in a sanity check and with ``fast_dev_run``."""
        if not self.save_last or internals.skips_saving(self, trainer):
            return
        internals.save_last_checkpoint(self, trainer)


def write_refused(error: BaseException) -> bool:
    """Whether ``error``, raised while a checkpoint was written, says that the file system wrote less than asked: a
    full disk, a quota or a file-size limit (torch's zip writer says "unexpected pos" or "failed writing file")."""
    codes = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    text = str(error)
    return getattr(error, "errno", None) in codes or "unexpected pos" in text or "failed writing file" in text


def is_local(path: str | Path) -> bool:
    """Whether ``path`` is on the local file system (no URL scheme, or ``file://``), as fsspec reads it."""
    return get_protocol(str(path)) == "file"


def check_checkpoint_folder(folder: Path, pl_module: L.LightningModule) -> None:
    """Raise OSError when ``folder`` cannot take checkpoints: not writable, or short of the space for two of them
    (a checkpoint holds the weights and AdamW's two moments: about 3 × the parameters' bytes)."""
    existing = next((p for p in [folder, *folder.parents] if p.exists()), folder)
    if not os.access(existing, os.W_OK):
        raise OSError(
            errno.EACCES,
            f"cannot write checkpoints to {folder}: {existing} is not writable; set trainer.logger.init_args.save_dir "
            "(or the checkpoint callback's dirpath) to a writable folder",
        )
    parameter_bytes = sum(p.numel() * p.element_size() for p in pl_module.parameters())
    needed = 2 * 3 * parameter_bytes + MIB  # and a MiB for the rest: loop state, tokenizers, random state
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"disk full: {existing} has {free / MIB:.0f} MiB free, and checkpoints of this model need about "
            f"{needed / MIB:.0f} MiB (the new file is written beside the previous one); free some space or write "
            "checkpoints elsewhere (trainer.logger.init_args.save_dir)",
        )


class NonFiniteLossError(RuntimeError):
    """A loss, metric or parameter became NaN or infinite; the message names the step and the last good checkpoint."""


def last_good_checkpoint(trainer: L.Trainer) -> str | None:
    """The most recently written checkpoint of the trainer's ModelCheckpoint callbacks, if any exists."""
    paths = set()
    for callback in trainer.checkpoint_callbacks:
        paths.update([callback.last_model_path, callback.best_model_path, *callback.best_k_models])
    existing = [path for path in paths if path and os.path.isfile(path)]
    return max(existing, key=os.path.getmtime) if existing else None


class NonFiniteLossGuard(Callback):
    """Stop training at the first NaN or infinite value, and never checkpoint non-finite weights.

    Each step's loss is checked on the device before its backward pass (no host sync); the host reads the result on
    the first step of a fit, and then on the steps whose logs are written (every ``trainer.log_every_n_steps``),
    which read values back anyway, or every ``check_every_n_steps`` when that is set (1: every step, as before: a
    NaN loss then never reaches the weights, at the cost of a host sync per step, which a fast GPU pays for). The
    trade-off: a non-finite loss is caught up to that many steps late, and the updates between ran on it (the
    weights are then likely non-finite too), but nothing is saved from them: every checkpoint, every validation
    and the end of training read the check first. Parameters are checked before every validation (a finite loss can
    still have overflowing gradients) and before every checkpoint is written, so a good checkpoint is never
    overwritten by a broken model; tasks check their validation metrics with ``raise_if_non_finite``. Every check
    raises ``NonFiniteLossError`` naming the step and the last good checkpoint. Put one in the config's
    ``trainer.callbacks`` (``--trainer.callbacks+=lightformer.training.callbacks.NonFiniteLossGuard
    --trainer.callbacks.check_every_n_steps=1``) and it replaces the default guard.
    """

    def __init__(self, check_every_n_steps: int | None = None) -> None:
        if check_every_n_steps is not None and check_every_n_steps < 1:
            raise ValueError(f"check_every_n_steps={check_every_n_steps} must be at least 1 (or null: when logging)")
        self.check_every_n_steps = check_every_n_steps
        self._first_step = 0  # of this fit: always read
        self._bad_step: torch.Tensor | None = None  # on the device: the first step whose loss was non-finite, or -1
        self._bad_loss: torch.Tensor | None = None  # on the device: that loss

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._first_step, self._bad_step, self._bad_loss = trainer.global_step, None, None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        loss = loss.detach()
        bad = ~torch.isfinite(loss).all()
        if self._bad_step is None:
            self._bad_step = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._bad_loss = torch.zeros((), dtype=loss.dtype, device=loss.device)
        first = bad & (self._bad_step < 0)
        self._bad_step = torch.where(first, trainer.global_step, self._bad_step)
        self._bad_loss = torch.where(first, loss.reshape(-1)[0], self._bad_loss)
        if self._reads_now(trainer):
            self._raise_if_non_finite_loss(trainer, "training stopped before the update")

    def _reads_now(self, trainer: L.Trainer) -> bool:
        """Whether this step's host reads the check: the fit's first step, then every ``check_every_n_steps`` or
        (by default) the steps whose logs are written."""
        if trainer.global_step == self._first_step:
            return True
        if self.check_every_n_steps is not None:
            return trainer.global_step % self.check_every_n_steps == 0
        return internals.should_update_logs(trainer)

    def _raise_if_non_finite_loss(self, trainer: L.Trainer, consequence: str) -> None:
        """Read the device's check (a host sync) on every process; raise if any saw a non-finite loss."""
        step = int(self._bad_step) if self._bad_step is not None else -1
        if trainer.strategy.reduce_boolean_decision(step >= 0, all=False):  # any rank → every rank stops
            if step < 0:
                value, step = "non-finite on another process", trainer.global_step
            else:
                value = f"{self._bad_loss.item()}"
            late = (f"; the guard read it at step {trainer.global_step} (it reads at logging steps, or every "
                    "check_every_n_steps: set 1 to stop before the first update), so the updates since ran on it"
                    if step < trainer.global_step else "")  # fmt: skip
            raise NonFiniteLossError(
                f"the training loss is {value} at global step {step} (epoch {trainer.current_epoch}){late}; "
                f"{consequence}. {non_finite_advice(trainer)}"
            )

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.state.fn == "fit":
            self._raise_if_non_finite_loss(trainer, "the checkpoint was not written and training stopped")
        self._check_parameters(trainer, pl_module, "the checkpoint was not written")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit":
            self._raise_if_non_finite_loss(trainer, "validation did not start and training stopped")
            self._check_parameters(trainer, pl_module, "validation did not start")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_non_finite_loss(trainer, "training stopped")

    @staticmethod
    def _check_parameters(trainer: L.Trainer, pl_module: L.LightningModule, consequence: str) -> None:
        broken = [name for name, p in pl_module.named_parameters() if not torch.isfinite(p.detach()).all()]
        if trainer.strategy.reduce_boolean_decision(bool(broken), all=False):
            raise NonFiniteLossError(
                f"parameters became non-finite by global step {trainer.global_step} "
                f"({', '.join(broken[:3]) or 'on another process'}{', ...' if len(broken) > 3 else ''}): the losses "
                f"were finite, so gradients overflowed; {consequence} and training stopped. "
                + non_finite_advice(trainer)
            )


def non_finite_advice(trainer: L.Trainer) -> str:
    """Which checkpoint to resume from, and what usually helps, from the run's own settings: gradient clipping where
    it is off (a lower clip where it is on), another precision than the run's 16- or bf16-bit one, a lower learning
    rate; resuming only where a checkpoint was written."""
    last = last_good_checkpoint(trainer)
    clip = trainer.gradient_clip_val
    remedies = [
        "set trainer.gradient_clip_val (e.g. 1.0)" if not clip else f"lower trainer.gradient_clip_val (now {clip})"
    ]
    precision = str(trainer.precision)
    if precision.startswith("16"):
        remedies.append(f"train in bf16-mixed or 32-true instead of {precision}")
    elif precision.startswith("bf16"):
        remedies.append(f"train in 32-true instead of {precision}")
    if last:
        return (
            f"The last good checkpoint is {last}. To continue, resume with --ckpt_path {last} and "
            f"{' or '.join(remedies)}; for a lower model.optimizer.lr, start a new run from that checkpoint's weights "
            "(--model.init.checkpoint)."
        )
    return (
        "No checkpoint was written before this step, so there is nothing to resume: start the run again and "
        f"{', or '.join([*remedies, 'lower model.optimizer.lr (or lengthen its warmup_steps)'])}."
    )


def raise_if_non_finite(trainer: L.Trainer, name: str, value: torch.Tensor) -> None:
    """Raise ``NonFiniteLossError`` naming the metric, the step and the last good checkpoint if ``value`` is not
    finite (a task calls it on its validation metrics before using them, e.g. to sample text)."""
    if not bool(torch.isfinite(value).all()):
        raise NonFiniteLossError(
            f"{name} is {value.item() if value.numel() == 1 else 'non-finite'} at global step {trainer.global_step} "
            f"(epoch {trainer.current_epoch}): the model's outputs are not finite, and the run stopped. "
            f"{non_finite_advice(trainer)}"
        )


def random_state() -> dict[str, Any]:
    """The state of every random generator training draws from, as tensors and plain Python values only."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": _plain(random.getstate())}
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    state["numpy"] = {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "position": position,
        "has_gauss": has_gauss,
        "cached_gauss": cached_gauss,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: dict[str, Any]) -> None:
    """Restore what ``random_state`` returned."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["kind"], keys, numpy["position"], numpy["has_gauss"], numpy["cached_gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


class SameDataOnResumeCheck(Callback):
    """Before the task compares the data's facts with its checkpoint's, on resuming a fit from ``ckpt_path``: the
    data module's prepared data against the checkpoint's (``SameDataOnResume``, which Lightning checks only after),
    so that a change of the source files that also changes the tokenizer is refused naming the files that changed.
    ``lightformer fit --ckpt_path`` adds it."""

    def __init__(self, ckpt_path: str) -> None:
        self.ckpt_path = ckpt_path  # the fit's --ckpt_path: the trainer knows it only after set-up

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightformer.data.preparation.caching import SameDataOnResume, check_same_data, prepared_identity
        from lightformer.io.checkpoints import read_checkpoint

        datamodule, path = trainer.datamodule, self.ckpt_path
        if stage != "fit" or not isinstance(datamodule, SameDataOnResume) or not path or not is_local(path):
            return
        if not Path(path).is_file():
            return  # Lightning names a missing checkpoint
        state = read_checkpoint(str(path)).get(type(datamodule).__qualname__)
        if isinstance(state, dict) and "prepared" in state:
            check_same_data(state["prepared"], prepared_identity(datamodule.prepared))


class RandomStateCheckpoint(Callback):
    """Save the random generators' state in every checkpoint and restore it on resume.

    Lightning restores weights, optimizer, schedule and loop counters but not the generators, so a resumed
    run would shuffle, augment and drop out differently from the run it continues. With this callback,
    fit for 4 epochs equals fit for 2 then resume for 2 (from an end-of-epoch checkpoint) exactly.
    """

    def state_dict(self) -> dict[str, Any]:
        return random_state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_random_state(state_dict)


class ResumeAfterEpochEnd(Callback):
    """Resume a run with ``max_steps`` from a checkpoint written at the end of an epoch, as from any other.

    Lightning's ``ModelCheckpoint`` writes at the end of the training epoch when the run validates once per epoch,
    and ``last.ckpt`` is written at the end of training. Lightning 2.6 resumes such checkpoints correctly only when
    training is epoch-based (``max_steps: -1``): with ``max_steps`` set it restarts inside the finished epoch and
    counts it a second time, so the resumed run skips one epoch of data and stops an epoch early (a run resumed
    after 2 of 4 epochs trained 3). Before the loops are restored, this marks the saved epoch as completed and the
    next one as not begun, the state in which Lightning starts a new epoch (tested against an uninterrupted run,
    both kinds of checkpoint, in ``tests/test_checkpoints.py``).
    """

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        loop = checkpoint.get("loops", {}).get("fit_loop")
        if trainer.max_steps == -1 or not loop or "epoch_progress" not in loop:
            return
        epochs = loop["epoch_progress"]
        total = epochs["total"]
        finished = total["ready"] == total["started"] == total["processed"]  # the epoch's batches all ran
        if not finished or total["completed"] < total["processed"] - 1:
            return  # written mid-epoch (or at its start): Lightning restarts from there correctly
        for counts in (total, epochs["current"]):
            counts["completed"] = counts["processed"]
        for name in ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress"):
            loop[name]["current"] = dict.fromkeys(loop[name]["current"], 0)
        loop["epoch_loop.batch_progress"]["is_last_batch"] = False


# Where each kind of module keeps its drop rate: every dropout a lightformer (or timm) model can hold.
_DROP_RATE_ATTRIBUTES = (
    (nn.modules.dropout._DropoutNd, "p"),  # torch's nn.Dropout family (timm's blocks use these)
    (Dropout, "p"),
    (TokenDropout, "p"),
    (DropPath, "drop_prob"),
    (MultiHeadAttention, "dropout"),  # on the attention weights
)


def drop_rates(model: nn.Module) -> dict[nn.Module, tuple[str, float]]:
    """Every module of ``model`` that drops at random: its rate's attribute name and its rate now."""
    rates = {}
    for module in model.modules():
        for kind, attribute in _DROP_RATE_ATTRIBUTES:
            if isinstance(module, kind):
                rates[module] = (attribute, getattr(module, attribute))
    return rates


class LateDropout(Callback):
    """Late dropout (Liu et al. 2023, "Dropout Reduces Underfitting"): every dropout of the model is off until
    training step ``start_step``, then at its configured rate to the end.

    A model that overfits a small dataset late, not early, learns faster without dropout in its first epochs
    and still gets dropout's regularisation for the rest of the run. All dropouts follow: on activations and
    embeddings, on attention weights, word dropout and stochastic depth (``drop_path``). The switch reads only
    ``trainer.global_step``, so a resumed run drops out exactly as the run it continues, and evaluation is
    untouched (dropout is off there anyway). Add it to a config's ``trainer.callbacks``::

        - class_path: lightformer.training.callbacks.LateDropout
          init_args:
            start_step: 600
    """

    def __init__(self, start_step: int) -> None:
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"LateDropout: start_step must be a training step >= 0, got {start_step!r}")
        self.start_step = start_step
        self._rates: dict[nn.Module, tuple[str, float]] = {}
        self._on: bool | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._rates = drop_rates(pl_module)
        if not any(rate for _, rate in self._rates.values()):
            raise ValueError(
                f"LateDropout(start_step={self.start_step}): the model has no dropout to start late (every rate is "
                "0): set one, e.g. model.net.dropout, or remove the callback"
            )
        self._on = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int):
        on = trainer.global_step >= self.start_step
        if on == self._on:
            return
        self._set_rates(on)
        if on and self._on is not None:
            rank_zero_info(f"LateDropout: dropout on from step {trainer.global_step}")
        self._on = on

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._set_rates(True)  # the model as configured again, whenever fit ended
            self._on = None

    def _set_rates(self, on: bool) -> None:
        for module, (attribute, rate) in self._rates.items():
            setattr(module, attribute, rate if on else 0.0)


class StepClock:
    """Time marks of a device's work without waiting for it: on a GPU a CUDA event recorded in the stream (read when
    the marks are converted to seconds, one host sync for all of them), elsewhere the wall clock (a CPU's work is done
    when its Python call returns)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._origin: torch.cuda.Event | None = None  # the first mark: the zero of a GPU's marks

    def mark(self) -> float | torch.cuda.Event:
        """A mark of now, in the device's stream of work."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        if self._origin is None:
            self._origin = event
        return event

    def seconds(self, marks: list[float | torch.cuda.Event]) -> list[float]:
        """``marks`` in seconds (one clock for all; a float given is taken as seconds already); on a GPU this waits
        for the latest of them."""
        events = [mark for mark in marks if not isinstance(mark, float)]
        if events:
            events[-1].synchronize()  # marks are recorded in order on one stream: the others are done too
        return [mark if isinstance(mark, float) else self._origin.elapsed_time(mark) / 1e3 for mark in marks]


def read_counts(values: list[int | Tensor]) -> list[int]:
    """``values`` as integers: the tensors among them (counts kept on the device) read back in one host sync."""
    tensors = [value for value in values if isinstance(value, Tensor)]
    if not tensors:
        return [int(value) for value in values]
    read = iter(torch.stack([tensor.reshape(()).to(torch.long) for tensor in tensors]).tolist())
    return [next(read) if isinstance(value, Tensor) else int(value) for value in values]


class Throughput(ThroughputMonitor):
    """Lightning's ``ThroughputMonitor`` for every lightformer task: samples, items (tokens or images) and FLOPs per
    second, and MFU (model FLOPs utilisation: achieved / peak FLOP/s), each a curve under ``train/``
    (``train/device/...`` per process, and for the whole job when there are several) and ``validate/``, which
    lightformer's ``TensorBoardLogger`` shows in a section after the loss and metrics: ``velocity/train/device/mfu``.

    The task says what a batch holds (``Task.throughput_counts``) and what it costs (``Task.batch_flops``: counted by
    PyTorch on the model's own operations, backward included in training). MFU needs the device's peak at the run's
    precision: ``lightformer.training.peaks.peak_flops`` takes it from a datasheet table (dense), Lightning's table,
    or, for a CPU or a card in neither, a short matrix-multiply measurement; the log says once which, and what it is.

    No step waits for the device: where Lightning's monitor calls ``torch.cuda.synchronize()`` after every batch to
    time it, each batch's end is a mark of a ``StepClock`` (a CUDA event on a GPU, the wall clock elsewhere), and its
    counts stay where the task made them (a target-token count is a tensor on the device); the marks and counts of
    the last ``window_size`` batches are read on the steps whose logs are written, in one host sync.

    Args:
        window_size: batches per throughput reading (a moving window).
        peak_flops: peak FLOP/s of one device for MFU; None: ``lightformer.training.peaks.peak_flops``.
    """

    def __init__(self, window_size: int = 20, peak_flops: float | None = None) -> None:
        # (not named ``_samples``: ThroughputMonitor's dict of counts by stage is, and would hide the method)
        super().__init__(batch_size_fn=self._samples_in, length_fn=self._items_in, window_size=window_size)
        self.peak_flops = peak_flops
        self.window_size = window_size
        self._task: L.LightningModule | None = None
        self._clock: StepClock | None = None
        # by stage: (mark, batches, samples, items, FLOPs) of each batch not yet handed to Lightning's meter
        self._pending: dict[Any, list[tuple[Any, int, int, int | Tensor, int | None]]] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._task = pl_module
        with warnings.catch_warnings():  # "FLOPs not found for ...": the peak comes from lightformer.training.peaks
            warnings.filterwarnings("ignore", message="FLOPs not found")
            super().setup(trainer, pl_module, stage)
        if self.peak_flops is None:  # once: a fit's later validate or test keeps it
            self.peak_flops, source = peaks.peak_flops(trainer.strategy.root_device, trainer.precision)
            rank_zero_info(f"MFU is against {self.peak_flops / 1e12:,.2f} TFLOP/s per device: {source}")
        self.available_flops = self.peak_flops
        for throughput in internals.throughput_meters(self):
            throughput.available_flops = self.peak_flops
        self._clock = StepClock(trainer.strategy.root_device)

    def _start(self, trainer: L.Trainer) -> None:
        stage = trainer.state.stage
        if stage not in self._samples or trainer.state.fn == "fit":  # Lightning resets the counts: drop their marks
            self._pending[stage] = []
        super()._start(trainer)
        self._t0s[stage] = self._clock.mark()

    @torch.inference_mode()
    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        """Lightning's ``_update`` without its ``torch.cuda.synchronize()``: the batch's end is marked, its counts
        kept (``_flush`` hands them to Lightning's meter when the logs are written)."""
        stage = trainer.state.stage
        self._lengths[stage] = self._lengths[stage] + self.length_fn(batch)  # a new tensor: the pending keep theirs
        self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        flops = getattr(pl_module, "flops_per_batch", None)
        pending = self._pending.setdefault(stage, [])
        pending.append((self._clock.mark(), self._batches[stage], self._samples[stage], self._lengths[stage], flops))
        del pending[: -self.window_size]  # the meter keeps only its window

    def _flush(self, stage: Any) -> None:
        """Hand the pending batches of ``stage`` to Lightning's meter: their marks and counts read in one sync."""
        pending = self._pending.get(stage)
        if not pending:
            return
        t0, *times = self._clock.seconds([self._t0s[stage], *(record[0] for record in pending)])
        self._t0s[stage] = t0  # seconds now: Lightning's on_validation_end moves it
        items = read_counts([record[3] for record in pending])
        for (_, batches, samples, _, flops), elapsed, length in zip(pending, times, items, strict=True):
            self._throughputs[stage].update(time=elapsed - t0, batches=batches, samples=samples, lengths=length,
                                            flops=flops)  # fmt: skip
        self._pending[stage] = []
        self._lengths[stage] = items[-1]

    def _compute(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        if internals.should_update_logs(trainer):
            self._flush(trainer.state.stage)
        super()._compute(trainer, iter_num)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, *args: Any) -> None:
        for stage in list(self._t0s):  # Lightning's monitor reads the times of both stages, in seconds
            self._flush(stage)
            self._t0s[stage] = self._clock.seconds([self._t0s[stage]])[0]
        super().on_validation_end(trainer, *args)

    def _samples_in(self, batch: Any) -> int:
        return self._task.throughput_counts(batch)[0]

    def _items_in(self, batch: Any) -> int | Tensor:
        return self._task.throughput_counts(batch)[1]
