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
import operator
import typing
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
from torchmetrics import Metric

from lightformer.checkpoints import (
    InitConfig,
    check_start,
    describe_loading,
    load_matching,
    match_weights,
    module_names,
    pretrained_weights,
    under,
)
from lightformer.config_groups import as_config
from lightformer.data.modules.base import DataModule
from lightformer.data.preparation.tokenizers import Tokenizer
from lightformer.distributed import layer_stacks, set_gathered, shard_model
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts, check_start_tokenizer, facts_of_checkpoint
from lightformer.flops import FlopCounter
from lightformer.internals import attached_trainer, hand_over_loader_states, should_update_logs, step_unscales_gradients
from lightformer.models.vit import resample_positions
from lightformer.progress import max_time_timer
from lightformer.tasks.optim import OptimizerConfig, configure_adamw, steps_within
from lightformer.tensorboard import (
    TensorBoardLogger,
    confusion_figure,
    set_logging_step,
    tensorboard_logger,
    tensorboard_writer,
)

FIT_TO_TIME_EVERY = 50  # optimizer steps between two plans of a schedule fitted to max_time
DYNAMIC_COMPILE_OPTIONS = {"triton.coalesce_tiling_analysis": False}  # inductor options, dynamic graphs (_compile)
# The fields of a model's config that may be larger than the data's (``Task.check_data``).
CAPACITIES = frozenset({"vocab_size", "src_vocab_size", "tgt_vocab_size", "block_size"})


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


def config_defaults(config_class: type) -> dict[str, Any]:
    """The defaults of a config dataclass's fields (``dataclasses.MISSING`` where it has none), a nested config's
    (a tower's) as the dict of its own."""
    defaults = {}
    for field in dataclasses.fields(config_class):
        has_factory = field.default_factory is not dataclasses.MISSING
        value = field.default_factory() if has_factory else field.default
        defaults[field.name] = asdict(value) if is_dataclass(value) else value
    return defaults


class Task(L.LightningModule):
    """A LightningModule around ``self.model``, with the shared optimizer and set-up.

    A task says what is its own: the model it trains (``model_class``, built from its config ``net``), which fields
    of that config the data fills (``net_from_data``), its extra arguments, its loss and metrics. Its ``__init__``
    takes ``net`` and its own arguments, and hands the others (``**common``) to this one.

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
        self.data_facts = DataFacts.of(data_facts)
        self._parsed: dict[str, tuple[Any, Any]] = {}  # fact name → (its value, the tokenizer or palette read from it)
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
        config = self.net_config(net)
        common = dict(optimizer=optimizer, compile=compile, init=init, data_facts=self.data_facts)
        self._init_arguments = self._arguments_given(common | {"activation_checkpointing": activation_checkpointing})
        self._init_arguments["net"] = config  # stored as built: with the sizes the data gave
        self.save_hyperparameters()
        try:
            self.model = self.model_class(config)
        except ValueError as error:  # a shape the model's layers refuse
            raise ConfigError(f"model.net: {error}") from None

    def net_config(self, net: Any) -> Any:
        """The model's config: ``net`` (a config dataclass or its dict), its fields in ``net_from_data`` filled from
        ``data_facts``. Such a field set to another value than the data's (in a config, or by an old checkpoint) is
        refused: the data decides it."""
        config_class = typing.get_type_hints(type(self).__init__)["net"]
        given = asdict(net) if is_dataclass(net) else dict(net or {})
        defaults = config_defaults(config_class)
        for path, value in self.sizes_from_data(self.data_facts).items():  # a dotted path into a nested config
            *towers, name = path.split(".")
            owner, default = given, defaults
            for tower in towers:  # copied on the way down: the caller's dicts stay as they are
                inner = owner.get(tower) or {}
                owner[tower] = asdict(inner) if is_dataclass(inner) else dict(inner)
                owner, default = owner[tower], default[tower]
            if owner.get(name, default[name]) not in (default[name], value):
                raise ConfigError(
                    f"model.net.{path}={owner[name]} is set, but it comes from the data, which gives {name}={value}: "
                    f"remove model.net.{path} from the config files and the command line (for a checkpoint's model, "
                    "use the data it was trained with)"
                )
            owner[name] = value
        try:
            return config_class(**given)
        except ValueError as error:
            raise ConfigError(f"model.net: {error}") from None

    @classmethod
    def sizes_from_data(cls, facts: DataFacts | None) -> dict[str, Any]:
        """The fields of the model's config that ``facts`` fill (``net_from_data``), those the data has."""
        if facts is None:
            return {}
        sizes = {name: getattr(facts, fact) for name, fact in cls.net_from_data.items()}
        return {name: value for name, value in sizes.items() if value is not None}

    def _arguments_given(self, common: dict[str, Any]) -> dict[str, Any]:
        """The arguments this task was built with: those of its class's ``__init__`` (read from that call's frame,
        the outermost ``__init__`` of this object on the stack) with the ones it hands to ``Task.__init__``
        (``common``: given or default). A task's ``__init__`` must not reassign its arguments before calling
        ``super().__init__``."""
        frame, outermost = inspect.currentframe(), None
        while frame is not None:
            if frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is self:
                outermost = frame
            frame = frame.f_back
        arguments = {}
        if outermost is not None and type(self).__init__ is not Task.__init__:
            for name, parameter in inspect.signature(type(self).__init__).parameters.items():
                if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(outermost.f_locals.get(name, {}))
                elif name != "self" and parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                    arguments[name] = outermost.f_locals[name]
        arguments.update(common)
        arguments.pop("_class_path", None)
        return arguments

    def save_hyperparameters(self) -> None:
        """Store the arguments the task was built with (``_arguments_given``), every config as a plain dict:
        checkpoints then load with ``torch.load(weights_only=True)``, TensorBoard lists each field, and
        ``load_from_checkpoint`` rebuilds the task with ``cls(**hyper_parameters)``. The task's class path is stored
        too (as LightningCLI stores it), so that every checkpoint names its task; ``__init__`` takes it and ignores
        it."""
        arguments = {key: _plain(value) for key, value in self._init_arguments.items()}
        arguments["_class_path"] = f"{type(self).__module__}.{type(self).__qualname__}"
        L.LightningModule.save_hyperparameters(self, arguments)

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
            self._forward = (self._compile(self.model) if self.compile else self.model).__call__
        return self._forward(*inputs)

    def _compile(self, function: Callable) -> Callable:
        """``torch.compile(function)``: dynamic from the start for a task of ``variable_shapes``, else static (then
        dynamic if a second shape comes). A dynamic graph compiles without inductor's memory-coalescing tiling
        analysis, which inductor does not apply to dynamic shapes by design but reaches anyway through a fused
        reduction on CUDA, and there fails an assertion (``get_pw_red_splits``, pytorch/pytorch#197077): the
        label-smoothed loss of ``configs/translation/ding_de_en_gpu.yaml`` stopped its first step on an H100 with
        torch 2.11 (docs/scaling.md, the GPU check)."""
        if self.variable_shapes:
            return torch.compile(function, dynamic=True, options=DYNAMIC_COMPILE_OPTIONS)
        return torch.compile(function)

    def compiled(self, method: Callable) -> Callable:
        """``method`` (of this task: the model's forward pass and the loss after it) compiled when ``compile``, as
        ``forward`` compiles the model; else ``method`` itself. Compiling the loss with the model lets inductor fuse
        the logits' cast to fp32 and the cross-entropy over the vocabulary, which the model's graph alone leaves to
        eager code: on the CPU translation config the model alone compiled ran at 0.9× eager, model and loss at 1.2×
        (docs/scaling.md). ``method`` calls ``self.model``, not ``self``: one compiled graph, not one inside another."""
        if not self.compile:
            return method
        if method.__name__ not in self._compiled:
            self._compiled[method.__name__] = self._compile(method)
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
        for stack in layer_stacks(self.model):
            stack.activation_checkpointing = self.activation_checkpointing
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
            weights = self.initial_weights(check=False)
            if self.trainer.ckpt_path is not None:
                self.pretrained = set(match_weights(self.model.state_dict(), weights)["loaded"])
            else:
                shapes = {name: value.shape for name, value in self.model.state_dict().items()}
                report = load_matching(self.model, weights)
                self.pretrained = set(report["loaded"])
                rank_zero_info(describe_loading(report, self.init_config.describe()))
                reshaped = {name: weights[name].shape for name in report["reshaped"]}
                self.unchecked_start = (report, shapes, reshaped)
        for parameter in self.frozen_parameters():
            parameter.requires_grad_(False)

    def take_data_facts(self, facts: DataFacts, stage: str) -> None:
        """The one check between the data and the model: ``facts`` (the data module's) must be the task's own, the
        ones its model was built with (a checkpoint's, or given by the command line), each difference named; and the
        model must hold what the data gives (``check_data``). A task built without facts takes these."""
        if self.data_facts is not None:
            self.data_facts.check_same(facts)
        self.check_data(facts, stage)
        if self.data_facts is None:
            self.hold(facts)

    def check_data(self, facts: DataFacts, stage: str) -> None:
        """Refuse data the model cannot hold: its sizes (``net_from_data``) must be the model's, except that the
        model's vocabularies and context may be larger than the data's; and a new fit's ``model.init`` checkpoints
        must have been trained with the data's tokenizer, where they carry one. A task adds its own checks (the data's
        ``max_length`` against the model's position table, a token its loss needs)."""
        starting = stage == "fit" and self.init_config.sources() and self.trainer.ckpt_path is None
        if starting and facts.tokenizer is not None:
            for _, file, option in self.init_config.sources():
                check_start_tokenizer(file, option, facts.tokenizer)
        config = self.model.config
        for name, value in self.sizes_from_data(facts).items():
            built = operator.attrgetter(name)(config)
            capacity = name.rpartition(".")[2] in CAPACITIES
            if value != built and not (capacity and value < built):
                need = "at least" if capacity else "equal to"
                raise ConfigError(
                    f"the data gives {name}={value} but the model has model.net.{name}={built}, which must be {need} "
                    "it; use the data settings the model was built for"
                )

    def fact(self, name: str, read: Callable[[Any], Any]) -> Any:
        """The fact ``name`` of ``data_facts`` read by ``read`` (a tokenizer from its JSON, a palette from its dict)
        once per value; None where the task has no such fact (yet)."""
        value = getattr(self.data_facts, name, None)
        if value is None:
            return None
        cached = self._parsed.get(name)
        if cached is None or cached[0] is not value:
            cached = self._parsed[name] = (value, read(value))
        return cached[1]

    def fact_tokenizer(self, name: str) -> Tokenizer | None:
        """The tokenizer of the fact ``name`` (``tokenizer``, ``src_tokenizer``, ``tgt_tokenizer``), read once."""
        return self.fact(name, lambda text: Tokenizer.from_str(text, source=f"the model's {name}"))

    @property
    def class_names(self) -> list[str] | None:
        """The classes, in the order of a classifier's outputs (the data's facts, or the checkpoint's); None: none."""
        return self.fact("class_names", list)

    def hold(self, facts: DataFacts) -> None:
        """Keep ``facts`` as the task's own, in its hyperparameters too (so in its checkpoints)."""
        self.data_facts = facts
        self.hparams["data_facts"] = facts.as_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """The checkpoint's facts (``facts_of_checkpoint``: also of one written before its hyperparameters held
        them, up to commit 51eef69), checked against the task's when it has some already (``fit``/``validate``/
        ``test --ckpt_path`` set the data's up first), else taken."""
        saved = facts_of_checkpoint(checkpoint)
        if saved is None:
            return
        if self.data_facts is not None:
            saved.check_same(self.data_facts)
        else:
            self.hold(saved)

    def check_init(self, starting: bool, unknown_shapes: frozenset[str] = frozenset()) -> None:
        """Refuse a ``model.init`` that cannot do what it says, as soon as the model is built (the command line
        calls this on a model built on the meta device, before any data is prepared:
        ``config_checks.check_init_before_data``).
        Every ``freeze`` pattern must name parameters of the model; when ``starting`` (a fit that does not resume),
        the checkpoint must exist, every ``skip`` pattern must name weights of it, and the start must be one
        ``init.strict`` allows. ``unknown_shapes``: tensors of the model whose shapes are not known yet (sized by the
        data), compared by name only."""
        self.frozen_parameters()
        if starting and self.init_config.sources():
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
        """The weights this model starts from: ``init.checkpoint``'s, and each of ``init.modules``' under its
        module's path (in the place of the checkpoint's there); a ViT's position table of another grid resampled to
        the model's (``resample_positions``); all but those under ``init.skip``, a pattern that names none refused.
        With ``check``, a start that ``init.strict`` refuses raises too (the tensors named in ``unknown_shapes`` are
        taken to have the checkpoint's shapes)."""
        init, names = self.init_config, list(self.model.state_dict())
        weights: dict[str, Tensor] = {}
        for path, file, option in init.sources():
            loaded = pretrained_weights(file, option)
            if path:
                if not any(under(name, path) for name in names):
                    modules = module_names(names, most=12)
                    raise ConfigError(f"{option}: the model has no module {path!r} (its modules: {modules})")
                weights = {name: value for name, value in weights.items() if not under(name, path)}
                loaded = {f"{path}.{name}": value for name, value in loaded.items()}
            weights.update(loaded)
        weights = resample_positions(self.model, weights)
        for prefix in init.skip:
            if not any(under(name, prefix) for name in weights):
                modules = module_names(list(weights), most=12)
                raise ConfigError(
                    f"model.init.skip: no weight of {init.describe()} is under {prefix!r} (its modules: {modules})"
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
            model = {key: value for key, value in self.hparams.items() if key != "data_facts"}  # the data's own: below
            logger.log_hparams_summary({"model": model, "data": data}, self.hparam_metrics)

    def log_confusion(self, confusion: Metric, names: list[str], noun: str) -> None:
        """The test split's ``confusion`` matrix (a torchmetrics metric, then reset) as TensorBoard's
        "test/confusion_matrix" figure, at the tested step; ``names``: the classes, ``noun``: what is counted."""
        matrix = confusion.compute().cpu()
        confusion.reset()
        writer = tensorboard_writer(self)
        if writer is not None:
            writer.add_figure("test/confusion_matrix", confusion_figure(matrix, names, noun), self.tested_step)

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
        hand_over_loader_states(self.trainer)
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
        """The precision the run trains in: ``precision: auto`` resumes in it (``runs.resolve_auto_precision``)."""
        if (trainer := attached_trainer(self)) is not None:  # (a checkpoint written outside a run has no precision)
            checkpoint["precision"] = str(trainer.precision)

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


def _plain(value: Any) -> Any:
    """A config as a plain dict (``DataFacts`` with lists, not tuples: they go to YAML too)."""
    if isinstance(value, DataFacts):
        return value.as_dict()
    return asdict(value) if is_dataclass(value) else value


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
    if scaler is not None and step_unscales_gradients(optimizer):
        scaler.unscale_(optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, value)
