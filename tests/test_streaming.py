"""The language-model data streamed from prepared shards: a run killed mid-epoch resumes with exactly the batches an
uninterrupted run sees (one process, two DDP processes), and two nodes launched by torchrun share every epoch."""

import json
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_runs import finish, recorded, run_cli, start_cli, task_args

# Random numbers: no two windows of the corpus hold the same ids, so windows can be told apart by their ids.
TEXT = "".join(" ".join(map(str, np.random.default_rng(i).integers(0, 10**6, 11))) + ".\n" for i in range(60))


def lm_args(tmp_path: Path, *extra: str) -> list[str]:
    """The tiny language-model run of ``tiny_runs``, on TEXT (about 4.5 k tokens: 240 windows of 17 ids)."""
    args = task_args("lm", tmp_path)
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    return [*args, "--data.source.val_fraction=0.1", "--trainer.max_epochs=-1", *extra]


def callback(name: str, **init_args) -> str:
    return f"--trainer.callbacks+={json.dumps({'class_path': f'tiny_runs.{name}', 'init_args': init_args})}"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_a_run_killed_mid_epoch_resumes_with_exactly_the_batches_it_would_have_seen(tmp_path, processes):
    ddp = ["--config=configs/trainer/ddp_cpu.yaml"] if processes == 2 else []
    every = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
             "--trainer.callbacks.every_n_train_steps=5", "--trainer.callbacks.save_top_k=-1",
             "--trainer.callbacks.monitor=null", "--trainer.callbacks.filename={step}",
             "--trainer.callbacks.save_last=true"]  # fmt: skip
    per_epoch = 28 // processes  # about: LitData gives each rank as many windows, in whole batches
    max_steps = per_epoch + per_epoch // 2 + 3  # into the second epoch
    kill_at = 5 * (per_epoch // 10) + 2  # mid-epoch, 2 steps after a checkpoint (one every 5 steps)
    # The uninterrupted run goes on beside the killed one: each launch leaves a core idle while its ranks import.
    straight = tmp_path / "straight"
    straight_args = [*lm_args(straight, *ddp), f"--trainer.max_steps={max_steps}",
                     callback("RecordBatches", out_dir=str(straight / "batches"))]  # fmt: skip
    uninterrupted = start_cli(["fit", *straight_args], straight / "cli.log", threads=1)

    killed = tmp_path / "killed"
    args = [*lm_args(killed, *ddp, *every), f"--trainer.max_steps={max_steps}"]
    killed_run = start_cli(["fit", *args, callback("KillAt", step=kill_at)], killed / "killed.log", threads=1)
    assert killed_run.wait(timeout=600) != 0, (killed / "killed.log").read_text()[-3000:]  # by SIGKILL (both ranks)
    finish(uninterrupted, straight / "cli.log")
    checkpoints = killed / "runs" / "austen_char" / "version_0" / "checkpoints"
    resumed_from = torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < resumed_from < kill_at and resumed_from % 5 == 0
    resume = [
        *args,
        callback("RecordBatches", out_dir=str(killed / "batches")),
        f"--ckpt_path={checkpoints / 'last.ckpt'}",
    ]
    run_cli(["fit", *resume], killed / "resumed.log", threads=1)

    for rank in range(processes):
        expected = [b for b in recorded(straight / "batches", "train", rank) if b["step"] >= resumed_from]
        actual = recorded(killed / "batches", "train", rank)
        assert [b["step"] for b in actual] == list(range(resumed_from, max_steps))
        assert actual == expected, f"rank {rank}: the resumed run saw other batches"
    final = torch.load(checkpoints / "last.ckpt", weights_only=True)
    reference = torch.load(next((straight / "runs").rglob("last.ckpt")), weights_only=True)
    assert final["global_step"] == reference["global_step"] == max_steps
    for name, value in reference["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][name], value, rtol=1e-5, atol=1e-6, msg=name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_launched_by_torchrun_share_each_epoch_and_evaluate_every_window_once(tmp_path):
    """The README's multi-node command, as two nodes of one CPU process each meeting on 127.0.0.1."""
    port = free_port()
    args = [
        *lm_args(tmp_path, "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=2",
                 "--trainer.strategy=ddp", "--trainer.max_epochs=1", "--trainer.logger=false",
                 f"--trainer.default_root_dir={tmp_path}"),
        callback("RecordBatches", out_dir=str(tmp_path / "batches")),
    ]  # fmt: skip
    nodes = []
    for node in (0, 1):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                    "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}"]  # fmt: skip
        log = tmp_path / f"node{node}.log"
        nodes.append((start_cli(["fit", *args], log, launcher=torchrun, threads=1), log))
    # Judge the nodes only once none is left running: a node whose peer failed waits for it at the next collective,
    # so the first node to fail (either one) or the time limit ends the wait, and the other is stopped.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not any(node.poll() for node, _ in nodes):
        if all(node.returncode is not None for node, _ in nodes):
            break
        time.sleep(0.5)
    for node, _ in nodes:
        node.terminate()  # torchrun passes SIGTERM on to its worker; a no-op for a node that has ended
    for node, log in nodes:
        finish(node, log)
    assert len(list((tmp_path / "prepared").glob("*/prepared.json"))) == 1  # prepared once, for both nodes

    train = [
        [tuple(row) for batch in recorded(tmp_path / "batches", "train", rank) for row in batch["rows"]]
        for rank in (0, 1)
    ]
    windows = json.loads(next((tmp_path / "prepared").glob("*/prepared.json")).read_text())["tokens"]["train"] // 17
    assert len(train[0]) == len(train[1]) > 0  # as many windows each, in batches of 8
    assert len(set(train[0] + train[1])) == len(train[0]) + len(train[1])  # no window twice, on a node or across
    assert windows - 4 * 8 < len(train[0]) + len(train[1]) <= windows  # all but what evens out the ranks' batches
    step = recorded(tmp_path / "batches", "train", 0)[-1]["step"] + 1
    val = [
        [tuple(row) for batch in recorded(tmp_path / "batches", f"val{step}", rank) for row in batch["rows"]]
        for rank in (0, 1)
    ]
    assert not set(val[0]) & set(val[1]) and len(val[0]) + len(val[1]) == len(set(val[0] + val[1])) > 0
