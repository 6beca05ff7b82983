"""The command line: ``python -m lightformer fit|validate|test|predict --config FILE`` through LightningCLI,
plus commands that need a checkpoint alone: ``generate`` (continue a prompt), ``translate`` (a file or
standard input) and ``classify`` (image files).

Sizes that come from the data are linked into the model when both are instantiated: each attribute of
the data module named in ``DATA_LINKS`` fills the task's argument of the same name, where the task has one.
"""

from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.cli import LightningCLI

DATA_LINKS = (
    "vocab_size",
    "block_size",
    "num_classes",
    "image_size",
    "in_channels",
    "src_vocab_size",
    "tgt_vocab_size",
    "pad_id",
)


class LightformerCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        for name in DATA_LINKS:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")


def cli_main(args: list[str] | None = None, run: bool = True) -> LightformerCLI:
    """Build (and by default run) the LightningCLI over every task and data module (subclass mode)."""
    return LightformerCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=args,
        run=run,
    )


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
    from lightformer.tasks.language_model import LanguageModelTask

    task = LanguageModelTask.load_from_checkpoint(ckpt_path, map_location=device)
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
    from lightformer.tasks.translation import TranslationTask

    task = TranslationTask.load_from_checkpoint(ckpt_path, map_location=device)
    stream = sys.stdin if input == "-" else open(input, encoding="utf-8")  # noqa: SIM115
    with stream:
        lines = [line.rstrip("\n") for line in stream]
    for start in range(0, len(lines), batch_size):
        for translation in task.translate(lines[start : start + batch_size], beam_size):
            print(translation)


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
    import glob

    from lightformer.tasks.image_classification import ImageClassificationTask

    if ckpt_path is None or not images:
        raise SystemExit("classify needs --ckpt_path CHECKPOINT and --images FILE (or a list or pattern of files)")
    patterns = [images] if isinstance(images, str) else images
    paths = [path for p in patterns for path in (sorted(glob.glob(p)) if glob.has_magic(p) else [p])]
    task = ImageClassificationTask.load_from_checkpoint(ckpt_path, map_location=device)
    for path, ranked in zip(paths, task.classify_files(paths, top_k), strict=True):
        print(f"{path}: " + ", ".join(f"{name} ({probability:.1%})" for name, probability in ranked))


COMMANDS = {"generate": generate, "translate": translate, "classify": classify}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in COMMANDS:
        from jsonargparse import auto_cli

        auto_cli(COMMANDS[args[0]], args=args[1:])
    else:
        cli_main(argv)
