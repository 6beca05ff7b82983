"""The contract between the data and the model, as a task keeps it: the model's config filled from the data's facts
(``net_config``, ``sizes_from_data``), the one check of the data module's facts against the task's at set-up
(``take_data_facts``, ``check_data``) and against a checkpoint's (``take_checkpoint_facts``), the one check of the
data's longest sequence against the model's position table (``PositionTable``: from the config alone before the data
is prepared, ``check_lengths_before_data``, and at set-up, ``check_positions``), and the facts read once for the task
(``fact``: its tokenizers, classes, palette).

``DataContract`` is a part of ``lightformer.tasks.Task`` (which sets ``data_facts`` and ``_parsed`` up and calls
these from its hooks), not a class of its own use.
"""

from __future__ import annotations

import operator
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from lightformer.data.module import ConfigFacts
from lightformer.errors import ConfigError
from lightformer.facts import DataFacts
from lightformer.io.checkpoints import check_start_tokenizer, facts_of_checkpoint, under
from lightformer.tasks.config_values import config_defaults, net_value
from lightformer.tokenization.text import Tokenizer

# The fields of a model's config that may be larger than the data's (``check_data``).
CAPACITIES = frozenset({"vocab_size", "src_vocab_size", "tgt_vocab_size", "block_size"})


@dataclass(frozen=True)
class PositionTable:
    """The model's position table, which must hold the data's longest sequence (``DataFacts.max_length``): what a task
    declares of it as its ``position_table``, beside its ``net_from_data``; ``DataContract`` checks it.

    Args:
        net_field: the field of ``model.net`` that sizes it (dotted: a tower's, "text.block_size").
        sequences: what the data's sequences are called in messages, in the plural ("captions").
        counted: what their lengths count besides their text's tokens, in words ("BOS and EOS included"; "": none).
        shorter: once the data is read, the data options' values under which its sequences fit a number of positions
            (before, the data module's ``ConfigFacts.within`` says it); None: "give the data shorter <sequences>".
        absent_when: values of ``model.net``'s fields under which the model has no position table to check
            ({"position": "none"}).
    """

    net_field: str
    sequences: str
    counted: str = ""
    shorter: Callable[[int], str] | None = None
    absent_when: Mapping[str, Any] = field(default_factory=dict)

    def absent(self, net: Callable[[str], Any]) -> bool:
        """Whether the model has no position table (``absent_when``), ``net`` reading a field of its config."""
        return any(net(name) == value for name, value in self.absent_when.items())

    def check(
        self, size: int, longest: int, beyond: str = "", options: str | None = None, within: Callable | None = None
    ) -> None:
        """ConfigError, in the one message of every task, when sequences of up to ``longest`` positions (``beyond``:
        the words for what they take besides the data's ``max_length``) outgrow a table of ``size``; ``options``,
        ``within``: the data options that make that length and their values that would fit (``ConfigFacts``), when
        the config alone is checked."""
        if longest <= size:
            return
        source = f"{options} makes" if options is not None else "the data has"
        shorter = within or self.shorter
        fix = shorter(size) if shorter is not None else f"give the data shorter {self.sequences}"
        counted = f" ({self.counted})" if self.counted else ""
        raise ConfigError(
            f"model.net.{self.net_field}={size} is shorter than the data's {self.sequences}: {source} {self.sequences} "
            f"of up to {longest} positions{beyond}{counted}, and the model's position table must hold them; set "
            f"model.net.{self.net_field} >= {longest} or {fix}"
        )


class DataContract:
    """The methods of a ``Task`` that hold its model to the data's facts (see the module's docstring)."""

    net_from_data: Mapping[str, str]  # field of the model's config → the ``DataFacts`` field that fills it
    data_facts: DataFacts | None  # the task's own: given (the command line, a checkpoint), or taken at set-up
    _parsed: dict[str, tuple[Any, Any]]  # fact name → (its value, the tokenizer or palette read from it)
    # The modules whose weights stand for token ids ("" the whole model): a start that loads none of them needs no
    # tokenizer of the data's (a vision-language model's image tower from a contrastive run of another vocabulary).
    token_modules: tuple[str, ...] = ("",)
    # The position table that must hold the data's longest sequence; None: no such check (the model has none, or the
    # data fills its size: ``net_from_data``).
    position_table: PositionTable | None = None

    @classmethod
    def net_class(cls) -> type:
        """The config dataclass of the task's model (the type of its ``net`` argument)."""
        return typing.get_type_hints(cls.__init__)["net"]

    def net_config(self, net: Any) -> Any:
        """The model's config: ``net`` (a config dataclass or its dict), its fields in ``net_from_data`` filled from
        ``data_facts``. Such a field set to another value than the data's (in a config, or by an old checkpoint) is
        refused: the data decides it."""
        config_class = self.net_class()
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

    def take_data_facts(self, facts: DataFacts, stage: str) -> None:
        """The one check between the data and the model: ``facts`` (the data module's) must be the task's own, the
        ones its model was built with (a checkpoint's, or given by the command line), each difference named; and the
        model must hold what the data gives (``check_data``). A task built without facts takes these."""
        if self.data_facts is not None:
            self.data_facts.check_same(facts)
        self.check_data(facts, stage)
        if self.data_facts is None:
            self.hold(facts)

    def starts_token_modules(self, path: str) -> bool:
        """Whether the ``model.init`` source that starts the module at ``path`` ("" the whole model) loads weights of
        one of ``token_modules``: not where another source, or ``init.skip``, takes all of that module's place."""
        within = lambda name, prefix: prefix == "" or under(name, prefix)  # noqa: E731
        others = [p for p, _, _ in self.init_config.sources() if p != path] + list(self.init_config.skip)
        for module in self.token_modules:
            if within(path, module):  # the source starts the module or a part of it
                return True
            if within(module, path) and not any(p and within(module, p) for p in others):
                return True
        return False

    def check_data(self, facts: DataFacts, stage: str) -> None:
        """Refuse data the model cannot hold: its sizes (``net_from_data``) must be the model's, except that the
        model's vocabularies and context may be larger than the data's; a new fit's ``model.init`` checkpoints
        must have been trained with the data's tokenizer, where they carry one; and the model's position table must
        hold the data's longest sequence (``check_positions``). A task adds its own checks (a token its loss needs)."""
        starting = stage == "fit" and self.init_config.sources() and self.trainer.ckpt_path is None
        if starting and facts.tokenizer is not None:
            for path, file, option in self.init_config.sources():
                if self.starts_token_modules(path):
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
        self.check_positions(facts)

    def positions_beyond(self, facts: DataFacts) -> list[tuple[int, str]]:
        """The positions the data's longest sequence takes in the model besides its ``max_length``, each with the
        words that say what takes them (one entry per kind of example: a vision-language model's image tokens for
        each kind of image); default: none. It needs the model: before the data is prepared
        (``check_lengths_before_data``) the data module's ``max_length`` counts every position."""
        return [(0, "")]

    def check_positions(self, facts: DataFacts) -> None:
        """Refuse data whose longest sequence (``max_length`` and ``positions_beyond``) outgrows the model's
        ``position_table``."""
        table, config = self.position_table, self.model.config
        if table is None or table.absent(lambda name: operator.attrgetter(name)(config)):
            return
        beyond = self.positions_beyond(facts)  # may refuse the data itself (images the model's patches do not tile)
        for extra, words in beyond if facts.max_length is not None else ():
            table.check(operator.attrgetter(table.net_field)(config), facts.max_length + extra, words)

    @classmethod
    def check_lengths_before_data(cls, net: Any, data: ConfigFacts) -> None:
        """Refuse, from the config alone (``net``: its ``model.net``), before any data is prepared, a position table
        shorter than the sequences the data module's options make (``DataModule.facts_from_config``);
        ``check_positions`` checks again at set-up."""
        table, longest = cls.position_table, data.facts.max_length
        if table is None or longest is None:
            return
        config_class = cls.net_class()
        value = lambda name: net_value(net, config_class, name)
        if not table.absent(value):
            options, within = data.options.get("max_length"), data.within.get("max_length")
            table.check(value(table.net_field), longest, "", options, within)

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

    def take_checkpoint_facts(self, checkpoint: dict) -> None:
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
