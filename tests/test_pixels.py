"""Pixel tokenizer for Image GPT: nearest colours, raster order, palettes, checkpoint dicts, downsampling."""

import io

import numpy as np
import pytest
import torch

from lightformer.tokenization import pixels
from lightformer.tokenization.pixels import PixelTokenizer, downsample


def random_images(batch: int, channels: int, size: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, channels, size, size), dtype=torch.uint8, generator=generator)


def brute_force_ids(images: torch.Tensor, palette: np.ndarray) -> np.ndarray:
    """Reference: for each pixel in raster order, the first palette row with the smallest squared distance."""
    batch, channels = images.shape[:2]
    flat = images.numpy().transpose(0, 2, 3, 1).reshape(-1, channels).astype(np.int64)
    distances = ((flat[:, None, :] - palette[None, :, :].astype(np.int64)) ** 2).sum(axis=-1)
    return distances.argmin(axis=1).reshape(batch, -1)  # numpy's argmin also returns the first minimum


# ---------------------------------------------------------------- sizes and round trips


def test_sizes_and_ids():
    tokenizer = PixelTokenizer.uniform(levels=8, image_size=12)
    assert (tokenizer.num_colors, tokenizer.vocab_size, tokenizer.start_id) == (8, 9, 8)
    assert (tokenizer.sequence_length, tokenizer.channels, tokenizer.image_size) == (144, 1, 12)
    colour = PixelTokenizer.uniform(levels=4, image_size=5, channels=3)
    assert (colour.num_colors, colour.vocab_size, colour.start_id, colour.sequence_length) == (64, 65, 64, 25)
    assert "num_colors=64" in repr(colour) and "image_size=5" in repr(colour)


@pytest.mark.parametrize("channels", [1, 3])
def test_round_trip_and_quantize_idempotent(channels):
    tokenizer = PixelTokenizer.uniform(levels=8, image_size=10, channels=channels)
    images = random_images(4, channels, 10)
    tokens = tokenizer.encode(images)
    assert tokens.dtype == torch.int64 and tokens.shape == (4, 100)
    assert int(tokens.min()) >= 0 and int(tokens.max()) < tokenizer.num_colors
    decoded = tokenizer.decode(tokens)
    assert decoded.dtype == torch.uint8 and decoded.shape == images.shape
    assert torch.equal(tokenizer.encode(decoded), tokens)
    quantized = tokenizer.quantize(images)
    assert torch.equal(quantized, decoded)
    assert torch.equal(tokenizer.decode(tokenizer.encode(quantized)), quantized)
    assert torch.equal(tokenizer.quantize(quantized), quantized)
    # Every quantised pixel is a palette colour, and quantising moves no pixel further than half a level step.
    step = 255 / 7
    assert (quantized.int() - images.int()).abs().max() <= step / 2 + 0.5


def test_empty_batch():
    tokenizer = PixelTokenizer.uniform(levels=4, image_size=3, channels=3)
    tokens = tokenizer.encode(torch.zeros(0, 3, 3, 3, dtype=torch.uint8))
    assert tokens.shape == (0, 9)
    assert tokenizer.decode(tokens).shape == (0, 3, 3, 3)


# ---------------------------------------------------------------- nearest colour


@pytest.mark.parametrize("channels", [1, 3])
def test_encode_matches_brute_force_nearest(channels):
    rng = np.random.default_rng(channels)
    palette = np.unique(rng.integers(0, 256, size=(40, channels), dtype=np.uint8), axis=0)
    rng.shuffle(palette)  # ids in no particular colour order
    tokenizer = PixelTokenizer(palette, image_size=16, channels=channels)
    images = random_images(3, channels, 16, seed=channels)
    assert np.array_equal(tokenizer.encode(images).numpy(), brute_force_ids(images, palette))


def test_ties_go_to_the_lowest_id():
    # Grey: 5 is 5 away from both 10 (id 0) and 0 (id 1); 15 is 5 away from 10 (id 0) and 20 (id 2).
    grey = PixelTokenizer(np.array([[10], [0], [20]], dtype=np.uint8), image_size=2, channels=1)
    images = torch.tensor([[[[5, 15], [0, 20]]]], dtype=torch.uint8)
    assert grey.encode(images).tolist() == [[0, 0, 1, 2]]
    # RGB: (1, 1, 0) is at squared distance 1 from both (1, 1, 1) (id 1) and (1, 0, 0) (id 2), 2 from (0, 0, 0).
    rgb = PixelTokenizer(np.array([[0, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=np.uint8), image_size=1, channels=3)
    assert rgb.encode(torch.tensor([1, 1, 0], dtype=torch.uint8).reshape(1, 3, 1, 1)).tolist() == [[1]]
    reversed_rgb = PixelTokenizer(rgb.palette.flip(0), image_size=1, channels=3)
    assert reversed_rgb.encode(torch.tensor([1, 1, 0], dtype=torch.uint8).reshape(1, 3, 1, 1)).tolist() == [[0]]


def test_chunked_encoding_gives_the_same_ids(monkeypatch):
    tokenizer = PixelTokenizer.uniform(levels=5, image_size=9, channels=3)
    images = random_images(3, 3, 9, seed=7)
    whole = tokenizer.encode(images)
    # 125 colours: chunks of 2 pixels, so 243 pixels take 122 chunks, the last one of a single pixel.
    monkeypatch.setattr(pixels, "_MAX_SCORES_PER_CHUNK", 250)
    assert torch.equal(tokenizer.encode(images), whole)
    assert np.array_equal(whole.numpy(), brute_force_ids(images, tokenizer.palette.numpy()))


def test_encoding_is_exact_under_autocast():
    # Scores reach 3 * 255**2; in bfloat16 they would round and near ties would pick other ids.
    rng = np.random.default_rng(3)
    palette = np.unique(rng.integers(0, 256, size=(300, 3), dtype=np.uint8), axis=0)
    tokenizer = PixelTokenizer(palette, image_size=12, channels=3)
    images = random_images(4, 3, 12, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tokens = tokenizer.encode(images)
    assert np.array_equal(tokens.numpy(), brute_force_ids(images, palette))


def test_raster_order():
    size = 6
    values = torch.arange(size * size, dtype=torch.uint8).reshape(size, size) * 7  # distinct per (row, col)
    palette = values.reshape(-1, 1).flip(0)  # pixel value v is palette row 35 - v/7: ids unrelated to values
    tokenizer = PixelTokenizer(palette, image_size=size, channels=1)
    tokens = tokenizer.encode(values.reshape(1, 1, size, size))
    for row in range(size):
        for column in range(size):
            assert palette[tokens[0, row * size + column], 0] == values[row, column]
    rgb = torch.stack([values, 255 - values, values // 2]).unsqueeze(0)
    rgb_palette = rgb[0].permute(1, 2, 0).reshape(-1, 3)
    rgb_tokenizer = PixelTokenizer(rgb_palette, image_size=size, channels=3)
    assert rgb_tokenizer.encode(rgb).tolist() == [list(range(size * size))]
    assert torch.equal(rgb_tokenizer.decode(torch.arange(size * size).unsqueeze(0)), rgb)


# ---------------------------------------------------------------- uniform palettes


def test_uniform_grey_levels_are_rounded_linspace():
    for levels in (2, 3, 8, 16, 100, 256):
        palette = PixelTokenizer.uniform(levels, image_size=4).palette
        assert palette.dtype == torch.uint8 and palette.shape == (levels, 1)
        assert np.array_equal(palette[:, 0].numpy(), np.round(np.linspace(0, 255, levels)).astype(np.uint8))
    for levels in range(2, 257):  # rounding never merges two levels
        assert PixelTokenizer.uniform(levels, image_size=1).num_colors == levels


def test_uniform_grey_ramp_gives_monotone_tokens_covering_all_levels():
    tokenizer = PixelTokenizer.uniform(levels=8, image_size=16)
    ramp = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16)
    tokens = tokenizer.encode(ramp)[0]
    assert bool((tokens[1:] >= tokens[:-1]).all())
    assert sorted(set(tokens.tolist())) == list(range(8))
    assert tokens[0] == 0 and tokens[-1] == 7


def test_uniform_colour_palette_is_every_level_combination_red_slowest():
    tokenizer = PixelTokenizer.uniform(levels=3, image_size=2, channels=3)
    palette = tokenizer.palette
    assert palette.shape == (27, 3)
    assert palette[0].tolist() == [0, 0, 0] and palette[-1].tolist() == [255, 255, 255]
    assert (
        palette[1].tolist() == [0, 0, 128] and palette[3].tolist() == [0, 128, 0] and palette[9].tolist() == [128, 0, 0]
    )
    assert torch.unique(palette, dim=0).shape[0] == 27


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"levels": 1, "image_size": 4}, "levels=1"),
        ({"levels": 257, "image_size": 4}, "levels=257"),
        ({"levels": 4, "image_size": 0}, "image_size=0"),
        ({"levels": 4, "image_size": 4, "channels": 2}, "channels=2"),
    ],
)
def test_uniform_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PixelTokenizer.uniform(**kwargs)


@pytest.mark.parametrize(
    ("palette", "channels", "message"),
    [
        (np.array([[3]], dtype=np.uint8), 1, "k >= 2"),
        (np.array([[3], [3]], dtype=np.uint8), 1, "distinct"),
        (np.array([[0.0], [1.0]]), 1, "integer colours"),
        (np.array([[0], [300]]), 1, "0..255"),
        (np.array([[0, 0], [1, 1]], dtype=np.uint8), 2, "channels=2"),
        (np.array([[0], [1]], dtype=np.uint8), 3, r"\(k, 3\)"),
    ],
)
def test_constructor_rejects_bad_palettes(palette, channels, message):
    with pytest.raises(ValueError, match=message):
        PixelTokenizer(palette, image_size=4, channels=channels)


# ---------------------------------------------------------------- k-means palettes

GREY_VALUES = (20, 90, 160, 230)


def grey_cluster_images(seed: int) -> np.ndarray:
    """(40, 1, 8, 8) uint8 pixels drawn from GREY_VALUES plus noise in -2..2."""
    rng = np.random.default_rng(seed)
    centres = rng.choice(np.array(GREY_VALUES), size=(40, 1, 8, 8))
    return (centres + rng.integers(-2, 3, size=centres.shape)).astype(np.uint8)


def test_fit_kmeans_recovers_grey_values_sorted():
    images = grey_cluster_images(seed=1)
    tokenizer = PixelTokenizer.fit_kmeans(torch.from_numpy(images), k=4, image_size=8, seed=0)
    values = tokenizer.palette[:, 0].int()
    assert (tokenizer.channels, tokenizer.num_colors, tokenizer.image_size) == (1, 4, 8)
    assert bool((values[1:] > values[:-1]).all())
    assert (values - torch.tensor(GREY_VALUES)).abs().max() <= 3
    # Pixels encode to the id of the value they were drawn around.
    nearest = np.abs(images.astype(int)[..., None] - np.array(GREY_VALUES)).argmin(-1).reshape(40, -1)
    assert np.array_equal(tokenizer.encode(torch.from_numpy(images)).numpy(), nearest)


def test_fit_kmeans_is_deterministic_and_subsamples():
    images = grey_cluster_images(seed=2)  # 2560 pixels
    first = PixelTokenizer.fit_kmeans(images, k=4, image_size=8, seed=3, max_pixels=500)
    second = PixelTokenizer.fit_kmeans(images, k=4, image_size=8, seed=3, max_pixels=500)
    assert first == second and hash(first) == hash(second)
    assert (first.palette[:, 0].int() - torch.tensor(GREY_VALUES)).abs().max() <= 3


def test_fit_kmeans_colour_palette_sorted_by_luminance():
    rng = np.random.default_rng(0)
    colours = np.array([[250, 10, 10], [10, 250, 10], [10, 10, 250], [240, 240, 240], [5, 5, 5]])
    chosen = colours[rng.integers(0, len(colours), size=(30 * 6 * 6))] + rng.integers(-2, 3, size=(30 * 6 * 6, 3))
    images = chosen.reshape(30, 6, 6, 3).transpose(0, 3, 1, 2).astype(np.uint8)
    tokenizer = PixelTokenizer.fit_kmeans(images, k=5, image_size=6)
    palette = tokenizer.palette.int()
    luminance = palette.double() @ torch.tensor(pixels.LUMINANCE_WEIGHTS, dtype=torch.float64)
    assert bool((luminance[1:] >= luminance[:-1]).all())
    expected = colours[np.argsort(colours @ np.array(pixels.LUMINANCE_WEIGHTS))]
    assert (palette - torch.from_numpy(expected)).abs().max() <= 3


def test_fit_kmeans_rejects_more_colours_than_the_data_hold():
    images = np.zeros((2, 1, 4, 4), dtype=np.uint8)
    images[:, :, :2] = 100
    images[0, 0, 0, 0] = 200  # three distinct values
    with pytest.raises(ValueError, match=r"only 3 distinct colours; use k <= 3"):
        PixelTokenizer.fit_kmeans(images, k=4, image_size=4)
    assert PixelTokenizer.fit_kmeans(images, k=3, image_size=4).palette[:, 0].tolist() == [0, 100, 200]


@pytest.mark.parametrize(
    ("images", "k", "message"),
    [
        (np.zeros((2, 1, 4, 4), dtype=np.float32), 2, "expected uint8 images"),
        (np.zeros((1, 4, 4), dtype=np.uint8), 2, "expected uint8 images"),
        (np.zeros((2, 2, 4, 4), dtype=np.uint8), 2, "channels=2"),
        (np.zeros((2, 1, 4, 4), dtype=np.uint8), 1, "k=1"),
    ],
)
def test_fit_kmeans_rejects_bad_arguments(images, k, message):
    with pytest.raises(ValueError, match=message):
        PixelTokenizer.fit_kmeans(images, k=k, image_size=4)


# ---------------------------------------------------------------- checkpoint dicts


@pytest.mark.parametrize("channels", [1, 3])
def test_dict_survives_torch_save_and_weights_only_load(channels):
    tokenizer = PixelTokenizer.uniform(levels=4, image_size=7, channels=channels)
    buffer = io.BytesIO()
    torch.save({"pixel_tokenizer": tokenizer.to_dict(), "step": 3}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    restored = PixelTokenizer.from_dict(loaded["pixel_tokenizer"])
    assert restored == tokenizer and restored is not tokenizer
    images = random_images(2, channels, 7, seed=5)
    assert torch.equal(restored.encode(images), tokenizer.encode(images))
    assert tokenizer != PixelTokenizer.uniform(levels=4, image_size=8, channels=channels)


def good_state() -> dict:
    return PixelTokenizer.uniform(levels=3, image_size=4).to_dict()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda state: state.pop("palette"), "missing keys \\['palette'\\]"),
        (lambda state: state.update(extra=1), "unknown keys \\['extra'\\]"),
        (lambda state: state.update(format="other"), "format 'other'"),
        (lambda state: state.update(version=2), "version 2"),
        (lambda state: state.update(image_size="4"), "image_size"),
        (lambda state: state.update(channels=2), "channels=2"),
        (lambda state: state.update(palette=[[0, 0], [1, 1]]), "lists of 1 ints"),
        (lambda state: state.update(palette=[[0.5], [1]]), "lists of 1 ints"),
        (lambda state: state.update(palette=[[0]]), "k >= 2"),
        (lambda state: state.update(palette=[[0], [999]]), "0..255"),
        (lambda state: state.update(image_size=0), "image_size=0"),
    ],
)
def test_from_dict_rejects_malformed_state(change, message):
    state = good_state()
    change(state)
    with pytest.raises(ValueError, match=message):
        PixelTokenizer.from_dict(state)


def test_from_dict_rejects_a_non_dict():
    with pytest.raises(ValueError, match="must be a dict"):
        PixelTokenizer.from_dict([1, 2])


# ---------------------------------------------------------------- errors


def test_decode_refuses_the_start_token_and_out_of_range_ids():
    tokenizer = PixelTokenizer.uniform(levels=4, image_size=2)
    with pytest.raises(ValueError, match=r"token id 4 is the start token.*tokens\[:, 1:\]"):
        tokenizer.decode(torch.tensor([[0, 1, 4, 2]]))
    with pytest.raises(ValueError, match=r"token id 9 is out of range: pixel ids are 0..3"):
        tokenizer.decode(torch.tensor([[0, 9, 1, 2]]))
    with pytest.raises(ValueError, match=r"token id -1 is out of range"):
        tokenizer.decode(torch.tensor([[0, -1, 1, 2]]))
    with pytest.raises(ValueError, match=r"\(batch, 4\); got int64 tensor of shape \(1, 5\)"):
        tokenizer.decode(torch.tensor([[tokenizer.start_id, 0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="float32"):
        tokenizer.decode(torch.zeros(1, 4))


def test_encode_refuses_float_images_and_wrong_sizes():
    tokenizer = PixelTokenizer.uniform(levels=4, image_size=8, channels=3)
    expected = r"expected uint8 images of shape \(batch, C, image_size, image_size\) = \(batch, 3, 8, 8\); got "
    with pytest.raises(ValueError, match=expected + r"float32 tensor of shape \(2, 3, 8, 8\)"):
        tokenizer.encode(torch.rand(2, 3, 8, 8))
    with pytest.raises(ValueError, match=expected + r"uint8 tensor of shape \(2, 3, 9, 9\)"):
        tokenizer.encode(torch.zeros(2, 3, 9, 9, dtype=torch.uint8))
    with pytest.raises(ValueError, match=expected + r"uint8 tensor of shape \(2, 1, 8, 8\)"):
        tokenizer.encode(torch.zeros(2, 1, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match=expected + r"uint8 tensor of shape \(3, 8, 8\)"):
        tokenizer.encode(torch.zeros(3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match=expected + r"numpy uint8 array of shape \(2, 3, 8, 8\)"):
        tokenizer.encode(np.zeros((2, 3, 8, 8), dtype=np.uint8))


# ---------------------------------------------------------------- downsampling


def test_downsample_of_constant_blocks_gives_the_block_values():
    blocks = torch.randint(0, 256, (2, 3, 14, 14), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    images = blocks.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    assert images.shape == (2, 3, 28, 28)
    small = downsample(images, 14)
    assert small.dtype == torch.uint8 and torch.equal(small, blocks)
    assert torch.equal(downsample(images, 28), images)


def test_downsample_averages_and_rounds():
    images = torch.tensor([[[[0, 1], [1, 1]], [[10, 20], [30, 40]]]], dtype=torch.uint8)  # (1, 2, 2, 2)
    assert downsample(images, 1).flatten().tolist() == [1, 25]  # means 0.75 and 25.0
    assert downsample(random_images(3, 1, 28), 8).shape == (3, 1, 8, 8)  # sizes that do not divide


def test_downsample_rejects_upsampling_and_float_images():
    with pytest.raises(ValueError, match=r"size=29 must be an integer from 1 to 28"):
        downsample(torch.zeros(1, 1, 28, 28, dtype=torch.uint8), 29)
    with pytest.raises(ValueError, match="size=0"):
        downsample(torch.zeros(1, 1, 28, 28, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match="expected uint8 images"):
        downsample(torch.zeros(1, 1, 28, 28), 14)


# ---------------------------------------------------------------- devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("channels", [1, 3])
def test_encode_and_decode_on_gpu_match_cpu(channels):
    tokenizer = PixelTokenizer.uniform(levels=6, image_size=16, channels=channels)
    images = random_images(4, channels, 16, seed=11)
    tokens = tokenizer.encode(images.cuda())
    assert tokens.device.type == "cuda"
    assert torch.equal(tokens.cpu(), tokenizer.encode(images))
    decoded = tokenizer.decode(tokens)
    assert decoded.device.type == "cuda" and torch.equal(decoded.cpu(), tokenizer.quantize(images))
