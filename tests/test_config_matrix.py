"""Every shipped config trains a few steps on one process, and every task on DDP and FSDP2 (2 processes), through
the one command that prints the config × preset table (``benchmarks/config_matrix.py``)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


# On 2 processes (DDP, FSDP2), one config of each task: the distributed code paths are the task's; the data and
# shapes of its other configs are tried on one process. (Every config on every preset: the same command without
# --presets/--configs, ~10 minutes here.)
DISTRIBUTED = [
    "lm/austen_char.yaml",
    "translation/ding_de_en.yaml",
    "vision/vit_digits.yaml",
    "mlm/austen.yaml",
    "t5/austen.yaml",
    "classify/austen_scratch.yaml",
    "igpt/digits.yaml",
]


def run_matrix(tmp_path, name: str, *options: str) -> tuple[list[dict], str]:
    results = tmp_path / f"{name}.json"
    command = [sys.executable, "benchmarks/config_matrix.py", "--quick", "--steps=3", "--jobs=2", f"--json={results}"]
    finished = subprocess.run([*command, *options], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(results.read_text()), finished.stdout


def task_of(config: str) -> str:
    return yaml.safe_load((REPO / "configs" / config).read_text())["model"]["class_path"]


@pytest.mark.slow
def test_every_config_trains_on_one_process_and_every_task_on_ddp_and_fsdp2(tmp_path):
    configs = {str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").glob("*/*.yaml")}
    configs -= {c for c in configs if c.startswith("trainer/")}
    assert {task_of(c) for c in DISTRIBUTED} == {task_of(c) for c in configs}, "a task without a distributed cell"
    single, table = run_matrix(tmp_path, "single", "--presets", "cpu")
    distributed, _ = run_matrix(tmp_path, "distributed", "--presets", "ddp_cpu", "fsdp_cpu", "--configs", *DISTRIBUTED)
    expected = {(c, "cpu") for c in configs} | {(c, p) for c in DISTRIBUTED for p in ("ddp_cpu", "fsdp_cpu")}
    rows = single + distributed
    assert {(row["config"], row["preset"]) for row in rows} == expected
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
    assert "| config | preset | result | steps/s | peak memory |" in table
