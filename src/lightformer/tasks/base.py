"""What every task shares: the optimizer and its schedule, gradient clipping, sharding, compilation, plain hparams.

A task (``LanguageModelTask``, ``TranslationTask``, ...) is a ``Task`` that builds its model from a model config
(``GPTConfig``, ...) and adds its loss, metrics and logging. Everything here is one code path for every device,
precision and strategy, so the CPU tests run what a GPU run does:

- AdamW is fused everywhere (``tasks.optim``). Lightning's mixed-precision plugins refuse to clip gradients for
  a fused optimizer (it would unscale fp16 gradients inside its step, after the clipping); ``clip_gradients``
  unscales first and then clips, under 32-true, bf16-mixed and 16-mixed alike.
- Under ``configs/trainer/fsdp.yaml`` (``lightformer.training.distributed.FSDP2Strategy``) each encoder/decoder layer
  and then the whole model are sharded with FSDP2's ``fully_shard``; their gradients are DTensors, whose global norm
  ``torch.nn.utils.clip_grad_norm_`` computes across the shards, so clipping is the same code there too.

``Task`` holds the Lightning hooks; what they do lives in its parts, one concern each, every one a module of
``lightformer.tasks``: ``data_contract`` (the data's facts: the model's sizes, the checks), ``warm_start``
(``model.init``), ``compilation`` (the compiled forward), ``batch_costs`` (what a batch holds and costs),
``optim`` (AdamW, clipping, the schedule fitted to max_time) and ``hyperparameters`` (what a checkpoint stores).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torchmetrics import Metric

from lightformer.config_groups import as_config
from lightformer.data.module import DataModule
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts
from lightformer.io.checkpoints import InitConfig
from lightformer.tasks.batch_costs import BatchCosts
from lightformer.tasks.compilation import CompiledForward
from lightformer.tasks.data_contract import DataContract
from lightformer.tasks.hyperparameters import KeptArguments, arguments_given, plain
from lightformer.tasks.optim import (
    OptimizerConfig,
    clip_gradients,
    configure_adamw,
    fit_schedule_to_max_time,
    warn_if_no_max_time,
    warn_if_schedule_kept,
)
from lightformer.tasks.warm_start import WarmStart
from lightformer.tokenization.text import Tokenizer
from lightformer.training.distributed import layer_stacks, set_gathered, shard_model
from lightformer.training.flops import FlopCounter
from lightformer.training.internals import attached_trainer, hand_over_loader_states, should_update_logs
from lightformer.training.tensorboard import (
    TensorBoardLogger,
    confusion_figure,
    set_logging_step,
    tensorboard_logger,
    tensorboard_writer,
)


class Task(DataContract, WarmStart, CompiledForward, BatchCosts, KeptArguments, L.LightningModule):
    """A LightningModule around ``self.model``, with the shared optimizer and set-up.

    A task says what is its own: the model it trains (``model_class``, built from its config ``net``), which fields
    of that config the data fills (``net_from_data``), its extra arguments, its loss and metrics. Its ``__init__``
    takes ``net`` and its own arguments, and hands the others (``**common``) to this one.

    The hooks below say when each part's work runs; the parts say how: ``DataContract`` (``net_config``,
    ``check_data``, ``fact``), ``WarmStart`` (``initial_weights``, ``frozen_parameters``, ``check_init``),
    ``CompiledForward`` (``forward``, ``compiled``), ``BatchCosts`` (``model_inputs``, ``throughput_counts``,
    ``batch_flops``) and ``KeptArguments`` (the arguments the task is built with, for its hyperparameters), each in
    the ``lightformer.tasks`` module of its concern.

    Args:
        net: the model's shape (its config dataclass); the fields that come from the data (``net_from_data``) are
            filled from ``data_facts``.
        optimizer: AdamW and its learning-rate schedule (``OptimizerConfig``).
        compile: run the training and evaluation forward pass through ``torch.compile``.
        activation_checkpointing: recompute each layer's activations in the backward pass instead of storing
            them: less memory for about a third more compute.
        init: start the model from another run's (or Hugging Face / timm) weights, freeze some, slow the loaded ones
            (``InitConfig``).
        data_facts: what the data tells the model (``DataFacts``): the command line gives the data module's, or a
            checkpoint's; never set in a config.
    """

    model: nn.Module
    model_class: type[nn.Module]  # built as ``model_class(config)``
    # field of the model's config (a dotted path into a tower: "encoder.image_size") → the ``DataFacts`` field
    # that fills it
    net_from_data: Mapping[str, str] = {}
    # The metrics the HParams tab shows beside each run's hyperparameters (their latest values).
    hparam_metrics: tuple[str, ...] = ("val/loss", "test/loss")
    items_name = "items"  # what ``throughput_counts`` counts, in progress lines
    variable_shapes = False  # do the batches' sizes or lengths vary from batch to batch (``forward``)

    def __init__(
        self,
        net: Any,
        optimizer: OptimizerConfig = OptimizerConfig(),
        compile: bool = False,
        activation_checkpointing: bool = False,
        init: InitConfig = InitConfig(),
        data_facts: DataFacts | None = None,
        _class_path: str | None = None,  # the task a checkpoint's hyperparameters name (``save_hyperparameters``)
    ) -> None:
        super().__init__()
        # DataContract's
        self.data_facts = DataFacts.of(data_facts)
        self._parsed: dict[str, tuple[Any, Any]] = {}  # fact name → (its value, the tokenizer or palette read from it)
        # configure_optimizers'
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        # WarmStart's
        self.init_config = as_config(InitConfig, init)
        self.pretrained: set[str] = set()  # names of the parameters loaded by init (their learning rate is scaled)
        self.unchecked_start = None  # what setup loaded from init.checkpoint, for check_pending_start
        # CompiledForward's
        self.compile = compile
        self._forward = None  # the model's __call__, compiled or not; a method, never a registered module
        self._compiled: dict[str, Callable] = {}  # the methods ``compiled`` compiled, by name
        # BatchCosts' and the hooks'
        self._flop_counter: FlopCounter | None = None
        self.flops_per_batch: int | None = (
            None  # of the current batch, read by lightformer.training.callbacks.Throughput
        )
        self.activation_checkpointing = activation_checkpointing
        self.tested_step = 0  # the step the weights under test were trained to (on_test_start)
        self._train_metrics: dict[str, Tensor] | None = None  # this training step's scalars (log_train)
        config = self.net_config(net)
        common = dict(optimizer=optimizer, compile=compile, init=init, data_facts=self.data_facts,
                      activation_checkpointing=activation_checkpointing)  # fmt: skip
        self._init_arguments = arguments_given(type(self), Task, self.pop_given_arguments(), common)
        self._init_arguments["net"] = config  # stored as built: with the sizes the data gave
        self.save_hyperparameters()
        try:
            self.model = self.model_class(config)
        except ValueError as error:  # a shape the model's layers refuse
            raise ConfigError(f"model.net: {error}") from None

    def save_hyperparameters(self) -> None:
        """Store the arguments the task was built with (``arguments_given``), every config as a plain dict:
        checkpoints then load with ``torch.load(weights_only=True)``, TensorBoard lists each field, and
        ``load_from_checkpoint`` rebuilds the task with ``cls(**hyper_parameters)``. The task's class path is stored
        too (as LightningCLI stores it), so that every checkpoint names its task; ``__init__`` takes it and ignores
        it."""
        arguments = {key: plain(value) for key, value in self._init_arguments.items()}
        arguments["_class_path"] = f"{type(self).__module__}.{type(self).__qualname__}"
        L.LightningModule.save_hyperparameters(self, arguments)

    # --- set-up shared by every device, precision and strategy --------------------------------------------

    def setup(self, stage: str) -> None:
        """Take the data module's facts (``take_data_facts``); then start from ``init.checkpoint``, all but the
        weights under ``init.skip`` (not when resuming: the run's own checkpoint holds the weights), and freeze
        ``init.freeze``; before the optimizer is made, which gives the loaded weights their learning rate. Whether
        ``init.strict`` allows the start is checked when the fit starts (``on_fit_start``), after the checks of the
        data: a tokenizer or classes other than the checkpoint's name the cause of a shape mismatch better."""
        datamodule = self.trainer.datamodule
        if datamodule is not None:
            if not isinstance(datamodule, DataModule):
                raise ConfigError(
                    f"data: {type(datamodule).__name__} does not say what its data is to the model: a lightformer task "
                    "takes a lightformer.data.DataModule, whose data_facts() returns the data's DataFacts"
                )
            self.take_data_facts(datamodule.data_facts(), stage)
        if stage == "fit" and self.init_config.sources():
            self.start_from_init()
        for parameter in self.frozen_parameters():
            parameter.requires_grad_(False)

    def configure_model(self) -> None:
        """Turn on activation checkpointing; under ``FSDP2Strategy`` shard each layer, then the model."""
        for stack in layer_stacks(self.model):
            stack.activation_checkpointing = self.activation_checkpointing
        if self.device_mesh is not None:
            shard_model(self.model, self.device_mesh["data_parallel"], str(self.trainer.precision))

    def configure_optimizers(self) -> dict:
        return configure_adamw(
            self.model,
            self.optimizer_config,
            self.trainer.estimated_stepping_batches,
            self.pretrained,
            self.init_config.pretrained_lr_scale,
        )

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        clip_gradients(self.trainer, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_fit_start(self) -> None:
        """Refuse a start ``init.strict`` does not allow; warn of a schedule fitted to no max_time; show the run's
        hyperparameters in TensorBoard's HParams tab, beside the curves."""
        self.check_pending_start()
        warn_if_no_max_time(self.trainer, self.optimizer_config)
        logger = tensorboard_logger(self)
        if isinstance(logger, TensorBoardLogger) and self.trainer.is_global_zero:
            datamodule = self.trainer.datamodule
            data = dict(datamodule.hparams) if datamodule is not None else {}
            model = {key: value for key, value in self.hparams.items() if key != "data_facts"}  # the data's own: below
            logger.log_hparams_summary({"model": model, "data": data}, self.hparam_metrics)

    def on_train_start(self) -> None:
        # A resumed run hands its loaders their saved position (mid-epoch) only if Lightning builds them after
        # restoring the checkpoint; asking for estimated_stepping_batches in configure_optimizers (a schedule fitted
        # to max_epochs) builds them before, and Lightning then keeps the position unused. Hand it over here, before
        # the first batch is drawn (a no-op when it was handed over, or when the run is not resumed).
        hand_over_loader_states(self.trainer)
        scheduler = self.lr_schedulers()
        planned = getattr(scheduler.lr_lambdas[0], "total_steps", None) if scheduler is not None else None
        warn_if_schedule_kept(self.trainer, planned, self.optimizer_config)

    # --- each batch: its cost, the training step's logs -----------------------------------------------------

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.flops_per_batch = self.batch_flops(batch, backward=True)

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.flops_per_batch = self.batch_flops(batch, backward=False)

    def log_train(self, metrics: dict[str, Tensor]) -> None:
        """This training step's scalars for the logs, ``train/loss`` among them (the progress line and bar show it).

        They are handed to ``self.log`` at the step's end, and only on the steps whose logs are written: every
        ``log_every_n_steps``, and the step where a callback stops the run (max_time's timer), as Lightning's own
        ``LearningRateMonitor`` and ``ThroughputMonitor`` decide. The logs hold the same values as if every step
        logged, without the cost: one ``self.log`` call takes about 0.4 ms of a CPU core whatever the model (two a
        step were 4% of the character LM's step on a 2-core host). ``trainer.callback_metrics``, which a checkpoint
        monitoring a ``train/`` metric reads, holds the latest logged step's."""
        self._train_metrics = {name: value.detach() for name, value in metrics.items()}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the callbacks' hooks (max_time's Timer may have just ended the run: then this step is logged) and
        # before Lightning writes the step's logs.
        metrics, self._train_metrics = self._train_metrics, None
        if metrics is not None and (should_update_logs(self.trainer) or self.trainer.fast_dev_run):
            for name, value in metrics.items():
                self.log(name, value)  # (the progress bar reads train/loss back only when logs are written)
        if self.optimizer_config.fit_to_max_time:
            fit_schedule_to_max_time(self)

    # --- evaluation: on whole (gathered) parameters under FSDP2 (``lightformer.training.distributed.set_gathered``) ---

    def on_validation_start(self) -> None:
        set_gathered(self.model, True)

    def on_validation_end(self) -> None:
        set_gathered(self.model, False)
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self.validated_at_step = self.trainer.global_step  # the weights a fit's validation last drew samples of

    def on_test_start(self) -> None:
        """Test metrics and figures go to the step the tested weights were trained to, beside the training curves
        (a test-only process would log them at step 0)."""
        path = self.trainer.ckpt_path
        trained = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"] if path else None
        self.tested_step = max((self.trainer.global_step if trained is None else trained) - 1, 0)
        set_logging_step(self.trainer, self.tested_step)
        set_gathered(self.model, True)

    def on_test_end(self) -> None:
        set_gathered(self.model, False)

    def on_predict_start(self) -> None:
        set_gathered(self.model, True)

    def on_predict_end(self) -> None:
        set_gathered(self.model, False)

    def log_confusion(self, confusion: Metric, names: list[str], noun: str) -> None:
        """The test split's ``confusion`` matrix (a torchmetrics metric, then reset) as TensorBoard's
        "test/confusion_matrix" figure, at the tested step; ``names``: the classes, ``noun``: what is counted."""
        matrix = confusion.compute().cpu()
        confusion.reset()
        writer = tensorboard_writer(self)
        if writer is not None:
            writer.add_figure("test/confusion_matrix", confusion_figure(matrix, names, noun), self.tested_step)

    # --- checkpoints ----------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The precision the run trains in: ``precision: auto`` resumes in it (``runs.resolve_auto_precision``)."""
        if (trainer := attached_trainer(self)) is not None:  # (a checkpoint written outside a run has no precision)
            checkpoint["precision"] = str(trainer.precision)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """The checkpoint's facts, checked against the task's or taken (``take_checkpoint_facts``)."""
        self.take_checkpoint_facts(checkpoint)


class TextTask(Task):
    """A task over one text tokenizer (``data_facts.tokenizer``), which travels with its model: in its
    hyperparameters, in every checkpoint and as the run folder's ``tokenizer.json``, so that a checkpoint alone
    encodes and decodes text."""

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The data's tokenizer, or the checkpoint's; None before either is known."""
        return self.fact_tokenizer("tokenizer")

    def on_fit_start(self) -> None:
        super().on_fit_start()
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every process must ask, or rank 0 waits forever
        if self.tokenizer is not None and self.trainer.is_global_zero and log_dir:
            self.tokenizer.save(Path(log_dir) / "tokenizer.json")
