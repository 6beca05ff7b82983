"""The image-to-text checkpoint written by commit b1bd12e (tests/data/old_checkpoints/b1bd12e/, made by its make.py),
when the model's config was one flat list of both towers' fields, still works with today's nested config: the task and
its model are rebuilt with the towers it had and saved nested, ``export`` takes it, and a new run starts from it in
its shape (``read``, ``test`` and ``fit --ckpt_path`` on it: tests/test_old_checkpoints.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from lightformer.cli import commands
from lightformer.cli.main import cli_main
from lightformer.tasks import ImageToTextTask
from test_old_checkpoints import AtTrainStart, assert_same_weights, quiet

REPO = Path(__file__).resolve().parents[1]
FIXTURE = str(REPO / "tests" / "data" / "old_checkpoints" / "b1bd12e" / "image_text.ckpt")
# The data the fixture was trained on (make.py), with today's config.
DATA = [f"--config={REPO}/configs/image_text/printed_lines.yaml", "--data.source.train_lines=48",
        "--data.source.val_lines=8", "--data.source.test_lines=8", "--data.source.max_words=1",
        "--data.render.height=16", "--data.render.width=96", "--data.loader.batch_size=8"]  # fmt: skip


def saved_state() -> dict[str, torch.Tensor]:
    return torch.load(FIXTURE, map_location="cpu", weights_only=True)["state_dict"]


def assert_fixture_shape(config) -> None:
    """The towers of the fixture's model, from its flat fields (``encoder_d_model`` 16 with the decoder's 2 heads,
    ``d_model`` 8, ``dropout`` 0.1 on both and on the encoder's attention weights, ``max_len`` 24)."""
    encoder, decoder = config.encoder, config.decoder
    assert (encoder.d_model, encoder.n_heads, encoder.n_layers, encoder.d_ff) == (16, 2, 1, 16)
    assert (encoder.image_size, encoder.patch_size, encoder.in_channels) == ((16, 96), (16, 8), 1)
    assert (encoder.dropout, encoder.attn_dropout, encoder.pool, encoder.num_classes) == (0.1, 0.1, "mean", 0)
    assert (decoder.d_model, decoder.n_heads, decoder.n_layers, decoder.d_ff) == (8, 2, 1, 16)
    assert (decoder.vocab_size, decoder.block_size, decoder.dropout) == (85, 24, 0.1)
    assert config.ctc_head


def test_the_b1bd12e_checkpoint_rebuilds_its_task_and_nested_model_with_its_exact_weights():
    checkpoint = torch.load(FIXTURE, map_location="cpu", weights_only=True)
    assert "encoder_layers" in checkpoint["hyper_parameters"]["net"]  # flat, as b1bd12e wrote it

    loaded = commands.load_task(FIXTURE, ImageToTextTask, "read")

    assert_fixture_shape(loaded.model.config)
    assert "encoder" in loaded.hparams["net"] and "encoder_layers" not in loaded.hparams["net"]  # saved nested now
    state, saved = loaded.state_dict(), checkpoint["state_dict"]
    assert set(state) == set(saved)
    for name, value in saved.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


def test_export_writes_the_b1bd12e_weights_to_safetensors(tmp_path):
    from safetensors.torch import load_model

    output = tmp_path / "image_text.safetensors"
    commands.export(ckpt_path=FIXTURE, output=str(output))
    model = commands.load_task(FIXTURE, ImageToTextTask, "export").model
    for parameter in model.parameters():
        parameter.data.zero_()
    load_model(model, str(output))
    assert_same_weights(model.state_dict(), saved_state())


def test_a_new_run_starts_from_the_b1bd12e_checkpoint_in_its_shape(tmp_path):
    """``model.init.checkpoint``: the fields neither the config file nor the command line gives come from the
    checkpoint's (flat) ones, here the encoder's dropout on its sublayers and attention weights; those given stay (the
    config file's shape, set to the checkpoint's here, and the decoder's dropout)."""
    shape = ["--model.net.encoder.patch_size=[16, 8]", "--model.net.encoder.n_layers=1",
             "--model.net.encoder.d_model=16", "--model.net.encoder.n_heads=2", "--model.net.encoder.d_ff=16",
             "--model.net.decoder.n_layers=1",
             "--model.net.decoder.d_model=8", "--model.net.decoder.n_heads=2", "--model.net.decoder.d_ff=16",
             "--model.net.decoder.block_size=24", "--model.net.decoder.dropout=0.0"]  # fmt: skip
    args = [*DATA, f"--data.prepare.dir={tmp_path / 'prepared'}", *quiet(tmp_path), *shape,
            f"--model.init.checkpoint={FIXTURE}", "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
            "--model.num_logged_samples=0", "--trainer.callbacks+=test_old_checkpoints.AtTrainStart"]  # fmt: skip
    cli = cli_main(["fit", *args])
    config = cli.model.model.config
    assert (config.encoder.dropout, config.encoder.attn_dropout, config.decoder.dropout) == (0.1, 0.1, 0.0)
    (start,) = [c for c in cli.trainer.callbacks if isinstance(c, AtTrainStart)]
    assert start.step == 0
    assert_same_weights(start.state, saved_state())
