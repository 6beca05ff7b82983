"""A task's warm start (``model.init``): the weights its model starts from (another run's checkpoint, Hugging Face's
or timm's, whole or by module), those skipped and those frozen, and the checks that the start is one ``init.strict``
allows: at once on the command line (``check_init``), when loading at set-up (``start_from_init``) and when the fit
starts (``check_pending_start``).

``WarmStart`` is a part of ``lightformer.tasks.Task`` (which sets ``init_config``, ``pretrained`` and
``unchecked_start`` up and calls these from its hooks), not a class of its own use.
"""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lightformer.errors import ConfigError
from lightformer.io.checkpoints import (
    InitConfig,
    check_start,
    describe_loading,
    load_matching,
    match_weights,
    module_names,
    pretrained_weights,
    under,
)
from lightformer.models.gpt import extend_positions
from lightformer.models.vit import resample_positions


class WarmStart:
    """The methods of a ``Task`` that start its model from ``model.init`` (see the module's docstring)."""

    init_config: InitConfig
    pretrained: set[str]  # names of the parameters loaded by init (their learning rate is scaled)
    unchecked_start: tuple | None  # what start_from_init loaded, for check_pending_start

    def check_init(self, starting: bool, unknown_shapes: frozenset[str] = frozenset()) -> None:
        """Refuse a ``model.init`` that cannot do what it says, as soon as the model is built (the command line
        calls this on a model built on the meta device, before any data is prepared:
        ``cli.checks.check_init_before_data``).
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
        the model's (``resample_positions``), a GPT's shorter position table extended with the model's fresh rows
        (``extend_positions``); all but those under ``init.skip``, a pattern that names none refused.
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
        weights = extend_positions(self.model, resample_positions(self.model, weights))
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

    def start_from_init(self) -> None:
        """Load the weights of ``init`` (``initial_weights``) into a new fit's model, and note which were loaded
        (their learning rate is ``init.pretrained_lr_scale`` times the others'); when resuming, only note them: the
        run's own checkpoint holds the weights. Whether ``init.strict`` allows the start is checked when the fit
        starts (``check_pending_start``)."""
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

    def check_pending_start(self) -> None:
        """Refuse the start ``start_from_init`` made if ``init.strict`` does not allow it (once: at the fit's start,
        after the data's checks, which name a tokenizer or classes other than the checkpoint's better)."""
        unchecked, self.unchecked_start = self.unchecked_start, None
        if unchecked is not None:
            check_start(*unchecked, self.init_config)
