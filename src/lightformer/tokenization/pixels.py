"""Pixels as tokens for Image GPT: each pixel becomes the id of its nearest palette colour, read in raster order.

Image GPT (Chen et al. 2020) models an image as a sequence: every pixel is replaced by the nearest colour of a
small palette (k-means clusters of RGB for colour images, a few grey levels for grey ones), the ids are read row
by row, and a GPT predicts the next one after a start-of-image token. `PixelTokenizer` holds the palette of `k`
uint8 colours, ids 0..k-1, with id k for the start token; `encode` maps uint8 images `(batch, channels, height,
width)` to ids `(batch, height * width)` and `decode` maps them back. "Nearest" is the smallest squared distance
in RGB (or grey), computed exactly; ties go to the lowest id. The palette travels in checkpoints as plain Python
(`to_dict` / `from_dict`), so `torch.load(weights_only=True)` can read it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F

VALID_CHANNELS = (1, 3)

# Luminance weights (ITU-R BT.601) that order a colour palette from dark to light.
LUMINANCE_WEIGHTS = (0.299, 0.587, 0.114)

# At most this many (pixel, colour) scores are held at once while encoding (float32: 16 MiB).
_MAX_SCORES_PER_CHUNK = 2**22

# k-means restarts (k-means++ seeding each time); the best of them by inertia is kept.
_KMEANS_N_INIT = 3

_DICT_FORMAT = "lightformer.PixelTokenizer"
_DICT_VERSION = 1
_DICT_KEYS = ("format", "version", "palette", "image_size", "channels")


PaletteName = Literal["uniform", "kmeans"]


@dataclass(frozen=True)
class PaletteConfig:
    """The colours pixels are read as (``data.palette``): the vocabulary of an Image GPT is these plus a start token.

    Args:
        kind: "uniform": evenly spaced levels (grey: ``levels`` greys; colour: ``levels`` per channel, all ``levels³``
            combinations); "kmeans": the ``levels`` colours of scikit-learn's k-means over the training pixels (seeded
            by the data's ``seed``), Image GPT's choice, which spends the colours where the pixels are.
        levels: grey levels or colours of the palette, from 2 to 256.
    """

    kind: PaletteName = "kmeans"
    levels: int = 16

    def __post_init__(self) -> None:
        if self.kind not in get_args(PaletteName):
            raise ValueError(f"data.palette.kind={self.kind!r} is unknown; valid: {list(get_args(PaletteName))}")
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or not 2 <= self.levels <= 256:
            raise ValueError(f"data.palette.levels={self.levels!r} must be an integer from 2 to 256 (palette colours)")


def _describe(value: Any) -> str:
    """What `value` is, for error messages: e.g. "uint8 tensor of shape (2, 1, 28, 28)"."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"numpy {value.dtype} array of shape {value.shape}"
    return type(value).__name__


def _check_channels(channels: int) -> None:
    if channels not in VALID_CHANNELS:
        raise ValueError(f"channels={channels!r} is not supported; expected 1 (grey) or 3 (RGB)")


def _check_image_size(image_size: int) -> None:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size={image_size!r} must be an integer >= 1 (pixels per side of a square image)")


def _nearest_ids(pixels: torch.Tensor, palette: torch.Tensor) -> torch.Tensor:
    """Id of the nearest palette colour for each pixel (smallest squared distance); ties go to the lowest id.

    pixels: integer (n, channels) in 0..255; palette: integer (k, channels) in 0..255. Returns int64 (n,) on
    the pixels' device. Pixels go in chunks so that no (chunk, k) score tensor exceeds `_MAX_SCORES_PER_CHUNK`
    elements, and no (n, k, channels) tensor is ever built.
    """
    device = pixels.device
    palette = palette.to(device=device, dtype=torch.float32)
    # |x - p|^2 = |x|^2 - 2 x.p + |p|^2, and |x|^2 is the same for every colour: the nearest colour has the
    # largest 2 x.p - |p|^2. Every value is an integer of magnitude below 2**24 (x.p <= 3 * 255**2), so float32
    # holds it exactly and equal distances give equal scores. The matmul stays exact even when float32 matmuls
    # run on TF32 or bfloat16 inputs (x <= 255 and 2p <= 510 have at most 8 significant bits; products accumulate
    # in float32); |p|^2 is subtracted outside the matmul and autocast is off, so nothing is rounded to 16 bits.
    doubled = (2 * palette).T.contiguous()
    squared_norms = (palette * palette).sum(dim=1)
    k = palette.shape[0]
    chunk = max(1, _MAX_SCORES_PER_CHUNK // k)
    ids = torch.empty(pixels.shape[0], dtype=torch.int64, device=device)
    autocast_off = (
        torch.autocast(device.type, enabled=False)
        if torch.amp.is_autocast_available(device.type)
        else contextlib.nullcontext()
    )
    with autocast_off:
        for start in range(0, pixels.shape[0], chunk):
            scores = pixels[start : start + chunk].to(torch.float32) @ doubled
            scores -= squared_norms
            # argmax returns the first index among equal maxima: the lowest id wins a tie.
            ids[start : start + chunk] = scores.argmax(dim=1)
    return ids


class PixelTokenizer:
    """A palette of `k` colours (k, channels) in uint8, token ids 0..k-1 for the colours and id k for the start token.

    Build one with `PixelTokenizer.uniform(levels, image_size, channels)` (evenly spaced levels) or
    `PixelTokenizer.fit_kmeans(images, k, image_size)` (k-means colours of a data set, as Image GPT), or
    rebuild one from a checkpoint with `PixelTokenizer.from_dict(state)`.
    """

    def __init__(self, palette: np.ndarray | torch.Tensor, image_size: int, channels: int) -> None:
        """palette: (k, channels) integer colours in 0..255, k >= 2, all distinct; images are image_size²."""
        _check_channels(channels)
        _check_image_size(image_size)
        if isinstance(palette, np.ndarray):
            palette = torch.from_numpy(np.ascontiguousarray(palette))
        if not isinstance(palette, torch.Tensor):
            raise ValueError(
                f"palette must be a numpy array or a torch tensor of shape (k, channels); got {_describe(palette)}"
            )
        if palette.dtype == torch.bool or palette.is_floating_point() or palette.is_complex():
            raise ValueError(
                f"palette must hold integer colours 0..255 (uint8), not {palette.dtype}; round a float palette first"
            )
        if palette.ndim != 2 or palette.shape[1] != channels:
            raise ValueError(f"palette must have shape (k, channels) = (k, {channels}); got {_describe(palette)}")
        if palette.shape[0] < 2:
            raise ValueError(f"palette must hold k >= 2 colours; got k={palette.shape[0]}")
        palette = palette.detach().to("cpu")
        low, high = int(palette.min()), int(palette.max())
        if low < 0 or high > 255:
            raise ValueError(f"palette colours must lie in 0..255; got values from {low} to {high}")
        palette = palette.to(torch.uint8).contiguous().clone()
        distinct = torch.unique(palette, dim=0).shape[0]
        if distinct != palette.shape[0]:
            raise ValueError(
                f"palette colours must be distinct (a repeated colour would be an id that encode never produces); "
                f"got {palette.shape[0]} colours of which {distinct} are distinct"
            )
        self._palette = palette
        self._image_size = image_size
        self._channels = channels
        # Grey images take a 256-entry lookup table (pixel value -> id) per device, built on first use.
        self._grey_tables: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def uniform(cls, levels: int, image_size: int, channels: int = 1) -> PixelTokenizer:
        """Evenly spaced levels: `round(linspace(0, 255, levels))` per channel.

        Grey: `levels` colours in increasing order. RGB: all `levels**3` combinations, id = r * levels**2 +
        g * levels + b where r, g, b are the level indices (red varies slowest).
        """
        if isinstance(levels, bool) or not isinstance(levels, int) or not 2 <= levels <= 256:
            raise ValueError(f"levels={levels!r} must be an integer from 2 to 256 (grey levels per channel)")
        _check_channels(channels)
        values = np.round(np.linspace(0, 255, levels)).astype(np.uint8)
        grids = np.meshgrid(*([values] * channels), indexing="ij")
        palette = np.stack([grid.reshape(-1) for grid in grids], axis=1)
        return cls(palette, image_size=image_size, channels=channels)

    @classmethod
    def fit_kmeans(
        cls,
        images: torch.Tensor | np.ndarray,
        k: int,
        image_size: int,
        seed: int = 0,
        max_pixels: int = 200_000,
    ) -> PixelTokenizer:
        """k-means palette of uint8 images (N, C, H, W) with C in (1, 3), as Image GPT's colour clusters.

        Fits scikit-learn's KMeans (seeded by `seed`) on at most `max_pixels` pixels drawn at random (by `seed`)
        from all images; the images may have any height and width (fit on originals, encode downsampled ones).
        Centres are rounded to uint8 and sorted (grey by value, colour by luminance, then R, G, B) so ids are
        stable and dark-to-light. Raises ValueError when the sampled pixels hold fewer than `k` distinct colours.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"k={k!r} must be an integer >= 2 (palette colours)")
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < k:
            raise ValueError(f"max_pixels={max_pixels!r} must be an integer >= k={k}")
        _check_image_size(image_size)
        if isinstance(images, torch.Tensor):
            images = images.detach().cpu().numpy()
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(f"expected uint8 images of shape (N, C, H, W) with C in (1, 3); got {_describe(images)}")
        channels = images.shape[1]
        _check_channels(channels)
        pixels = images.transpose(0, 2, 3, 1).reshape(-1, channels)
        rng = np.random.default_rng(seed)
        sampled = len(pixels) > max_pixels
        if sampled:
            pixels = pixels[np.sort(rng.choice(len(pixels), size=max_pixels, replace=False))]
        distinct = np.unique(pixels, axis=0).shape[0]
        if distinct < k:
            where = f"the {len(pixels)} pixels sampled (max_pixels={max_pixels})" if sampled else "the images"
            raise ValueError(
                f"cannot fit k={k} colours: {where} hold only {distinct} distinct colours; use k <= {distinct}"
                + (" or a larger max_pixels" if sampled else "")
            )

        from sklearn.cluster import KMeans  # slow to import: only when fitting

        kmeans = KMeans(n_clusters=k, n_init=_KMEANS_N_INIT, random_state=seed)
        kmeans.fit(pixels.astype(np.float32))
        palette = np.clip(np.round(kmeans.cluster_centers_), 0, 255).astype(np.uint8)
        if np.unique(palette, axis=0).shape[0] < k:
            raise ValueError(
                f"k-means found fewer than k={k} distinct colours after rounding the centres to uint8; "
                f"use a smaller k (the images hold {distinct} distinct colours)"
            )
        if channels == 1:
            order = np.argsort(palette[:, 0], kind="stable")
        else:
            luminance = palette.astype(np.float64) @ np.asarray(LUMINANCE_WEIGHTS)
            # lexsort sorts by the last key first: luminance, then R, G, B for equal luminance.
            order = np.lexsort((palette[:, 2], palette[:, 1], palette[:, 0], luminance))
        return cls(palette[order], image_size=image_size, channels=channels)

    @property
    def palette(self) -> torch.Tensor:
        """The colours, uint8 (k, channels), row i for token id i (a copy)."""
        return self._palette.clone()

    @property
    def num_colors(self) -> int:
        """k, the number of palette colours."""
        return self._palette.shape[0]

    @property
    def channels(self) -> int:
        """1 (grey) or 3 (RGB)."""
        return self._channels

    @property
    def image_size(self) -> int:
        """Height and width of the square images this tokenizer encodes."""
        return self._image_size

    @property
    def vocab_size(self) -> int:
        """k + 1: the k colours and the start token."""
        return self.num_colors + 1

    @property
    def start_id(self) -> int:
        """k, the start-of-image token that precedes the pixel tokens."""
        return self.num_colors

    @property
    def sequence_length(self) -> int:
        """image_size * image_size, the pixel tokens per image (the start token not counted)."""
        return self._image_size * self._image_size

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Token ids of uint8 images (B, C, H, W) with H == W == image_size: int64 (B, H*W) in raster order.

        Token r * W + c is the id of the palette colour nearest to pixel (row r, column c); ties go to the
        lowest id. Runs on the images' device.
        """
        expected = (
            f"(batch, C, image_size, image_size) = (batch, {self._channels}, {self._image_size}, {self._image_size})"
        )
        if (
            not isinstance(images, torch.Tensor)
            or images.dtype != torch.uint8
            or images.ndim != 4
            or tuple(images.shape[1:]) != (self._channels, self._image_size, self._image_size)
        ):
            raise ValueError(f"expected uint8 images of shape {expected}; got {_describe(images)}")
        batch = images.shape[0]
        if self._channels == 1:
            return self._grey_table(images.device)[images.reshape(batch, self.sequence_length).long()]
        pixels = images.permute(0, 2, 3, 1).reshape(-1, self._channels)
        return _nearest_ids(pixels, self._palette.to(images.device)).reshape(batch, self.sequence_length)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, C, image_size, image_size) of pixel token ids (B, image_size**2) (ids 0..k-1).

        The start token and any id outside 0..k-1 raise ValueError: strip the start token (`tokens[:, 1:]`) first.
        """
        if (
            not isinstance(tokens, torch.Tensor)
            or tokens.dtype == torch.bool
            or tokens.is_floating_point()
            or tokens.is_complex()
            or tokens.ndim != 2
            or tokens.shape[1] != self.sequence_length
        ):
            raise ValueError(
                f"expected integer token ids of shape (batch, sequence_length) = (batch, {self.sequence_length}); "
                f"got {_describe(tokens)}"
            )
        if tokens.numel() > 0:
            invalid = (tokens < 0) | (tokens >= self.num_colors)
            if bool(invalid.any()):
                bad = int(tokens[invalid][0])
                if bad == self.start_id:
                    raise ValueError(
                        f"token id {bad} is the start token, not a pixel; strip it before decoding (tokens[:, 1:])"
                    )
                raise ValueError(f"token id {bad} is out of range: pixel ids are 0..{self.num_colors - 1}")
        batch = tokens.shape[0]
        colours = self._palette.to(tokens.device)[tokens.long()]
        return (
            colours.reshape(batch, self._image_size, self._image_size, self._channels).permute(0, 3, 1, 2).contiguous()
        )

    def quantize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (B, C, H, W) with every pixel replaced by its nearest palette colour: decode(encode(images))."""
        return self.decode(self.encode(images))

    def to_dict(self) -> dict[str, Any]:
        """Plain Python (strings, ints, lists of ints) for a checkpoint that `torch.load(weights_only=True)` reads."""
        return {
            "format": _DICT_FORMAT,
            "version": _DICT_VERSION,
            "palette": self._palette.tolist(),
            "image_size": self._image_size,
            "channels": self._channels,
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> PixelTokenizer:
        """Rebuild a tokenizer from `to_dict()`'s output; a malformed dict raises ValueError saying what is wrong."""
        if not isinstance(state, dict):
            raise ValueError(
                f"pixel tokenizer state must be a dict from PixelTokenizer.to_dict(); got {_describe(state)}"
            )
        missing = [key for key in _DICT_KEYS if key not in state]
        unknown = sorted(str(key) for key in state if key not in _DICT_KEYS)
        if missing or unknown:
            raise ValueError(
                f"pixel tokenizer state has missing keys {missing} and unknown keys {unknown}; "
                f"expected exactly {list(_DICT_KEYS)}"
            )
        if state["format"] != _DICT_FORMAT or state["version"] != _DICT_VERSION:
            raise ValueError(
                f"pixel tokenizer state has format {state['format']!r} version {state['version']!r}; "
                f"expected {_DICT_FORMAT!r} version {_DICT_VERSION}"
            )
        for key in ("image_size", "channels"):
            if isinstance(state[key], bool) or not isinstance(state[key], int):
                raise ValueError(f"pixel tokenizer state[{key!r}] must be an int; got {state[key]!r}")
        _check_channels(state["channels"])
        palette = state["palette"]
        if not isinstance(palette, list) or not all(
            isinstance(colour, list)
            and len(colour) == state["channels"]
            and all(isinstance(value, int) and not isinstance(value, bool) for value in colour)
            for colour in palette
        ):
            raise ValueError(
                f"pixel tokenizer state['palette'] must be a list of k lists of {state['channels']} ints (0..255)"
            )
        return cls(np.asarray(palette, dtype=np.int64), image_size=state["image_size"], channels=state["channels"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PixelTokenizer):
            return NotImplemented
        return (
            self._image_size == other._image_size
            and self._channels == other._channels
            and torch.equal(self._palette, other._palette)
        )

    def __hash__(self) -> int:
        return hash((self._image_size, self._channels, self._palette.numpy().tobytes()))

    def __repr__(self) -> str:
        return (
            f"PixelTokenizer(num_colors={self.num_colors}, channels={self._channels}, "
            f"image_size={self._image_size}, vocab_size={self.vocab_size})"
        )

    def _grey_table(self, device: torch.device) -> torch.Tensor:
        """int64 (256,): the id of every grey value 0..255, by the same nearest rule as colour images."""
        if device not in self._grey_tables:
            values = torch.arange(256, dtype=torch.int32).reshape(256, 1)
            self._grey_tables[device] = _nearest_ids(values, self._palette).to(device)
        return self._grey_tables[device]


def downsample(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 images (B, C, H, W) to uint8 (B, C, size, size) by area averaging, rounded (half to even).

    When `size` divides H and W each output pixel is the mean of an (H/size) x (W/size) block; otherwise the
    blocks overlap as in adaptive average pooling. `size` must be between 1 and min(H, W).
    """
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.ndim != 4:
        raise ValueError(f"expected uint8 images of shape (batch, C, H, W); got {_describe(images)}")
    height, width = images.shape[2:]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= min(height, width):
        raise ValueError(
            f"size={size!r} must be an integer from 1 to {min(height, width)} (downsampling only: images are "
            f"{height}x{width})"
        )
    if images.shape[0] == 0:
        return images.new_empty(0, images.shape[1], size, size)
    averaged = F.interpolate(images.float(), size=(size, size), mode="area")
    return averaged.round().clamp(0, 255).to(torch.uint8)
