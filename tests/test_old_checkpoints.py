"""Checkpoints written by older lightformers (commits 51eef69 and b1bd12e, one tiny run per task, in
tests/data/old_checkpoints/ and its b1bd12e/, made by its make.py) still work with today's code: the task and its
model are rebuilt from the checkpoint alone and take its weights exactly, each checkpoint command runs on them,
``test`` and ``fit --ckpt_path`` read them through the CLI (their hyperparameters become the model config), and a
new run starts from their weights. A change of how tasks store their hyperparameters or what travels in a checkpoint
fails here unless old files still load."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lightformer import tasks
from lightformer.cli import commands
from lightformer.cli.main import cli_main, main
from lightformer.tasks import image_classification, image_gpt, image_text, language_model, translation
from tiny_runs import IMAGE_TEXT_DATA

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "data" / "old_checkpoints"
# Each set of fixtures, by the commit that wrote it: 51eef69's before the refactor of how tasks store the data's facts,
# b1bd12e's before the refactor of the model configs (the image-text config's towers nested), the Task base and the
# package layout.
COMMITS = {"51eef69": FIXTURES, "b1bd12e": FIXTURES / "b1bd12e"}
TASK_CLASSES = {
    "vision": "ImageClassificationTask",
    "lm": "LanguageModelTask",
    "translation": "TranslationTask",
    "mlm": "MaskedLanguageModelTask",
    "t5": "DenoisingTask",
    "classify": "TextClassificationTask",
    "igpt": "ImageGPTTask",
    "image_text": "ImageToTextTask",  # b1bd12e's only
}
# Every (commit, task) fixture.
FIXTURE_NAMES = [
    (commit, task) for commit in COMMITS for task in TASK_CLASSES if commit != "51eef69" or task != "image_text"
]
# What each fixture's model was built with (make.py): today's model rebuilt from it must have the same config (the
# sizes the data gave, vocab_size and the like, included). Checked on the model, not on where the task keeps them.
SHAPES = {
    "vision": {"d_model": 16, "n_layers": 1, "n_heads": 2, "num_classes": 10, "image_size": 8, "in_channels": 1},
    "lm": {"d_model": 16, "n_layers": 1, "n_heads": 2, "vocab_size": 30, "block_size": 16},
    "translation": {"d_model": 8, "n_encoder_layers": 1, "src_vocab_size": 268, "tgt_vocab_size": 268},
    "mlm": {"d_model": 8, "n_layers": 1, "vocab_size": 300, "max_len": 32},
    "t5": {"d_model": 8, "n_decoder_layers": 1, "src_vocab_size": 300, "share_embeddings": True},
    "classify": {"d_model": 8, "n_layers": 1, "vocab_size": 397, "num_classes": 2},
    "igpt": {"d_model": 16, "n_layers": 1, "vocab_size": 9, "block_size": 64},
    "image_text": {
        "encoder.d_model": 16,
        "encoder.n_layers": 1,
        "decoder.d_model": 8,
        "decoder.n_layers": 1,
        "decoder.n_heads": 2,
        "decoder.vocab_size": 85,
        "encoder.image_size": (16, 96),
    },
}


def task_class(task: str) -> type:
    return getattr(tasks, TASK_CLASSES[task])


def fixture(task: str, commit: str = "51eef69") -> str:
    return str(COMMITS[commit] / f"{task}.ckpt")


def quiet(tmp_path: Path) -> list[str]:
    """Trainer options of every run here: logs under tmp_path, fp32, no progress bar, summary or time limit."""
    return [
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.max_time=null",
        "--trainer.precision=32-true",
        "--trainer.num_sanity_val_steps=0",
    ]


def fixture_data(commit: str) -> Path:
    """The folder of the data files the fixtures of ``commit`` were trained on: this folder for 51eef69's; for later
    ones, whose data modules refuse to resume on other files than their own (path, size and time), the files written
    again where make.py wrote them."""
    if commit == "51eef69":
        return FIXTURES
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    return make.restore_data(Path(make.DATA_FOLDER) / commit)


def data_args(task: str, tmp_path: Path, commit: str = "51eef69") -> list[str]:
    """The task's shipped config and the data each fixture was trained on (make.py's data options), prepared under
    tmp_path. No model option: with --ckpt_path the model config comes from the checkpoint."""
    data = fixture_data(commit)
    prepared = f"--data.prepare.dir={tmp_path / 'prepared'}"
    if task == "vision":
        return [f"--config={REPO}/configs/vision/vit_digits.yaml", "--data.source.val_size=200", prepared]
    if task == "lm":
        return [
            f"--config={REPO}/configs/lm/austen_char.yaml",
            "--data.source.corpus=null",
            f"--data.source.train_files=[{data / 'corpus.txt'}]",
            "--data.source.test_fraction=0.1",
            "--data.block_size=16",
            "--data.loader.batch_size=8",
            prepared,
        ]
    if task == "translation":
        pairs = data / "pairs.tsv"
        return [
            f"--config={REPO}/configs/translation/ding_de_en.yaml",
            "--data.source.corpus=null",
            "--data.source.ding_phrases=false",
            f"--data.source.tsv_files=[{pairs}]",
            f"--data.source.val_tsv_files=[{pairs}]",
            f"--data.source.test_tsv_files=[{pairs}]",
            "--data.tokenizer.vocab_size=270",
            "--data.batches.max_tokens=128",
            prepared,
        ]
    if task == "classify":
        labelled = data / "labelled.tsv"
        return [
            f"--config={REPO}/configs/classify/austen_scratch.yaml",
            "--data.source.corpus=null",
            f"--data.source.tsv_files=[{labelled}]",
            f"--data.source.val_tsv_files=[{labelled}]",
            f"--data.source.test_tsv_files=[{labelled}]",
            "--data.tokenizer.vocab_size=400",
            "--data.max_tokens=16",
            "--data.loader.batch_size=16",
            prepared,
        ]
    if task in ("mlm", "t5"):
        return [
            f"--config={REPO}/configs/{task}/austen.yaml",
            "--data.source.corpus=null",
            f"--data.source.train_files=[{data / 'corpus.txt'}]",
            "--data.tokenizer.vocab_size=300",
            "--data.num_sentinels=8",
            "--data.segment_tokens=16",
            "--data.source.val_fraction=0.25",
            "--data.source.test_fraction=0.0",
            "--data.loader.batch_size=4",
            prepared,
        ]
    if task == "igpt":
        return [f"--config={REPO}/configs/igpt/digits.yaml", "--data.loader.batch_size=32", prepared]
    if task == "image_text":
        return [f"--config={REPO}/configs/image_text/printed_lines.yaml", *IMAGE_TEXT_DATA, prepared,
                "--data.loader.batch_size=8"]  # fmt: skip
    raise ValueError(task)


def saved_state(task: str, commit: str = "51eef69") -> dict[str, torch.Tensor]:
    return torch.load(fixture(task, commit), map_location="cpu", weights_only=True)["state_dict"]


def assert_shape(task_module, task: str) -> None:
    """The task's model has the config the fixture's model was built with (``SHAPES``; a dotted name is a field of
    a tower's config)."""
    for name, value in SHAPES[task].items():
        config = task_module.model.config
        for part in name.split("."):
            config = getattr(config, part)
        assert config == value, name


def assert_same_weights(model_state: dict[str, torch.Tensor], saved: dict[str, torch.Tensor], prefix: str = "") -> None:
    """Every tensor of ``saved`` whose name starts with ``prefix`` is in ``model_state`` (named without "model.")
    with the same values."""
    names = [name for name in saved if name.startswith(f"model.{prefix}")]
    assert names
    for name in names:
        torch.testing.assert_close(model_state[name.removeprefix("model.")], saved[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(("commit", "task"), FIXTURE_NAMES)
def test_an_old_checkpoint_rebuilds_its_task_and_model_with_its_exact_weights(commit, task):
    checkpoint = torch.load(fixture(task, commit), map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 3
    class_path = checkpoint["hyper_parameters"]["_class_path"]  # lightformer.tasks[.<module>].<class>
    assert class_path.startswith("lightformer.tasks.") and class_path.endswith(f".{TASK_CLASSES[task]}")
    assert commands.task_class_of(checkpoint).__name__ == TASK_CLASSES[task]

    loaded = commands.load_task(fixture(task, commit), task_class(task), "test")

    assert type(loaded).__name__ == TASK_CLASSES[task]
    assert_shape(loaded, task)
    state, saved = loaded.state_dict(), checkpoint["state_dict"]
    assert set(state) == set(saved)  # nothing missing, nothing left over (a strict load)
    for name, value in saved.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------------------------------------------------- commands


def digit_png(path: Path, index: int = 0) -> str:
    """A PNG of one of scikit-learn's 8×8 digits (the fixtures' image data), as a greyscale image."""
    from PIL import Image
    from sklearn.datasets import load_digits

    pixels = load_digits().images[index] * (255 / 16)
    Image.fromarray(pixels.round().astype("uint8"), mode="L").save(path)
    return str(path)


def test_generate_continues_a_prompt_with_the_old_language_model(capsys):
    language_model.generate(ckpt_path=fixture("lm"), prompt="It is a", max_new_tokens=12, seed=0, num_samples=2)
    out = capsys.readouterr().out
    samples = out.split("\n" + "-" * 40 + "\n")
    assert len(samples) == 2
    assert all(sample.startswith("It is a") and len(sample.rstrip("\n")) > len("It is a") for sample in samples)


def test_translate_translates_a_line_with_the_old_translation_model(tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_text("a e i\n\nb f j\n", encoding="utf-8")
    translation.translate(ckpt_path=fixture("translation"), input=str(source), beam_size=2)
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # three lines out, the blank one kept
    assert lines[0].strip() and lines[2].strip()  # the untrained model writes something


def test_classify_names_classes_of_an_image_with_the_old_vision_model(tmp_path, capsys):
    image = digit_png(tmp_path / "digit.png")
    image_classification.classify(ckpt_path=fixture("vision"), images=[image], top_k=3)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{image}: ")
    ranked = line.removeprefix(f"{image}: ").split(", ")
    assert len(ranked) == 3 and all(entry.split(" ")[0] in "0123456789" for entry in ranked)
    assert sum(float(entry.split("(")[1].rstrip("%)")) for entry in ranked) <= 100.1


def test_fill_mask_fills_a_mask_with_the_old_masked_lm(capsys):
    main(["fill-mask", f"--ckpt_path={fixture('mlm')}", "--text=It is a truth universally [MASK].", "--top_k=2"])
    filled, mask = capsys.readouterr().out.splitlines()
    assert filled.startswith("It is a truth universally") and "[" in filled.removeprefix("It is a truth universally")
    assert mask.startswith("mask 1: ") and mask.count("%)") == 2


def test_sample_images_draws_and_completes_digits_with_the_old_image_gpt(tmp_path, capsys):
    from PIL import Image

    output = tmp_path / "samples.png"
    written = image_gpt.sample_images(
        ckpt_path=fixture("igpt"), output=str(output), num_samples=4, complete_from=[digit_png(tmp_path / "d.png")],
        num_completions=1, seed=0,
    )  # fmt: skip
    assert written == [str(output), str(tmp_path / "samples_completions.png")]
    for path in written:
        with Image.open(path) as picture:
            assert picture.width > 8 and picture.height > 8
    assert "4 samples of 8×8 pixels" in capsys.readouterr().out


def test_read_reads_a_line_with_the_old_image_to_text_model(tmp_path, capsys):
    from PIL import Image, ImageDraw

    line = tmp_path / "line.png"
    picture = Image.new("L", (96, 16), 255)
    ImageDraw.Draw(picture).text((2, 2), "truth", fill=0)
    picture.save(line)
    image_text.read(ckpt_path=fixture("image_text", "b1bd12e"), images=[str(line)], beam_size=2)
    (reading,) = capsys.readouterr().out.splitlines()  # one line per image; the untrained model's text is any
    assert len(reading) <= 24


@pytest.mark.parametrize("task", ["t5", "classify"])  # the two tasks with no command of their own
def test_export_writes_the_old_weights_to_safetensors(task, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import load_model

    output = tmp_path / f"{task}.safetensors"
    commands.export(ckpt_path=fixture(task), output=str(output))
    assert capsys.readouterr().out.startswith(f"wrote {output} ({TASK_CLASSES[task]}, ")
    with safe_open(str(output), "pt") as exported:
        metadata = exported.metadata()
    assert metadata["lightformer.task"] == TASK_CLASSES[task]
    json.loads(metadata["lightformer.hyper_parameters"])
    # the tokenizer travels with the weights (under its own key, or within the hyperparameters)
    tokenizer = torch.load(fixture(task), weights_only=True)["src_tokenizer" if task == "t5" else "tokenizer"]
    assert any(tokenizer in value or json.dumps(tokenizer) in value for value in metadata.values())
    model = commands.load_task(fixture(task), task_class(task), "export").model
    for parameter in model.parameters():
        parameter.data.zero_()
    load_model(model, str(output))  # strict: every weight back, from the old checkpoint's values
    assert_same_weights(model.state_dict(), saved_state(task))


# ---------------------------------------------------------------------------------- the CLI: test, resume, start from


@pytest.mark.parametrize(("commit", "task"), FIXTURE_NAMES)
def test_test_evaluates_an_old_checkpoint_on_its_data(commit, task, tmp_path):
    """``test``, or ``validate`` where the fixture's data has no test split (the pretraining tasks')."""
    command = "validate" if task in ("mlm", "t5") else "test"
    args = [*data_args(task, tmp_path, commit), *quiet(tmp_path), f"--ckpt_path={fixture(task, commit)}"]
    cli = cli_main([command, *args])
    assert_shape(cli.model, task)  # the checkpoint's model, not the config file's
    assert_same_weights(cli.model.model.state_dict(), saved_state(task, commit))
    loss = float(cli.trainer.callback_metrics["val/loss" if command == "validate" else "test/loss"])
    assert math.isfinite(loss) and loss > 0


class AtTrainStart(Callback):
    """Where training starts: the global step and the model's weights (after a resume restored them, or ``setup``
    loaded ``model.init.checkpoint``). Given to a run as ``--trainer.callbacks+=test_old_checkpoints.AtTrainStart``."""

    def on_train_start(self, trainer, pl_module) -> None:
        self.step = trainer.global_step
        self.state = {name: value.detach().clone() for name, value in pl_module.model.state_dict().items()}


def fit(args: list[str]) -> tuple[object, AtTrainStart]:
    """``fit <args>`` through the CLI, and where its training started."""
    cli = cli_main(["fit", *args, f"--trainer.callbacks+={__name__}.AtTrainStart"])
    (probe,) = [callback for callback in cli.trainer.callbacks if type(callback).__name__ == "AtTrainStart"]
    return cli, probe


@pytest.mark.parametrize(("commit", "task"), FIXTURE_NAMES)
def test_fit_resumes_an_old_checkpoint_for_two_more_steps(commit, task, tmp_path, capsys):
    # The language model's training loader (LitData's) saved the absolute path of the shards it read, in a scratch
    # folder long gone: the resumed loader reads them where this run prepared them (its position in the stream kept).
    resumed = tmp_path / f"{task}.ckpt"
    shutil.copyfile(fixture(task, commit), resumed)
    args = [*data_args(task, tmp_path, commit), *quiet(tmp_path), "--trainer.max_steps=5",
            "--trainer.limit_val_batches=1"]  # fmt: skip
    cli, start = fit([*args, f"--ckpt_path={resumed}"])
    assert start.step == 3 and cli.trainer.global_step == 5  # two more steps
    assert_same_weights(start.state, saved_state(task, commit))  # from the checkpoint's weights
    assert_shape(cli.model, task)
    (last,) = (tmp_path / "runs").glob("*/version_*/checkpoints/last.ckpt")
    written = torch.load(last, map_location="cpu", weights_only=True)
    assert written["global_step"] == 5
    saved = saved_state(task, commit)
    assert set(written["state_dict"]) == set(saved)
    assert any(not torch.equal(value, written["state_dict"][name]) for name, value in saved.items())  # it trained


@pytest.mark.parametrize("task", ["lm", "vision"])
def test_a_new_run_starts_from_an_old_checkpoints_weights(task, tmp_path):
    shape = {
        "lm": ["--model.net.n_layers=1", "--model.net.d_model=16", "--model.net.n_heads=2"],
        "vision": ["--model.net.n_layers=1", "--model.net.d_model=16", "--model.net.n_heads=2",
                   "--model.net.d_ff=32"],
    }[task]  # fmt: skip
    args = [*data_args(task, tmp_path), *quiet(tmp_path), *shape, f"--model.init.checkpoint={fixture(task)}"]
    cli, start = fit([*args, "--trainer.max_steps=1", "--trainer.limit_val_batches=1"])
    assert start.step == 0 and cli.trainer.global_step == 1  # a new run: its own step count and schedule
    assert_same_weights(start.state, saved_state(task))


def test_a_classifier_starts_from_the_old_masked_lm(tmp_path):
    """configs/classify/austen_from_mlm.yaml's path: the pretraining run's tokenizer (taken from the old
    checkpoint) and its BERT weights, with a new classification head."""
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(torch.load(fixture("mlm"), weights_only=True)["tokenizer"], encoding="utf-8")
    labelled = FIXTURES / "labelled.tsv"
    args = [
        f"--config={REPO}/configs/classify/austen_from_mlm.yaml",
        "--data.source.corpus=null",
        f"--data.source.tsv_files=[{labelled}]",
        f"--data.source.val_tsv_files=[{labelled}]",
        f"--data.tokenizer.file={tokenizer}",
        "--data.max_tokens=16",
        "--data.loader.batch_size=16",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--model.net.n_layers=1",
        "--model.net.d_model=8",
        "--model.net.n_heads=2",
        "--model.net.d_ff=16",
        "--model.net.max_len=32",
        f"--model.init.checkpoint={fixture('mlm')}",
        "--model.init.skip=[]",
        "--model.optimizer.fit_to_max_time=false",
        *quiet(tmp_path),
        "--trainer.max_steps=1",
        "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=1",
    ]
    cli, start = fit(args)
    assert start.step == 0 and cli.trainer.global_step == 1
    assert cli.model.model.config.vocab_size == 300  # the old tokenizer's
    assert_same_weights(start.state, saved_state("mlm"), prefix="bert.")
