"""Random reads of image records: lightformer's layout (``prepare.write_records``: image bytes as ``litdata.File``
leaves) against LitData's default for the same records (plain ``bytes`` fields, which ``litdata.optimize`` puts into
an Arrow footer), in one process.

Both folders hold the same rendered text lines (``image_text.line_records``: PNG bytes, text, typeface family), are
written by ``litdata.optimize`` through ``prepare.write_shards`` into 64 MB chunks, and are read by
``StreamingDataset(batch_decode=0)`` (what ``streaming.Records`` opens) at the same random indices, as a shuffled
training epoch reads them. An Arrow footer serves a read by converting the 256-row record batch that holds it; a
``File`` leaf is sliced out of its chunk alone.

    python benchmarks/record_reads.py                   # 20,000 lines (about a minute of rendering on 2 cores)
    python benchmarks/record_reads.py --lines 2000      # quicker
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from litdata import StreamingDataset

from lightformer.data.preparation.prepare import write_records, write_shards
from lightformer.data.sources.corpora import austen_text
from lightformer.data.sources.lines import ImageTextSource, LineDrawer, RenderConfig, line_records, split_families

PIECE = 500  # lines per piece a writing process renders


def reads_per_second(folder: Path, indices: list[int], rounds: int) -> float:
    """Median records/s over ``rounds`` passes over ``indices``."""
    dataset = StreamingDataset(str(folder), batch_decode=0)
    dataset[0]  # opened, first chunk mapped
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        for index in indices:
            dataset[index]
        rates.append(len(indices) / (time.perf_counter() - start))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=20_000, help="rendered lines in each folder")
    parser.add_argument("--reads", type=int, default=3_000, help="random reads per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per layout (median kept)")
    parser.add_argument("--workers", type=int, default=None, help="writing processes (default: every core)")
    parser.add_argument("--data-root", default="data", help="where the Austen corpus is stored")
    args = parser.parse_args(argv)

    source = ImageTextSource(train_lines=args.lines, data_root=args.data_root)
    families = tuple(split_families(source).items())
    drawer = LineDrawer(source, RenderConfig(), 0, str(austen_text(Path(args.data_root) / "austen")), families)
    pieces = [(start, min(start + PIECE, args.lines)) for start in range(0, args.lines, PIECE)]
    random.seed(0)
    indices = [random.randrange(args.lines) for _ in range(args.reads)]
    records = partial(line_records, drawer=drawer, split="train")  # the same records in both layouts
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        layouts = {
            "lightformer (litdata.File leaves)": lambda folder: write_records(
                folder, records, pieces, args.workers, ("text",)
            ),
            "LitData's default (bytes fields, Arrow footer)": lambda folder: write_shards(
                folder, records, pieces, args.workers
            ),
        }
        for i, (name, write) in enumerate(layouts.items()):
            folder = Path(tmp) / f"layout{i}"
            start = time.perf_counter()
            write(folder)
            seconds = time.perf_counter() - start
            size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
            rows.append((name, seconds, size, reads_per_second(folder, indices, args.rounds)))
    print(f"{args.lines:,} rendered lines, {args.reads:,} random reads per round, median of {args.rounds} rounds")
    print("| layout | writing (s) | on disk (MB) | random reads/s | µs per read |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds, size, rate in rows:
        print(f"| {name} | {seconds:.1f} | {size / 1e6:.1f} | {rate:,.0f} | {1e6 / rate:.0f} |")
    print(f"ratio lightformer/default reads/s: {rows[0][3] / rows[1][3]:.1f}")


if __name__ == "__main__":
    main()
