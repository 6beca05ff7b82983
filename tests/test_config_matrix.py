"""Every shipped config composes with every CPU trainer preset and trains a few steps, through the one command
that prints the config × preset table (``benchmarks/config_matrix.py``): one process, DDP and FSDP2 on 2 processes."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_PRESETS = {"cpu", "ddp_cpu", "fsdp_cpu"}


@pytest.mark.slow
def test_every_config_trains_on_every_cpu_preset(tmp_path):
    results = tmp_path / "matrix.json"
    command = [sys.executable, "benchmarks/config_matrix.py", "--quick", "--steps=3", "--jobs=2", f"--json={results}"]
    finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = json.loads(results.read_text())
    configs = {str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").glob("*/*.yaml")}
    configs -= {c for c in configs if c.startswith("trainer/")}
    assert {(row["config"], row["preset"]) for row in rows} == {(c, p) for c in configs for p in CPU_PRESETS}
    for row in rows:
        where = f"{row['config']} × {row['preset']}"
        if row["status"] == "unavailable":  # data this machine cannot download, or a pretraining run not made here
            if row["config"] == "classify/austen_from_mlm.yaml":
                assert "runs/mlm_austen" in row["detail"] and "pretraining run" in row["detail"], where
            else:
                assert row["config"] == "vision/vit_cifar10.yaml" and "internet" in row["detail"], where
            continue
        assert row["status"] == "ok", f"{where}: {row.get('detail')}"
        assert row["steps"] == 3 and math.isfinite(row["loss"]), where
    assert "| config | preset | result | steps/s | peak memory |" in finished.stdout
