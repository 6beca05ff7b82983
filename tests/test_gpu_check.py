"""benchmarks/gpu_check.py's dry run (every part of the GPU check, through the same code, on the CPU at tiny sizes),
and the device handling of benchmarks/fit_overhead.py's bare step, which a GPU run needs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_runs import CORPUS, quiet_run_args

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmarks(monkeypatch):
    """The benchmarks' modules become importable."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_the_bare_step_trains_on_the_device_of_the_recorded_batches(benchmarks, monkeypatch, tmp_path):
    """On a GPU, fit's teardown moves the task back to the CPU while the batches it recorded stay on the GPU; the bare
    step must move the task to the batches (before building its optimizer). Here the batches go to the meta device
    in the GPU's place, where SGD can step (AdamW reads its step count, which a meta tensor does not hold)."""
    import fit_overhead

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    tiny = [*quiet_run_args(tmp_path), "--data.source.corpus=null", f"--data.source.train_files=[{corpus}]",
            f"--data.prepare.dir={tmp_path / 'prepared'}", "--data.block_size=16", "--data.loader.batch_size=8",
            "--model.net.n_layers=1", "--model.net.d_model=32", "--model.net.n_heads=2"]  # fmt: skip
    cli, window = fit_overhead.fit_window("configs/lm/austen_char.yaml", 3, 1, tiny, str(tmp_path / "runs"))
    assert {p.device.type for p in cli.model.parameters()} == {"cpu"}  # where the teardown left it
    batches = [tuple(tensor.to("meta") for tensor in batch) for batch in window.batches]
    assert fit_overhead.batches_device(batches) == torch.device("meta")
    assert fit_overhead.batches_device([{"src": batches[0][0]}]) == torch.device("meta")  # a batch of named tensors

    monkeypatch.setattr(torch.optim, "AdamW", lambda groups, lr, betas, fused: torch.optim.SGD(groups, lr=lr))
    seconds = fit_overhead.bare_seconds(cli, batches)
    assert len(seconds) == len(batches) == 3
    assert {p.device.type for p in cli.model.parameters()} == {"meta"}


@pytest.mark.slow
def test_the_dry_run_reports_a_figure_for_every_part(benchmarks, tmp_path):
    """The parts in two halves side by side, one thread each (the CPU's two cores), each half one check with its
    own report, and ``--parts`` exercised."""
    import gpu_check

    halves = (gpu_check.PARTS[:6], gpu_check.PARTS[6:])  # 85 s and 105 s of parts, one thread each
    outputs = [tmp_path / f"gpu_check_{i}.md" for i in range(len(halves))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--dry-run", "--output", str(output), "--parts", *half],
            cwd=BENCHMARKS.parent,
            env=env,
        )
        for half, output in zip(halves, outputs, strict=True)
    ]
    assert [run.wait(timeout=600) for run in runs] == [0, 0]
    sections = {}
    for half, output in zip(halves, outputs, strict=True):
        report = output.read_text()
        assert report.startswith("# GPU check (dry run")
        assert re.search(r"^- device: .*\n- versions: Python .*torch .*lightning .*jsonargparse", report, re.MULTILINE)
        found = dict(re.findall(r"^## (\S+): .*?\n(.*?)(?=^## |\Z)", report, re.MULTILINE | re.DOTALL))
        assert list(found) == list(half)  # only the parts asked for, in order
        sections.update(found)
        log = output.with_suffix(".log").read_text()  # each part's whole output, its commands first
        assert re.findall(r"^# (\S+): ok\n\$ python ", log, re.MULTILINE) == list(half)
    for name, section in sections.items():
        assert re.search(r"^Result: \*\*ok\*\*, \d+ s$", section, re.MULTILINE), (name, section)
        figures = "\n".join(line for line in section.splitlines() if line.startswith("- "))
        assert re.search(r"\d", figures), (name, section)
