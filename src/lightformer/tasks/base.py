"""What every task shares: the optimizer and its schedule, gradient clipping, sharding, compilation, plain hparams.

A task (``LanguageModelTask``, ``TranslationTask``, ...) is a ``Task`` that builds its model from a model config
(``GPTConfig``, ...) and adds its loss, metrics and logging. Everything here is one code path for every device,
precision and strategy, so the CPU tests run what a GPU run does:

- AdamW is fused everywhere (``tasks.optim``). Lightning's mixed-precision plugins refuse to clip gradients for
  a fused optimizer (it would unscale fp16 gradients inside its step, after the clipping); ``clip_gradients``
  unscales first and then clips, under 32-true, bf16-mixed and 16-mixed alike.
- Under ``configs/trainer/fsdp.yaml`` (``lightformer.distributed.FSDP2Strategy``) each encoder/decoder layer and
  then the whole model are sharded with FSDP2's ``fully_shard``; their gradients are DTensors, whose global norm
  ``torch.nn.utils.clip_grad_norm_`` computes across the shards, so clipping is the same code there too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.optim import Optimizer

from lightformer.checkpoints import (
    InitConfig,
    check_same_tokenizer,
    check_start,
    describe_loading,
    load_matching,
    match_weights,
    module_names,
    pretrained_weights,
    under,
)
from lightformer.config_groups import as_config
from lightformer.data.preparation.tokenizers import Tokenizer
from lightformer.distributed import set_gathered, shard_model
from lightformer.errors import ConfigError
from lightformer.flops import FlopCounter
from lightformer.nn import Decoder, Encoder
from lightformer.progress import max_time_timer
from lightformer.tasks.optim import OptimizerConfig, configure_adamw, steps_within
from lightformer.tensorboard import TensorBoardLogger, set_logging_step, tensorboard_logger

FIT_TO_TIME_EVERY = 50  # optimizer steps between two plans of a schedule fitted to max_time


# --- a config's values before anything is built (the command line's checks before any data is prepared) -------


def class_of(class_path: str) -> type | None:
    """The class a config's ``class_path`` names, or None where it names none (instantiation says why)."""
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


def data_config_values(data: Mapping | None, expected: str) -> dict[str, Any] | None:
    """The init arguments of the data module a config names (``class_path``, ``init_args``), its signature's
    defaults filled in, when it is ``expected`` (a class path) or a subclass of it; None otherwise (another data
    module, whose own checks apply at set-up)."""
    if not data or not data.get("class_path"):
        return None
    data_class, expected_class = class_of(str(data["class_path"])), class_of(expected)
    if data_class is None or expected_class is None or not issubclass(data_class, expected_class):
        return None  # another data module, or a class path that instantiation refuses with its own message
    parameters = inspect.signature(data_class.__init__).parameters.values()
    values = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return {**values, **dict(data.get("init_args") or {})}


def net_config_values(net: Mapping | None, config_class: type) -> dict[str, Any]:
    """``model.net`` as given in a config, the defaults of ``config_class`` (a dataclass) filled in."""
    defaults = {field.name: field.default for field in dataclasses.fields(config_class)}
    given = dataclasses.asdict(net) if dataclasses.is_dataclass(net) else dict(net or {})
    return {**defaults, **given}


class Task(L.LightningModule):
    """A LightningModule around ``self.model`` (built by the subclass) with the shared optimizer and set-up.

    Args of every task:
        optimizer: AdamW and its learning-rate schedule (``OptimizerConfig``).
        compile: run the training and evaluation forward pass through ``torch.compile``.
        activation_checkpointing: recompute each layer's activations in the backward pass instead of storing
            them: less memory for about a third more compute.
        init: start the model from another run's weights, freeze some, slow the loaded ones (``InitConfig``).
    """

    model: nn.Module
    # The metrics the HParams tab shows beside each run's hyperparameters (their latest values).
    hparam_metrics: tuple[str, ...] = ("val/loss", "test/loss")
    items_name = "items"  # what ``throughput_counts`` counts, in progress lines
    variable_shapes = False  # do the batches' sizes or lengths vary from batch to batch (``forward``)

    def __init__(
        self, optimizer: OptimizerConfig | dict, compile: bool, activation_checkpointing: bool, init: InitConfig | dict
    ) -> None:
        super().__init__()
        self.optimizer_config = as_config(OptimizerConfig, optimizer)
        self.init_config = as_config(InitConfig, init)
        self.pretrained: set[str] = set()  # names of the parameters loaded by init (their learning rate is scaled)
        self.unchecked_start = None  # what setup loaded from init.checkpoint, for on_fit_start's check_start
        self.compile = compile
        self.activation_checkpointing = activation_checkpointing
        self._forward = None  # the model's __call__, compiled or not; a method, never a registered module
        self._compiled: dict[str, Callable] = {}  # the methods ``compiled`` compiled, by name
        self._flop_counter: FlopCounter | None = None
        self.flops_per_batch: int | None = None  # of the current batch, read by lightformer.callbacks.Throughput
        self.tested_step = 0  # the step the weights under test were trained to (on_test_start)
        self._train_metrics: dict[str, Tensor] | None = None  # this training step's scalars (log_train)

    def __new__(cls, *args: Any, **kwargs: Any) -> Task:
        """Record the arguments the task is built with (its ``__init__``'s, defaults filled in), for
        ``save_hyperparameters``."""
        task = super().__new__(cls)
        try:
            bound = inspect.signature(cls.__init__).bind(task, *args, **kwargs)
        except TypeError:  # arguments __init__ does not take: it raises its own error
            arguments = {}
        else:
            bound.apply_defaults()
            parameters = inspect.signature(cls.__init__).parameters
            arguments = {}
            for name, value in list(bound.arguments.items())[1:]:
                kind = parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(value)
                elif kind is not inspect.Parameter.VAR_POSITIONAL:
                    arguments[name] = value
        object.__setattr__(task, "_init_arguments", arguments)
        return task

    def save_hyperparameters(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's, with every config stored as a plain dict: checkpoints then load with
        ``torch.load(weights_only=True)`` and TensorBoard lists each field. A config is stored as the task was built
        with it (the arguments ``__new__`` recorded): the command line hands Lightning its raw arguments, where a data
        link can add a field that this task's config lacks (a data module's ``block_size`` beside a BERT config). The
        task's class path is stored as the command line stores it, so a checkpoint written through the Python API
        names its task.

        Lightning's is called as ``L.LightningModule.save_hyperparameters``, not through ``super()``: outside the
        command line, Lightning collects the arguments from the ``__init__`` that called this method, stepping over
        this frame only if it holds no ``__class__`` (which ``super()`` would put there). ``tests/test_checkpoints.py``
        pins it."""
        L.LightningModule.save_hyperparameters(self, *args, **kwargs)
        self.hparams.setdefault("_class_path", f"{type(self).__module__}.{type(self).__qualname__}")
        built = getattr(self, "_init_arguments", {})
        for key, value in self.hparams.items():
            value = built.get(key, value)
            if is_dataclass(value):
                self.hparams[key] = asdict(value)

    def forward(self, *inputs: Tensor) -> Tensor:
        """The model's forward pass, compiled on first use when ``compile`` (see the model for the shapes).

        A task whose batches vary in shape (``variable_shapes``: token-budget batches, padding to the longest in the
        batch) compiles with dynamic shapes from the start: one graph serves every batch size and length. Left to
        itself, ``torch.compile`` compiles the first shape static and the second dynamic, and a model with a graph
        break (the masked-LM head's gather of the masked positions) twice more; each compile costs a minute of a CPU
        or of a GPU's host (``tests/test_compile.py`` counts them). A task of fixed shapes compiles them static.

        The compiled function is kept as a bound method, not a module: a second registered module would store
        every weight twice in checkpoints, under keys an eager model cannot load. Generation and beam search
        (growing lengths, a cache) call ``self.model`` eagerly.
        """
        if self._forward is None:
            self._forward = (torch.compile(self.model, dynamic=self._dynamic) if self.compile else self.model).__call__
        return self._forward(*inputs)

    @property
    def _dynamic(self) -> bool | None:
        return True if self.variable_shapes else None  # None: static, then dynamic if a second shape comes

    def compiled(self, method: Callable) -> Callable:
        """``method`` (of this task: the model's forward pass and the loss after it) compiled when ``compile``, as
        ``forward`` compiles the model; else ``method`` itself. Compiling the loss with the model lets inductor fuse
        the logits' cast to fp32 and the cross-entropy over the vocabulary, which the model's graph alone leaves to
        eager code: on the CPU translation config the model alone compiled ran at 0.9× eager, model and loss at 1.2×
        (docs/scaling.md). ``method`` calls ``self.model``, not ``self``: one compiled graph, not one inside another."""
        if not self.compile:
            return method
        if method.__name__ not in self._compiled:
            self._compiled[method.__name__] = torch.compile(method, dynamic=self._dynamic)
        return self._compiled[method.__name__]

    # --- throughput: what a batch holds and costs ----------------------------------------------------------

    def model_inputs(self, batch: Any) -> tuple[Tensor, ...]:
        """The tensors of ``batch`` that ``forward`` takes, batch dimension first."""
        raise NotImplementedError

    def throughput_counts(self, batch: Any) -> tuple[int, int]:
        """(samples, items) in ``batch``: items are what the task's throughput counts (tokens or images)."""
        raise NotImplementedError

    def batch_flops(self, batch: Any, backward: bool) -> int:
        """Floating-point operations of the model on ``batch``: the forward pass, and the backward pass if
        ``backward``. Counted by PyTorch's ``FlopCounterMode`` on a copy of the model on the meta device (no
        compute) at a few shapes, then by a polynomial in the sequence lengths (``lightformer.flops``): a batch of a
        new shape costs no count."""
        if self._flop_counter is None:
            model_class = next(c for c in type(self.model).__mro__ if "FSDP" not in c.__name__)  # FSDP2 subclasses
            self._flop_counter = FlopCounter(lambda: model_class(self.model.config))
        inputs = self.model_inputs(batch)
        return self._flop_counter.per_example(inputs, backward) * len(inputs[0])

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.flops_per_batch = self.batch_flops(batch, backward=True)

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.flops_per_batch = self.batch_flops(batch, backward=False)

    # --- set-up shared by every device, precision and strategy --------------------------------------------

    def configure_model(self) -> None:
        """Turn on activation checkpointing; under ``FSDP2Strategy`` shard each layer, then the model."""
        for module in self.model.modules():
            if isinstance(module, Encoder | Decoder):
                module.activation_checkpointing = self.activation_checkpointing
        if self.device_mesh is not None:
            shard_model(self.model, self.device_mesh["data_parallel"], str(self.trainer.precision))

    # Under FSDP2 evaluation runs on whole (gathered) parameters: see ``lightformer.distributed.set_gathered``.
    def on_validation_start(self) -> None:
        set_gathered(self.model, True)

    def on_validation_end(self) -> None:
        set_gathered(self.model, False)
        if self.trainer.state.fn == "fit" and not self.trainer.sanity_checking:
            self.validated_at_step = self.trainer.global_step  # the weights a fit's validation last drew samples of

    def on_test_end(self) -> None:
        set_gathered(self.model, False)

    def on_predict_start(self) -> None:
        set_gathered(self.model, True)

    def on_predict_end(self) -> None:
        set_gathered(self.model, False)

    def setup(self, stage: str) -> None:
        """Start from ``init.checkpoint``, all but the weights under ``init.skip`` (not when resuming: the run's own
        checkpoint holds the weights), and freeze ``init.freeze``; before the optimizer is made, which gives the
        loaded weights their learning rate. Whether ``init.strict`` allows the start is checked when the fit starts
        (``on_fit_start``), after the task's own checks of the data in its ``setup``: a tokenizer or classes other
        than the checkpoint's name the cause of a shape mismatch better."""
        if stage == "fit" and self.init_config.checkpoint:
            weights = self.initial_weights(check=False)
            if self.trainer.ckpt_path is not None:
                self.pretrained = set(match_weights(self.model.state_dict(), weights)["loaded"])
            else:
                shapes = {name: value.shape for name, value in self.model.state_dict().items()}
                report = load_matching(self.model, weights)
                self.pretrained = set(report["loaded"])
                rank_zero_info(describe_loading(report, self.init_config.checkpoint))
                reshaped = {name: weights[name].shape for name in report["reshaped"]}
                self.unchecked_start = (report, shapes, reshaped)
        for parameter in self.frozen_parameters():
            parameter.requires_grad_(False)

    def check_init(self, starting: bool, unknown_shapes: frozenset[str] = frozenset()) -> None:
        """Refuse a ``model.init`` that cannot do what it says, as soon as the model is built (the command line calls
        this on a model built on the meta device, before any data is prepared: ``cli.check_init_before_data``).
        Every ``freeze`` pattern must name parameters of the model; when ``starting`` (a fit that does not resume),
        the checkpoint must exist, every ``skip`` pattern must name weights of it, and the start must be one
        ``init.strict`` allows. ``unknown_shapes``: tensors of the model whose shapes are not known yet (sized by the
        data), compared by name only."""
        self.frozen_parameters()
        if starting and self.init_config.checkpoint:
            self.initial_weights(check=True, unknown_shapes=unknown_shapes)

    def frozen_parameters(self) -> list[nn.Parameter]:
        """The parameters under ``init.freeze``; a pattern that names none is refused (a typo would train them)."""
        frozen = []
        for prefix in self.init_config.freeze:
            matched = [p for name, p in self.model.named_parameters() if under(name, prefix)]
            if not matched:
                modules = module_names([name for name, _ in self.model.named_parameters()], most=12)
                raise ConfigError(
                    f"model.init.freeze: no parameter of the model is under {prefix!r} (its modules: {modules})"
                )
            frozen += matched
        return frozen

    def initial_weights(self, check: bool, unknown_shapes: frozenset[str] = frozenset()) -> dict[str, Tensor]:
        """The weights of ``init.checkpoint`` this model starts from: all but those under ``init.skip``, a pattern
        that names none refused. With ``check``, a start that ``init.strict`` refuses raises too (the tensors named
        in ``unknown_shapes`` are taken to have the checkpoint's shapes)."""
        init = self.init_config
        weights = pretrained_weights(init.checkpoint)
        for prefix in init.skip:
            if not any(under(name, prefix) for name in weights):
                modules = module_names(list(weights), most=12)
                raise ConfigError(
                    f"model.init.skip: no weight of {init.checkpoint} is under {prefix!r} (its modules: {modules})"
                )
        weights = {name: value for name, value in weights.items() if not any(under(name, p) for p in init.skip)}
        if check:
            state = self.model.state_dict()
            state.update({name: weights[name] for name in unknown_shapes if name in weights})
            shapes = [{name: value.shape for name, value in tensors.items()} for tensors in (state, weights)]
            check_start(match_weights(state, weights), *shapes, init)
        return weights

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

    # --- what TensorBoard shows beside the curves -----------------------------------------------------------

    def on_fit_start(self) -> None:
        unchecked, self.unchecked_start = self.unchecked_start, None
        if unchecked is not None:
            check_start(*unchecked, self.init_config)
        if self.optimizer_config.fit_to_max_time and max_time_timer(self.trainer) is None:
            rank_zero_warn(
                "model.optimizer.fit_to_max_time=true fits the learning-rate decay to trainer.max_time, which is not "
                f"set: the decay ends at step {self.trainer.estimated_stepping_batches} (max_steps/max_epochs)"
            )
        logger = tensorboard_logger(self)
        if isinstance(logger, TensorBoardLogger) and self.trainer.is_global_zero:
            datamodule = self.trainer.datamodule
            data = dict(datamodule.hparams) if datamodule is not None else {}
            logger.log_hparams_summary({"model": dict(self.hparams), "data": data}, self.hparam_metrics)

    def on_test_start(self) -> None:
        """Test metrics and figures go to the step the tested weights were trained to, beside the training curves
        (a test-only process would log them at step 0)."""
        path = self.trainer.ckpt_path
        trained = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"] if path else None
        self.tested_step = max((self.trainer.global_step if trained is None else trained) - 1, 0)
        set_logging_step(self.trainer, self.tested_step)
        set_gathered(self.model, True)

    def on_train_start(self) -> None:
        # A resumed run hands its loaders their saved position (mid-epoch) only if Lightning builds them after
        # restoring the checkpoint; asking for estimated_stepping_batches in configure_optimizers (a schedule fitted
        # to max_epochs) builds them before, and Lightning then keeps the position unused. Hand it over here, before
        # the first batch is drawn (a no-op when it was handed over, or when the run is not resumed).
        self.trainer.fit_loop._load_combined_loader_states()
        scheduler = self.lr_schedulers()
        planned = getattr(scheduler.lr_lambdas[0], "total_steps", None) if scheduler is not None else None
        total = self.trainer.estimated_stepping_batches
        fitted = self.optimizer_config.fit_to_max_time  # re-planned as it goes: a resumed plan differs by design
        if planned is not None and planned != total and self.optimizer_config.schedule == "cosine" and not fitted:
            warmup = self.optimizer_config.warmup_steps
            if total <= planned:
                effect = f"it stops at step {total}, before the decay ends"
            elif planned >= warmup:
                effect = f"steps {planned}..{total} run at min_lr={self.optimizer_config.min_lr}"
            elif total <= warmup:
                effect = f"steps {planned}..{total} still warm up (to step {warmup}), with no decay after them"
            else:
                effect = (f"steps {planned}..{warmup} still warm up, then steps {warmup}..{total} run at "
                          f"min_lr={self.optimizer_config.min_lr} (no decay)")  # fmt: skip
            rank_zero_warn(
                f"the learning-rate schedule was planned for {planned} steps by the run this checkpoint comes from, "
                f"and it is kept (resuming is exact); this run goes to {total} steps, so {effect}. To plan a new "
                "schedule, start a new run from the checkpoint's weights instead of resuming."
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The precision the run trains in: ``precision: auto`` resumes in it (``cli.resolve_auto_precision``)."""
        if self._trainer is not None:  # (a checkpoint written outside a run has no precision)
            checkpoint["precision"] = str(self._trainer.precision)

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
        if metrics is not None and (self.trainer._logger_connector.should_update_logs or self.trainer.fast_dev_run):
            for name, value in metrics.items():
                self.log(name, value, prog_bar=name == "train/loss")
        if self.optimizer_config.fit_to_max_time:
            self._fit_schedule_to_max_time()

    def _fit_schedule_to_max_time(self) -> None:
        """Plan the cosine decay to end when max_time stops the run (``OptimizerConfig.fit_to_max_time``)."""
        step = self.trainer.global_step
        if step % FIT_TO_TIME_EVERY:  # the usual case, on every training batch: nothing else looked up
            return
        schedule, timer = self.lr_schedulers().lr_lambdas[0], max_time_timer(self.trainer)
        if timer is None or step <= schedule.warmup_steps:
            return
        reached = steps_within(step, timer.time_elapsed(), timer.time_remaining())
        planned = min(reached, self.trainer.estimated_stepping_batches)
        schedule.total_steps = self.trainer.strategy.broadcast(planned)  # rank 0's: the same rate on every rank


class TextTask(Task):
    """A task over one text tokenizer, which travels with its model: taken from the data module at setup (checked
    against the model and against a checkpoint's), written to the run's folder as ``tokenizer.json`` and into
    every checkpoint, so that a checkpoint alone encodes and decodes text."""

    tokenizer: Tokenizer | None = None  # the data module's, or the checkpoint's

    def take_tokenizer(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        """Use the data module's ``tokenizer`` with a model of ``vocab_size`` ids."""
        if tokenizer.vocab_size > vocab_size:
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but model.net.vocab_size={vocab_size}; the model's "
                "vocabulary must hold every token id"
            )
        if self.tokenizer is not None:  # loaded from a checkpoint, or set by an earlier run
            check_same_tokenizer(saved=self.tokenizer, data=tokenizer)
        self.tokenizer = tokenizer

    def on_fit_start(self) -> None:
        super().on_fit_start()
        log_dir = self.trainer.log_dir  # a broadcast under DDP: every process must ask, or rank 0 waits forever
        if self.tokenizer is not None and self.trainer.is_global_zero and log_dir:
            self.tokenizer.save(Path(log_dir) / "tokenizer.json")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = self.tokenizer.to_str()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "tokenizer" in checkpoint:
            saved = Tokenizer.from_str(checkpoint["tokenizer"], source="the checkpoint's tokenizer")
            if self.tokenizer is not None:  # `fit/validate/test --ckpt_path` run `setup` (data) before this
                check_same_tokenizer(saved=saved, data=self.tokenizer)
            self.tokenizer = saved


def clip_gradients(trainer: L.Trainer, optimizer: Optimizer, value: float | None, algorithm: str | None) -> None:
    """Clip the gradients of ``optimizer``'s parameters to norm (or per value) ``value``, in true units.

    Under 16-mixed the gradients are still multiplied by the loss scale when a fused optimizer is used (Lightning
    leaves unscaling to its step), so they are unscaled here first; the step then knows they are (PyTorch's
    ``GradScaler`` tracks it) and still skips steps with infinite gradients.
    """
    if not value:
        return
    if isinstance(trainer.strategy, FSDPStrategy):
        raise ValueError(
            "gradient clipping is not supported with Lightning's FSDPStrategy (FSDP1) in lightformer: use "
            "configs/trainer/fsdp.yaml (FSDP2 through ModelParallelStrategy), where it works like everywhere else"
        )
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
        scaler.unscale_(optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, value)
