"""Image GPT: pixel-token data, the task's palette in checkpoints, generation with and without the KV cache, features,
a tiny digits run through the CLI (bits/dim, TensorBoard images), and the sample-images and probe commands."""

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torchvision.transforms.v2.functional import pil_to_tensor

from lightformer.cli.main import cli_main
from lightformer.data.families import images as image_tokens
from lightformer.data.families.images import ImageTokenDataModule
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources.image_files import load_image
from lightformer.data.sources.images import CARVE, ImageSource
from lightformer.errors import CheckpointError
from lightformer.facts import DataFacts
from lightformer.models.gpt import GPTConfig
from lightformer.tasks.image_gpt import ImageGPTTask, bits_per_dim, completion_rows, probe, sample_images
from lightformer.tokenization.pixels import PaletteConfig, PixelTokenizer
from lightformer.training.tensorboard import image_grid
from tiny_runs import FactsOnly, with_data

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "igpt" / "digits.yaml"


def palette_facts(tokenizer: PixelTokenizer) -> dict:
    """The facts an ``ImageTokenDataModule`` with this palette states."""
    return dict(palette=tokenizer.to_dict(), vocab_size=tokenizer.vocab_size, max_length=tokenizer.sequence_length)


def tiny_task(tokenizer: PixelTokenizer, **options) -> ImageGPTTask:
    torch.manual_seed(0)
    net = GPTConfig(n_layers=2, n_heads=2, d_model=32)
    task = ImageGPTTask(net=net, data_facts=DataFacts(**palette_facts(tokenizer)), **options)
    assert (task.model.config.vocab_size, task.model.config.block_size) == (
        tokenizer.vocab_size,
        tokenizer.sequence_length,
    )
    return task


@pytest.fixture(scope="module")
def digits() -> ImageTokenDataModule:
    data = ImageTokenDataModule(
        source=ImageSource(dataset="digits"),
        loader=LoaderConfig(batch_size=16),
        palette=PaletteConfig(kind="kmeans", levels=6),
    )
    data.setup()
    return data


# --- data ----------------------------------------------------------------------------------------------------------


def test_batches_are_start_then_the_pixels_before_each_target(digits):
    tokenizer = digits.pixel_tokenizer
    facts = digits.data_facts()
    assert (facts.vocab_size, digits.block_size, tokenizer.start_id) == (7, 64, 6)
    assert facts == DataFacts(**palette_facts(tokenizer)) and facts.max_length == 64
    x, y = next(iter(digits.val_dataloader()))  # evaluation: the split's order
    assert x.shape == y.shape == (16, 64) and x.dtype == y.dtype == torch.long
    assert (x[:, 0] == tokenizer.start_id).all()
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y, digits.tokens("val")[:16])
    assert torch.equal(tokenizer.decode(y), digits.images("val")[:16])
    assert int(y.max()) < tokenizer.num_colors  # the start token is never a target
    # training order: a permutation drawn from (seed, epoch) alone
    first, again = (next(iter(digits.train_dataloader()))[1] for _ in range(2))
    assert torch.equal(first, again) and not torch.equal(first, digits.tokens("train")[:16])
    assert [len(digits.labels(s)) for s in ("train", "val", "test")] == [1298, 229, 270]


def test_palette_is_fitted_on_training_pixels_and_downsampling_is_area_averaging():
    data = ImageTokenDataModule(
        source=ImageSource(dataset="digits"), palette=PaletteConfig(kind="uniform", levels=4), image_size=4
    )
    assert (data.block_size, data.data_facts().vocab_size) == (16, 5)  # a uniform palette: known before setup
    data.setup()
    assert data.images("test").shape == (270, 1, 4, 4)
    assert set(data.images("test").unique().tolist()) <= {0, 85, 170, 255}


def test_an_image_folder_is_streamed_and_encoded_batch_by_batch(tmp_path, monkeypatch):
    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(8):
            Image.effect_noise((9, 9), 40 + 10 * i).convert("RGB").save(tmp_path / "images" / name / f"{i}.png")
    monkeypatch.setattr(image_tokens, "PALETTE_SAMPLE_PIXELS", 5 * 36)  # five 6×6 images
    data = ImageTokenDataModule(
        source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "images")),
        palette=PaletteConfig(kind="kmeans", levels=4),
        loader=LoaderConfig(batch_size=4),
        prepare=PrepareConfig(dir=str(tmp_path / "prepared")),
        image_size=6,
    )
    assert len(data._palette_sample()) == 5 < len(data.images_data.train_dataset)  # a bounded sample of training images
    tokenizer = data.pixel_tokenizer
    val = list(data.val_dataloader())
    assert len(list(data.train_dataloader())) == 3  # 11 training images
    assert not data._tokens and not data._images  # streamed: no split is held in memory
    x, y = (torch.cat(parts) for parts in zip(*val, strict=True))
    val_files = json.loads((data.images_data.prepared / CARVE).read_text())["val"]
    pixels = torch.stack([pil_to_tensor(load_image(path, 3, 6)) for path in val_files])
    assert torch.equal(y, tokenizer.encode(pixels))  # each batch: the palette ids of its files' pixels
    assert (x[:, 0] == tokenizer.start_id).all() and torch.equal(x[:, 1:], y[:, :-1])
    records = data.images_data.train_dataset.source.records
    read, read_record = [], type(records).__getitem__
    monkeypatch.setattr(type(records), "__getitem__", lambda self, i: (read.append((self, i)), read_record(self, i))[1])
    images, labels = data.labelled_images("train", limit=3)  # lightformer probe --max_train=3
    assert read == [(records, i) for i in range(3)] and not data._images  # those three files only, nothing held
    assert images.shape == (3, 3, 6, 6) and labels.tolist() == [int(records[i]["label"]) for i in range(3)]
    assert torch.equal(tokenizer.encode(images), data.tokens("train")[:3])  # the quantised images, as read whole
    assert torch.equal(data.tokens("val"), y)  # read whole only when asked


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"palette": {"levels": 1}}, "data.palette.levels=1 must be an integer from 2 to 256"),
        ({"image_size": 9}, "data.image_size=9 must be from 1 to 8"),
        ({"palette": {"kind": "median"}}, "data.palette.kind='median' is unknown"),
        (
            {"source": {"dataset": "cifar10"}, "palette": {"kind": "uniform", "levels": 32}},
            "levels=32 gives 32³ = 32768 colours",
        ),
        ({"source": {"dataset": "image_folder", "image_folder": "."}}, "data.image_size is needed"),
    ],
)
def test_bad_data_options_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        ImageTokenDataModule(**{"source": {"dataset": "digits"}, **options})


# --- the task ------------------------------------------------------------------------------------------------------


def test_palette_saved_in_a_checkpoint_reproduces_the_quantised_images(digits, tmp_path):
    task = tiny_task(digits.pixel_tokenizer)
    checkpoint = {"state_dict": task.state_dict(), "hyper_parameters": dict(task.hparams)}
    task.on_save_checkpoint(checkpoint)
    path = tmp_path / "model.ckpt"
    torch.save(checkpoint | {"pytorch-lightning_version": "2.6.6"}, path)
    saved = torch.load(path, weights_only=True)["hyper_parameters"]["data_facts"]  # weights_only loads it
    assert saved["palette"]["palette"] and saved["palette"] == digits.pixel_tokenizer.to_dict()  # plain lists
    loaded = ImageGPTTask.load_from_checkpoint(path, weights_only=True)
    assert loaded.pixel_tokenizer == digits.pixel_tokenizer
    quantised = digits.images("test")
    tokens = loaded.pixel_tokenizer.encode(quantised)
    assert torch.equal(tokens, digits.tokens("test"))  # quantised images encode to the data's tokens...
    assert torch.equal(loaded.pixel_tokenizer.decode(tokens), quantised)  # ...and decode back exactly
    raw = digits._images["test"]
    assert torch.equal(loaded.pixel_tokenizer.quantize(raw), quantised)


def test_resuming_with_another_palette_is_refused():
    task = tiny_task(PixelTokenizer.uniform(8, image_size=8))
    with_data(task, FactsOnly(**palette_facts(PixelTokenizer.uniform(6, 8))))
    with pytest.raises(CheckpointError, match="the data differs from what the checkpoint's model was trained with .*"
                                              "palette: another palette of colours"):  # fmt: skip
        task.setup("fit")
    with_data(task, FactsOnly(**palette_facts(PixelTokenizer.uniform(8, 8))))
    task.setup("fit")  # the same palette: accepted


def test_cached_and_uncached_greedy_generation_are_identical():
    tokenizer = PixelTokenizer.uniform(5, image_size=6)
    task = tiny_task(tokenizer)
    with torch.no_grad():  # make the start token the most likely everywhere: it must still never be emitted
        task.model.lm_head.weight[tokenizer.start_id] += 1.0
    for given in (torch.empty(3, 0, dtype=torch.long), torch.randint(0, 5, (3, 18))):
        cached = task.generate_pixels(given, temperature=0, use_cache=True)
        uncached = task.generate_pixels(given, temperature=0, use_cache=False)
        assert cached.shape == (3, 36)
        assert torch.equal(cached, uncached)
        assert torch.equal(cached[:, : given.shape[1]], given)
        assert int(cached.max()) < tokenizer.num_colors
    sampled = task.sample_images(4, seed=3)
    assert sampled.dtype == torch.uint8 and sampled.shape == (4, 1, 6, 6)
    assert torch.equal(sampled, task.sample_images(4, seed=3))  # seeded: reproducible


def test_completions_keep_the_given_rows_and_the_grid_has_a_row_per_image():
    tokenizer = PixelTokenizer.uniform(4, image_size=8)
    task = tiny_task(tokenizer, sample_temperature=0.5)
    images = tokenizer.quantize(torch.randint(0, 256, (2, 1, 8, 8), dtype=torch.uint8))
    completed = task.complete_images(images, num_completions=3, seed=0)
    assert completed.shape == (2, 3, 1, 8, 8)
    assert torch.equal(completed[:, :, :, :4], images[:, None, :, :4].expand(-1, 3, -1, -1, -1))
    grid, legend = completion_rows(task, images, num_completions=3, seed=0)
    cell = 8 * 8 + 2  # 8×8 images shown 8× larger, 2 pixels apart
    assert grid.shape == (3, 2 * cell + 2, 5 * cell + 2) and grid.dtype == torch.uint8
    assert "top 4 of 8 rows" in legend and "3 completions" in legend
    assert image_grid(images[:1], columns=4).shape == (3, cell + 2, cell + 2)


def test_features_are_the_mean_residual_stream_after_a_layer_and_leave_the_model_unchanged():
    tokenizer = PixelTokenizer.uniform(4, image_size=4)
    task = tiny_task(tokenizer)
    task.train()
    images = tokenizer.quantize(torch.randint(0, 256, (5, 1, 4, 4), dtype=torch.uint8))
    y = tokenizer.encode(images)
    x = torch.cat([torch.full_like(y[:, :1], tokenizer.start_id), y[:, :-1]], dim=1)
    model = task.model
    with torch.no_grad():
        model.eval()
        stream = [model.position(model.embed(x), 0)]
        for layer in model.decoder.layers:
            stream.append(layer(stream[-1]))
        model.train()
    for layer in (0, 1, 2):
        features = task.features(images, layer, batch_size=2)
        assert features.shape == (5, 32)
        torch.testing.assert_close(features, stream[layer].mean(dim=1))
    assert task.default_probe_layer() == 1
    assert model.training  # restored
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with pytest.raises(ValueError, match="layer=3 must be from 0"):
        task.features(images, 3)


def test_bits_per_dim_is_the_loss_in_bits():
    assert bits_per_dim(math.log(2)) == pytest.approx(1.0)
    assert float(bits_per_dim(torch.tensor(math.log(256)))) == pytest.approx(8.0)


# --- through the CLI: fit, TensorBoard, the commands ----------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A tiny digits run (40 steps, validations at steps 20 and 40) through the CLI: its log folder and last.ckpt."""
    save_dir = tmp_path_factory.mktemp("runs")
    cli = cli_main(
        [
            "fit",
            f"--config={CONFIG}",
            f"--trainer.logger.init_args.save_dir={save_dir}",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.max_steps=40",
            "--trainer.val_check_interval=20",
            "--trainer.limit_val_batches=2",
            "--model.net.n_layers=2",
            "--model.net.d_model=32",
            "--model.net.n_heads=2",
            "--model.net.dropout=0.0",
            "--model.optimizer.lr=3e-3",
            "--model.optimizer.warmup_steps=5",
            "--model.num_samples=4",
            "--model.completion_images=2",
            "--model.num_completions=2",
            "--data.loader.batch_size=32",
        ]
    )
    return Path(cli.trainer.logger.log_dir), Path(cli.trainer.checkpoint_callback.last_model_path)


@pytest.mark.slow
def test_fit_lowers_bits_per_dim_and_draws_images_at_each_validation(fitted):
    log_dir, _ = fitted
    events = EventAccumulator(str(log_dir), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    assert {"train/loss", "train/bpd", "val/loss", "val/bpd", "velocity/train/device/items_per_sec"} <= set(
        events.Tags()["scalars"]
    )
    bpd, loss = events.Scalars("val/bpd"), events.Scalars("val/loss")
    assert [e.step for e in bpd] == [19, 39]  # no sanity-check entry
    for b, entry in zip(bpd, loss, strict=True):
        assert b.value == pytest.approx(entry.value / math.log(2), rel=1e-5)
    assert bpd[-1].value < bpd[0].value < math.log2(9)  # below a uniform guess among 8 levels + start
    samples, completions = events.Images("val/samples"), events.Images("val/completions")
    assert [e.step for e in samples] == [e.step for e in completions] == [19, 39]
    assert (samples[-1].width, samples[-1].height) == (2 * 66 + 2, 2 * 66 + 2)  # 4 samples, 2 × 2
    assert (completions[-1].width, completions[-1].height) == (4 * 66 + 2, 2 * 66 + 2)  # 2 rows of 4
    legend = events.Tensors("val/completions_legend/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "2 completions" in legend


@pytest.mark.slow
def test_test_of_the_checkpoint_logs_bits_per_dim_into_its_run(fitted):
    log_dir, checkpoint = fitted
    cli = cli_main(
        [
            "test",
            f"--config={CONFIG}",
            f"--ckpt_path={checkpoint}",
            f"--trainer.logger.init_args.save_dir={log_dir.parent.parent}",
            "--trainer.enable_progress_bar=false",
            "--trainer.limit_test_batches=2",
            "--data.loader.batch_size=32",
        ]
    )
    metrics = cli.trainer.callback_metrics
    assert float(metrics["test/bpd"]) == pytest.approx(float(metrics["test/loss"]) / math.log(2))
    assert float(metrics["test/bpd"]) < math.log2(9)


@pytest.mark.slow
def test_sample_images_writes_pngs_from_the_checkpoint_alone(fitted, tmp_path, capsys):
    _, checkpoint = fitted
    files = []
    for i, size in enumerate((8, 16, 12)):  # the model's size, larger (area-averaged), not a multiple (resized)
        path = tmp_path / f"digit{i}.png"
        Image.fromarray((torch.rand(size, size) * 255).to(torch.uint8).numpy(), mode="L").save(path)
        files.append(str(path))
    output = tmp_path / "out" / "grid.png"
    written = sample_images(
        ckpt_path=str(checkpoint), output=str(output), num_samples=5, complete_from=str(tmp_path / "digit*.png")
    )
    assert written == [str(output), str(tmp_path / "out" / "grid_completions.png")]
    with Image.open(output) as image:
        assert image.size == (3 * 66 + 2, 2 * 66 + 2)  # 5 samples: 3 columns, 2 rows of 8×8 shown 64×64
    with Image.open(written[1]) as image:
        assert image.size == (5 * 66 + 2, 3 * 66 + 2)  # 3 files: original, masked, 3 completions each
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--num_samples=-1"):
        sample_images(ckpt_path=str(checkpoint), num_samples=-1)
    with pytest.raises(ValueError, match="--top_p"):
        sample_images(ckpt_path=str(checkpoint), top_p=1.5)


@pytest.mark.slow
def test_linear_probe_beats_chance_and_reports_the_pixel_baseline(fitted, capsys):
    _, checkpoint = fitted
    result = probe(ckpt_path=str(checkpoint), max_train=600)  # data rebuilt from the checkpoint
    assert result["layer"] == 1
    assert 0.0 <= result["features"] <= 1.0 and 0.0 <= result["pixels"] <= 1.0
    assert result["features"] > 0.4  # chance is 0.1
    assert result["pixels"] > 0.8
    printed = capsys.readouterr().out
    assert "linear probe on layer 1 of 2" in printed and "quantised pixels" in printed
    with pytest.raises(ValueError, match="--layer=5 must be from 0"):
        probe(ckpt_path=str(checkpoint), layer=5)
    config = checkpoint.parent.parent / "config.yaml"
    assert probe(ckpt_path=str(checkpoint), config=str(config), layer=0, max_train=300)["layer"] == 0
