"""Preparing images with their texts as the corpus grows: time and peak memory (the bar: flat memory at 20,000 and
200,000), for webdataset caption shards or LLaVA conversation files, built by repeating the Open Clip Art Library's
drawings.

    python benchmarks/image_text_preparation.py --pairs 20000 200000                  # webdataset shards
    python benchmarks/image_text_preparation.py --layout llava --pairs 20000 200000   # LLaVA conversations

``--layout shards``: img2dataset's layout, ``00000.tar`` of 10,000 ``<key>.jpg`` + ``<key>.txt``, each drawing fitted
to ``--size`` pixels once and repeated under new keys, prepared by ``ImageTextFilesDataModule``. ``--layout llava``:
one ``train.jsonl`` of LLaVA records, two turns each ("What is this?" and its caption, then "Which copy is this?"
and its number), over the distinct drawings written once as JPEG files (a record names one by its path), prepared by
``ConversationFilesDataModule`` (its tokenizer trained on the conversations, as a user without one gets). The corpora
go under ``--work`` and are kept for the next run. Each size is prepared in a fresh process (every core or
``--workers``); peak RSS is measured as data_scale.py measures it, the largest of the process
(``getrusage(RUSAGE_SELF)``) and of its preparation workers (``RUSAGE_CHILDREN``), and also as the largest sum over
the process and its workers, sampled every 0.1 s from /proc. The prepared folder is removed after each size.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PER_SHARD = 10_000
MOST_PIXELS = 20_000_000  # drawings larger than this are not among those repeated (they take seconds each to read)


def drawings(count: int, size: int) -> list[tuple[bytes, str]]:
    """(JPEG of the drawing fitted to ``size``, its first caption) of the library's first ``count`` captioned
    drawings of at most ``MOST_PIXELS`` pixels."""
    from PIL import Image

    from lightformer.data.sources import openclipart
    from lightformer.data.sources.rendering import jpeg_bytes

    root = Path(openclipart.OPENCLIPART_ROOT)
    out = []
    for drawing in openclipart.read_drawings(root, openclipart.drawing_names(root), 96):
        if isinstance(drawing, str):
            continue
        path = root / "png" / f"{drawing.name}.png"
        with Image.open(path) as opened:
            if opened.width * opened.height > MOST_PIXELS:
                continue
        out.append((jpeg_bytes(openclipart.drawing_image(path, size)), drawing.captions[0]))
        if len(out) == count:
            break
    return out


def build_shards(folder: Path, pairs: int, pool: list[tuple[bytes, str]]) -> Path:
    """``pairs`` samples in shards of ``PER_SHARD`` under ``folder`` (kept: built once), the drawings repeated."""
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text()) == pairs:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for shard in range(-(-pairs // PER_SHARD)):
        with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
            for i in range(shard * PER_SHARD, min(pairs, (shard + 1) * PER_SHARD)):
                image, caption = pool[i % len(pool)]
                for suffix, data in ((".jpg", image), (".txt", f"{caption} ({i})".encode())):
                    info = tarfile.TarInfo(f"{i:09d}{suffix}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    done.write_text(json.dumps(pairs))
    return folder


def build_conversations(folder: Path, records: int, pool: list[tuple[bytes, str]]) -> Path:
    """``records`` LLaVA records in ``folder/train.jsonl`` (kept: built once) over the pool's drawings, each written
    once as ``images/NNNN.jpg``; returns the file."""
    from lightformer.data.sources.conversations import ROLES

    done, path = folder / "done.json", folder / "train.jsonl"
    if done.is_file() and json.loads(done.read_text()) == records:
        return path
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "images").mkdir(parents=True)
    for n, (image, _) in enumerate(pool):
        (folder / "images" / f"{n:04d}.jpg").write_bytes(image)
    with path.open("w", encoding="utf-8") as f:
        for i in range(records):
            drawing, copy = i % len(pool), i // len(pool)
            turns = [("<image>\nWhat is this?", pool[drawing][1]), ("Which copy is this?", str(copy))]
            conversations = [{"from": ROLES[n % 2], "value": value} for n, value in enumerate(sum(turns, ()))]
            f.write(json.dumps({"id": i, "image": f"images/{drawing:04d}.jpg", "conversations": conversations}) + "\n")
    done.write_text(json.dumps(records))
    return path


def tree_rss_kb(pid: int) -> int:
    """The resident memory (kB) of ``pid`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        total += rss.get(current, 0)
        stack += children.get(current, [])
    return total


def prepare(layout: str, corpus: str, prepared: str, size: int, workers: int | None, val_fraction: float) -> None:
    """In the measured process: prepare the corpus, then print the peaks as JSON."""
    peak = {"sum_kb": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            peak["sum_kb"] = max(peak["sum_kb"], tree_rss_kb(os.getpid()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    from lightformer.data.families.chat import ConversationFilesDataModule
    from lightformer.data.families.image_text import ImageTextFilesDataModule
    from lightformer.data.preparation.prepare import PrepareConfig
    from lightformer.data.sources.captions import ImageTextFiles
    from lightformer.data.sources.conversations import ConversationFiles

    start = time.perf_counter()
    where = PrepareConfig(dir=prepared, num_workers=workers)
    if layout == "shards":
        source = ImageTextFiles(train=corpus, height=size, width=size, channels=3, fit="resize",
                                val_fraction=val_fraction)  # fmt: skip
        data = ImageTextFilesDataModule(source, prepare=where)
    else:
        data = ConversationFilesDataModule(ConversationFiles(corpus, image_size=size, val_fraction=val_fraction),
                                           prepare=where)  # fmt: skip
    data.prepare_data()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    print(json.dumps({"wall_s": round(wall, 1), "images": data.manifest[data.counted],
                      "parent_peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
                      "largest_worker_peak_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6, 3),
                      "sum_peak_gb": round(peak["sum_kb"] / 1e6, 3)}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", choices=["shards", "llava"], default="shards", help="webdataset or LLaVA JSONL")
    parser.add_argument("--pairs", type=int, nargs="+", default=[20_000, 200_000], help="images (with their texts)")
    parser.add_argument("--drawings", type=int, default=1000, help="distinct drawings repeated")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None, help="preparing processes (default: every core)")
    parser.add_argument("--val-fraction", type=float, default=0.01, help="carved for validation by the key's hash")
    parser.add_argument("--work", default="/tmp/lightformer-image-text-preparation")
    parser.add_argument("--prepare", nargs=2, metavar=("CORPUS", "PREPARED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.layout, *args.prepare, args.size, args.workers, args.val_fraction)
        return
    work = Path(args.work)
    pool = drawings(args.drawings, args.size)
    rows = []
    for pairs in args.pairs:
        if args.layout == "shards":
            corpus = build_shards(work / f"shards-{pairs}", pairs, pool)
        else:
            corpus = build_conversations(work / f"llava-{pairs}", pairs, pool)
        prepared = work / "prepared"
        shutil.rmtree(prepared, ignore_errors=True)
        command = [sys.executable, __file__, "--layout", args.layout, "--size", str(args.size), "--val-fraction",
                   str(args.val_fraction), "--prepare", str(corpus), str(prepared)]  # fmt: skip
        command += ["--workers", str(args.workers)] if args.workers else []
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-3000:])
        row = {"pairs": pairs, **json.loads(result.stdout.strip().splitlines()[-1])}
        row["pairs_per_s"] = round(pairs / row["wall_s"])
        rows.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(prepared, ignore_errors=True)
    print(f"\n{'pairs':>8} {'wall s':>7} {'pairs/s':>8} {'parent GB':>10} {'largest worker GB':>18} {'sum GB':>7}")
    for r in rows:
        print(f"{r['pairs']:>8,} {r['wall_s']:>7} {r['pairs_per_s']:>8} {r['parent_peak_gb']:>10} "
              f"{r['largest_worker_peak_gb']:>18} {r['sum_peak_gb']:>7}")  # fmt: skip


if __name__ == "__main__":
    main()
