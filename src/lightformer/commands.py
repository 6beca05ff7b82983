"""The commands that need a checkpoint alone (no config, no data): ``lightformer generate`` continues a prompt,
``translate`` translates lines, ``classify`` names the classes of image files, ``fill-mask`` fills in masked words,
``sample-images`` draws and completes images, ``probe`` measures an Image GPT's features with a linear classifier,
``export`` writes weights to safetensors and ``average`` averages a run's last checkpoints.

Each is a function whose keyword arguments are its options (``jsonargparse.auto_cli`` reads them with their types
and docstrings), so it runs the same from Python; a bad option raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Literal

import yaml
from torch import Tensor

from lightformer import checkpoints, tasks
from lightformer.checkpoints import CARRIED, CheckpointError, read_checkpoint, require_file
from lightformer.data.preparation.tokenizers import MASK
from lightformer.errors import ConfigError, DataError
from lightformer.files import atomic_write_bytes, expand_patterns, read_lines
from lightformer.generation import check_sampling
from lightformer.tasks.image_gpt import check_same_palette, completion_rows, read_image_files
from lightformer.tasks.masked_lm import MASK_MARKERS
from lightformer.tensorboard import image_grid

# The command that takes each task's checkpoints, named when a checkpoint of another task is given.
COMMAND_OF_TASK = {
    "LanguageModelTask": "generate",
    "TranslationTask": "translate",
    "ImageClassificationTask": "classify",
    "MaskedLanguageModelTask": "fill-mask",
    "ImageGPTTask": "sample-images",
}


def task_name(checkpoint: dict) -> str | None:
    """The lightformer task class that wrote ``checkpoint``, or None if it was not written by one."""
    name = str(checkpoint.get("hyper_parameters", {}).get("_class_path", "")).rsplit(".", 1)[-1]
    if name not in tasks.__all__:  # written through the Python API before the class path was stored with it
        carried = {"tokenizer": "LanguageModelTask", "src_tokenizer": "TranslationTask"}
        carried["image_classification"] = "ImageClassificationTask"
        name = next((task for key, task in carried.items() if key in checkpoint), None)
    return name


def load_task(path: str, expected: str, command: str, device: str = "cpu") -> tasks.Task:
    """The ``expected`` task (class name) rebuilt from the checkpoint at ``path``, on ``device``, for ``command``;
    a checkpoint of another task is refused naming the command that takes it."""
    found = task_name(read_checkpoint(path))
    if found != expected:
        other = f" (use `lightformer {COMMAND_OF_TASK[found]}`)" if found in COMMAND_OF_TASK else ""
        written_by = f"a {found} checkpoint{other}" if found else "not written by a lightformer task"
        raise CheckpointError(f"--ckpt_path: {path} is {written_by}; `lightformer {command}` needs a {expected} one")
    return getattr(tasks, expected).load_from_checkpoint(path, map_location=device, weights_only=True)


def _paths(patterns: list[str] | str, option: str, noun: str, suffix: str) -> list[str]:
    """The files that an option's paths and glob patterns name (``files.expand_patterns``), or ``ConfigError``."""
    try:
        return [str(path) for path in expand_patterns(patterns, option, noun, suffix)]
    except OSError as error:  # a missing file, a folder, a pattern that matches nothing
        raise ConfigError(str(error)) from None


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    try:
        check_sampling(temperature, top_k, top_p)
    except ValueError as error:
        raise ConfigError(f"--{error}") from None


def generate(
    *,
    ckpt_path: str,
    prompt: str = "\n",
    max_new_tokens: int = 500,
    temperature: float = 0.8,
    top_k: int | None = 200,
    top_p: float | None = None,
    num_samples: int = 1,
    seed: int | None = None,
    device: str = "cpu",
) -> None:
    """Print continuations of PROMPT from a language-model checkpoint (its tokenizer travels inside it).

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the language-model task.
        prompt: the text to continue.
        max_new_tokens: how many tokens to generate at most (generation also stops at end-of-text).
        temperature: divides the logits; 0 is greedy decoding.
        top_k: sample among the k most likely tokens only.
        top_p: sample among the most likely tokens whose probabilities add up to p (nucleus sampling).
        num_samples: how many continuations to print.
        seed: seed of the sampler, for reproducible samples.
        device: "cpu", "cuda", "cuda:1", ...
    """
    _check_sampling(temperature, top_k, top_p)
    _check(max_new_tokens >= 1, f"--max_new_tokens={max_new_tokens} must be at least 1")
    _check(num_samples >= 1, f"--num_samples={num_samples} must be at least 1")
    task = load_task(ckpt_path, "LanguageModelTask", "generate", device)
    unknown = task.tokenizer.unknown_characters(prompt)
    if unknown:
        print(
            f"warning: the prompt's characters {', '.join(map(repr, unknown))} are not in the model's vocabulary "
            "(it never saw them in training): they become <unk>",
            file=sys.stderr,
        )
    texts = task.generate_text(prompt, max_new_tokens, temperature, top_k, top_p, num_samples, seed)
    for i, text in enumerate(texts):
        if i:
            print("\n" + "-" * 40)
        print(prompt + text)


def translate(
    *,
    ckpt_path: str,
    input: str = "-",
    beam_size: int | None = None,
    batch_size: int = 32,
    device: str = "cpu",
) -> None:
    """Translate the lines of INPUT (a file, or - for standard input) with a translation checkpoint alone.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the translation task (its tokenizers travel inside).
        input: a UTF-8 text file with one source sentence per line, or "-" for standard input.
        beam_size: beam width (1 = greedy); default: the model's ``beam_size``.
        batch_size: sentences translated together.
        device: "cpu", "cuda", "cuda:1", ...
    """
    _check(beam_size is None or beam_size >= 1, f"--beam_size={beam_size} must be at least 1 (1 is greedy)")
    _check(batch_size >= 1, f"--batch_size={batch_size} must be at least 1")
    if input != "-":
        require_file(input, "--input: the file")
    task = load_task(ckpt_path, "TranslationTask", "translate", device)
    try:
        lines = read_lines(input, "--input") if input != "-" else sys.stdin.read().splitlines()
    except ValueError as error:  # not UTF-8: the message names the file, the byte and its line
        raise ConfigError(str(error)) from None
    for number, length in task.too_long(lines):
        print(
            f"warning: line {number + 1} of --input has {length} tokens; the model reads at most "
            f"{task.model.max_len - 1}, so its end is cut",
            file=sys.stderr,
        )
    blank = [number for number, line in enumerate(lines) if not line.strip()]
    if blank:
        shown = ", ".join(str(number + 1) for number in blank[:10]) + (
            f", ... ({len(blank)} in all)" * (len(blank) > 10)
        )
        print(
            f"note: line{'s' * (len(blank) > 1)} {shown} of --input {'are' if len(blank) > 1 else 'is'} blank: not "
            "translated, printed as an empty line (the output stays aligned with the input line for line)",
            file=sys.stderr,
        )
    text = [(number, line) for number, line in enumerate(lines) if line.strip()]  # a model given nothing repeats words
    printed = 0  # input lines answered so far
    for start in range(0, len(text), batch_size):
        batch = text[start : start + batch_size]
        for (number, _), translation in zip(batch, task.translate([line for _, line in batch], beam_size), strict=True):
            print("\n" * (number - printed) + translation)  # the blank lines before this one, then its translation
            printed = number + 1
    print("\n" * (len(lines) - printed), end="")


def classify(
    ckpt_path: str | None = None, images: list[str] | str | None = None, top_k: int = 3, device: str = "cpu"
) -> None:
    """Print the most likely classes of image files, with an image-classification checkpoint alone.

    Example: ``classify --ckpt_path best.ckpt --images "[a.png, b.png]" --top_k 3`` (also ``--images a.png``,
    ``--images+ a.png --images+ b.png``, or a quoted pattern ``--images "photos/*.jpg"``).

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the image-classification task (its class names and
            preprocessing travel inside).
        images: image files (PNG, JPEG, ...) or glob patterns; each image is resized and normalised as in
            training.
        top_k: how many classes to print per image, most likely first.
        device: "cpu", "cuda", "cuda:1", ...
    """
    _check(ckpt_path is not None and bool(images), "classify needs --ckpt_path CHECKPOINT and --images FILE ...")
    _check(top_k >= 1, f"--top_k={top_k} must be at least 1")
    task = load_task(ckpt_path, "ImageClassificationTask", "classify", device)
    paths = _paths(images, "--images", "image file", ".png")
    try:
        classified = task.classify_files(paths, top_k)
    except DataError as error:  # a file that is not a readable image, named
        raise DataError(f"--images: {error}") from None
    for path, ranked in zip(paths, classified, strict=True):
        print(f"{path}: " + ", ".join(f"{name} ({probability:.1%})" for name, probability in ranked))


def output_file(path: str, example: str) -> Path:
    """The file ``--output`` names, its folder made if missing (before any work: a typo in the folder fails fast, not
    after minutes); a folder is refused, with ``example`` as the kind of file to give."""
    output = Path(path)
    if output.is_dir():
        raise ConfigError(f"--output: {path} is a folder; give the file to write in it, such as {output / example}")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--output: the folder {output.parent} cannot be made ({error.strerror})") from None
    return output


def export(*, ckpt_path: str, output: str, layout: Literal["lightformer", "timm"] = "lightformer") -> None:
    """Write a checkpoint's model weights to a safetensors file (no pickle: safe to share and to load).

    The file's metadata holds the task, its hyperparameters (JSON) and what travels with the model (tokenizer
    JSON, image preprocessing), so the model can be rebuilt; ``safetensors.torch.load_model(task.model, path)``
    loads the weights back (tied weights are stored once). ``layout="timm"`` writes a vision model under timm's
    ``VisionTransformer`` names instead, for ``timm.create_model(...).load_state_dict(load_file(path))``.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with any lightformer task.
        output: the ``.safetensors`` file to write (atomically).
        layout: "lightformer" (our parameter names) or "timm" (image classification only).
    """
    from safetensors.torch import save, save_model

    from lightformer.models.vit import lightformer_to_timm

    output_file(output, "model.safetensors")
    checkpoint = read_checkpoint(ckpt_path)
    name = task_name(checkpoint)
    if name is None:
        raise CheckpointError(f"{ckpt_path} was not written by a lightformer task (tasks: {', '.join(tasks.__all__)})")
    if layout == "timm" and name != "ImageClassificationTask":
        raise CheckpointError(f"--layout timm applies to image classification, not to a {name} checkpoint")
    task = load_task(ckpt_path, name, "export")
    hparams = {k: v for k, v in checkpoint["hyper_parameters"].items() if not k.startswith("_")}
    metadata = {"format": "pt", "lightformer.task": name, "lightformer.hyper_parameters": json.dumps(hparams)}
    for key in CARRIED:
        if key in checkpoint:
            value = checkpoint[key]
            metadata[f"lightformer.{key}"] = value if isinstance(value, str) else json.dumps(value)
    if layout == "timm":
        tensors = {k: v.contiguous() for k, v in lightformer_to_timm(task.model.state_dict()).items()}
        atomic_write_bytes(output, save(tensors, metadata))
    else:
        staging = Path(f"{output}.partial")
        try:
            save_model(task.model, str(staging), metadata)  # stores tied weights once
            staging.replace(output)
        finally:
            staging.unlink(missing_ok=True)
    print(f"wrote {output} ({name}, {sum(p.numel() for p in task.model.parameters()):,} parameters)")


def average(*, ckpt_paths: list[str] | str, output: str, last: int | None = None) -> None:
    """Average the model weights of checkpoints of one run, as "Attention Is All You Need" averages its last
    checkpoints (fairseq's ``average_checkpoints.py``): the mean of nearby weights usually scores better than
    each. The result evaluates, translates, generates and exports like any checkpoint (``test --ckpt_path``);
    it has no optimizer state, so it cannot resume training.

    Example: ``average --ckpt_paths "runs/ding_de_en/version_0/checkpoints/step=*.ckpt" --last 5 --output avg.ckpt``

    Args:
        ckpt_paths: checkpoint files or glob patterns (quote them), all of one model shape.
        output: the averaged checkpoint to write (atomically).
        last: average only the ``last`` checkpoints with the highest global step.
    """
    paths = sorted(set(_paths(ckpt_paths, "--ckpt_paths", "checkpoint file", ".ckpt")))
    if not paths:
        raise ConfigError("--ckpt_paths: no checkpoint file given")
    output_file(output, "averaged.ckpt")
    print(checkpoints.average(paths, output, last))


def fill_mask(*, ckpt_path: str, text: str, top_k: int = 5, device: str = "cpu") -> None:
    """Print the most likely tokens at each mask of TEXT, with a masked-language-model checkpoint alone: first the
    text with the most likely token in brackets at each mask, then per mask the ``top_k`` tokens and probabilities.

    Example: ``fill-mask --ckpt_path last.ckpt --text "It is a truth universally [MASK]."``

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the masked-language-model task (its tokenizer travels
            inside).
        text: the text, with one or more mask markers: "[MASK]" or "<mask>" (a marker takes the space before it).
        top_k: how many tokens to print per mask, most likely first.
        device: "cpu", "cuda", "cuda:1", ...
    """
    if top_k < 1:
        raise ConfigError(f"--top_k={top_k} must be at least 1")
    if not MASK_MARKERS.search(text):
        raise ConfigError(f"--text={text!r} has no mask marker: put [MASK] (or {MASK}) where a token is to be filled")
    task = load_task(ckpt_path, "MaskedLanguageModelTask", "fill-mask", device)
    try:
        ranked = task.fill_mask(text, top_k)
    except ValueError as error:  # a text longer than the model reads
        raise ConfigError(f"--text: {error}") from None
    best = iter([tokens[0][0] for tokens in ranked])

    def bracketed(match: re.Match) -> str:  # the most likely token, in brackets after its leading space
        token = next(best)
        core = token.removeprefix(" ")
        return f"{token[: len(token) - len(core)]}[{core}]"

    print(re.sub(f" ?(?:{MASK_MARKERS.pattern})", bracketed, text))  # the marker's space is the token's own
    for number, tokens in enumerate(ranked, 1):
        print(f"mask {number}: " + ", ".join(f"{token!r} ({probability:.1%})" for token, probability in tokens))


def sample_images(
    *,
    ckpt_path: str,
    output: str = "samples.png",
    num_samples: int = 16,
    complete_from: list[str] | str | None = None,
    num_completions: int = 3,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> list[str]:
    """Write PNG grids of images sampled by an Image GPT checkpoint alone (its palette travels inside it).

    Example: ``sample-images --ckpt_path last.ckpt --num_samples 64 --complete_from "digits/*.png"`` writes
    samples.png and samples_completions.png.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the Image GPT task.
        output: the PNG of the unconditional samples (a square grid, upscaled so that small images are visible).
        num_samples: how many images to sample from nothing (0: none, with ``complete_from``).
        complete_from: image files or glob patterns (quote them) whose bottom half the model completes: each is
            resized to the model's size (area-averaged when square and larger), quantised to its palette, and
            shown in a row: the image, its top half with the bottom masked grey, ``num_completions`` completions.
            The grid goes to OUTPUT's name with ``_completions`` added (samples_completions.png).
        num_completions: completions sampled per image of ``complete_from``.
        temperature: divides the logits; 0 is greedy (every sample alike).
        top_k: sample among the k most likely colours only.
        top_p: sample among the most likely colours whose probabilities add up to p (nucleus sampling).
        seed: seed of the sampler: the same seed gives the same images.
        device: "cpu", "cuda", "cuda:1", ...

    Returns:
        The paths written.
    """
    _check_sampling(temperature, top_k, top_p)
    if num_samples < 0:
        raise ConfigError(f"--num_samples={num_samples} must be at least 0")
    if num_completions < 1:
        raise ConfigError(f"--num_completions={num_completions} must be at least 1")
    paths = _paths(complete_from, "--complete_from", "image file", ".png") if complete_from else []
    if num_samples == 0 and not paths:
        raise ConfigError("--num_samples=0 and no --complete_from: there is nothing to draw")
    task = load_task(ckpt_path, "ImageGPTTask", "sample-images", device)
    tokenizer = task._require_palette()
    size = tokenizer.image_size
    try:  # before any sampling: a file that is not a readable image is named at once
        given = read_image_files(paths, tokenizer) if paths else None
    except DataError as error:
        raise DataError(f"--complete_from: {error}") from None
    written = []
    if num_samples:
        images = task.sample_images(num_samples, temperature, top_k, top_p, seed)
        columns = math.ceil(math.sqrt(num_samples))
        grid = image_grid(images, columns)
        _write_png(grid, output)
        rows = math.ceil(num_samples / columns)
        print(
            f"wrote {output}: {num_samples} samples of {size}×{size} pixels in a {rows}×{columns} grid "
            f"({grid.shape[2]}×{grid.shape[1]} pixels)"
        )
        written.append(output)
    if paths:
        target = Path(output)
        completions_path = str(target.with_name(f"{target.stem}_completions{target.suffix or '.png'}"))
        grid, _ = completion_rows(task, given, num_completions, temperature, top_k, top_p, seed)
        _write_png(grid, completions_path)
        print(
            f"wrote {completions_path}: one row per image of --complete_from ({len(paths)}): the image in the "
            f"model's palette, its top {size // 2} rows given, {num_completions} completions "
            f"({grid.shape[2]}×{grid.shape[1]} pixels)"
        )
        written.append(completions_path)
    return written


def _probe_data(checkpoint: dict, ckpt_path: str, config: str | None):
    """The checkpoint run's data module, from ``config`` or from the data hyperparameters saved in the checkpoint."""
    from lightformer.data.modules.image_tokens import ImageTokenDataModule

    if config is not None:
        if not Path(config).is_file():
            raise ConfigError(f"--config: the file {config!r} does not exist")
        section = (yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}).get("data")
        if not isinstance(section, dict):
            raise ConfigError(f"--config: {config} has no data section")
        class_path, arguments = section.get("class_path", ""), dict(section.get("init_args") or {})
        origin = f"--config {config}"
    else:
        saved = checkpoint.get("datamodule_hyper_parameters")
        if not saved:
            raise ConfigError(
                f"--ckpt_path: {ckpt_path} holds no data settings (it was not written by `lightformer fit`); give "
                "the run's config with --config (e.g. <run dir>/config.yaml)"
            )
        class_path, arguments = saved.get("_class_path", ""), dict(saved)
        origin = f"the data settings saved in {ckpt_path}"
    if class_path and class_path.rsplit(".", 1)[-1] != "ImageTokenDataModule":
        raise ConfigError(f"{origin}: the data module is {class_path}, not ImageTokenDataModule")
    return ImageTokenDataModule(**{k: v for k, v in arguments.items() if not k.startswith("_")})


def probe(
    *,
    ckpt_path: str,
    layer: int | None = None,
    config: str | None = None,
    max_train: int | None = None,
    batch_size: int = 256,
    device: str = "cpu",
) -> dict[str, float]:
    """Print the test accuracy of a linear classifier on an Image GPT's features, and on the pixels for comparison.

    A linear probe is Image GPT's measure of what a model learnt without labels. The features of an image are the
    mean over positions of the residual stream after decoder layer LAYER. The classifier is scikit-learn's
    LogisticRegression on standardised inputs, fitted on the training split and scored on the test split of the
    data the model was trained on (rebuilt from the checkpoint, or from --config).

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the Image GPT task.
        layer: the decoder layer whose output is probed (1-based; 0: the embeddings); default: the middle layer.
        config: a config YAML (the run's ``config.yaml`` or the one it was trained with) whose data section
            rebuilds the data; default: the data settings saved in the checkpoint.
        max_train: fit the classifiers on the first MAX_TRAIN training images only (the split is in random
            order), to probe a large dataset quickly; an image folder's others are not read. Default: all.
        batch_size: images per forward pass when extracting features.
        device: "cpu", "cuda", "cuda:1", ...

    Returns:
        ``{"layer": ..., "features": test accuracy of the probe, "pixels": test accuracy on raw pixels}``.
    """
    if max_train is not None and max_train < 1:
        raise ConfigError(f"--max_train={max_train} must be at least 1 (or omitted: every training image)")
    if batch_size < 1:
        raise ConfigError(f"--batch_size={batch_size} must be at least 1")
    checkpoint = read_checkpoint(ckpt_path)
    task = load_task(ckpt_path, "ImageGPTTask", "probe", device)
    n_layers = len(task.model.decoder.layers)
    layer = task.default_probe_layer() if layer is None else layer
    if not 0 <= layer <= n_layers:
        raise ConfigError(f"--layer={layer} must be from 0 (the embeddings) to {n_layers} (the model's last layer)")
    data = _probe_data(checkpoint, ckpt_path, config)
    check_same_palette(saved=task._require_palette(), data=data.pixel_tokenizer)
    data.setup()
    train_images, train_labels = data.labelled_images("train", max_train)
    test_images, test_labels = data.labelled_images("test")

    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def accuracy(train_x: Tensor, test_x: Tensor) -> float:
        classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
        classifier.fit(train_x.numpy(), train_labels.numpy())
        return float(classifier.score(test_x.numpy(), test_labels.numpy()))

    features = accuracy(task.features(train_images, layer, batch_size), task.features(test_images, layer, batch_size))
    pixels = accuracy(train_images.flatten(1).float() / 255, test_images.flatten(1).float() / 255)
    counts = f"{len(train_images)} training, {len(test_images)} test images"
    width = task.model.config.d_model
    print(f"linear probe on layer {layer} of {n_layers} ({width} features): test accuracy {features:.2%} ({counts})")
    print(f"the same classifier on the quantised pixels ({train_images[0].numel()} features): {pixels:.2%}")
    return {"layer": layer, "features": features, "pixels": pixels}


def _write_png(picture: Tensor, path: str) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(picture.permute(1, 2, 0).contiguous().numpy()).save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())


COMMANDS = {
    "generate": generate,
    "translate": translate,
    "classify": classify,
    "fill-mask": fill_mask,
    "sample-images": sample_images,
    "probe": probe,
    "export": export,
    "average": average,
}
