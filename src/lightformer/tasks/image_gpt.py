"""Image GPT: the language-model task on images read as sequences of palette ids (``ImageTokenDataModule``).

The model, loss, optimizer and batches are the language model's; what differs is what an id means. The pixel
palette (``PixelTokenizer``) travels in checkpoints instead of a text tokenizer, the metric is bits per dimension
(the per-pixel cross-entropy in bits), and each validation shows images in TensorBoard instead of text: samples
drawn from nothing (``val/samples``) and completions of the bottom half of a few fixed validation images
(``val/completions``, explained by the text ``val/completions_legend``).

Two commands work from a checkpoint alone: ``sample_images`` (``lightformer sample-images``) writes PNG grids of
samples and completions, and ``linear_probe`` (``lightformer probe``) measures how linearly separable the classes
are in the model's features, as Image GPT evaluates its representations.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import Tensor

from lightformer.data.families.images import ImageTokenDataModule
from lightformer.errors import ConfigError, DataError
from lightformer.generation import check_sampling, generate
from lightformer.io.checkpoints import read_checkpoint
from lightformer.io.files import atomic_write_bytes
from lightformer.models.gpt import GPT, GPTConfig
from lightformer.registry import register
from lightformer.tasks.command_support import check_sampling_options, load_task, paths_of
from lightformer.tasks.language_model import LanguageModelTask
from lightformer.tokenization.pixels import PixelTokenizer, downsample
from lightformer.training.callbacks import raise_if_non_finite
from lightformer.training.tensorboard import image_grid, logging_step, tensorboard_logger, tensorboard_writer

MASK_GREY = 128  # the value shown for the pixels a completion is not given


def bits_per_dim(loss: Tensor | float) -> Tensor | float:
    """Bits per dimension of a mean per-pixel cross-entropy in nats: ``loss / ln 2``.

    A dimension is one token: a grey pixel, or a whole colour pixel (one palette id), not a subpixel.
    """
    return loss / math.log(2)


class ImageGPTTask(LanguageModelTask):
    """Next-pixel cross-entropy on a GPT over palette ids; logs loss and bits per dimension, samples and completions.

    The model's ``vocab_size`` (palette colours + start token) and ``block_size`` (pixels per image) come from
    ``ImageTokenDataModule``'s facts. The palette travels inside the checkpoint, so a checkpoint alone samples
    images (``sample_images``), completes image files, and gives features (``features``).

    Args:
        net: the GPT's shape (``GPTConfig``).
        num_samples: images sampled from the start token alone and shown as a grid at each validation (0: none).
        completion_images: fixed validation images (the first of the first batch) whose bottom half is
            completed at each validation (0: none).
        num_completions: completions sampled per image, shown beside the original and its masked top half.
        sample_temperature: sampling temperature of the shown samples and completions (0: greedy).
        sample_top_k: sample among the k most likely colours only (None: all).
        sample_top_p: sample among the most likely colours whose probabilities reach p (None: all).
    """

    items_name = "pixels"  # what throughput counts
    hparam_metrics = ("val/bpd", "val/loss", "test/bpd")

    def __init__(
        self,
        net: GPTConfig = GPTConfig(),
        num_samples: int = 16,
        completion_images: int = 4,
        num_completions: int = 3,
        sample_temperature: float = 1.0,
        sample_top_k: int | None = None,
        sample_top_p: float | None = None,
        **common: Any,
    ) -> None:
        for name, value, minimum in (
            ("num_samples", num_samples, 0),
            ("completion_images", completion_images, 0),
            ("num_completions", num_completions, 1),
        ):
            if value < minimum:
                raise ValueError(f"{name}={value} must be at least {minimum}")
        try:
            check_sampling(sample_temperature, sample_top_k, sample_top_p)
        except ValueError as error:
            raise ValueError(f"sample_{error}") from None
        super().__init__(net, sample_temperature=sample_temperature, **common)
        self._completion_tokens: Tensor | None = None  # pixel ids (n, S*S) of the fixed validation images

    @property
    def pixel_tokenizer(self) -> PixelTokenizer | None:
        """The palette of the data (``data_facts.palette``), or of the checkpoint; None before either is known."""
        return self.fact("palette", PixelTokenizer.from_dict)

    # --- training and evaluation: the language model's loss, reported in bits per dimension ----------------

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log_train({"train/loss": loss, "train/bpd": bits_per_dim(loss.detach())})
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        if batch_idx == 0 and self._completion_tokens is None and self.hparams.completion_images > 0:
            # the first validation images: the same at every validation
            self._completion_tokens = batch[1][: self.hparams.completion_images].detach().clone()
        super().validation_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.val_loss.reset()
        raise_if_non_finite(self.trainer, "val/loss", loss)  # before sampling from a broken model
        self.log_dict({"val/loss": loss, "val/bpd": bits_per_dim(loss)}, prog_bar=True, sync_dist=False)
        self._log_images()

    def on_test_epoch_end(self) -> None:
        loss = self.test_loss.compute()
        self.test_loss.reset()
        self.log_dict({"test/loss": loss, "test/bpd": bits_per_dim(loss)})

    # --- generation -----------------------------------------------------------------------------------------

    def _require_palette(self) -> PixelTokenizer:
        if self.pixel_tokenizer is None:
            raise RuntimeError(
                "this model has no pixel palette: train it with an ImageTokenDataModule or load a checkpoint"
            )
        return self.pixel_tokenizer

    @torch.no_grad()
    def generate_pixels(
        self,
        given: Tensor,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        use_cache: bool = True,
    ) -> Tensor:
        """Complete images in raster order: ``given`` pixel ids ``(n, p)`` (p may be 0) → all ids ``(n, S*S)``.

        Only palette colours are sampled (never the start token); ``temperature=0`` is greedy. With ``seed`` the
        draw is reproducible. The KV cache (``use_cache``) gives the same images as rerunning the whole prefix.
        """
        tokenizer = self._require_palette()
        length = tokenizer.sequence_length
        if given.ndim != 2 or given.shape[1] >= length:
            raise ValueError(f"given must be pixel ids (n, p) with p < {length}; got shape {tuple(given.shape)}")
        start = torch.full((given.shape[0], 1), tokenizer.start_id, dtype=torch.long, device=self.device)
        prompt = torch.cat([start, given.to(self.device, torch.long)], dim=1)
        generator = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        was_training = self.model.training
        self.model.eval()
        try:
            out = generate(
                _PaletteDecoder(self.model, tokenizer.num_colors),
                prompt,
                length - given.shape[1],
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                use_cache=use_cache,
                generator=generator,
            )
        finally:
            self.model.train(was_training)
        return out[:, 1:]

    def sample_images(self, n: int, **sampling: Any) -> Tensor:
        """``n`` images sampled from the start token alone: uint8 ``(n, C, S, S)`` in palette colours; ``sampling``:
        ``generate_pixels``' temperature, top_k, top_p and seed."""
        given = torch.empty(n, 0, dtype=torch.long, device=self.device)
        tokens = self.generate_pixels(given, **sampling)
        return self._require_palette().decode(tokens.cpu())

    def complete_images(
        self, images: Tensor, num_completions: int, given_rows: int | None = None, **sampling: Any
    ) -> Tensor:
        """Sample the bottom of each image from its top ``given_rows`` rows (default: the top half); ``sampling``:
        ``generate_pixels``' temperature, top_k, top_p and seed.

        images: uint8 ``(n, C, S, S)`` (quantised to the palette first). Returns uint8
        ``(n, num_completions, C, S, S)``: the given rows as quantised, the rest sampled.
        """
        tokenizer = self._require_palette()
        size = tokenizer.image_size
        given_rows = size // 2 if given_rows is None else given_rows
        if not 0 <= given_rows < size:
            raise ValueError(f"given_rows={given_rows} must be from 0 to {size - 1} (rows of a {size}×{size} image)")
        tokens = tokenizer.encode(images.cpu())
        given = tokens[:, : given_rows * size].repeat_interleave(num_completions, dim=0)
        completed = self.generate_pixels(given, **sampling).cpu()
        return tokenizer.decode(completed).reshape(len(images), num_completions, *images.shape[1:])

    @torch.no_grad()
    def features(self, images: Tensor, layer: int | None = None, batch_size: int = 256) -> Tensor:
        """Image GPT's features for linear probes: the mean over positions of the residual stream after decoder
        layer ``layer`` (1-based; 0: the embeddings; default the middle layer, where Image GPT's probes score
        best), reading [start] + all pixels but the last, in eval mode.

        images: uint8 ``(n, C, S, S)``. Returns float32 ``(n, d_model)`` on the CPU. The model is not changed: a
        forward hook reads the layer's output.
        """
        tokenizer = self._require_palette()
        layer = self.default_probe_layer() if layer is None else layer
        n_layers = len(self.model.decoder.layers)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layers:
            raise ValueError(f"layer={layer!r} must be from 0 (the embeddings) to {n_layers} (the last layer)")
        captured: list[Tensor] = []
        if layer == 0:  # the decoder's input: token + position embeddings
            handle = self.model.decoder.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
        else:
            hooked = self.model.decoder.layers[layer - 1]
            handle = hooked.register_forward_hook(lambda module, args, output: captured.append(output))
        was_training = self.model.training
        self.model.eval()
        features = []
        try:
            for start in range(0, len(images), batch_size):
                y = tokenizer.encode(images[start : start + batch_size].cpu()).to(self.device)
                x = torch.cat([torch.full_like(y[:, :1], tokenizer.start_id), y[:, :-1]], dim=1)
                captured.clear()
                self.model(x)
                features.append(captured[0].float().mean(dim=1).cpu())
        finally:
            handle.remove()
            self.model.train(was_training)
        return torch.cat(features) if features else torch.empty(0, self.model.config.d_model)

    def default_probe_layer(self) -> int:
        """The middle decoder layer (1-based): ``(n_layers + 1) // 2``."""
        return (len(self.model.decoder.layers) + 1) // 2

    # --- what TensorBoard shows at each validation ----------------------------------------------------------

    def _log_images(self) -> None:
        """Samples and completions of the fixed validation images, at the step of this validation's metrics."""
        if tensorboard_logger(self) is None or self.trainer.sanity_checking or self.pixel_tokenizer is None:
            return
        hp = self.hparams  # every process samples (a forward pass under FSDP2 needs them all); rank zero writes
        sampling = dict(temperature=hp.sample_temperature, top_k=hp.sample_top_k, top_p=hp.sample_top_p)
        samples = self.sample_images(hp.num_samples, **sampling, seed=0) if hp.num_samples else None
        completions = None
        if self._completion_tokens is not None:
            originals = self.pixel_tokenizer.decode(self._completion_tokens.cpu())
            completions = completion_rows(self, originals, hp.num_completions, seed=1, **sampling)
        writer = tensorboard_writer(self)
        if writer is None:
            return
        step = logging_step(self.trainer)
        if samples is not None:
            grid = image_grid(samples, columns=math.ceil(math.sqrt(len(samples))))
            writer.add_image("val/samples", grid, step, dataformats="CHW")
        if completions is not None:
            grid, legend = completions
            writer.add_image("val/completions", grid, step, dataformats="CHW")
            writer.add_text("val/completions_legend", legend, step)


class _PaletteDecoder:
    """The GPT as an incremental decoder that only emits palette colours: the logits of the start token (and of
    any id past the palette) are -inf, so sampling never draws them."""

    def __init__(self, model: GPT, num_colors: int) -> None:
        self.model = model
        self.num_colors = num_colors
        self.block_size = model.block_size

    def new_cache(self, max_length: int | None = None) -> Any:
        return self.model.new_cache(max_length)

    def __call__(self, ids: Tensor, cache: Any = None) -> Tensor:
        logits = self.model(ids, cache=cache)
        logits[..., self.num_colors :] = float("-inf")
        return logits


def check_same_palette(saved: PixelTokenizer, data: PixelTokenizer) -> None:
    """Refuse data encoded with another palette than the one the model was trained with."""
    if saved != data:
        raise ConfigError(
            f"the data module's palette ({data!r}: {data.palette.flatten().tolist()}) differs from the one saved in "
            f"the checkpoint ({saved!r}: {saved.palette.flatten().tolist()}), so the model's ids would stand for "
            "other colours; use the data settings the model was trained with (dataset, image_size, palette, levels, "
            "seed)"
        )


# --- pictures -------------------------------------------------------------------------------------------------------


def completion_rows(task: ImageGPTTask, images: Tensor, num_completions: int, **sampling: Any) -> tuple[Tensor, str]:
    """A grid with one row per image: the image quantised, its top half with the bottom masked grey, then
    ``num_completions`` bottoms sampled as ``sampling`` says (``generate_pixels``' temperature, top_k, top_p, seed);
    and a line of Markdown that says so. images: uint8 ``(n, C, S, S)``."""
    tokenizer = task._require_palette()
    quantised = tokenizer.quantize(images.cpu())
    size = tokenizer.image_size
    given_rows = size // 2
    masked = quantised.clone()
    masked[:, :, given_rows:] = MASK_GREY
    completed = task.complete_images(quantised, num_completions, given_rows, **sampling)
    rows = torch.cat([quantised[:, None], masked[:, None], completed], dim=1)  # (n, 2 + num_completions, C, S, S)
    grid = image_grid(rows.flatten(0, 1), columns=2 + num_completions)
    settings = dict(temperature=1.0, top_k=None, top_p=None) | {k: v for k, v in sampling.items() if k != "seed"}
    settings = ", ".join(f"{name} {value}" for name, value in settings.items())
    legend = (
        f"One row per image. Columns: the image in the model's palette; its top {given_rows} of {size} rows as "
        f"given, the rest masked grey; {num_completions} completions of the masked rows sampled by the model "
        f"({settings}, seeded)."
    )
    return grid, legend


def read_image_files(paths: list[str], tokenizer: PixelTokenizer) -> Tensor:
    """Image files → uint8 ``(n, C, S, S)`` at the palette's size: square images larger than S area-averaged as in
    training, others resized (antialiased)."""
    from lightformer.data.sources.image_files import load_image

    size, channels = tokenizer.image_size, tokenizer.channels
    images = []
    for path in paths:
        array = np.asarray(load_image(path, channels))
        image = torch.from_numpy(array.copy()).reshape(array.shape[0], array.shape[1], channels).permute(2, 0, 1)
        height, width = image.shape[1:]
        if height == width and height >= size:
            image = downsample(image[None].contiguous(), size)[0] if height > size else image
        else:
            image = torch.from_numpy(np.asarray(load_image(path, channels, size)).copy())
            image = image.reshape(size, size, channels).permute(2, 0, 1)
        images.append(image.contiguous())
    return torch.stack(images)


# --- the commands that take this task's checkpoints alone ---------------------------------------------------


def sample_images(
    *,
    ckpt_path: str,
    output: str = "samples.png",
    num_samples: int = 16,
    complete_from: list[str] | str | None = None,
    num_completions: int = 3,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> list[str]:
    """PNGs of images an Image GPT draws, or completes from image files.

    Write PNG grids of images sampled by an Image GPT checkpoint alone (its palette travels inside it).

    Example: ``sample-images --ckpt_path last.ckpt --num_samples 64 --complete_from "digits/*.png"`` writes
    samples.png and samples_completions.png.

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the Image GPT task.
        output: the PNG of the unconditional samples (a square grid, upscaled so that small images are visible).
        num_samples: how many images to sample from nothing (0: none, with ``complete_from``).
        complete_from: image files or glob patterns (quote them) whose bottom half the model completes: each is
            resized to the model's size (area-averaged when square and larger), quantised to its palette, and
            shown in a row: the image, its top half with the bottom masked grey, ``num_completions`` completions.
            The grid goes to OUTPUT's name with ``_completions`` added (samples_completions.png).
        num_completions: completions sampled per image of ``complete_from``.
        temperature: divides the logits; 0 is greedy (every sample alike).
        top_k: sample among the k most likely colours only.
        top_p: sample among the most likely colours whose probabilities add up to p (nucleus sampling).
        seed: seed of the sampler: the same seed gives the same images.
        device: "cpu", "cuda", "cuda:1", ...

    Returns:
        The paths written.
    """
    check_sampling_options(temperature, top_k, top_p)
    if num_samples < 0:
        raise ConfigError(f"--num_samples={num_samples} must be at least 0")
    if num_completions < 1:
        raise ConfigError(f"--num_completions={num_completions} must be at least 1")
    paths = paths_of(complete_from, "--complete_from", "image file", ".png") if complete_from else []
    if num_samples == 0 and not paths:
        raise ConfigError("--num_samples=0 and no --complete_from: there is nothing to draw")
    task = load_task(ckpt_path, ImageGPTTask, "sample-images", device)
    tokenizer = task._require_palette()
    size = tokenizer.image_size
    try:  # before any sampling: a file that is not a readable image is named at once
        given = read_image_files(paths, tokenizer) if paths else None
    except DataError as error:
        raise DataError(f"--complete_from: {error}") from None
    written = []
    if num_samples:
        images = task.sample_images(num_samples, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        columns = math.ceil(math.sqrt(num_samples))
        grid = image_grid(images, columns)
        _write_png(grid, output)
        rows = math.ceil(num_samples / columns)
        print(
            f"wrote {output}: {num_samples} samples of {size}×{size} pixels in a {rows}×{columns} grid "
            f"({grid.shape[2]}×{grid.shape[1]} pixels)"
        )
        written.append(output)
    if paths:
        target = Path(output)
        completions_path = str(target.with_name(f"{target.stem}_completions{target.suffix or '.png'}"))
        grid, _ = completion_rows(
            task, given, num_completions, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
        )
        _write_png(grid, completions_path)
        print(
            f"wrote {completions_path}: one row per image of --complete_from ({len(paths)}): the image in the "
            f"model's palette, its top {size // 2} rows given, {num_completions} completions "
            f"({grid.shape[2]}×{grid.shape[1]} pixels)"
        )
        written.append(completions_path)
    return written


def _probe_data(checkpoint: dict, ckpt_path: str, config: str | None):
    """The checkpoint run's data module, from ``config`` or from the data hyperparameters saved in the checkpoint."""
    from lightformer.data.families.images import ImageTokenDataModule

    if config is not None:
        if not Path(config).is_file():
            raise ConfigError(f"--config: the file {config!r} does not exist")
        section = (yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}).get("data")
        if not isinstance(section, dict):
            raise ConfigError(f"--config: {config} has no data section")
        class_path, arguments = section.get("class_path", ""), dict(section.get("init_args") or {})
        origin = f"--config {config}"
    else:
        saved = checkpoint.get("datamodule_hyper_parameters")
        if not saved:
            raise ConfigError(
                f"--ckpt_path: {ckpt_path} holds no data settings (it was not written by `lightformer fit`); give "
                "the run's config with --config (e.g. <run dir>/config.yaml)"
            )
        class_path, arguments = saved.get("_class_path", ""), dict(saved)
        origin = f"the data settings saved in {ckpt_path}"
    if class_path and class_path.rsplit(".", 1)[-1] != "ImageTokenDataModule":
        raise ConfigError(f"{origin}: the data module is {class_path}, not ImageTokenDataModule")
    return ImageTokenDataModule(**{k: v for k, v in arguments.items() if not k.startswith("_")})


def probe(
    *,
    ckpt_path: str,
    layer: int | None = None,
    config: str | None = None,
    max_train: int | None = None,
    batch_size: int = 256,
    device: str = "cpu",
) -> dict[str, float]:
    """A linear classifier on an Image GPT's features, against raw pixels.

    Print the test accuracy of a linear classifier on an Image GPT's features, and on the pixels for comparison.

    A linear probe is Image GPT's measure of what a model learnt without labels. The features of an image are the
    mean over positions of the residual stream after decoder layer LAYER. The classifier is scikit-learn's
    LogisticRegression on standardised inputs, fitted on the training split and scored on the test split of the
    data the model was trained on (rebuilt from the checkpoint, or from --config).

    Args:
        ckpt_path: a checkpoint written by ``fit`` with the Image GPT task.
        layer: the decoder layer whose output is probed (1-based; 0: the embeddings); default: the middle layer.
        config: a config YAML (the run's ``config.yaml`` or the one it was trained with) whose data section
            rebuilds the data; default: the data settings saved in the checkpoint.
        max_train: fit the classifiers on the first MAX_TRAIN training images only (the split is in random
            order), to probe a large dataset quickly; an image folder's others are not read. Default: all.
        batch_size: images per forward pass when extracting features.
        device: "cpu", "cuda", "cuda:1", ...

    Returns:
        ``{"layer": ..., "features": test accuracy of the probe, "pixels": test accuracy on raw pixels}``.
    """
    if max_train is not None and max_train < 1:
        raise ConfigError(f"--max_train={max_train} must be at least 1 (or omitted: every training image)")
    if batch_size < 1:
        raise ConfigError(f"--batch_size={batch_size} must be at least 1")
    checkpoint = read_checkpoint(ckpt_path)
    task = load_task(ckpt_path, ImageGPTTask, "probe", device)
    n_layers = len(task.model.decoder.layers)
    layer = task.default_probe_layer() if layer is None else layer
    if not 0 <= layer <= n_layers:
        raise ConfigError(f"--layer={layer} must be from 0 (the embeddings) to {n_layers} (the model's last layer)")
    data = _probe_data(checkpoint, ckpt_path, config)
    check_same_palette(saved=task._require_palette(), data=data.pixel_tokenizer)
    data.setup()
    train_images, train_labels = data.labelled_images("train", max_train)
    test_images, test_labels = data.labelled_images("test")

    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def accuracy(train_x: Tensor, test_x: Tensor) -> float:
        classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
        classifier.fit(train_x.numpy(), train_labels.numpy())
        return float(classifier.score(test_x.numpy(), test_labels.numpy()))

    features = accuracy(task.features(train_images, layer, batch_size), task.features(test_images, layer, batch_size))
    pixels = accuracy(train_images.flatten(1).float() / 255, test_images.flatten(1).float() / 255)
    counts = f"{len(train_images)} training, {len(test_images)} test images"
    width = task.model.config.d_model
    print(f"linear probe on layer {layer} of {n_layers} ({width} features): test accuracy {features:.2%} ({counts})")
    print(f"the same classifier on the quantised pixels ({train_images[0].numel()} features): {pixels:.2%}")
    return {"layer": layer, "features": features, "pixels": pixels}


def _write_png(picture: Tensor, path: str) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(picture.permute(1, 2, 0).contiguous().numpy()).save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())


register(
    ImageGPTTask,
    data=ImageTokenDataModule,
    commands={"sample-images": sample_images, "probe": probe},
    list_options={"sample-images": "--complete_from"},
)
