"""``read`` of a printed line longer than the model's canvas (issue 73's bar): its CER read whole, in the overlapping
windows ``read`` cuts at the trained height (``lightformer.tasks.image_text.line_canvases``), against the CER of the
same text cut into canvas-sized pieces (whole words, each rendered on the canvas as training renders a line) and
read one by one, joined with spaces. The bar: the whole line within 2 points of the pieces.

The texts are ``--chars``-character stretches of the test split of Austen's novels (text the model never trained on,
cut at word boundaries), rendered in a held-out typeface (``--family``, one of ``printed_lines.yaml``'s held-out
families: never trained on) at the trained height, with the training's default style (no blur, noise, rotation),
the line at the left of a strip ``--width`` pixels wide (the rest is paper), saved as PNG and read by the code of
``lightformer read``. CER by torchmetrics' ``CharErrorRate`` over all lines (total edits / total characters).

    python benchmarks/long_lines.py --ckpt_path runs/printed_lines/version_0/checkpoints/last.ckpt
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
from torchmetrics.text import CharErrorRate

from lightformer.data.sources.corpora import austen_text
from lightformer.data.sources.image_files import to_normalised_tensor
from lightformer.data.sources.lines import split_sentences
from lightformer.data.sources.rendering import LineStyle, LineTooWide, declared_fonts, ink_mask, render_line
from lightformer.tasks.image_text import ImageToTextTask


def stretches(text: str, chars: int, count: int, seed: int) -> list[str]:
    """``count`` stretches of about ``chars`` characters (at most, whole words) of ``text``, from random places."""
    words, rng, found = text.split(), random.Random(seed), []
    while len(found) < count:
        start, line = rng.randrange(len(words) - 40), ""
        for word in words[start:]:
            if len(line) + 1 + len(word) > chars:
                break
            line = f"{line} {word}".strip()
        if len(line) >= chars - 8:
            found.append(line)
    return found


def pieces_of(text: str, font: str, style: LineStyle, height: int, width: int) -> list[str]:
    """``text`` cut between words into the longest pieces that fit the canvas, rendered as training renders them."""
    pieces, piece = [], ""
    for word in text.split():
        longer = f"{piece} {word}".strip()
        if piece and style.margin + ink_mask(longer, font, style, height).width + 1 > width:
            pieces.append(piece)
            longer = word
        piece = longer
    return [*pieces, piece]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="an image-to-text checkpoint (printed_lines.yaml's)")
    parser.add_argument("--lines", type=int, default=50, help="how many lines")
    parser.add_argument("--chars", type=int, default=60, help="characters of a line (at most, whole words)")
    parser.add_argument("--width", type=int, default=2000, help="the strip's width in pixels (the line at its left)")
    parser.add_argument("--family", default="DejaVu Serif", help="a typeface family never trained on")
    parser.add_argument("--beam_size", type=int, default=None, help="default: the model's")
    parser.add_argument("--corpus", default="data/austen", help="the folder of austen.txt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    task = ImageToTextTask.load_from_checkpoint(args.ckpt_path, map_location="cpu", weights_only=True)
    height, width = task.model.config.encoder.image_size
    font = declared_fonts()[args.family][0]
    style = LineStyle()
    texts = stretches(" ".join(split_sentences("austen", str(austen_text(args.corpus)))["test"]), args.chars,
                      args.lines, args.seed)  # fmt: skip
    normalise = to_normalised_tensor(task.data_facts.normalize_mean, task.data_facts.normalize_std)
    whole, pieces, widths = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for i, text in enumerate(texts):
            needed = style.margin + ink_mask(text, font, style, height).width + 1
            widths.append(needed)
            line = render_line(text, font, style, height, max(needed, args.width))
            path = Path(folder) / f"line_{i}.png"
            line.save(path)
            (reading,) = task.read_files([str(path)], args.beam_size, warn=print)
            whole.append(reading)
            cut = pieces_of(text, font, style, height, width)
            try:
                canvases = [normalise(render_line(piece, font, style, height, width)) for piece in cut]
            except LineTooWide:  # a single word wider than the canvas: not comparable
                canvases = None
            pieces.append(" ".join(task.read_images(torch.stack(canvases), args.beam_size)) if canvases else "")
    cer_whole = float(CharErrorRate()(whole, texts)) * 100
    cer_pieces = float(CharErrorRate()(pieces, texts)) * 100
    for text, reading, joined in list(zip(texts, whole, pieces, strict=True))[:5]:
        print(f"text:   {text}\nwhole:  {reading}\npieces: {joined}\n")
    print(f"{len(texts)} lines of {np.mean([len(t) for t in texts]):.0f} characters in {args.family}, the text "
          f"{np.mean(widths):.0f} pixels wide at the trained height {height} (canvas {width}), on {args.width}-pixel "
          "strips")  # fmt: skip
    print(f"| read | CER |\n|---|---|\n| the whole line (windows) | {cer_whole:.2f}% |\n"
          f"| canvas-sized pieces | {cer_pieces:.2f}% |")  # fmt: skip
    verdict = "within" if cer_whole - cer_pieces <= 2 else "NOT within"
    print(f"difference: {cer_whole - cer_pieces:+.2f} points ({verdict} the bar of 2 points)")


if __name__ == "__main__":
    main()
