"""The one place lightformer touches other libraries' private internals (Lightning, torch, LitData).

Where Lightning, torch or LitData have no public API for what lightformer needs, the private attribute or method is
used here, in one small function each, and nowhere else. Each function says what it relies on and since which
version it is there (checked against the versions installed: lightning 2.6.6, torch 2.14, litdata 0.2.76), and
``tests/test_internals.py`` pins each on real objects (a tiny ``Trainer`` fit, a ``SummaryWriter``, a LitData
loader), so that an upgrade that changes one of them fails there, by name, and not somewhere in a training run.

Subclasses that override a private hook (``ProgressBar._get_train_description``, ``ResumableDataLoader.
_index_sampler``) cannot be isolated in a function; their hooks are pinned in ``tests/test_internals.py`` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lightning as L
    from lightning.fabric.utilities.throughput import Throughput
    from lightning.pytorch.callbacks import ModelCheckpoint, ThroughputMonitor
    from lightning.pytorch.loggers import TensorBoardLogger
    from litdata import StreamingDataLoader
    from torch.optim import Optimizer
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.writer import FileWriter


# --- Lightning: the trainer and its loops -----------------------------------------------------------------------------


def attached_trainer(module: L.LightningModule) -> L.Trainer | None:
    """The trainer ``module`` is attached to, or None (``module.trainer`` raises instead).

    Relies on ``LightningModule._trainer``, the attribute behind the ``trainer`` property (Lightning 2.0 and later)."""
    return module._trainer


def logging_step(trainer: L.Trainer) -> int:
    """The step Lightning logs scalars at now: its count of batches that stepped an optimizer, before the current one.

    Relies on ``trainer.fit_loop.epoch_loop._batches_that_stepped`` (Lightning 2.0 and later), which the logger
    connector uses as the ``step`` of every ``log_metrics`` call without one (``trainer.global_step`` differs from it
    in a ``test`` of a checkpoint in a fresh process)."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_logging_step(trainer: L.Trainer, step: int) -> None:
    """Make Lightning log the next scalars at ``step`` (see ``logging_step``)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = step


def should_update_logs(trainer: L.Trainer) -> bool:
    """Whether Lightning writes the logs of the current training step (every ``log_every_n_steps``, and the step where
    the run stops), as Lightning's own ``LearningRateMonitor`` and ``ThroughputMonitor`` decide.

    Relies on ``trainer._logger_connector.should_update_logs`` (Lightning 2.0 and later), a property."""
    return trainer._logger_connector.should_update_logs


def hand_over_loader_states(trainer: L.Trainer) -> None:
    """Give the training loaders the states a resumed checkpoint saved for them (their position inside the epoch),
    if Lightning still holds them: it hands them over only when it builds the loaders after restoring the checkpoint,
    so a loader built earlier (``estimated_stepping_batches`` asked in ``configure_optimizers``) would start the epoch
    afresh. A no-op when they were handed over, or when the run is not resumed.

    Relies on ``trainer.fit_loop._load_combined_loader_states()`` (Lightning 2.2 and later): it calls
    ``load_state_dict`` of each stateful loader with the saved states, once, while the loop is restarting."""
    trainer.fit_loop._load_combined_loader_states()


# --- Lightning: ModelCheckpoint ---------------------------------------------------------------------------------------


def every_n_train_steps(callback: ModelCheckpoint) -> int:
    """The callback's ``every_n_train_steps`` as it uses it: 0 when it does not save every n training steps.

    Relies on ``ModelCheckpoint._every_n_train_steps`` (Lightning 2.0 and later; there is no public property)."""
    return callback._every_n_train_steps


def saves_on_train_epoch_end(callback: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """Whether the callback saves at the end of the training epoch (True) or at the end of validation (False): its
    ``save_on_train_epoch_end`` argument, or when that is None, Lightning's choice from how the run validates.

    Relies on ``ModelCheckpoint._should_save_on_train_epoch_end(trainer)`` (Lightning 1.9 and later)."""
    return callback._should_save_on_train_epoch_end(trainer)


def skips_saving(callback: ModelCheckpoint, trainer: L.Trainer) -> bool:
    """Whether the callback saves nothing now: ``fast_dev_run``, not fitting, a sanity check, or a checkpoint of this
    callback already written at this global step.

    Relies on ``ModelCheckpoint._should_skip_saving_checkpoint(trainer)`` (Lightning 2.0 and later)."""
    return callback._should_skip_saving_checkpoint(trainer)


def save_last_checkpoint(callback: ModelCheckpoint, trainer: L.Trainer) -> None:
    """Write the callback's ``last.ckpt`` now, as Lightning writes it: named from the current metrics, the previous
    one replaced (or linked, with ``save_last="link"``), ``last_model_path`` updated, this step marked as saved
    (``skips_saving`` is then True) and the loggers told. Nothing when ``save_last`` is off.

    Relies on ``ModelCheckpoint._save_last_checkpoint(trainer, monitor_candidates)`` and
    ``ModelCheckpoint._monitor_candidates(trainer)`` (Lightning 2.0 and later)."""
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


# --- Lightning: ThroughputMonitor -------------------------------------------------------------------------------------


def throughput_meters(monitor: ThroughputMonitor) -> list[Throughput]:
    """The meters (``lightning.fabric.utilities.throughput.Throughput``, one per stage) that compute the curves the
    monitor logs; ``ThroughputMonitor.setup`` builds them with its ``available_flops``, which their MFU divides by.

    Relies on ``ThroughputMonitor._throughputs``, a dict stage → meter (Lightning 2.2 and later)."""
    return list(monitor._throughputs.values())


# --- Lightning: TensorBoardLogger, and torch's SummaryWriter ----------------------------------------------------------


def opened_writer(logger: TensorBoardLogger) -> SummaryWriter | None:
    """The logger's ``SummaryWriter`` if it has opened one, else None (``logger.experiment`` would open one).

    Relies on ``TensorBoardLogger._experiment`` (Lightning 2.0 and later), the writer ``experiment`` returns."""
    return logger._experiment


def forget_writer(logger: TensorBoardLogger) -> None:
    """Make the logger open a new ``SummaryWriter`` at its next ``experiment`` (after closing it in ``finalize``).

    Relies on ``TensorBoardLogger._experiment`` (see ``opened_writer``)."""
    logger._experiment = None


def event_file_writer(writer: SummaryWriter) -> FileWriter:
    """The ``FileWriter`` that writes ``writer``'s own events file (the one in ``writer.log_dir``), reopened if the
    writer was closed: its ``add_summary(summary, step)`` writes a prepared ``Summary`` protocol buffer there, which
    ``SummaryWriter`` has no public method for (``add_hparams`` writes into a new folder).

    Relies on ``SummaryWriter._get_file_writer()`` (torch 1.1 and later)."""
    return writer._get_file_writer()


# --- torch: optimizers --------------------------------------------------------------------------------------------


def step_unscales_gradients(optimizer: Optimizer) -> bool:
    """Whether the optimizer's ``step`` handles a ``GradScaler``'s scaled gradients itself (fused Adam, AdamW, SGD):
    Lightning then leaves them scaled until the step, so they must be unscaled (``scaler.unscale_``) before clipping.

    Relies on the ``_step_supports_amp_scaling`` attribute that such optimizers set, and that ``GradScaler.step``
    reads (torch 1.13 and later); an optimizer without it does not."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


# --- LitData ----------------------------------------------------------------------------------------------------------


def samples_yielded(loader: StreamingDataLoader) -> int:
    """The samples a ``StreamingDataLoader`` over one ``StreamingDataset`` has handed out in the current epoch (what
    its ``state_dict`` saves as ``num_samples_yielded``, and 0 after an elastic ``load_state_dict``).

    Relies on ``StreamingDataLoader._num_samples_yielded_streaming`` (checked in litdata 0.2.76)."""
    return loader._num_samples_yielded_streaming


__all__ = [
    "attached_trainer",
    "event_file_writer",
    "every_n_train_steps",
    "forget_writer",
    "hand_over_loader_states",
    "logging_step",
    "opened_writer",
    "samples_yielded",
    "save_last_checkpoint",
    "saves_on_train_epoch_end",
    "set_logging_step",
    "should_update_logs",
    "skips_saving",
    "step_unscales_gradients",
    "throughput_meters",
]
