"""Two diagnostics of why the vision-language model of configs/vlm/clipart_qa.yaml does not learn to read printed
lines (docs/results.md, "Vision-language"): ``lightformer`` with one thing changed, the rest of the command as given.

    python benchmarks/vlm_reading_variants.py scrambled fit --config configs/vlm/clipart_qa.yaml ...
    python benchmarks/vlm_reading_variants.py strips fit --config configs/vlm/clipart_qa.yaml ...

- scrambled: the lines drawn from Jane Austen's novels with every lowercase letter replaced by a random one (seed 0;
  word lengths, capitals, punctuation kept): text whose next character a language model cannot guess, so that what
  it writes comes from the image or from nowhere. The text is written once to data/austen_scrambled/austen.txt.
- strips: the projector's pixel shuffle joins each 4 × 1 column of patches (a full-height strip of a 32-pixel line,
  8 pixels wide; in a drawing, of its 32 × 8 pixels) where it joined each 2 × 2 block: the same number of tokens of
  the same width, a line's tokens in one row from left to right where they were two rows of half-height tokens.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

from torch import Tensor

from lightformer.cli.main import main as lightformer
from lightformer.data.families import chat as visual_qa
from lightformer.models import vlm

STRIP = (4, 1)  # patches joined into one token: rows, columns


def scrambled(text: str, seed: int = 0) -> str:
    """``text`` with every lowercase ASCII letter replaced by a random one."""
    rng = random.Random(seed)
    return re.sub(r"[a-z]", lambda _: rng.choice("abcdefghijklmnopqrstuvwxyz"), text)


def strips(tokens: Tensor, grid: tuple[int, int], s: int) -> Tensor:
    """``vlm.pixel_shuffle`` over ``STRIP`` blocks of patches where it joins s × s blocks (``s`` must be their size's
    square root: the projector's width is s² patches): each token the channels of a column of patches, top first."""
    rows, columns = STRIP
    if s * s != rows * columns:
        raise ValueError(f"strips join {rows * columns} patches a token: run it with pixel_shuffle=2, not {s}")
    b, _, d = tokens.shape
    h, w = grid
    x = tokens.reshape(b, h // rows, rows, w // columns, columns, d).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // rows) * (w // columns), rows * columns * d)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("scrambled", "strips"):
        raise SystemExit("usage: python benchmarks/vlm_reading_variants.py scrambled|strips <lightformer arguments>")
    variant = sys.argv.pop(1)
    if variant == "scrambled":
        corpus = Path("data/austen_scrambled/austen.txt")
        original = visual_qa.VisualQADataModule._austen

        def austen(self) -> Path:
            if not corpus.is_file():
                corpus.parent.mkdir(parents=True, exist_ok=True)
                corpus.write_text(scrambled(Path(original(self)).read_text(encoding="utf-8")), encoding="utf-8")
            return corpus

        visual_qa.VisualQADataModule._austen = austen
    else:
        vlm.pixel_shuffle = strips
    lightformer()


if __name__ == "__main__":
    main()
