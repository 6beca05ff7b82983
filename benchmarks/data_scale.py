"""How preparation and streaming grow with the corpus: prepare wall time (1 and 2 workers), peak RSS of prepare, of
`fit` and of each rank of a two-process DDP `fit`, and the streaming loader's tokens/s per process, for corpora
built by repeating Jane Austen's novels.

    python benchmarks/data_scale.py --sizes-mb 40 400 4000 --tokenizer char
    python benchmarks/data_scale.py --rendered-lines 4000 50000 200000   # image to text: rendering lines
    python benchmarks/data_scale.py --source-documents-mb 40 400         # a user's Source (TextData)

Each measurement runs in a fresh process (`lightformer prepare` / `fit`); peak RSS is the largest of the process and
its preparation workers (``getrusage(RUSAGE_CHILDREN)``). The corpora go under ``--work`` and are kept for the next run
(delete the folder when done); the prepared shards are removed after each size. 4 GB needs 12 GB of free disk while it
runs. Repeated text is fine for memory and speed figures, not for quality ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lightformer.data.sources import Source, file_stamps

REPO = Path(__file__).resolve().parents[1]


def build_corpus(path: Path, size_mb: int) -> Path:
    """A file of ``size_mb`` MB: Austen's novels repeated (written in 4 MB appends, never held whole)."""
    if path.exists() and path.stat().st_size >= size_mb * 1_000_000:
        return path
    from lightformer.data.sources.corpora import austen_text

    novels = austen_text(REPO / "data" / "austen").read_text(encoding="utf-8") + "\n"
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < size_mb * 1_000_000:
            f.write(novels)
    return path


# Runs a command and prints the peak RSS (kB) of the largest process among it and its descendants.
PEAK = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)"
)


def run(args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GB of the command and its workers, stdout) of a fresh process."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", PEAK, sys.executable, *args], cwd=REPO, capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return wall, int(result.stderr.strip().splitlines()[-1]) / 1e6, result.stdout


def data_args(corpus: Path, prepared: Path, tokenizer: str, workers: int) -> list[str]:
    return [
        "--config=configs/lm/austen_char.yaml",
        "--data.source.corpus=null",
        f"--data.source.train_files=[{corpus}]",
        f"--data.prepare.dir={prepared}",
        f"--data.prepare.num_workers={workers}",
        f"--data.tokenizer.kind={tokenizer}",
        "--data.tokenizer.vocab_size=8192",
    ]


LOADER_SPEED = """
import sys, time
from lightformer.data.preparation.prepare import PreparedText
from lightformer.data.loading.streaming import LoaderConfig, training_loader
prepared = PreparedText(sys.argv[1])
loader = training_loader(prepared.split_dir("train"), 1024, LoaderConfig(batch_size=16), seed=0)
start, tokens = time.perf_counter(), 0
for x, _ in loader:
    tokens += x.numel()
    if time.perf_counter() - start > 10:
        break
print(tokens / (time.perf_counter() - start))
"""


def rendered_lines(counts: list[int], work: Path, workers: int) -> None:
    """How rendering text lines into records (``ImageTextDataModule``, configs/image_text/printed_lines.yaml) grows
    with the lines: wall time, peak RSS of the largest process, and the records' size on disk, per count."""
    for count in counts:
        prepared = work / f"prepared-lines-{count}"
        shutil.rmtree(prepared, ignore_errors=True)
        wall, rss, _ = run(["-m", "lightformer", "prepare", "--config=configs/image_text/printed_lines.yaml",
                            f"--data.source.train_lines={count}", "--data.source.val_lines=0",
                            "--data.source.test_lines=0", f"--data.prepare.dir={prepared}",
                            f"--data.prepare.num_workers={workers}"])  # fmt: skip
        size = sum(f.stat().st_size for f in prepared.rglob("*") if f.is_file())
        print(json.dumps({"lines": count, "workers": workers, "prepare_s": round(wall, 1),
                          "lines_per_s": round(count / wall), "prepare_rss_gb": round(rss, 2),
                          "disk_mb": round(size / 1e6, 1)}), flush=True)  # fmt: skip
        shutil.rmtree(prepared)


@dataclass(frozen=True)
class CorpusParagraphs(Source):
    """A user's source as docs/data.md writes one: the paragraphs of ``file`` (blocks between blank lines), each a
    document; every 20th validates. Read a line at a time: nothing holds the file."""

    file: str
    splits = ("train", "val")

    def fingerprint(self) -> dict:
        return {"file": file_stamps([self.file])}

    def records(self, split: str) -> Iterator[dict]:
        paragraph, index = [], 0
        with open(self.file, encoding="utf-8") as lines:
            for line in itertools.chain(lines, ["\n"]):  # a blank line ends the last paragraph
                if line.strip():
                    paragraph.append(line)
                elif paragraph:
                    if (index % 20 == 0) == (split == "val"):
                        yield {"text": "".join(paragraph)}
                    paragraph, index = [], index + 1


def source_documents(sizes: list[int], work: Path, tokenizer: str) -> None:
    """How preparing a user's ``Source`` (``TextData``: documents into token shards, ``prepare_documents``) grows with
    its size: wall time and peak RSS of ``lightformer prepare``, per size."""
    for size in sizes:
        corpus = build_corpus(work / f"corpus-{size}mb.txt", size)
        prepared = work / f"prepared-documents-{size}"
        shutil.rmtree(prepared, ignore_errors=True)
        config = work / "documents.yaml"
        config.write_text(json.dumps({"data": {"class_path": "lightformer.data.TextData", "init_args": {
            "source": {"class_path": "data_scale.CorpusParagraphs", "init_args": {"file": str(corpus)}},
            "tokenizer": {"kind": tokenizer, "vocab_size": 8192}, "prepare": {"dir": str(prepared)}}}}))  # fmt: skip
        wall, rss, _ = run(["-m", "lightformer", "prepare", "--config=configs/lm/austen_char.yaml", "--data=null",
                            f"--config={config}"])  # fmt: skip
        print(json.dumps({"documents_mb": size, "tokenizer": tokenizer, "prepare_s": round(wall, 1),
                          "prepare_rss_gb": round(rss, 2)}), flush=True)  # fmt: skip
        shutil.rmtree(prepared)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[40, 400])
    parser.add_argument("--tokenizer", choices=["char", "bpe"], default="char")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lightformer-data-scale"))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rendered-lines", type=int, nargs="+", help="measure rendering this many text lines instead")
    parser.add_argument("--source-documents-mb", type=int, nargs="+", help="measure a user's Source of these sizes")
    options = parser.parse_args()
    options.work.mkdir(parents=True, exist_ok=True)
    if options.rendered_lines:
        rendered_lines(options.rendered_lines, options.work, options.workers[-1])
        return
    if options.source_documents_mb:
        source_documents(options.source_documents_mb, options.work, options.tokenizer)
        return
    rows = []
    for size in options.sizes_mb:
        corpus = build_corpus(options.work / f"corpus-{size}mb.txt", size)
        row = {"size_mb": size, "tokenizer": options.tokenizer}
        for workers in options.workers:
            prepared = options.work / f"prepared-{size}-{workers}"
            shutil.rmtree(prepared, ignore_errors=True)
            wall, rss, out = run(
                ["-m", "lightformer", "prepare", *data_args(corpus, prepared, options.tokenizer, workers)]
            )
            row[f"prepare_s_{workers}w"], row[f"prepare_rss_gb_{workers}w"] = round(wall, 1), round(rss, 2)
            print(json.dumps(row), flush=True)  # so far: a later step that fails leaves these figures
            folder = out.strip().removeprefix("prepared: ")
            if workers != options.workers[-1]:
                shutil.rmtree(prepared)  # one prepared copy on disk at a time (4 GB of text: 8 GB of char shards)
        fit = ["-m", "lightformer", "fit", *data_args(corpus, prepared, options.tokenizer, workers)] + [
            "--trainer.max_steps=20", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
            "--trainer.limit_val_batches=2", "--trainer.val_check_interval=10",
            f"--trainer.default_root_dir={options.work}",
        ]  # fmt: skip
        row["fit_rss_gb"] = round(run(fit)[1], 2)
        # Two DDP processes (gloo): the peak of the largest process is the peak of one rank.
        row["fit_ddp_rss_gb_per_rank"] = round(run([*fit, "--config=configs/trainer/ddp_cpu.yaml"])[1], 2)
        speed = subprocess.run([sys.executable, "-c", LOADER_SPEED, folder], capture_output=True, text=True, check=True)
        row["loader_tokens_per_s"] = round(float(speed.stdout.strip()))
        shutil.rmtree(prepared)  # the corpus stays for the next run; its shards are twice its size
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{os.cpu_count()} cores; {' | '.join(rows[0])}")


if __name__ == "__main__":
    main()
