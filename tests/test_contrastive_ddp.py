"""The contrastive losses under DDP on 2 gloo processes: each process's images meet every process's texts (gathered
with gradients), so the loss (the mean over the processes) and every parameter's gradient (after DDP's averaging)
are those of one process on the concatenated batch, for CLIP's and SigLIP's loss alike; and batches of unequal sizes
gather whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from lightformer.models.contrastive import ContrastiveConfig, ContrastiveModel
from lightformer.tasks.contrastive import contrastive_loss, gather_with_grad
from test_scale_out import probe
from tiny_runs import ShardProbe, build, last_checkpoint, quiet_run_args, run_cli

WORLD, PER_PROCESS, VOCAB, PAD = 2, 4, 12, 0
TINY = dict(d_model=32, n_layers=1, n_heads=2, d_ff=64)


def model_of(loss: str) -> ContrastiveModel:
    """The same model in every process (seeded), without dropout's randomness (eval mode)."""
    torch.manual_seed(0)
    config = ContrastiveConfig(image=dict(image_size=8, patch_size=4, **TINY),
                               text=dict(vocab_size=VOCAB, block_size=8, **TINY), embed_dim=16, loss=loss,
                               pad_id=PAD)  # fmt: skip
    return ContrastiveModel(config).eval()


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Images and captions of the whole batch (WORLD × PER_PROCESS pairs); captions of several lengths, padded."""
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(WORLD * PER_PROCESS, 3, 8, 8, generator=generator)
    ids = torch.randint(1, VOCAB, (WORLD * PER_PROCESS, 8), generator=generator)
    for row in range(len(ids)):
        ids[row, 3 + row % 5 :] = PAD
    return images, ids


def loss_and_gradients(model: torch.nn.Module, images, ids, inner: ContrastiveModel) -> tuple[torch.Tensor, dict]:
    image_embeddings, text_embeddings = model(images, ids)
    loss, contrasted = contrastive_loss(image_embeddings, text_embeddings, inner.scale(), inner.logit_bias,
                                        inner.config.loss)  # fmt: skip
    loss.backward()
    assert contrasted == WORLD * PER_PROCESS
    return loss.detach(), {name: p.grad.clone() for name, p in inner.named_parameters() if p.grad is not None}


def worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    images, ids = global_batch()
    mine = slice(rank * PER_PROCESS, (rank + 1) * PER_PROCESS)
    found = {}
    for loss in ("infonce", "sigmoid"):
        inner = model_of(loss)
        value, gradients = loss_and_gradients(DistributedDataParallel(inner), images[mine], ids[mine], inner)
        dist.all_reduce(value)
        found[loss] = {"loss": value / WORLD, "gradients": gradients}
    rows = torch.arange(3 + 2 * rank, dtype=torch.float32)[:, None].repeat(1, 2)  # 3 rows on rank 0, 5 on rank 1
    gathered, offset = gather_with_grad(rows)
    found["uneven"] = {"gathered": gathered, "offset": offset}
    torch.save(found, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_ddp_gathers_negatives_so_loss_and_gradients_equal_one_process_on_the_whole_batch(tmp_path):
    mp.spawn(worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]
    images, ids = global_batch()
    for loss in ("infonce", "sigmoid"):
        inner = model_of(loss)
        expected_loss, expected = loss_and_gradients(inner, images, ids, inner)
        for rank, found in enumerate(ranks):
            assert torch.allclose(found[loss]["loss"], expected_loss, rtol=1e-5, atol=1e-6), (loss, rank)
            assert found[loss]["gradients"].keys() == expected.keys()
            for name, gradient in expected.items():
                assert torch.allclose(found[loss]["gradients"][name], gradient, rtol=1e-4, atol=1e-6), (loss, name)
        assert expected["logit_scale"].abs() > 0 and all(g.abs().sum() > 0 for g in expected.values())
    whole = torch.cat([torch.arange(3.0), torch.arange(5.0)])[:, None].repeat(1, 2)
    assert [found["uneven"]["offset"] for found in ranks] == [0, 3]
    for found in ranks:
        assert torch.equal(found["uneven"]["gathered"], whole)


@pytest.mark.slow
def test_a_two_process_fit_contrasts_the_global_batch_and_evaluates_on_every_processs_images(tmp_path):
    """A 2-process gloo ``fit`` through the command line says the global batch it contrasts, and both processes end
    with the metrics of one process validating the same weights on the whole split (retrieval and zero-shot over the
    gathered embeddings; the loss, each process's batch against itself, aside)."""
    from test_contrastive import write_shapes

    train = write_shapes(tmp_path)
    args = [
        "--model=ContrastiveTask",
        "--data=test_contrastive.LabelledShapes",
        f"--data.source.train={train}",
        "--data.source.fit=resize",
        "--data.source.channels=3",
        "--data.source.height=16",
        "--data.source.width=16",
        "--data.source.val_fraction=0.25",
        "--data.tokenizer.kind=char",
        "--data.loader.batch_size=8",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        *(
            f"--model.net.{tower}.{field}"
            for tower in ("image", "text")
            for field in ("d_model=32", "n_layers=1", "n_heads=2", "d_ff=64")
        ),  # fmt: skip
        "--model.net.image.patch_size=4",
        "--model.net.text.block_size=24",
        "--model.net.embed_dim=16",
        '--model.templates=["a {}"]',
        "--model.optimizer.warmup_steps=2",
        "--trainer.logger=lightformer.training.tensorboard.TensorBoardLogger",
        *quiet_run_args(tmp_path),
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=4",
        "--trainer.check_val_every_n_epoch=null",
        "--trainer.num_sanity_val_steps=0",
    ]
    run_cli(["fit", *args, "--config=configs/trainer/ddp_cpu.yaml", probe(tmp_path / "ddp")], tmp_path / "cli.log")
    assert (
        "contrasting each image against the 16 texts of the global batch (8 per process × 2 processes)"
        in (tmp_path / "cli.log").read_text()
    )
    ranks = [json.loads((tmp_path / "ddp" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["metrics"] == ranks[1]["metrics"] and "val/zero_shot_top1" in ranks[0]["metrics"]

    single = build([*args, "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'single'}"],
                   ShardProbe(str(tmp_path / "single")))  # fmt: skip
    single.trainer.validate(single.model, single.datamodule, ckpt_path=last_checkpoint(tmp_path))
    one = json.loads((tmp_path / "single" / "rank0.json").read_text())["metrics"]
    assert one.keys() == ranks[0]["metrics"].keys()
    for name, value in one.items():
        if name != "val/loss":
            assert ranks[0]["metrics"][name] == pytest.approx(value, abs=1e-6), name
