"""The table of bad inputs and faults of the reliability issue: each gets a clear message (naming the option, file
or value and what would be valid) before work is lost, or works correctly. Earlier cases are in test_errors.py."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from lightformer.cli.main import cli_main, main
from lightformer.io.files import atomic_open
from lightformer.training import callbacks
from lightformer.training.callbacks import NonFiniteLossError
from tiny_runs import build, last_checkpoint, task_args


def refused(argv: list[str]) -> str:
    """The one-line message a command exits with (it must not run)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert isinstance(exit_info.value.code, str), exit_info.value.code
    return exit_info.value.code


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, str]:
    """A checkpoint of each task (a few steps of the tiny configurations)."""
    paths = {}
    for task in ("lm", "translation", "vision"):
        folder = tmp_path_factory.mktemp(task)
        cli = build([*task_args(task, folder), "--trainer.max_steps=2", "--trainer.limit_val_batches=1"])
        cli.trainer.fit(cli.model, cli.datamodule)
        paths[task] = last_checkpoint(folder)
    return paths


# --- config values: refused before any data is prepared ----------------------------------------------------------

LM = ["fit", "--config=configs/lm/austen_char.yaml"]
VISION = ["fit", "--config=configs/vision/vit_digits.yaml", "--trainer.logger=false"]
MLM = ["fit", "--config=configs/mlm/austen.yaml"]  # the sequence lengths: known from the config, before data work
T5 = ["fit", "--config=configs/t5/austen.yaml", "--trainer.logger=false"]
CLASSIFY = ["fit", "--config=configs/classify/austen_scratch.yaml"]
IMAGE_TEXT = ["fit", "--config=configs/image_text/printed_lines.yaml", "--trainer.logger=false"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*LM, "--model.net.vocab_size=10"], "model.net.vocab_size=10 is set, but it comes from the data"),
        ([*LM, "--model.net.block_size=16"], "model.net.block_size=16 is set, but it comes from the data"),
        ([*VISION, "--model.net.num_classes=3"], "model.net.num_classes=3 is set, but it comes from the data"),
        ([*LM, "--model.net.n_layers=0"], "model.net: n_layers=0 must be at least 1"),
        ([*LM, "--model.net.d_model=0"], "model.net: d_model=0 must be at least 1"),
        ([*LM, "--model.net.dropout=1.5"], r"model.net: dropout=1.5 must be in \[0, 1\)"),
        ([*VISION, "--model.net.patch_size=3"], "model.net: image_size=8 is not a multiple of patch_size=3"),
        ([*LM, "--model.net.norm_first=false"], "model.net: norm_first=False is not valid for GPTConfig; valid: True$"),
        ([*VISION, "--model.net.norm_first=false"], "norm_first=False is not valid for ViTConfig; valid: True"),
        ([*MLM, "--model.net.norm=rmsnorm"], "norm='rmsnorm' is not valid for BertConfig; valid: 'layernorm'$"),
        ([*MLM, "--model.net.activation=swiglu"], "activation='swiglu' is not valid for BertConfig; valid: 're"),
        ([*T5, "--model.net.bias=false"], "model.net: bias=False is not valid for EncoderDecoderConfig; valid: True$"),
        (
            [*IMAGE_TEXT, "--model.net.encoder.image_size=[32, 64]"],
            r"model.net.encoder.image_size=\(32, 64\) is set, but it comes from the data",
        ),
        ([*IMAGE_TEXT, "--model.net.decoder.vocab_size=50"], "model.net.decoder.vocab_size=50 is set, but it comes"),
        ([*IMAGE_TEXT, "--model.net.encoder.num_classes=3"], "encoder.num_classes=3: the encoder of an image-to-text"),
        ([*IMAGE_TEXT, "--model.net.decoder.n_heads=3"], "the decoder: d_model=128 is not divisible by n_heads=3"),
        ([*LM, "--model.optimizer.lr=-1"], "model.optimizer: lr=-1.0 must be positive"),
        ([*LM, "--model.optimizer.warmup_steps=-5"], "model.optimizer: warmup_steps=-5 must be at least 0"),
        ([*VISION, "--data.loader.batch_size=0"], "data.loader.batch_size=0 must be at least 1"),
        ([*LM, "--data.loader.batch_size=0"], "data.loader.batch_size=0 must be at least 1"),
        ([*VISION, "--data.source.val_size=100", "--data.source.val_fraction=0.5"], "give val_size .*, not both"),
        ([*LM, "--trainer.max_time=20 minutes"], r"trainer.max_time='20 minutes' is not a duration: give \"DD:HH:MM"),
        ([*LM, "--trainer.max_time=00:99"], r"trainer.max_time='00:99' is not a duration: .*or a dict \(e.g. \{hours"),
        ([*LM, "--trainer.max_time=00:00:00:00"], r"trainer.max_time='00:00:00:00' is not a positive duration"),
        ([*LM, '--trainer.max_time={"minutez": 5}'], r"max_time=\{'minutez': 5\} is not a duration: its keys are"),
        ([*LM, "--trainer.max_steps=-5"], r"trainer.max_steps=-5: give a number of steps \(at least 0\), or -1 for no"),
        ([*LM, "--trainer.max_epochs=-2"], r"trainer.max_epochs=-2: give a number of epochs \(at least 0\), or -1"),
        (
            [*MLM, "--model.net.max_len=16"],
            r"model.net.max_len=16 is shorter than the data's examples: data.segment_"
            r"tokens=64 makes examples of up to 128 positions .*; set model.net.max_len >= "
            r"128 or data.segment_tokens <= 8$",
        ),
        (
            [*T5, "--model.net.max_len=16"],
            r"model.net.max_len=16 is shorter than the data's sources or targets: data.segment_"
            r"tokens=64 makes sources or targets of up to 58 positions, .*; set model."
            r"net.max_len >= 58 or data.segment_tokens <= 17$",
        ),
        (
            [*CLASSIFY, "--data.tokenizer.kind=char"],
            r"data.tokenizer.kind='char': TextClassificationDataModule prepares its text with kind 'bpe' \(or a data",
        ),
        ([*LM, "--data.tokenizer.bpe_dropout=0.1"], r"data.tokenizer.bpe_dropout=0.1 applies to sentence pairs"),
        ([*LM, "--data.tokenizer.joint_vocab=false"], r"data.tokenizer.joint_vocab=false applies to sentence pairs"),
        (
            [
                "fit",
                "--config=configs/translation/ding_de_en.yaml",
                "--data.tokenizer.file=configs/lm/austen_bpe_gpu.yaml",
            ],
            r"data.tokenizer.file='configs/lm/austen_bpe_gpu.yaml': TranslationDataModule trains its own tokenizers",
        ),
        (
            [*CLASSIFY, "--model.net.max_len=16", "--data.max_tokens=64"],
            r"model.net.max_len=16 is shorter than the data's texts: data.max_tokens=64 makes texts of up to 64 "
            r"positions .*; set model.net.max_len >= 64 or data.max_tokens <= 16$",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_invalid_config_values_are_refused_naming_the_field(argv, message):
    found = refused(argv)
    assert "\n" not in found and re.search(message, found), found


def test_the_flat_image_text_fields_of_b1bd12e_are_refused_naming_their_new_places(tmp_path):
    """The image-to-text config holds its towers whole since b1bd12e: a config file or a command line that gives
    its former flat fields is refused before anything is parsed, each field named with its new place."""
    old = tmp_path / "old.yaml"
    old.write_text(
        "model:\n  class_path: lightformer.tasks.ImageToTextTask\n  init_args:\n    net:\n      encoder_layers: 3\n"
        "      encoder_d_model: 64\n      max_len: 64\n      ctc_head: true\n",
        encoding="utf-8",
    )
    found = refused(["fit", f"--config={old}"])
    assert found == (
        "lightformer: ImageToTextTask's model.net holds its towers whole (encoder, decoder): "
        "model.net.encoder_layers is now model.net.encoder.n_layers; model.net.encoder_d_model is now "
        "model.net.encoder.d_model; model.net.max_len is now model.net.decoder.block_size"
    )
    found = refused([*IMAGE_TEXT, "--model.net.decoder_layers=2", "--model.net.dropout", "0.1"])
    assert found.endswith(
        "model.net.decoder_layers is now model.net.decoder.n_layers; model.net.dropout is now "
        "model.net.encoder.dropout, model.net.encoder.attn_dropout and model.net.decoder.dropout"
    )


def test_model_options_on_the_command_line_apply_over_the_checkpoints_hyperparameters(trained, tmp_path):
    # LightningCLI builds the model of validate/test/predict --ckpt_path from the checkpoint's hyperparameters,
    # which used to replace even what the command line asked for (a beam size tried in validate was ignored).
    config = [arg for arg in task_args("vision", tmp_path) if not arg.startswith("--model.")]
    args = ["validate", *config, f"--ckpt_path={trained['vision']}"]
    validated = cli_main(args)
    plain, plain_loss = validated.model.hparams, validated.trainer.callback_metrics["val/loss"]
    assert plain.test_time_flip is False and plain.label_smoothing == 0.1
    assert plain.net["drop_path"] == 0.1  # the checkpoint's (the tiny run's command line), over the config file's 0.0
    changed = cli_main(
        [*args, "--model.test_time_flip=true", "--model.init_args.label_smoothing", "0.3", "--model.net.dropout=0.2"]
    )
    assert changed.model.hparams.test_time_flip is True and changed.model.hparams.label_smoothing == 0.3
    assert changed.model.hparams.net["drop_path"] == 0.1 and changed.model.hparams.net["dropout"] == 0.2
    assert changed.trainer.callback_metrics["val/loss"] != plain_loss  # the changed model is the one validated


def test_resuming_with_model_options_the_checkpoint_would_override_is_refused(trained, tmp_path):
    # fit --ckpt_path restores the optimizer and its schedule: a new learning rate would silently not apply.
    args = ["fit", *task_args("vision", tmp_path), f"--ckpt_path={trained['vision']}"]
    message = refused([*args, "--model.optimizer.lr=0.0002"])
    assert "--model.optimizer.lr=0.0002 (the checkpoint's: 0.005) would be ignored" in message
    assert "--model.init.checkpoint=<the checkpoint> instead of --ckpt_path" in message
    assert "(the checkpoint's: 0.1)" in refused([*args, "--model.init_args.net.dropout", "0.2"])


def test_data_that_differs_from_the_checkpoints_model_is_refused(trained, tmp_path):
    args = task_args("lm", tmp_path)
    message = refused(["validate", *args, "--data.block_size=32", f"--ckpt_path={trained['lm']}"])
    assert "the data gives block_size=32 but the model has model.net.block_size=16, which must be at least" in message
    main(["validate", *args, "--data.block_size=8", f"--ckpt_path={trained['lm']}"])  # shorter windows: it runs


# --- data: found at setup, before training ----------------------------------------------------------------------


def image_folder(root: Path, classes: list[str], per_class: int = 3) -> Path:
    for index, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("L", (8, 8), 30 * index + i).save(root / name / f"{i}.png")
    return root


def test_an_unreadable_image_is_found_at_setup_naming_the_file(tmp_path):
    from lightformer.data import ImageDataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources.images import ImageSource
    from lightformer.errors import ConfigError

    folder = image_folder(tmp_path / "images", ["cat", "dog"])
    (folder / "dog" / "broken.png").write_bytes(b"\x89PNG not really")
    source = ImageSource(dataset="image_folder", image_folder=str(folder))
    datamodule = ImageDataModule(source=source, prepare=PrepareConfig(dir=str(tmp_path / "prepared")), image_size=8)
    with pytest.raises(ConfigError, match=r"1 of 7 files are not readable images: .*broken\.png \(not an "
                       r"image: PIL recognises no image format in it\)"):  # fmt: skip
        datamodule.setup("fit")


def test_a_cut_short_image_in_the_training_folder_is_refused_before_training_naming_it(tmp_path):
    """A PNG cut short passed the header check and failed in the data loader after training had started."""
    folder = image_folder(tmp_path / "images", ["cat", "dog"], per_class=4)
    cut = folder / "cat" / "2.png"
    Image.effect_noise((64, 64), 60).save(cut)  # noise: its pixels take more than one compressed block
    cut.write_bytes(cut.read_bytes()[:200])
    source = ("dataset=image_folder", f"image_folder={folder}", "val_size=null")
    data = [*(f"--data.source.{option}" for option in source), f"--data.prepare.dir={tmp_path}/prepared"]
    data.append("--data.image_size=8")
    message = refused(["fit", *task_args("vision", tmp_path), *data])
    assert re.fullmatch(
        rf"lightformer: data.source.image_folder: 1 of 8 files are not readable images: {cut} \(cut short: "
        r"image file is truncated.*\)\. Remove or replace them: every file with an image extension under a class "
        r"folder is trained on",
        message,
    ), message
    assert not list(tmp_path.rglob("*.ckpt"))  # refused at setup: nothing trained


def test_a_max_len_shorter_than_the_longest_sentence_is_refused_in_one_line_at_setup(tmp_path):
    """Known only once the data is read (the longest sentence kept): a traceback from the task's set-up before."""
    found = refused(["fit", *task_args("translation", tmp_path), "--model.net.max_len=2", "--trainer.max_steps=1"])
    assert re.fullmatch(
        r"lightformer: model.net.max_len=2 is shorter than the data's sentences: the data has sentences of up to "
        r"(\d+) positions \(at most data.batches.max_sentence_tokens\), .*; set model.net.max_len >= \1 or "
        r"data.batches.max_sentence_tokens <= 2 \(longer train pairs are dropped, val/test ids cut\)",
        found,
    ), found
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_length_multiple_below_one_or_padding_past_max_len_is_refused(tmp_path):
    """Length buckets (data.batches.length_multiple): a multiple below 1 before any data; a padded length that the
    model's position table cannot hold at set-up, naming the multiple."""
    found = refused(["fit", *task_args("translation", tmp_path / "a"), "--data.batches.length_multiple=0"])
    assert found == "lightformer: data: data.batches.length_multiple=0 must be at least 1", found
    args = ["--data.batches.length_multiple=32", "--model.net.max_len=24", "--trainer.max_steps=1"]
    found = refused(["fit", *task_args("translation", tmp_path / "b"), *args])
    assert re.fullmatch(
        r"lightformer: model.net.max_len=24 is shorter than the data's sentences: the data has sentences of up to 32 "
        r"positions once padded to a multiple of data.batches.length_multiple=32 .*; set model.net.max_len >= 32 or "
        r"data.batches.max_sentence_tokens <= 24 .*",
        found,
    ), found
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_one_class_image_folder_is_refused(tmp_path):
    from lightformer.data import ImageDataModule
    from lightformer.data.sources.images import ImageSource

    folder = image_folder(tmp_path / "images", ["cat"])
    with pytest.raises(ValueError, match=r"has 1 class folder \(cat\); classification needs at least 2"):
        ImageDataModule(source=ImageSource(dataset="image_folder", image_folder=str(folder)))


# --- checkpoint-alone commands -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "command", "message"),
    [
        ("translation", ["generate"], r"is a TranslationTask checkpoint \(use `lightformer translate`\); "),
        ("lm", ["translate", "--input=-"], r"is a LanguageModelTask checkpoint \(use `lightformer generate`\)"),
        ("lm", ["classify", "--images=x.png"], r"is a LanguageModelTask checkpoint .*needs a ImageClassificationTask"),
        ("translation", ["translate", "--beam_size=0"], r"--beam_size=0 must be at least 1 \(1 is greedy\)"),
        ("translation", ["translate", "--batch_size=0"], "--batch_size=0 must be at least 1"),
        ("lm", ["generate", "--temperature=-1"], "--temperature=-1.0 must be at least 0"),
        ("lm", ["generate", "--top_k=0"], "--top_k=0 must be at least 1"),
        ("lm", ["generate", "--top_p=1.5"], r"--top_p=1.5 must be in \(0, 1\]"),
        ("lm", ["generate", "--max_new_tokens=0"], "--max_new_tokens=0 must be at least 1"),
        ("vision", ["classify", "--images=x.png", "--top_k=0"], "--top_k=0 must be at least 1"),
        ("lm", ["export", "--output=x.safetensors", "--layout=timm"], "--layout timm applies to image classification"),
        (
            "lm",
            ["export", "--output=x.safetensors", "--layout=onnx"],
            "--layout onnx: no task has this layout; a LanguageModelTask checkpoint's: lightformer, hf",
        ),
        ("lm", ["average", "--output=x.ckpt", "--last=0"], "--last=0 must be at least 1"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_command_options_out_of_range_are_refused(trained, task, command, message, tmp_path):
    import re

    option = "--ckpt_paths" if command[0] == "average" else "--ckpt_path"
    argv = [*command, f"{option}={trained[task]}"]
    argv = [a.replace("=x.", f"={tmp_path}/x.") for a in argv]
    assert re.search(message, refused(argv))


def test_file_options_of_the_commands_name_the_missing_file_the_folder_or_the_empty_pattern(trained, tmp_path):
    vision = ["classify", f"--ckpt_path={trained['vision']}"]
    assert (
        refused([*vision, f"--images={tmp_path}/x.png"])
        == f"lightformer: --images: the image file '{tmp_path}/x.png' does not exist"
    )
    assert refused([*vision, f"--images={tmp_path}"]) == (
        f"lightformer: --images: '{tmp_path}' is a folder; name files or a glob like '{tmp_path}/*.png'"
    )
    nothing = f"{tmp_path}/*.ckpt"
    assert refused(["average", f"--ckpt_paths={nothing}", f"--output={tmp_path}/a.ckpt"]) == (
        f"lightformer: --ckpt_paths: the pattern '{nothing}' matches no checkpoint file"
    )


def test_prompt_characters_outside_the_vocabulary_are_reported(trained, capsys):
    main(["generate", f"--ckpt_path={trained['lm']}", "--prompt=It ∑é", "--max_new_tokens=3", "--seed=0"])
    captured = capsys.readouterr()
    assert "the prompt's characters '∑', 'é' are not in the model's vocabulary" in captured.err
    assert captured.out.startswith("It ∑é")


def test_translate_reports_cut_lines_and_names_a_file_that_is_not_utf8(trained, tmp_path, capsys):
    long_line = tmp_path / "long.de"
    long_line.write_text("a b c\n" + " ".join(["abcdefgh"] * 10) + "\n", encoding="utf-8")
    main(["translate", f"--ckpt_path={trained['translation']}", f"--input={long_line}", "--beam_size=1"])
    captured = capsys.readouterr()
    assert "line 2 of --input has" in captured.err  # its end of sentence counted, as the limit counts it
    assert "the model reads at most 16 (model.net.max_len), so its end is cut" in captured.err
    assert "line 1 " not in captured.err and len(captured.out.splitlines()) == 2

    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("gut\ncaf\xe9\n".encode("latin-1"))
    message = refused(["translate", f"--ckpt_path={trained['translation']}", f"--input={latin1}"])
    assert f"--input: {latin1} is not UTF-8 text: byte 0xe9 at byte offset 7 (line 2" in message


def test_translate_keeps_blank_lines_blank_and_says_so(trained, tmp_path, capsys):
    """A blank line came out as a run of repeated words (the model given nothing); now it stays blank, is not sent
    to the model, and the output stays aligned with the input."""
    source = tmp_path / "blank.de"
    source.write_text("\na b c\n   \nd e f\n\n", encoding="utf-8")
    main(["translate", f"--ckpt_path={trained['translation']}", f"--input={source}", "--beam_size=1"])
    captured = capsys.readouterr()
    assert "note: lines 1, 3, 5 of --input are blank: not translated, printed as an empty line" in captured.err
    text = tmp_path / "text.de"
    text.write_text("a b c\nd e f\n", encoding="utf-8")
    main(["translate", f"--ckpt_path={trained['translation']}", f"--input={text}", "--beam_size=1"])
    first, second = capsys.readouterr().out.split("\n")[:2]
    assert captured.out == f"\n{first}\n\n{second}\n\n"  # five lines: the blank ones blank, the others in place


# --- faults during training ------------------------------------------------------------------------------------


# --- refused in one line where a traceback, or a run that trained nothing, used to be (issue #49) -----------------

ONE_LINE_TEXT = ("It is a truth universally acknowledged that a single man in possession of a good fortune must be in "
                 "want of a wife. ") * 3  # fmt: skip


def one_line_corpus(tmp_path: Path) -> list[str]:
    """The character LM's config on a 300-character text of one line (no line break to cut a validation split at)."""
    text = tmp_path / "tiny.txt"
    text.write_text(ONE_LINE_TEXT[:300], encoding="utf-8")
    return [*LM, "--trainer.logger=false", "--data.source.corpus=null", f"--data.source.train_files=[{text}]",
            f"--data.prepare.dir={tmp_path / 'prepared'}", "--data.block_size=32", "--trainer.precision=32-true",
            f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip


def test_a_fit_that_would_train_nothing_is_refused_before_the_first_step(tmp_path):
    # Lightning ended such a fit at once with a warning ("No training batches") and exit 0, nothing trained.
    args = one_line_corpus(tmp_path)
    message = refused([*args, "--data.source.val_fraction=0.3"])
    assert re.fullmatch(
        r"lightformer: data.source.val_fraction=0.3 gives an empty val split: the training text is cut only "
        r"between line breaks, and .*tiny.txt has too few for 30% of it; give more text, the split's own files "
        r"\(data.source.val_files\), or data.source.val_fraction=0 for no val split",
        message,
    ), message
    message = refused([*args, "--data.source.val_fraction=0", "--data.source.test_fraction=0"])
    assert message == (
        "lightformer: data: the train split has 301 tokens: 9 windows of block_size + 1 = 33 tokens, fewer than one "
        "batch of data.loader.batch_size=12; lower the batch size or data.block_size, or give more training text"
    )


@pytest.mark.slow
def test_a_fit_with_no_training_batch_on_either_ddp_process_is_refused(tmp_path):
    from tiny_runs import start_cli

    args = [*one_line_corpus(tmp_path)[1:], "--config=configs/trainer/ddp_cpu.yaml", "--trainer.devices=2",
            "--data.source.val_fraction=0", "--data.source.test_fraction=0", "--data.loader.batch_size=5"]  # fmt: skip
    log = tmp_path / "log.txt"
    assert start_cli(["fit", *args], log).wait(timeout=300) != 0
    output = log.read_text()
    assert (
        "lightformer: data: the train split has 301 tokens: 9 windows of block_size + 1 = 33 tokens, 4 for each of 2 "
        "processes, fewer than one batch of data.loader.batch_size=5"
    ) in output
    assert "Traceback" not in output, output[-3000:]


def test_a_config_file_that_is_not_yaml_is_named_with_the_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("trainer:\n  max_steps: [1\nmodel: x\n", encoding="utf-8")
    for command in ("fit", "prepare", "test"):
        message = refused([command, f"--config={config}"])
        assert (
            message
            == f"lightformer: --config {config}: not valid YAML at line 3, column 6: expected ',' or ']', but got ':'"
        )
    config.write_text("- trainer\n", encoding="utf-8")
    assert "a config is a mapping of sections (trainer, model, data), not a list" in refused(["fit", "-c", str(config)])


def test_export_and_average_make_the_output_folder_and_refuse_one_they_cannot(trained, tmp_path, capsys):
    made = tmp_path / "new" / "folder" / "lm.safetensors"
    main(["export", f"--ckpt_path={trained['lm']}", f"--output={made}"])
    assert made.is_file()
    for command, output in (("export", tmp_path), ("average", tmp_path)):
        paths = f"--ckpt_path={trained['lm']}" if command == "export" else f"--ckpt_paths={trained['lm']}"
        assert refused([command, paths, f"--output={output}"]).startswith(
            f"lightformer: --output: {output} is a folder"
        )
    (tmp_path / "a_file").write_text("")
    message = refused(["export", f"--ckpt_path={trained['lm']}", f"--output={tmp_path / 'a_file' / 'x.safetensors'}"])
    assert message.startswith(f"lightformer: --output: the folder {tmp_path / 'a_file'} cannot be made (")
    assert "Traceback" not in capsys.readouterr().err


def test_testing_a_run_whose_data_has_no_test_split_is_refused_before_the_checkpoint_is_restored(tmp_path, caplog):
    args = [*task_args("lm", tmp_path), "--data.source.test_fraction=0", "--trainer.max_steps=2"]
    main(["fit", *args])
    caplog.clear()
    with caplog.at_level("INFO"):
        message = refused(["test", *args, f"--ckpt_path={last_checkpoint(tmp_path)}"])
    assert message == "lightformer: data: there is no test split: set data.source.test_files, or test_fraction above 0"
    assert "Restoring states from the checkpoint" not in caplog.text


def test_resuming_on_data_that_changed_since_the_checkpoint_is_refused_naming_the_file(tmp_path):
    args = task_args("lm", tmp_path)
    main(["fit", *args, "--trainer.max_steps=2"])
    checkpoint = last_checkpoint(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus.read_text(encoding="utf-8").replace("fortune", "fortunes"), encoding="utf-8")
    message = refused(["fit", *args, "--trainer.max_steps=4", f"--ckpt_path={checkpoint}"])
    assert message.startswith(
        f"lightformer: data: the data changed since the checkpoint was written ({corpus} changed (size or "
    )
    assert message.endswith(
        "Resume on the data it trained on (restore those files and settings), or start a new run from its weights: "
        "give the checkpoint as --model.init.checkpoint instead of --ckpt_path"
    )
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 2  # nothing trained
    validated = cli_main(["validate", *args, f"--ckpt_path={checkpoint}"])  # evaluating on other data is allowed
    assert "val/loss" in validated.trainer.callback_metrics


def test_freezing_parameters_the_model_lacks_is_refused_before_any_data_work(tmp_path):
    prepared = tmp_path / "prepared"
    message = refused([*CLASSIFY, "--trainer.logger=false", "--model.init.freeze=[bert.nope]",
                       f"--data.prepare.dir={prepared}"])  # fmt: skip
    assert message.startswith(
        "lightformer: model.init.freeze: no parameter of the model is under 'bert.nope' (its modules: bert,"
    )
    assert not prepared.exists()


def test_a_resume_into_the_warm_up_says_which_steps_still_warm_up(tmp_path):
    args = [*task_args("vision", tmp_path), "--trainer.limit_train_batches=3", "--model.optimizer.warmup_steps=10"]
    first = build([*args, "--trainer.max_epochs=1"])
    first.trainer.fit(first.model, first.datamodule)
    longer = build([*args, "--trainer.max_epochs=5"])
    with pytest.warns(UserWarning, match=r"planned for 3 steps .* goes to 15 steps, so steps 3\.\.10 still warm up, "
                                         r"then steps 10\.\.15 run at min_lr="):  # fmt: skip
        longer.trainer.fit(longer.model, longer.datamodule, ckpt_path=last_checkpoint(tmp_path))


@pytest.mark.parametrize(
    ("error", "ours", "message"),
    [
        (KeyError("an internal inconsistency"), True, "the error above is a bug in lightformer, not in your config or "
                                                      "data: please report it with the command line and this output"),
        (torch.OutOfMemoryError("CUDA out of memory"), False, "the device ran out of memory: lower data.loader."),
    ],
)  # fmt: skip
def test_an_error_of_ours_keeps_its_traceback_and_asks_for_a_report(monkeypatch, capsys, error, ours, message):
    import lightformer.cli.main

    def fail(args):
        raise error

    monkeypatch.setattr(lightformer.cli.main, "cli_main", fail)
    assert refused(["fit", "--config=configs/lm/austen_char.yaml"]).startswith(f"lightformer: {message}")
    assert ("Traceback" in capsys.readouterr().err) == ours


def test_last_ckpt_is_the_last_state_even_when_the_metric_never_improves(tmp_path):
    """The issue's reproducer: 4 epochs at a learning rate too small to move the metric; last.ckpt at the end."""
    args = [
        *task_args("vision", tmp_path),
        "--trainer.max_epochs=4",
        "--trainer.limit_train_batches=3",
        "--model.optimizer.lr=1e-9",
        "--model.optimizer.min_lr=1e-10",
    ]
    cli = build(args)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert torch.load(last_checkpoint(tmp_path), weights_only=True)["global_step"] == 12
    best = [c for c in cli.trainer.checkpoint_callbacks if c.monitor][0]
    assert torch.load(best.best_model_path, weights_only=True)["global_step"] < 12  # the metric did not improve
    # a config without checkpoint callbacks gets one that writes last.ckpt
    default = cli_main([*task_args("vision", tmp_path / "default"), "--trainer.callbacks=[]"], run=False)
    (checkpoint,) = default.trainer.checkpoint_callbacks
    assert isinstance(checkpoint, callbacks.ModelCheckpoint) and checkpoint.save_last
    # and a config with checkpoint callbacks runs without any when checkpointing is turned off
    off = cli_main([*task_args("vision", tmp_path / "off"), "--trainer.enable_checkpointing=false"], run=False)
    assert off.trainer.checkpoint_callbacks == []


def test_a_resumed_longer_run_keeps_its_schedule_and_says_so(tmp_path):
    args = [*task_args("vision", tmp_path), "--trainer.limit_train_batches=3", "--model.optimizer.warmup_steps=2"]
    first = build([*args, "--trainer.max_epochs=2"])
    first.trainer.fit(first.model, first.datamodule)
    longer = build([*args, "--trainer.max_epochs=4"])
    with pytest.warns(
        UserWarning, match=r"schedule was planned for 6 steps .* this run goes to 12 steps, so steps 6\.\.12"
    ):
        longer.trainer.fit(longer.model, longer.datamodule, ckpt_path=last_checkpoint(tmp_path))
    lr = longer.trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == pytest.approx(first.model.optimizer_config.min_lr)  # no jump back up


def test_an_orphaned_temporary_file_is_removed_at_the_next_start(tmp_path):
    cli = build([*task_args("vision", tmp_path), "--trainer.max_steps=2"])
    cli.trainer.fit(cli.model, cli.datamodule)
    folder = Path(last_checkpoint(tmp_path)).parent
    orphan = folder / ".last.ckpt.k1ll3d.tmp"  # what atomic_open leaves when the process is killed mid-write
    orphan.write_bytes(b"half a checkpoint")
    resumed = build([*task_args("vision", tmp_path), "--trainer.max_steps=4"])
    resumed.trainer.fit(resumed.model, resumed.datamodule, ckpt_path=last_checkpoint(tmp_path))
    assert not orphan.exists() and not list(folder.glob(".*.tmp"))


def test_non_finite_weights_are_caught_before_validation_with_the_step_and_checkpoint(tmp_path):
    class BreakWeights(callbacks.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                with torch.no_grad():
                    next(pl_module.model.parameters()).fill_(float("nan"))

    cli = build([*task_args("lm", tmp_path), "--trainer.max_steps=6", "--trainer.val_check_interval=3"], BreakWeights())
    with pytest.raises(NonFiniteLossError, match=r"parameters became non-finite by global step 3 \(model\.embed"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_a_non_finite_validation_loss_stops_before_sampling(tmp_path, monkeypatch):
    """A model whose outputs turn non-finite at the second validation: stopped there, before text is sampled from
    it (which failed inside torch.multinomial), naming the step and the checkpoint of the first validation."""
    args = [*task_args("lm", tmp_path), "--trainer.max_steps=4", "--trainer.val_check_interval=2"]
    cli = build([*args, "--trainer.num_sanity_val_steps=0"])
    compute, calls = cli.model.val_loss.compute, []
    monkeypatch.setattr(cli.model.val_loss, "compute", lambda: compute() if calls.append(1) or len(calls) < 2 else
                        torch.tensor(float("nan")))  # fmt: skip
    with pytest.raises(NonFiniteLossError, match=r"val/loss is nan at global step 4 .* checkpoint is .*last\.ckpt"):
        cli.trainer.fit(cli.model, cli.datamodule)


def test_an_unwritable_or_full_checkpoint_folder_is_refused_before_training(tmp_path, monkeypatch):
    cli = build([*task_args("vision", tmp_path / "read-only"), "--trainer.max_steps=2"])
    monkeypatch.setattr(callbacks.os, "access", lambda path, mode: False)  # as a read-only folder answers
    with pytest.raises(Exception, match=r"not writable.*read-only|read-only.*not writable"):  # config.yaml, checkpoints
        cli.trainer.fit(cli.model, cli.datamodule)
    with pytest.raises(OSError, match=r"cannot write checkpoints to .*checkpoints: .*read-only.* is not writable"):
        callbacks.check_checkpoint_folder(tmp_path / "read-only" / "checkpoints", cli.model)
    assert cli.trainer.global_step == 0
    monkeypatch.undo()

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(callbacks.shutil, "disk_usage", lambda path: usage._replace(free=1024))
    cli = build([*task_args("vision", tmp_path / "full"), "--trainer.max_steps=2"])
    with pytest.raises(OSError, match=r"disk full: .* has 0 MiB free, and checkpoints of this model need about"):
        cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 0


def test_a_save_that_fills_the_disk_says_so_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    cli = build([*task_args("vision", tmp_path), "--trainer.max_steps=2"])
    cli.trainer.fit(cli.model, cli.datamodule)
    path = Path(last_checkpoint(tmp_path))
    before = path.read_bytes()

    def full_disk(checkpoint, f):  # what torch's zip writer raises when the disk fills up
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file")

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(callbacks.torch, "save", full_disk)
    monkeypatch.setattr(callbacks.shutil, "disk_usage", lambda p: usage._replace(free=0))
    with pytest.raises(OSError, match=rf"disk full: the checkpoint {path} could not be written .* previous checkpoint"):
        callbacks.AtomicCheckpointIO().save_checkpoint({"x": 1}, path)
    assert path.read_bytes() == before and not list(path.parent.glob(".*.tmp"))


def test_atomic_writes_leave_the_previous_file_when_interrupted(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as f:
        f.write(b"new but unfinished")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["file.bin"]


# --- training text and tokenizer files: the message names the file, not only what a library said ------------------


@pytest.mark.parametrize(
    ("content", "option", "message"),
    [
        ("hello world\n".encode("utf-16") * 50, None, r"utf16\.txt is not UTF-8 text: byte 0xff at byte offset 0"),
        (bytes(range(256)) * 4, None, r"utf16\.txt is not UTF-8 text: byte 0x80 at byte offset 128"),
        (b"some text\n" * 50, "tokenizer", r"tokenizer file .*tok\.json is not a valid tokenizer JSON"),
    ],
    ids=["utf-16", "binary", "tokenizer-not-json"],
)
def test_text_a_library_cannot_read_is_refused_naming_the_file(tmp_path, content, option, message):
    import re

    corpus = tmp_path / "utf16.txt"
    corpus.write_bytes(content)
    (tmp_path / "tok.json").write_text("not json at all", encoding="utf-8")
    argv = [
        *LM,
        "--data.source.corpus",  # two words: the same option as --data.source.corpus=null
        "null",
        f"--data.source.train_files=[{corpus}]",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        "--trainer.logger=false",
    ]
    if option == "tokenizer":
        argv.append(f"--data.tokenizer.file={tmp_path / 'tok.json'}")
    found = refused(argv)
    assert re.search(message, found), found


# --- model.init: a start from weights that do not fit, refused before any data work ----------------------------------


def masked_lm_checkpoint(path: Path) -> str:
    """A masked-LM run's checkpoint as its task writes it: a ``BertForPreTraining`` under ``model.``."""
    from lightformer.models.bert import BertConfig, BertForPreTraining

    model = BertForPreTraining(BertConfig(vocab_size=300, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_len=16))
    torch.save({"state_dict": {f"model.{name}": value for name, value in model.state_dict().items()}}, path)
    return str(path)


def classifier_export(path: Path, d_model: int = 32, num_classes: int = 2) -> str:
    """A text classifier's weights as ``lightformer export`` writes them (safetensors)."""
    from safetensors.torch import save_file

    from lightformer.models.bert import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=300, n_layers=1, d_model=d_model, n_heads=2, d_ff=64, max_len=16)
    model = BertForSequenceClassification(dataclasses.replace(config, num_classes=num_classes))
    save_file({name: value.contiguous() for name, value in model.state_dict().items()}, path)
    return str(path)


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ([], r"model.init.checkpoint .*mlm\.ckpt: no tensor of it fits this model, so the run would start from "
             r"scratch \(loaded 0 tensors; new \d+ \(decoder.*; dropped \d+ \(bert.*\)\)\. Start from a checkpoint "
             r"of this kind of model .* or set model.init.strict=false"),
        (["--model.init.checkpoint=MISSING"], r"model.init.checkpoint: the file '.*missing\.ckpt' does not exist"),
        (["--model.init.skip=[bert.nope]"], r"model.init.skip: no weight of .*mlm\.ckpt is under 'bert.nope' \(its "
                                            r"modules: bert, bert.encoder.layers.0"),
        (["--model.init.freeze=[encder]"], r"model.init.freeze: no parameter of the model is under 'encder' \(its "
                                           r"modules: decoder"),
    ],
    ids=["loads nothing", "missing file", "skip matches nothing", "freeze matches nothing"],
)  # fmt: skip
def test_a_start_from_weights_that_do_not_fit_is_refused_before_any_data_work(tmp_path, init, message):
    """T5 from a masked-LM run's checkpoint loaded nothing and trained from scratch, exit 0; a missing file or a
    pattern matching nothing was found after the data was read and a tokenizer trained."""
    import re

    checkpoint = masked_lm_checkpoint(tmp_path / "mlm.ckpt")
    init = [arg.replace("MISSING", str(tmp_path / "missing.ckpt")) for arg in init]
    prepared = tmp_path / "prepared"
    found = refused([*T5, f"--model.init.checkpoint={checkpoint}", *init, f"--data.prepare.dir={prepared}"])
    assert re.search(message, found), found
    assert not prepared.exists()


def test_a_start_that_leaves_tensors_fresh_for_their_shape_is_refused_unless_asked_for(tmp_path):
    """A classifier of d_model 32 from a d_model-64 export loaded 1 tensor and dropped the others for their shapes,
    exit 0. Refused now, naming a tensor and both shapes; a head of another number of classes is fine when
    init.skip names it, and any start when init.strict is off. Tensors the model has no place for (a masked-LM
    head) and parameters the checkpoint lacks (a new classifier) are normal."""
    from lightformer.errors import ConfigError
    from lightformer.io.checkpoints import InitConfig
    from lightformer.models.bert import BertConfig
    from lightformer.tasks import TextClassificationTask

    wider = classifier_export(tmp_path / "wide.safetensors", d_model=64)
    message = refused(["fit", *task_args("classify", tmp_path), f"--model.init.checkpoint={wider}"])
    expected = (
        r"wide\.safetensors: \d+ of its tensors have another shape than this model's, so those parameters would stay "
        r"fresh \(e.g. bert\.\S+: \[\d+, 64\] in the checkpoint, \[\d+, 32\] in the model; loaded \d+ tensors; "
        r"new \d+ \(bert.*; dropped \d+ \(.*\), \d+ of them for their shape\)\. Build the model with the "
        r"checkpoint's sizes \(model\.net\)"
    )
    assert re.search(expected, message), message

    def task(init: InitConfig) -> TextClassificationTask:
        net = BertConfig(vocab_size=300, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_len=16, num_classes=3)
        return TextClassificationTask(net=net, init=init)

    two_classes = classifier_export(tmp_path / "two.safetensors")
    head = (
        r"e.g. classifier.weight: \[2, 32\] in the checkpoint, \[3, 32\] in the model.* model.init.skip=\[classifier\],"
    )
    with pytest.raises(ConfigError, match=head + " or set model.init.strict=false"):
        task(InitConfig(checkpoint=two_classes)).check_init(starting=True)
    started = task(InitConfig(checkpoint=two_classes))  # outside the command line: checked when the fit starts
    started._trainer = SimpleNamespace(ckpt_path=None, datamodule=None)
    started.setup("fit")  # loads what fits; a task's own checks of the data follow (another tokenizer, classes)
    with pytest.raises(ConfigError, match=head):
        started.on_fit_start()
    task(InitConfig(checkpoint=two_classes, skip=("classifier",))).check_init(starting=True)
    task(InitConfig(checkpoint=two_classes, strict=False)).check_init(starting=True)
    task(InitConfig(checkpoint=wider, strict=False)).check_init(starting=True)
    task(InitConfig(checkpoint=masked_lm_checkpoint(tmp_path / "mlm.ckpt"))).check_init(starting=True)
    task(InitConfig(checkpoint=str(tmp_path / "gone.ckpt"))).check_init(starting=False)  # resuming: not read


# --- checkpoint files: missing, cut short, or not a checkpoint, named before anything is built -----------------------


@pytest.mark.parametrize(
    ("command", "content", "message"),
    [
        ("fit", None, r"--ckpt_path: the checkpoint file '.*given\.ckpt' does not exist"),
        ("test", None, r"--ckpt_path: the checkpoint file '.*given\.ckpt' does not exist"),
        ("fit", "truncated", r"--ckpt_path: .*given\.ckpt is not a readable lightformer checkpoint \(.+\)$"),
        ("validate", "truncated", r"--ckpt_path: .*given\.ckpt is not a readable lightformer checkpoint \(.+\)$"),
        ("test", b"step,loss\n1,2.5\n", r"--ckpt_path: .*given\.ckpt is not a readable lightformer checkpoint"),
        ("validate", "weights", r"--ckpt_path: .*given\.ckpt holds no state_dict, so it is not a checkpoint of a run "
                                r"\(to start from weights alone, give them as --model.init.checkpoint\)"),
    ],
)  # fmt: skip
def test_a_checkpoint_file_that_is_missing_cut_short_or_not_one_is_named(tmp_path, command, content, message):
    """A torch traceback that did not name the file (a missing one gave a message about in_channels)."""
    import re

    given = tmp_path / "given.ckpt"
    if content in ("truncated", "weights"):
        torch.save({"state_dict": {"w": torch.zeros(1000)}} if content == "truncated" else {"w": torch.zeros(3)}, given)
        if content == "truncated":
            given.write_bytes(given.read_bytes()[:2000])
    elif content is not None:
        given.write_bytes(content)
    found = refused([command, "--config=configs/lm/austen_char.yaml", f"--ckpt_path={given}"])
    assert "\n" not in found and re.search(message, found), found


# --- a run folder is written by one fit at a time ----------------------------------------------------------------


def test_a_run_folder_held_by_a_live_fit_is_refused_and_a_stale_lock_is_replaced(tmp_path):
    """Two fits into one run folder both exited 0, leaving two event files, last.ckpt and last-v1.ckpt and one
    config.yaml describing only one of them."""
    import socket
    import subprocess

    args = [*task_args("vision", tmp_path), "--trainer.logger.init_args.version=0", "--trainer.max_steps=1"]
    folder = tmp_path / "runs" / "vit_digits" / "version_0"
    folder.mkdir(parents=True)
    lock = folder / "run.lock"
    lock.write_text(f"{socket.gethostname()} {os.getpid()}\n")  # a live process: this one
    assert refused(["fit", *args]) == (
        f"lightformer: the run folder {folder} is in use by another fit (process {os.getpid()} on "
        f"{socket.gethostname()}, which holds {lock}): give this run a folder of its own (another "
        "--trainer.logger.init_args.version, or none for the next free one), or wait for that run to end (if it "
        f"ended without removing {lock}, remove it)"
    )
    assert sorted(p.name for p in folder.iterdir()) == ["run.lock"]  # nothing written there
    lock.write_text("node7 1234\n")  # another node's, on a shared file system: its process cannot be seen from here
    assert "(process 1234 on node7, which holds" in refused(["fit", *args])

    gone = subprocess.Popen(["true"])
    gone.wait()
    lock.write_text(f"{socket.gethostname()} {gone.pid}\n")  # a killed run's

    class Holder(callbacks.Callback):
        def on_train_start(self, trainer, pl_module):
            self.lock = lock.read_text()

    holder = Holder()
    cli = build([*args, "--trainer.limit_val_batches=1"], holder)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert holder.lock == f"{socket.gethostname()} {os.getpid()}\n" and not lock.exists()  # taken, then released
    lock.write_text(f"{socket.gethostname()} {os.getpid()}\n")
    cli.trainer.test(cli.model, cli.datamodule)  # test (and validate) write beside a run: no lock taken


# --- data the config names (issue #49) ---


def text_data(command: str, corpus: Path, tmp_path: Path, *more: str) -> list[str]:
    """``fit`` (or ``prepare``) of the character LM on ``corpus``, prepared under ``tmp_path/prepared``."""
    options = ["--data.source.corpus", "null", f"--data.source.train_files=[{corpus}]", "--trainer.logger=false"]
    return [command, *LM[1:], *options, f"--data.prepare.dir={tmp_path / 'prepared'}", *more]


def assert_one_line(message: str, capsys) -> None:
    assert "\n" not in message, message
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["prepare", "fit"])
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_text_column_of_numbers_is_refused_naming_the_file_the_column_and_its_type(tmp_path, command, kind, capsys):
    """Integers in the text column: "TypeError: 'int' object is not iterable" from the tokenizer, naming neither
    the file nor the column; and the refused preparation left an empty folder and a .lock under prepare.dir."""
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        corpus = tmp_path / "numbers.parquet"
        pq.write_table(pa.table({"text": list(range(50)), "title": [f"t{i}" for i in range(50)]}), corpus)
        expected = (
            rf"{corpus}: the column 'text' holds int64 values, but the text must be strings; set "
            r"data.source.text_field to a column of strings \(its columns: text: int64, title: string\)"
        )
    else:
        import json

        corpus = tmp_path / "numbers.jsonl"
        corpus.write_text("".join(json.dumps({"text": i, "title": f"t{i}"}) + "\n" for i in range(50)))
        expected = (
            rf"{corpus}: the record at byte offset 0 has a number in its text field 'text', not a string; set "
            r"data.source.text_field to the field that holds the text \(its fields: \['text', 'title'\]\)"
        )
    message = refused(text_data(command, corpus, tmp_path))
    assert re.search(expected, message), message
    assert_one_line(message, capsys)
    assert list((tmp_path / "prepared").iterdir()) == []  # nothing left behind: no half-made folder, no .lock


def test_an_object_store_without_credentials_is_refused_naming_prepare_dir(tmp_path, monkeypatch, capsys):
    """botocore's NoCredentialsError traceback, naming neither data.prepare.dir nor the bucket."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no wait for a cloud machine's credentials service
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world\n" * 50, encoding="utf-8")
    store = ["--data.prepare.dir=s3://nonexistent-bucket/x", f"--data.prepare.cache_dir={tmp_path / 'cache'}"]
    for command in ("prepare", "fit"):
        message = refused(text_data(command, corpus, tmp_path, *store))
        assert re.search(
            r"data.prepare.dir='s3://nonexistent-bucket/x': the bucket nonexistent-bucket cannot be used \(Unable to "
            r"locate credentials\): give credentials that may read and write it \(AWS_ACCESS_KEY_ID and "
            r"AWS_SECRET_ACCESS_KEY, or "
            r"AWS_PROFILE and ~/.aws/credentials; AWS_ENDPOINT_URL for an S3-compatible store\), or a local folder "
            r"as data.prepare.dir$",
            message,
        ), message
        assert_one_line(message, capsys)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "prepared").exists()


@pytest.mark.parametrize(("task", "damage"), [("lm", "cut short"), ("lm", "missing"), ("translation", "cut short")])
def test_a_damaged_prepared_shard_is_refused_at_setup_in_one_line(tmp_path, task, damage, capsys):
    """A shard cut short or deleted: a good message, but inside a traceback from train_dataloader (a ValueError
    raised in trainer.fit, which main let through)."""
    args = [*task_args(task, tmp_path), "--trainer.max_steps=1"]
    main(["prepare", *args])
    folder = re.search(r"prepared: (\S+)", capsys.readouterr().out).group(1)
    (shard, *_) = sorted(Path(folder).glob("train/chunk-*.bin"))
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:100])
    message = refused(["fit", *args])
    state = "missing" if damage == "missing" else r"cut short \(100 bytes\)"
    assert re.search(
        rf"the shard {shard} is {state}: delete {folder} and prepare again \(`lightformer prepare`, or any `fit`\)$",
        message,
    ), message
    assert_one_line(message, capsys)
    assert not list(tmp_path.rglob("*.ckpt"))  # refused at set-up: nothing trained


@pytest.mark.parametrize("content", ["nothing", "files that are not images"])
def test_an_image_folder_without_images_is_refused_in_one_line(tmp_path, content, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    if content != "nothing":
        for name in ("cat", "dog"):
            (folder / name).mkdir()
            (folder / name / "notes.txt").write_text("not an image")
    source = [f"--data.source.{option}" for option in ("dataset=image_folder", f"image_folder={folder}")]
    message = refused(["fit", *task_args("vision", tmp_path), *source, f"--data.prepare.dir={tmp_path}/prepared"])
    expected = (
        rf"data.source.image_folder: {folder} has no class subfolders; expected a folder holding train/"
        if content == "nothing"
        else rf"data.source.image_folder: no image files \(\.jpg, .*\) in {folder}: put each class's images in a "
        r"subfolder named after the class"
    )
    assert re.search(expected, message), message
    assert_one_line(message, capsys)
    assert not (tmp_path / "prepared").exists() or list((tmp_path / "prepared").iterdir()) == []


@pytest.fixture(scope="module")
def image_gpt(tmp_path_factory) -> str:
    """A checkpoint of the tiny Image GPT run (one step)."""
    folder = tmp_path_factory.mktemp("igpt")
    cli = build([*task_args("igpt", folder), "--trainer.max_steps=1", "--trainer.limit_val_batches=1"])
    cli.trainer.fit(cli.model, cli.datamodule)
    return last_checkpoint(folder)


def test_an_image_file_that_is_not_an_image_is_refused_by_classify_and_sample_images(
    trained, image_gpt, tmp_path, capsys
):
    """classify and sample-images printed the right last line after a traceback."""
    not_image = tmp_path / "notimage.png"
    not_image.write_text("not pixels")
    for argv in (
        ["classify", f"--ckpt_path={trained['vision']}", f"--images={not_image}"],
        ["sample-images", f"--ckpt_path={image_gpt}", f"--complete_from={not_image}", "--num_samples=0",
         f"--output={tmp_path}/samples.png"],
    ):  # fmt: skip
        option = argv[2].partition("=")[0]
        message = refused(argv)
        assert message == (
            f"lightformer: {option}: {not_image} is not a readable image file (cannot identify image file "
            f"'{not_image}'): give PNG, JPEG or another image file that PIL reads"
        ), message
        assert_one_line(message, capsys)
    assert not list(tmp_path.glob("samples*"))


def test_text_in_utf16_is_refused_with_the_conversion_from_utf16(tmp_path, capsys):
    """The refusal of a UTF-16 file suggested `iconv -f latin1`; a Latin-1 file keeps that hint."""
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("hello world\n".encode("utf-16") * 50)
    message = refused(text_data("prepare", utf16, tmp_path))
    assert re.search(
        rf"{utf16} is not UTF-8 text: byte 0xff at byte offset 0 \(invalid start byte\); it looks like UTF-16 \(a "
        r"byte-order mark, or NUL bytes between the characters\): convert it, e.g. `iconv -f utf-16 -t utf-8`$",
        message,
    ), message
    assert_one_line(message, capsys)
    assert list((tmp_path / "prepared").iterdir()) == []
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    assert refused(text_data("prepare", latin1, tmp_path)).endswith("convert it, e.g. `iconv -f latin1 -t utf-8`")


def test_what_a_class_refuses_as_it_is_built_is_named_with_its_section(tmp_path):
    """The section comes from what was being built (the data module, then the task), not from reading the frames of
    a traceback: jsonargparse's report of the error is left out, the class's own message kept."""
    assert refused(["fit", *task_args("mlm", tmp_path), "--model.nsp_weight=-1"]) == (
        "lightformer: model: nsp_weight=-1.0 must be at least 0"
    )
    assert refused(["fit", *task_args("lm", tmp_path), "--data.block_size=0"]) == (
        "lightformer: data: data.block_size=0 must be at least 1"
    )


# --- issue 73: nothing silent, nothing called our bug that is not -----------------------------------------------

OLD = Path(__file__).parent / "data" / "old_checkpoints"  # small checkpoints of each task, committed


def run_lightformer(*args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """``python -m lightformer ARGS`` as a user runs it (bytes arguments as a shell passes them)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lightformer", *args], input=stdin, capture_output=True, env=env,
                          timeout=300, check=False)  # fmt: skip


def test_read_where_no_image_could_be_read_fails_naming_each(tmp_path, monkeypatch, capsys):
    """Before: two empty lines and exit status 0, the reasons only on standard error."""
    from lightformer.tasks import image_text
    from test_image_text import synthetic_line, synthetic_task

    monkeypatch.setattr(image_text, "load_task", lambda *args: synthetic_task(16, 128, []))
    Image.new("L", (300, 32), 255).save(tmp_path / "empty.png")
    (tmp_path / "notimage.png").write_text("not pixels")
    images = [f"{tmp_path}/empty.png", f"{tmp_path}/notimage.png"]
    for batch_size in (1, 2):
        message = refused(["read", "--ckpt_path=any.ckpt", "--images", *images, f"--batch_size={batch_size}"])
        assert message.startswith(
            f"lightformer: --images: none of the 2 images could be read: {tmp_path}/empty.png is blank (every pixel "
            f"has one value): it holds nothing to read; {tmp_path}/notimage.png is not a readable image file"
        ), message
        assert capsys.readouterr().out == ""
    synthetic_line("abc").save(tmp_path / "good.png")  # one good image among them: read, the others empty lines
    main(["read", "--ckpt_path=any.ckpt", "--images", *images, f"{tmp_path}/good.png", "--batch_size=1"])
    captured = capsys.readouterr()
    assert captured.out == "\n\nabc\n"
    assert f"read: {tmp_path}/empty.png: " in captured.err and f"read: {tmp_path}/notimage.png: " in captured.err


def test_classify_answers_the_readable_images_in_order_and_names_the_others(trained, tmp_path, capsys):
    """Before: one unreadable image refused the whole call, where read answered the others."""
    good = tmp_path / "good.png"
    Image.new("L", (8, 8), 100).save(good)
    bad = tmp_path / "bad.png"
    bad.write_text("not pixels")
    main(["classify", f"--ckpt_path={trained['vision']}", "--images", str(good), str(bad), str(good)])
    captured = capsys.readouterr()
    assert [line.partition(":")[0] for line in captured.out.splitlines()] == [str(good), str(good)]
    assert captured.err.strip() == (
        f"classify: {bad}: {bad} is not a readable image file (cannot identify image file '{bad}'): give PNG, JPEG or "
        "another image file that PIL reads"
    )
    message = refused(["classify", f"--ckpt_path={trained['vision']}", "--images", str(bad), str(bad)])
    assert message.startswith(f"lightformer: --images: none of the 2 images could be read: {bad} is not a readable")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA has a CUDA device")
def test_a_device_this_machine_lacks_is_refused_naming_the_ones_it_has(capsys):
    """Before: read --device cuda printed torch's "Attempting to deserialize object on a CUDA device" traceback."""
    for command in (["generate", f"--ckpt_path={OLD / 'lm.ckpt'}"], ["classify", f"--ckpt_path={OLD / 'vision.ckpt'}",
                    f"--images={OLD / 'corpus.txt'}"]):  # fmt: skip
        message = refused([*command, "--device=cuda"])
        assert message == (
            "lightformer: --device=cuda: no CUDA device is available on this machine; the devices here: cpu"
        )
    assert refused(["generate", f"--ckpt_path={OLD / 'lm.ckpt'}", "--device=gpu"]).startswith(
        "lightformer: --device='gpu' is not a device: give cpu, cuda, cuda:1, mps, ... (here: cpu"
    )
    assert_one_line("lightformer: ", capsys)


def test_text_that_is_not_utf8_on_the_command_line_or_standard_input_is_named_with_its_byte():
    """Before: `TypeError: TextInputSequence must be str` and "a bug in lightformer" for each of these."""
    latin1 = "caf\xe9 au lait".encode("latin-1")
    for args, stdin, option in (
        (["generate", f"--ckpt_path={OLD / 'lm.ckpt'}", b"--prompt=" + latin1], b"", "--prompt"),
        (["fill-mask", f"--ckpt_path={OLD / 'mlm.ckpt'}", b"--text=" + latin1 + b" [MASK]"], b"", "--text"),
        (["translate", f"--ckpt_path={OLD / 'translation.ckpt'}"], b"gut\n" + latin1 + b"\n", "standard input"),
    ):
        done = run_lightformer(*args, stdin=stdin)
        where = "at byte offset 3 (line 1" if stdin == b"" else "at byte offset 7 (line 2"
        assert done.returncode == 1 and done.stderr.decode().strip() == (
            f"lightformer: {option} is not UTF-8 text: byte 0xe9 {where}: invalid continuation byte); convert it, "
            "e.g. `iconv -f latin1 -t utf-8`"
        ), done.stderr.decode()


def test_fill_mask_never_offers_a_special_token_for_a_word(capsys):
    """Before: `<extra_id_93>`, ... were among the candidates for a word."""
    main(["fill-mask", f"--ckpt_path={OLD / 'mlm.ckpt'}", "--text=It is a truth universally [MASK].", "--top_k=10000"])
    offered = capsys.readouterr().out.splitlines()[-1]
    assert "'e'" in offered and not re.search(r"'(<extra_id_\d+>|<pad>|<bos>|<eos>|<unk>|<mask>|\[MASK\])'", offered)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A language model exported as a Hugging Face folder (the committed tiny checkpoint's)."""
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    main(["export", f"--ckpt_path={OLD / 'lm.ckpt'}", "--layout=hf", f"--output={folder}"])
    return folder


def test_a_start_folder_that_cannot_be_loaded_says_what_it_lacks_and_a_cut_short_file_is_named(hf_folder, tmp_path):
    """Before: a folder without config.json was "the file ... is a folder"; a cut-short model.safetensors ended in
    `SafetensorError: ... incomplete metadata` and "a bug in lightformer"; config.json's vocab_size 92 against
    weights of 85 rows was accepted without a word."""
    args = task_args("lm", tmp_path / "run")
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    shutil.copy(hf_folder / "model.safetensors", no_config)
    assert refused(["fit", *args, f"--model.init.checkpoint={no_config}"]) == (
        f"lightformer: model.init.checkpoint: the folder '{no_config}' has no config.json, so it cannot be loaded: a "
        "Hugging Face model folder holds config.json and its weights (model.safetensors, or "
        "model.safetensors.index.json with its shards, or pytorch_model.bin); or give a checkpoint file (.ckpt, "
        ".safetensors)"
    )
    start = [f"--data.tokenizer.file={hf_folder / 'tokenizer.json'}", "--trainer.max_steps=1"]
    cut = tmp_path / "cut"
    shutil.copytree(hf_folder, cut)
    size = (hf_folder / "model.safetensors").stat().st_size
    for kept in (size - 100, 20, 4):
        (cut / "model.safetensors").write_bytes((hf_folder / "model.safetensors").read_bytes()[:kept])
        message = refused(["fit", *args, f"--model.init.checkpoint={cut}", *start])
        assert re.fullmatch(
            rf"lightformer: model.init.checkpoint: {cut}/model.safetensors is cut short: .*; download or copy it again",
            message,
        ), message
    (tmp_path / "cut.safetensors").write_bytes((hf_folder / "model.safetensors").read_bytes()[: size // 2])
    assert "cut.safetensors is cut short" in refused(
        ["fit", *args, f"--model.init.checkpoint={tmp_path}/cut.safetensors"]
    )

    vocab = tmp_path / "vocab"
    shutil.copytree(hf_folder, vocab)
    config = (vocab / "config.json").read_text()
    (vocab / "config.json").write_text(re.sub(r'"vocab_size": \d+', '"vocab_size": 92', config))
    assert refused(["fit", *args, f"--model.init.checkpoint={vocab}", *start]) == (
        f"lightformer: model.init.checkpoint: {vocab}: config.json says vocab_size=92, but its weights' embedding "
        "table transformer.wte.weight has 30 rows: the folder's config and weights do not belong together; set "
        "vocab_size to 30 in config.json if these weights are the ones meant, or give the folder its own weights"
    )


def test_a_checkpoint_write_stopped_by_a_file_size_limit_says_so(tmp_path):
    """Before: `ulimit -f` at the first save ended in `RuntimeError: [enforce fail at inline_container.cc:672]
    unexpected pos ...` and "a bug in lightformer"."""
    path = tmp_path / "last.ckpt"
    script = (
        "import resource, sys, torch\n"
        "from lightformer.training.callbacks import AtomicCheckpointIO\n"
        "from lightformer.errors import raise_as_bug\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))\n"
        "try:\n"
        f"    AtomicCheckpointIO().save_checkpoint({{'w': torch.zeros(100_000)}}, {str(path)!r})\n"
        "except OSError as error:\n"
        "    sys.exit(error.strerror)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and done.stderr.startswith(
        f"the checkpoint {path} could not be written: the file system stopped the write, as this process may write "
        "files of at most 100,000 bytes (`ulimit -f`; "
    ), done.stderr
    assert "no half-written file is left" in done.stderr and list(tmp_path.iterdir()) == []


def test_the_advice_on_a_non_finite_loss_follows_the_runs_settings(tmp_path):
    """Before: it advised gradient_clip_val when set, leaving 16-mixed in a bf16-mixed run, and resuming with
    --ckpt_path when no checkpoint existed."""

    def trainer(clip, precision, last=None):
        checkpoint = SimpleNamespace(last_model_path=last, best_model_path="", best_k_models={})
        return SimpleNamespace(gradient_clip_val=clip, precision=precision, checkpoint_callbacks=[checkpoint])

    advice = callbacks.non_finite_advice(trainer(1.0, "bf16-mixed"))
    assert advice == (
        "No checkpoint was written before this step, so there is nothing to resume: start the run again and lower "
        "trainer.gradient_clip_val (now 1.0), or train in 32-true instead of bf16-mixed, or lower "
        "model.optimizer.lr (or lengthen its warmup_steps)."
    )
    last = tmp_path / "last.ckpt"
    last.write_bytes(b"x")
    advice = callbacks.non_finite_advice(trainer(None, "16-mixed", str(last)))
    assert advice == (
        f"The last good checkpoint is {last}. To continue, resume with --ckpt_path {last} and set "
        "trainer.gradient_clip_val (e.g. 1.0) or train in bf16-mixed or 32-true instead of 16-mixed; for a lower "
        "model.optimizer.lr, start a new run from that checkpoint's weights (--model.init.checkpoint)."
    )
    assert "precision" not in callbacks.non_finite_advice(trainer(0.5, "32-true")) and "32-true" not in (
        callbacks.non_finite_advice(trainer(0.5, "32-true"))
    )


def test_a_loaded_tokenizer_that_lacks_the_datas_characters_is_refused_or_warned_with_counts(tmp_path):
    """Before: a start's 81-token tokenizer encoded `_` (2,868 times), `X`, `Z` and `£` of Austen as <unk> silently."""
    from lightformer.tokenization.text import Tokenizer
    from tiny_runs import CORPUS

    file = Tokenizer.train_char([CORPUS.replace("e", "").replace(",", "")]).save(tmp_path / "tokenizer.json")
    args = [*task_args("lm", tmp_path), f"--data.tokenizer.file={file}"]
    message = refused(["prepare", *args])
    assert message == (
        f"lightformer: data.tokenizer.file: the tokenizer {file} lacks 2 of the data's characters, which it encodes "
        "as <unk>: 'e' (180 times), ',' (30 times); 7.69% of the 2,730 characters read, more than "
        "data.tokenizer.max_unknown=0.001 allows. Give a tokenizer that has them, or train one on this data "
        "(data.tokenizer.file=null), or raise data.tokenizer.max_unknown to train with them as <unk>"
    )
    assert not list((tmp_path / "prepared").glob("corpus-*/train"))
    with pytest.warns(UserWarning) as warned:
        main(["prepare", *args, "--data.tokenizer.max_unknown=0.1"])
    assert any(
        str(warning.message).endswith(
            "lacks 2 of the data's characters, which it encodes as <unk>: 'e' (180 times), ',' (30 times); 7.69% of "
            "the 2,730 characters read (data.tokenizer.max_unknown=0.1 allows it)"
        )
        for warning in warned
    )


def test_resuming_on_data_whose_change_changes_the_tokenizer_names_the_file(tmp_path):
    """Before: "the data differs from what the checkpoint's model was trained with (... 81 tokens vs 94 ...)",
    without the file that changed."""
    args = task_args("lm", tmp_path)
    main(["fit", *args, "--trainer.max_steps=2"])
    checkpoint = last_checkpoint(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus.read_text(encoding="utf-8").replace("fortune", "FORTUNE"), encoding="utf-8")
    message = refused(["fit", *args, "--trainer.max_steps=4", f"--ckpt_path={checkpoint}"])
    assert message.startswith(
        f"lightformer: data: the data changed since the checkpoint was written ({corpus} changed (size or "
    ), message


def contrastive_checkpoint(path: Path) -> str:
    """A contrastive task's checkpoint, untrained (the commands' refusals come before any answer)."""
    import lightning

    from lightformer.facts import DataFacts
    from lightformer.tasks.contrastive import ContrastiveTask
    from lightformer.tokenization.text import Tokenizer

    tokenizer = Tokenizer.train_char(["a red circle"])
    facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                      image_size=8, in_channels=3, normalize_mean=(0.5,) * 3, normalize_std=(0.5,) * 3,
                      image_fit="resize", max_length=8)  # fmt: skip
    tiny = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32)
    task = ContrastiveTask(
        net=dict(image=dict(patch_size=4, **tiny), text=dict(block_size=8, **tiny)), data_facts=facts
    )
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": lightning.__version__}, path)  # fmt: skip
    return str(path)


def test_zero_shot_and_embed_refuse_what_they_cannot_do_naming_the_option(tmp_path):
    ckpt = contrastive_checkpoint(tmp_path / "clip.ckpt")
    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8), "red").save(image)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"no image")
    zero_shot = ["zero-shot", f"--ckpt_path={ckpt}", f"--images={image}"]
    embed = ["embed", f"--ckpt_path={ckpt}"]
    cases = [
        ([*zero_shot, "--labels=circle"], "--labels='circle' gives 1 label(s): give at least two"),
        ([*zero_shot, "--labels=a,b", "--top=0"], "--top=0 must be at least 1"),
        ([*zero_shot, "--labels=a,b", "--prompts=a photo"], "--prompts: the template 'a photo' has no '{}'"),
        ([*zero_shot[:2], "--labels=a,b", f"--images={broken}"], f"--images: {broken} is not a readable image"),
        ([*embed, f"--images={image}", f"--texts={image}", "--output=x.safetensors"], "one of --images FILE"),
        ([*embed, f"--images={image}", f"--output={tmp_path}/x.pt"], "give a .safetensors file"),
        ([*embed, f"--texts={tmp_path}/none.txt", f"--output={tmp_path}/x.safetensors"], "none.txt' does not exist"),
        (["zero-shot", f"--ckpt_path={ckpt}", "--labels=a,b"], "zero-shot needs --ckpt_path"),
    ]
    for argv, message in cases:
        assert message in refused(argv), argv


def test_a_webdataset_shard_with_an_image_of_no_caption_is_refused_naming_the_shard_and_the_key(tmp_path, capsys):
    """A user's shards (img2dataset's layout) through ``prepare``: the key without a caption named, in one line,
    before any image is decoded; a path of no shard named with what would be valid."""
    import io
    import tarfile

    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "00000.tar", "w") as tar:
        for name, data in (("000000000.jpg", b"x"), ("000000000.txt", b"a cat"), ("000000001.jpg", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    config = ["prepare", "--config=configs/image_text/captions.yaml", f"--data.prepare.dir={tmp_path}/prepared",
              "--data.source.val=null", "--data.source.images=null", "--data.tokenizer.kind=char"]  # fmt: skip
    message = refused([*config, f"--data.source.train={tmp_path}/shards"])
    assert message == (
        f"lightformer: data.source.train: {tmp_path}/shards/00000.tar, key '000000001': the image has no caption (a "
        ".txt, or a .json with 'caption' or 'text')"
    )
    assert_one_line(message, capsys)
    message = refused([*config, f"--data.source.train={tmp_path}/none/*.tar"])
    assert message.startswith(f"lightformer: data.source.train='{tmp_path}/none/*.tar' names no webdataset shard")


def test_the_built_in_captioned_images_refuse_a_missing_library_or_font_naming_the_package(tmp_path):
    from lightformer.data import ClipArtDataModule, EmojiDataModule
    from lightformer.data.sources.emoji import EmojiSource
    from lightformer.data.sources.openclipart import ClipArtSource
    from lightformer.errors import DataError

    with pytest.raises(DataError, match=r"data.source.root='.*' does not hold .* apt-get install openclipart-png"):
        ClipArtDataModule(ClipArtSource(root=str(tmp_path)))
    with pytest.raises(DataError, match=r"data.source.noto_font='.*' does not exist: apt-get install fonts-noto"):
        EmojiDataModule(EmojiSource(noto_font=str(tmp_path / "none.ttf")))
    with pytest.raises(ValueError, match=r"data.source.val_fraction \+ test_fraction = 1.0 leaves nothing to train"):
        ClipArtSource(val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ValueError, match=r"data.source.image_size=8 must be at least 16 pixels"):
        EmojiSource(image_size=8)


def test_the_visual_qa_data_refuses_options_and_missing_sources_naming_the_field(tmp_path, monkeypatch):
    from lightformer.data import ConversationFilesDataModule, VisualQADataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources.conversations import ConversationFiles
    from lightformer.data.sources.questions import VisualQASource
    from lightformer.errors import DataError

    with pytest.raises(ValueError, match=r"data.source.sources=\['maps'\]: give each of \['clipart', 'lines'"):
        VisualQASource(sources=("maps",))
    with pytest.raises(ValueError, match=r"data.source.line_width=200 must be a positive multiple of 16"):
        VisualQASource(line_width=200)
    with pytest.raises(ValueError, match=r"data.source.words=\[3, 1\] must be \[fewest, most\]"):
        VisualQASource(words=(3, 1))
    with pytest.raises(DataError, match=r"data.source.clipart_root='.*' does not hold .* apt-get install openclipart"):
        VisualQADataModule(VisualQASource(sources=("clipart",), clipart_root=str(tmp_path)))
    monkeypatch.setattr("lightformer.data.sources.corpora.DEBIAN_FASHION_MNIST_DIR", tmp_path / "not-installed")
    with pytest.raises(DataError, match=r"data.source.sources holds fashion_mnist but .* dataset-fashion-mnist"):
        VisualQADataModule(VisualQASource(sources=("fashion_mnist",), data_root=str(tmp_path)))
    with pytest.raises(ValueError, match=r"data.source.train='x.txt' is not a conversation file"):
        ConversationFiles(train="x.txt")
    (tmp_path / "train.jsonl").write_text('{"id": 1, "conversations": []}\n', encoding="utf-8")
    prepare = PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=1)
    data = ConversationFilesDataModule(ConversationFiles(train=str(tmp_path / "train.jsonl")), prepare=prepare)
    with pytest.raises(DataError, match=r"data.source.train: .*train.jsonl, line 1: field 'image' is missing"):
        data.prepare_data()
    assert not any((tmp_path / "prepared").iterdir())  # the half-made folder removed


# --- the typefaces of the rendered lines: declared, each file checked ---------------------------------------------


def test_a_missing_declared_typeface_is_named_with_its_family_file_and_package(tmp_path, monkeypatch):
    """Before: the lines were drawn in whatever fonts /usr/share/fonts held; now in rendering.TYPEFACES' files, each
    checked before any work (empty stand-ins here: only their presence is checked then)."""
    from lightformer.data import ImageTextDataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources import rendering
    from lightformer.data.sources.lines import ImageTextSource
    from lightformer.errors import DataError

    for file in (f for packages in rendering.TYPEFACES.values() for files in packages.values() for f in files):
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).touch()
    (tmp_path / "truetype/liberation2/LiberationSans-Bold.ttf").unlink()
    monkeypatch.setattr(rendering, "FONT_ROOT", tmp_path)
    with pytest.raises(DataError) as error:
        ImageTextDataModule(ImageTextSource(), prepare=PrepareConfig(dir=str(tmp_path / "prepared")))
    assert re.fullmatch(
        r"data\.source\.font_dir: 1 file\(s\) of the declared typefaces \(rendering\.TYPEFACES\) are missing under "
        r".*: Liberation Sans's .*/truetype/liberation2/LiberationSans-Bold\.ttf, of fonts-liberation2\. apt-get "
        r"install fonts-liberation2 \(debian-packages\.txt installs every one\), or set data\.source\.font_dir to a "
        r"folder of fonts of your own",
        str(error.value),
    ), error.value
    assert not (tmp_path / "prepared").exists()


# --- commands over texts and images: one rule each (command_support.check_texts, image_files.open_image) ----------


def vlm_checkpoint(path: Path, fit: str = "resize") -> str:
    """A vision-language task's checkpoint, untrained, of 48 text positions and 16 × 16 images of one token, whose
    char tokenizer lacks 'ä' and '∑'; answers of at most 2 tokens."""
    import lightning

    from lightformer.facts import DataFacts
    from lightformer.tasks.vision_language import VisionLanguageTask
    from lightformer.tokenization.text import Tokenizer

    tokenizer = Tokenizer.train_char(["Q: What colour is it? Which?\nA: red"])
    facts = DataFacts(tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                      image_size=(16, 16), in_channels=3, image_fit=fit, max_length=30, normalize_mean=(0.5,) * 3,
                      normalize_std=(0.5,) * 3)  # fmt: skip
    tiny = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32)
    net = dict(image=dict(patch_size=8, **tiny), text=dict(block_size=48, **tiny))
    task = VisionLanguageTask(net=net, data_facts=facts, max_answer_tokens=2)
    torch.save({"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": lightning.__version__}, path)  # fmt: skip
    return str(path)


def test_ask_refuses_a_question_longer_than_the_positions_and_names_characters_outside_the_vocabulary(tmp_path, capsys):
    """Before: a question of 520 characters on a model of 48 positions printed an empty line, nothing on standard
    error, exit status 0; 'ä' and '∑' became <unk> without the warning generate gives."""
    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8), "red").save(image)
    ask = ["ask", f"--ckpt_path={vlm_checkpoint(tmp_path / 'vlm.ckpt')}", f"--images={image}"]
    question = ("What colour is it? " * 28)[:514] + "Which?"
    assert refused([*ask, f"--question={question}"]) == (
        "lightformer: --question 'What colour is it? What colour is it? Wh'… has 530 tokens with the chat template's, "
        "the image's 1 token in place of its placeholder and one for the answer; the model reads at most 48 "
        "(model.net.text.block_size): shorten it by at least 482 characters"
    )
    assert capsys.readouterr().out == ""
    main([*ask, "--question=Whät colour is ∑?"])
    captured = capsys.readouterr()
    assert captured.err == (
        "warning: the question's characters 'ä', '∑' are not in the model's vocabulary (it never saw them in "
        "training): they become <unk>\n"
    )
    assert len(captured.out.splitlines()) == 1


def test_the_text_commands_refuse_or_cut_with_a_warning_what_outgrows_the_positions(tmp_path, capsys):
    """ask's rule (command_support.check_texts) in every command over texts. Before: generate read the last 16 tokens
    of a longer prompt, zero-shot and embed cut a long prompt or text, each without a word; fill-mask's refusal
    named neither the option's field nor how much to cut."""
    prompt = "It is a truth universally acknowledged"
    main(["generate", f"--ckpt_path={OLD / 'lm.ckpt'}", f"--prompt={prompt}", "--max_new_tokens=1", "--seed=0"])
    assert capsys.readouterr().err == (
        f"warning: --prompt has {len(prompt)} tokens; the model reads at most 16 (model.net.block_size), so its start "
        "is cut: the model reads its last 16\n"
    )
    message = refused(["fill-mask", f"--ckpt_path={OLD / 'mlm.ckpt'}", f"--text={prompt * 3} [MASK]."])
    assert re.fullmatch(r"lightformer: --text has (\d+) tokens with \[CLS\] and \[SEP\]; the model reads at most 32 "
                        r"\(model\.net\.max_len\): shorten it by at least \d+ tokens", message), message  # fmt: skip
    ckpt = contrastive_checkpoint(tmp_path / "clip.ckpt")  # 8 text positions
    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8), "red").save(image)
    main(["zero-shot", f"--ckpt_path={ckpt}", "--labels=red,a red circle", f"--images={image}", "--prompts={}"])
    captured = capsys.readouterr()
    assert captured.err == (
        "warning: --labels: the prompt 'a red circle' of 'a red circle' has 14 tokens with BOS and EOS; the model "
        "reads at most 8 (model.net.text.block_size), so its end is cut\n"
    )
    texts = tmp_path / "texts.txt"
    texts.write_text("red\na red circle\n", encoding="utf-8")
    main(["embed", f"--ckpt_path={ckpt}", f"--texts={texts}", f"--output={tmp_path}/t.safetensors"])
    assert capsys.readouterr().err.startswith(
        f"warning: line 2 of --texts {texts} has 14 tokens with BOS and EOS; the model reads at most 8 "
        "(model.net.text.block_size), so its end is cut\nwrote "
    )


def test_zero_shot_keeps_each_label_once_with_a_warning_and_counts_the_labels_after(tmp_path, capsys):
    """Before: `--labels red,circle,red` printed 'red' twice, its probability split between the copies and a --top
    place taken; `--labels red,red` passed the two-label check."""
    ckpt = contrastive_checkpoint(tmp_path / "clip.ckpt")
    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8), "red").save(image)
    listed = tmp_path / "labels.txt"
    listed.write_text("red\ncircle\nred\n", encoding="utf-8")
    for labels in ("red,circle,red", str(listed)):
        main(["zero-shot", f"--ckpt_path={ckpt}", f"--labels={labels}", f"--images={image}", "--prompts={}"])
        captured = capsys.readouterr()
        assert sorted(re.findall(r"(\w+) \(\d", captured.out)) == ["circle", "red"], captured.out
        assert captured.err == (
            "warning: --labels gives 'red' (2 times): each label is kept once (a copy would split its probability)\n"
        )
    assert refused(["zero-shot", f"--ckpt_path={ckpt}", "--labels=red, red", f"--images={image}"]) == (
        "lightformer: --labels='red, red' gives 1 label(s) once repeats are left out: give at least two, separated "
        "by commas ('cat,dog,bird'), or a file of one label a line"
    )


def test_zero_shot_and_ask_name_an_unreadable_image_with_the_same_advice(tmp_path):
    """Before: a model that fits drawings (`image_fit: drawing`, the clip art's) gave PIL's words alone, "cannot
    identify image file '…'", where a model that resizes added what would be valid."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"no image")
    advice = (
        f"lightformer: --images: {broken} is not a readable image file (cannot identify image file '{broken}'): give "
        "PNG, JPEG or another image file that PIL reads"
    )
    clip = Path(contrastive_checkpoint(tmp_path / "clip.ckpt"))
    checkpoint = torch.load(clip, weights_only=True)
    checkpoint["hyper_parameters"]["data_facts"]["image_fit"] = "drawing"
    torch.save(checkpoint, clip)
    assert refused(["zero-shot", f"--ckpt_path={clip}", "--labels=red,circle", f"--images={broken}"]) == advice
    vlm = vlm_checkpoint(tmp_path / "vlm.ckpt", fit="drawing")
    for fit in ("drawing", "resize"):
        ask = ["ask", f"--ckpt_path={vlm}", f"--images={broken}", "--question=Which?", f"--fit={fit}"]
        assert refused(ask) == advice


def png_of_size(path: Path, width: int, height: int) -> Path:
    """A 1-bit PNG that says it is ``width`` × ``height`` pixels, of no pixel data (its size is all that is read)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    return path


def test_an_image_above_pillows_decompression_bomb_limit_is_read_with_one_warning_and_twice_it_refused(
    tmp_path, capsys, monkeypatch
):
    """Before: ask printed Pillow's two-line DecompressionBombWarning for a 12000 × 12000 photo, and above twice the
    limit (179 megapixels) its DecompressionBombError was "a bug in lightformer". Now the photo is read with one
    warning line naming it and its size (here Pillow's limit lowered, for a small image to be over it); a file above
    twice the limit is refused before it is decoded."""
    vlm = vlm_checkpoint(tmp_path / "vlm.ckpt")
    bomb = png_of_size(tmp_path / "bomb.png", 14000, 14000)
    assert refused(["ask", f"--ckpt_path={vlm}", f"--images={bomb}", "--question=Which?"]) == (
        f"lightformer: --images: {bomb} is 14000 × 14000 pixels (196 megapixels), more than the 179 megapixels an "
        "image file may have (twice Pillow's decompression-bomb limit: a file this large can be an attack that fills "
        "the memory as it is decoded); reduce it first, e.g. `convert in.png -resize 8000x8000 out.png` (the model "
        "sees it far smaller)"
    )
    import warnings

    photo = tmp_path / "photo.png"
    Image.new("RGB", (30, 20), "red").save(photo)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # Pillow's own lines: none
        main(["ask", f"--ckpt_path={vlm}", f"--images={photo}", "--question=Which?"])
    captured = capsys.readouterr()
    warned = [line for line in captured.err.splitlines() if "megapixels" in line or "Pillow" in line]
    assert warned == [  # one line of ours (Lightning's log lines may share stderr, after an earlier fit in a worker)
        f"warning: {photo} is 30 × 20 pixels (0.0006 megapixels), more than Pillow's decompression-bomb limit of "
        "0.0005 megapixels: decoded all the same (above 0.001 megapixels an image file is refused)"
    ]
    assert "DecompressionBomb" not in captured.err and len(captured.out.splitlines()) == 1


# --- records bounded as they are read, a shard image's clean reason, null in model.init, a refused run's folder ------


def _llava(answer: str) -> str:
    import json

    turns = [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": answer}]
    return json.dumps({"image": "a.png", "conversations": turns})


def _conversations(tmp_path: Path, path: Path, **options):
    from lightformer.data import ConversationFilesDataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources.conversations import ConversationFiles

    Image.new("RGB", (40, 24), "red").save(path.parent / "a.png")
    source = ConversationFiles(train=str(path), val_fraction=0.0, image_size=32, **options)
    return ConversationFilesDataModule(source, prepare=PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=1))


def test_a_conversation_longer_than_max_tokens_is_refused_as_it_is_read_naming_the_file_and_line(tmp_path):
    """A 10 MB answer was prepared whole (20 s, 4.3 GB at the peak) and refused only at set-up, naming neither file
    nor line. Now its line is refused as the file is first read, never held whole (data.source.max_tokens × 128
    bytes at most); a record within that but of more ids than max_tokens once they are counted, before its image is
    loaded; a record of a JSON list by its characters, before a tokenizer is trained on it."""
    import tracemalloc

    from lightformer.errors import DataError

    path = tmp_path / "train.jsonl"
    path.write_text(f"{_llava('red')}\n{_llava('very ' * 2_000_000)}\n{_llava('red')}\n", encoding="utf-8")
    data = _conversations(tmp_path, path)
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as error:
            data.prepare_data()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(error.value) == (
        f"data.source.train: {path}, line 2 is longer than 524,288 bytes: more than data.source.max_tokens=4096 "
        "tokens can take (128 bytes a token at most); shorten it, or raise data.source.max_tokens if the model holds "
        "longer texts"
    )
    assert peak < 4 * 2**20, peak  # the 10 MB line was never read whole
    path.write_text(f"{_llava('red')}\n{_llava('very ' * 100)}\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^data.source.train: {path}, line 2: the record is 5\d\d tokens long \(its "
                       r"turns in the chat template, .*\), more than data.source.max_tokens=64: shorten its "
                       r"conversation or split it into records, or raise data.source.max_tokens"):  # fmt: skip
        _conversations(tmp_path, path, max_tokens=64).prepare_data()
    listed = tmp_path / "list.json"
    listed.write_text(f"[{_llava('red')}, {_llava('x' * 9000)}]", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^data.source.train: {listed}, record 1: field conversations is longer "
                       r"than 8,192 characters: more than data.source.max_tokens=64 tokens"):  # fmt: skip
        _conversations(tmp_path, listed, max_tokens=64).prepare_data()
    assert not any((tmp_path / "prepared").iterdir())


def test_a_caption_longer_than_max_tokens_is_refused_as_it_is_read_naming_the_line_or_the_shards_key(tmp_path):
    """The same bound on image-text files (image-to-text, contrastive): a JSONL, CSV or TSV line, a COCO caption, a
    webdataset shard's caption member (a .txt by its size, unread), before anything is prepared."""
    import io
    import json
    import tarfile

    from lightformer.data.families.image_text import ImageTextFilesDataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources.captions import ImageTextFiles
    from lightformer.errors import DataError

    def prepare(train: Path) -> None:
        source = ImageTextFiles(train=str(train), val_fraction=0, max_tokens=16)
        ImageTextFilesDataModule(source, prepare=PrepareConfig(dir=str(tmp_path / "prepared"))).prepare_data()

    Image.new("L", (40, 16), 255).save(tmp_path / "a.png")
    long = "a cat " * 400  # 2,400 characters: more than 16 tokens × 128
    rows = [{"file": "a.png", "text": "a cat"}, {"file": "a.png", "text": long}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (tmp_path / "c.tsv").write_text(f"file\ttext\na.png\ta cat\na.png\t{long}\n", encoding="utf-8")
    coco = {"images": [{"id": 1, "file_name": "a.png"}], "annotations": [{"image_id": 1, "caption": long}]}
    (tmp_path / "c.json").write_text(json.dumps(coco), encoding="utf-8")
    for name, where in (("c.jsonl", "line 2"), ("c.tsv", "line 3"), ("c.json", "annotations[0]: the caption")):
        with pytest.raises(DataError, match=rf"^data.source.train: {tmp_path / name}, {re.escape(where)} is longer "
                           r"than 2,048 characters: more than data.source.max_tokens=16 tokens can take"):  # fmt: skip
            prepare(tmp_path / name)
    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "00000.tar", "w") as tar:
        for name, data in (("000000000.png", (tmp_path / "a.png").read_bytes()), ("000000000.txt", long.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match=rf"^data.source.train: {tmp_path}/shards/00000.tar, key '000000000': the "
                       r"caption member.txt \(2,400 bytes\) is longer than 2,048 bytes"):  # fmt: skip
        prepare(tmp_path / "shards")


def test_a_webdataset_image_that_is_not_one_is_named_with_a_reason_free_of_python_objects(tmp_path):
    """Its reason was PIL's "cannot identify image file <_io.BytesIO object at 0x7f…>"."""
    import io
    import tarfile

    from lightformer.data.families.image_text import ImageTextFilesDataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources.captions import ImageTextFiles
    from lightformer.errors import DataError

    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "00000.tar", "w") as tar:
        for name, data in (("000000000.jpg", b"not a jpeg"), ("000000000.txt", b"a cat")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    source = ImageTextFiles(train=str(tmp_path / "shards"), val_fraction=0, height=16, width=16, fit="resize")
    data = ImageTextFilesDataModule(source, prepare=PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=1))
    with pytest.raises(DataError) as error:
        data.prepare_data()
    assert str(error.value) == (
        f"data.source.train: {tmp_path}/shards/00000.tar, key '000000000': the image is not readable (not an image: "
        "PIL recognises no image format in it)"
    )


def test_null_for_model_init_modules_freeze_or_skip_means_none_and_for_its_other_fields_is_refused(tmp_path):
    """``--model.init.modules null`` ended in a traceback and "a bug in lightformer" (``'{}'`` worked)."""
    args = ["fit", *task_args("lm", tmp_path), "--trainer.max_steps=1"]
    nulls = ["--model.init.modules", "null", "--model.init.freeze=null", "--model.init.skip", "null"]
    init = cli_main([*args[1:], *nulls], run=False).model.init_config  # built as fit builds it
    assert (init.modules, init.freeze, init.skip, init.sources()) == ({}, (), (), [])
    assert refused([*args, "--model.init.strict=null"]) == (
        "lightformer: model.init: strict=None: give true (refuse a start that leaves tensors fresh) or false"
    )
    assert refused([*args, "--model.init.pretrained_lr_scale", "null"]).startswith(
        "lightformer: model.init: pretrained_lr_scale=None: give a number, at least 0"
    )


def test_a_fit_refused_at_setup_leaves_no_run_folder_behind(tmp_path):
    """A fit refused as the trainer set up (after the logger had made version_0 and written its config and events
    file there) left that folder, and the next run became version_1. A folder that was there before the fit, or that
    holds anything but what a fit writes as it starts, is kept."""
    from lightformer.cli.runs import RunFolderLock

    args = ["fit", *task_args("translation", tmp_path), "--model.net.max_len=2", "--trainer.max_steps=1"]
    assert "model.net.max_len=2 is shorter than the data's sentences" in refused(args)
    assert (tmp_path / "runs").is_dir() and not list((tmp_path / "runs").glob("*/version_*"))
    for existed in (True, False):
        folder = tmp_path / f"kept_{existed}" / "version_0"
        if existed:
            folder.mkdir(parents=True)
        lock = RunFolderLock()
        lock.take(str(folder))
        if not existed:
            (folder / "checkpoints").mkdir()
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"weights")
        (folder / "config.yaml").write_text("seed_everything: 0\n", encoding="utf-8")
        assert not lock.remove_if_unused() and folder.is_dir()
        lock.release()
