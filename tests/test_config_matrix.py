"""Every shipped CPU config trains a few steps on one process, through the one command that prints the config × preset
table (``benchmarks/config_matrix.py``). The distributed presets are tested per data pipeline in
``tests/test_scale_out.py`` (DDP against one process, FSDP2 against DDP, on 2 CPU processes): running the shipped
configs on them here too took ~3.7 of CI's 20 minutes and found nothing those tests do not."""

import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_runs import ALL_TASKS, task_args

REPO = Path(__file__).resolve().parents[1]


def run_matrix(tmp_path, name: str, *options: str) -> tuple[list[dict], str]:
    results = tmp_path / f"{name}.json"
    command = [sys.executable, "benchmarks/config_matrix.py", "--quick", "--steps=3", "--jobs=2", f"--json={results}"]
    finished = subprocess.run([*command, *options], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(results.read_text()), finished.stdout


def task_of(config: str) -> str:
    return yaml.safe_load((REPO / "configs" / config).read_text())["model"]["class_path"]


def shipped_configs() -> set[str]:
    """The task configs (not the trainer presets), relative to configs/."""
    configs = {str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").glob("*/*.yaml")}
    return {c for c in configs if not c.startswith("trainer/")}


def cpu_configs() -> set[str]:
    """The configs made for a CPU. The GPU ones (GPT-2 small, Transformer base, ...) take minutes of CI on a CPU:
    ``tests/test_scale_out.py`` composes them with every preset, and ``benchmarks/config_matrix.py`` trains them
    where there is a GPU."""
    return {c for c in shipped_configs() if yaml.safe_load((REPO / "configs" / c).read_text())["trainer"].get(
        "accelerator") == "cpu"}  # fmt: skip


def test_every_task_of_the_configs_is_one_of_the_tiny_runs(tmp_path):
    tiny = set()
    for task in ALL_TASKS:
        args = task_args(task, tmp_path / task)
        (config,) = [arg.removeprefix("--config=configs/") for arg in args if arg.startswith("--config=configs/")]
        tiny.add(task_of(config))
    assert tiny == {task_of(c) for c in shipped_configs()}, "a task without a tiny run: add it to tiny_runs"


@pytest.mark.slow
def test_every_config_trains_on_one_process(tmp_path):
    configs = cpu_configs()
    rows, table = run_matrix(tmp_path, "single", "--presets", "cpu", "--configs", *sorted(configs))
    assert {(row["config"], row["preset"]) for row in rows} == {(c, "cpu") for c in configs}
    for row in rows:
        where = f"{row['config']} × {row['preset']}"
        if row["status"] == "unavailable":  # data this machine cannot download, or a pretraining run not made here
            pretraining = {"classify/austen_from_mlm.yaml": "runs/mlm_austen",
                           "image_text/printed_lines_from_lm.yaml": "runs/austen_char",
                           "vlm/clipart_qa.yaml": "runs/clipart/",
                           "vlm/clipart_qa_projector.yaml": "runs/clipart/"}  # fmt: skip
            assert row["config"] in pretraining, where
            assert pretraining[row["config"]] in row["detail"] and "pretraining run" in row["detail"], where
            continue
        assert row["status"] == "ok", f"{where}: {row.get('detail')}"
        assert row["steps"] == 3 and math.isfinite(row["loss"]), where
    assert "| config | preset | result | steps/s | peak memory |" in table


def test_configs_whose_data_this_machine_cannot_get_are_reported_unavailable(monkeypatch, tmp_path):
    """The configs whose data a user brings, downloads or trains first, read from a folder that has none of it:
    each is named unavailable, with what is missing (a renamed config key would make it an error of the matrix's run
    instead)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    unavailable = importlib.import_module("config_matrix").unavailable
    monkeypatch.chdir(tmp_path)
    reasons = {c: unavailable(yaml.safe_load((REPO / "configs" / c).read_text())) for c in shipped_configs()}
    assert {c: r for c, r in reasons.items() if r} == {
        "classify/austen_from_mlm.yaml": "starts from runs/mlm_austen/version_0/checkpoints/last.ckpt, which a "
        "pretraining run writes first (see the config's comments)",
        "contrastive/captions.yaml": "reads data/shards, which is not on this machine (see the config's comments)",
        "image_text/captions.yaml": "reads data/coco/annotations/captions_train2017.json, which is not on this machine "
        "(see the config's comments)",
        "image_text/printed_lines_from_lm.yaml": "starts from runs/austen_char/version_0/checkpoints/last.ckpt, which "
        "a pretraining run writes first (see the config's comments)",
        "vision/vit_cifar10.yaml": "CIFAR-10 is downloaded by torchvision (needs internet); put cifar-10-batches-py in "
        "data/",
        **{
            f"vlm/{name}.yaml": f"starts from runs/{run}/version_0/checkpoints/last.ckpt, which a pretraining run "
            "writes first (see the config's comments)"
            for name, run in [
                ("clipart_qa", "clipart"),
                ("clipart_qa_projector", "clipart"),
                ("llava_jsonl", "captions_clip"),
                ("vlm_gpu", "clipart_gpu"),
            ]
        },  # fmt: skip
    }
