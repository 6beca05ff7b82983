"""The data layer's shape, as the families-and-sources design asks: no data module imports another family's, none
stands more than two levels below the generic ``DataModule`` (generic → family → preset), the public presets keep the
names, arguments and defaults of 42e7f06 (configs and checkpoints name them), data/ stays under its line budget, and
the main job trains its first 60 steps on the very batches, with the very losses, of 42e7f06."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import lightning as L
import pytest

import lightformer.data
import lightformer.data.families
from lightformer.cli.main import cli_main
from lightformer.data.module import DataModule
from lightformer.errors import DataError

DATA = Path(lightformer.data.__file__).parent
REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 8_500


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_family_imports_another_and_nothing_below_the_families_imports_one():
    family_modules = {
        f"lightformer.data.families.{info.name}" for info in pkgutil.iter_modules([str(DATA / "families")])
    }
    assert {"lightformer.data.families.text", "lightformer.data.families.image_text"} <= family_modules
    for path in sorted(DATA.rglob("*.py")):
        module = ".".join(("lightformer", *path.relative_to(DATA.parent).with_suffix("").parts))
        if path.parent == DATA:  # data/__init__.py names every preset; data/module.py is the generic module
            continue
        imported = {name for name in imported_modules(path) for family in family_modules if name.startswith(family)}
        others = {name for name in imported if not name.startswith(module)}
        assert not others, f"{path.relative_to(DATA)} imports {sorted(others)}"
        assert not any(name.startswith("lightformer.data.modules") for name in imported_modules(path)), path


def test_every_data_module_is_at_most_two_levels_below_the_generic_one():
    for info in pkgutil.iter_modules(lightformer.data.families.__path__):
        importlib.import_module(f"lightformer.data.families.{info.name}")
    classes = [cls for cls in all_subclasses(DataModule) if cls.__module__.startswith("lightformer.data.")]
    assert len(classes) >= 15  # the families and every public preset
    for cls in classes:
        chain = [base for base in cls.__mro__ if issubclass(base, DataModule) and base is not DataModule]
        assert len(chain) <= 2, f"{cls.__qualname__}: {[base.__qualname__ for base in chain]} below DataModule"


def all_subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *all_subclasses(direct)}}


def test_the_public_presets_keep_their_names_arguments_and_defaults_of_42e7f06():
    """A config or a checkpoint's hyperparameters name a preset and give its arguments by name, an option group as a
    partial dict; Lightning keeps a data module's state in a checkpoint under its class's ``__qualname__``. So each
    preset keeps its name, its arguments in their order, and every option's default (a group may gain fields)."""
    pinned = json.loads((REPO / "tests" / "data" / "data_presets_42e7f06.json").read_text())
    for name, before in pinned.items():
        preset = getattr(lightformer.data, name)
        assert preset.__qualname__ == before["qualname"]
        parameters = list(inspect.signature(preset.__init__).parameters.values())[1:]
        assert [p.name for p in parameters] == [argument for argument, _ in before["arguments"]], name
        for parameter, (argument, default) in zip(parameters, before["arguments"], strict=True):
            if default is None:  # required then, required now
                assert parameter.default is inspect.Parameter.empty, (name, argument)
            elif "fields" in default:  # an option group: every field of then, with its default
                now = json.loads(json.dumps(dataclasses.asdict(parameter.default), default=str))
                assert {field: now.get(field) for field in default["fields"]} == default["fields"], (name, argument)
            else:
                assert parameter.default == default["value"], (name, argument)


@pytest.mark.parametrize(
    "name", ["TextDataModule", "MaskedLMDataModule", "SpanCorruptionDataModule", "ClipArtDataModule", "EmojiDataModule"]
)
def test_a_preset_keeps_its_own_arguments_as_hyperparameters_not_its_familys(name):
    """What a checkpoint rebuilds a preset from (``Cls(**hparams)``): its own arguments, none of its family's."""
    try:
        data = getattr(lightformer.data, name)()
    except DataError as error:  # the clip art library or the emoji fonts are not installed
        pytest.skip(str(error))
    assert set(data.hparams) == set(inspect.signature(type(data).__init__).parameters) - {"self"}


def test_the_data_layer_stays_within_its_line_budget():
    lines = sum(len(path.read_text().splitlines()) for path in DATA.rglob("*.py"))
    assert lines <= MAX_LINES, f"src/lightformer/data holds {lines:,} lines, more than {MAX_LINES:,}"


class Recorded(L.Callback):
    """Each training batch's bytes, hashed, and each step's loss."""

    def __init__(self) -> None:
        self.batches, self.losses = hashlib.sha256(), []

    def on_train_batch_start(self, trainer, module, batch, index) -> None:
        for tensor in batch:
            self.batches.update(tensor.numpy().tobytes())

    def on_train_batch_end(self, trainer, module, outputs, batch, index) -> None:
        self.losses.append(float(outputs["loss"]))


def test_the_main_job_trains_its_first_60_steps_on_the_batches_and_losses_of_42e7f06(tmp_path):
    """``configs/lm/austen_char.yaml`` in fp32 (its ``precision: auto`` picks by CPU): its prepared data, its order and
    its windows are the same bytes as before the data layer was regrouped, and so is what it learns from them."""
    cli = cli_main(["--config=configs/lm/austen_char.yaml", "--trainer.max_steps=60", "--trainer.precision=32-true",
                    f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.enable_progress_bar=false",
                    "--trainer.enable_model_summary=false", "--trainer.max_time=null",
                    "--model.optimizer.fit_to_max_time=false", f"--data.prepare.dir={tmp_path / 'data'}"],
                   run=False)  # fmt: skip
    recorded = Recorded()
    cli.trainer.callbacks.append(recorded)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    # measured at 42e7f06 with the same script (the first, 10th, 30th and 60th step's losses)
    assert recorded.batches.hexdigest() == "131a1b41a576ec7368e7d54bee0a2080c109140dc15f83ceb16c092271576680"
    expected = [4.439046859741211, 3.6857054233551025, 2.7816245555877686, 2.602332592010498]
    assert [recorded.losses[i] for i in (0, 9, 29, 59)] == pytest.approx(expected, rel=1e-6)


def test_one_loader_config_fills_a_partial_dict_from_the_presets_own_default_and_refuses_windows_off_text():
    """A checkpoint of 42e7f06 stores an image module's ``loader`` as a dict of the image loader config it had; its
    missing fields come from the preset's default (128 images, no pinned memory), not from another family's."""
    from lightformer.data import ImageDataModule, TextClassificationDataModule, TextDataModule

    data = ImageDataModule({"dataset": "digits"}, loader={"num_workers": 0})
    assert (data.loader.batch_size, data.loader.pin_memory) == (128, False)
    assert TextDataModule(loader={"val_windows": 8}).loader.batch_size == 12
    for family in (ImageDataModule, TextClassificationDataModule):
        message = rf"data.loader.val_windows=4 is for windows of text: {family.__name__} validates on every example"
        with pytest.raises(ValueError, match=message):
            family(loader={"val_windows": 4})
