"""Tests for lightformer.data.families.images: digits, Fashion-MNIST from Debian's files, image folders, batch
augmentation on the device, errors."""

import json
from pathlib import Path

import pytest
import torch
import torchvision
from PIL import Image
from torchvision.transforms import v2

from lightformer.data.families.images import ImageDataModule
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.objectives import augment
from lightformer.data.objectives.augment import AugmentConfig
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources import corpora, images
from lightformer.data.sources.image_files import load_image
from lightformer.data.sources.images import ImageSource
from lightformer.errors import DataError

HAS_DEBIAN_FASHION_MNIST = corpora.DEBIAN_FASHION_MNIST_DIR.is_dir()


def write_image_folder(folder: Path, class_names: list[str], images_per_class: int) -> None:
    """Write small PNGs of mixed sizes and modes ("L", "RGB", "RGBA") into folder/<class>/."""
    modes_and_sizes = [("L", (20, 30)), ("RGB", (40, 40)), ("RGBA", (17, 23))]
    for class_index, class_name in enumerate(class_names):
        (folder / class_name).mkdir(parents=True)
        for image_index in range(images_per_class):
            mode, size = modes_and_sizes[image_index % len(modes_and_sizes)]
            rgba = (40 * class_index, 255 - 40 * class_index, 80 + image_index, 200)
            color = rgba[0] if mode == "L" else rgba[: len(mode)]
            Image.new(mode, size, color).save(folder / class_name / f"{image_index}.png")


# ---------------------------------------------------------------- digits


def test_digits_shapes_sizes_and_labels():
    datamodule = ImageDataModule(source=ImageSource(dataset="digits"), loader=LoaderConfig(batch_size=32))
    assert (datamodule.num_classes, datamodule.in_channels, datamodule.image_size) == (10, 1, 8)
    assert datamodule.class_names == [str(digit) for digit in range(10)]
    datamodule.setup("fit")
    sizes = [len(datamodule.train_dataset), len(datamodule.val_dataset), len(datamodule.test_dataset)]
    assert sizes == [1298, 229, 270]
    assert sum(sizes) == 1797
    all_indices = datamodule.train_dataset.indices + datamodule.val_dataset.indices
    all_indices += datamodule.test_dataset.indices
    assert sorted(all_indices) == list(range(1797))

    for loader in (datamodule.train_dataloader(), datamodule.val_dataloader(), datamodule.test_dataloader()):
        batch = next(iter(loader))
        assert batch[0].shape == (32, 1, 8, 8) and batch[0].dtype == torch.uint8  # 4x less to copy to a GPU
        batch_images, labels = datamodule.transform_batch(batch, train=False)
        assert batch_images.shape == (32, 1, 8, 8)
        assert batch_images.dtype == torch.float32
        assert labels.shape == (32,) and labels.dtype == torch.int64
        assert labels.min() >= 0 and labels.max() < 10


def test_digits_split_is_deterministic_for_a_seed():
    first = ImageDataModule(source=ImageSource(dataset="digits"), seed=3)
    second = ImageDataModule(source=ImageSource(dataset="digits"), seed=3)
    other_seed = ImageDataModule(source=ImageSource(dataset="digits"), seed=4)
    for datamodule in (first, second, other_seed):
        datamodule.setup()
    assert first.val_dataset.indices == second.val_dataset.indices
    assert first.val_dataset.indices != other_seed.val_dataset.indices
    # The test set is a fixed carve: comparable across seeds.
    assert first.test_dataset.indices == other_seed.test_dataset.indices
    # Same seed, same shuffling.
    assert torch.equal(next(iter(first.train_dataloader()))[1], next(iter(second.train_dataloader()))[1])


def test_digits_normalisation_uses_train_statistics():
    datamodule = ImageDataModule(
        source=ImageSource(dataset="digits"),
        augment=AugmentConfig(policy="none"),
        loader=LoaderConfig(batch_size=2000),
    )
    datamodule.setup()
    train_images, _ = datamodule.transform_batch(next(iter(datamodule.train_dataloader())), train=True)
    assert train_images.mean().abs() < 1e-4
    assert (train_images.std() - 1).abs() < 1e-3


def test_val_size_is_a_count_and_val_fraction_a_fraction():
    by_count = ImageDataModule(source=ImageSource(dataset="digits", val_size=100))
    by_fraction = ImageDataModule(source=ImageSource(dataset="digits", val_fraction=0.5))
    no_validation = ImageDataModule(source=ImageSource(dataset="digits", val_size=0))
    for datamodule in (by_count, by_fraction, no_validation):
        datamodule.setup()
    assert len(by_count.val_dataset) == 100
    assert len(by_fraction.val_dataset) == round(0.5 * (1797 - 270))
    assert len(no_validation.val_dataset) == 0 and len(no_validation.train_dataset) == 1797 - 270


def test_dataloader_options():
    datamodule = ImageDataModule(
        source=ImageSource(dataset="digits"), loader=LoaderConfig(num_workers=1, pin_memory=True)
    )
    datamodule.setup()
    loader = datamodule.train_dataloader()
    assert loader.persistent_workers and loader.pin_memory and loader.num_workers == 1
    assert len(datamodule.predict_dataloader().dataset) == len(datamodule.test_dataset)  # predict: the test set
    with pytest.raises(RuntimeError, match="setup"):
        ImageDataModule(source=ImageSource(dataset="fashion_mnist")).train_dataloader()


# ---------------------------------------------------------------- augmentation and transforms


def windows(image: torch.Tensor, padding: int) -> list[torch.Tensor]:
    """Every (S × S) window of ``image`` (C, S, S) zero-padded by ``padding``: the possible random crops."""
    size = image.shape[-1]
    padded = torch.nn.functional.pad(image, (padding,) * 4)
    return [padded[:, y : y + size, x : x + size] for y in range(2 * padding + 1) for x in range(2 * padding + 1)]


@pytest.mark.parametrize(("dataset", "flips"), [("fashion_mnist", True), ("mnist", False)])
def test_flip_crop_crops_and_flips_each_image_on_its_own(dataset, flips):
    datamodule = ImageDataModule(
        source=ImageSource(dataset=dataset), augment=AugmentConfig(policy="flip_crop")
    )  # no data is read
    torch.manual_seed(0)
    image = torch.randint(0, 256, (1, 28, 28), dtype=torch.uint8)  # asymmetric: its mirror is another image
    batch = image.expand(64, -1, -1, -1).contiguous()
    out, _ = datamodule.transform_batch((batch, torch.zeros(64, dtype=torch.long)), train=True)
    pixels = (out * 0.3530 + 0.2860) * 255 if dataset == "fashion_mnist" else (out * 0.3081 + 0.1307) * 255
    pixels = pixels.round().to(torch.uint8)
    plain, mirrored = windows(image, 4), windows(image.flip(-1), 4)  # padding: 28 // 7
    is_plain = [any(torch.equal(x, w) for w in plain) for x in pixels]
    is_mirrored = [any(torch.equal(x, w) for w in mirrored) for x in pixels]
    assert all(p or m for p, m in zip(is_plain, is_mirrored, strict=True))  # every output is a crop of the image
    assert any(is_mirrored) == flips and (not flips or any(is_plain))  # flips only where they keep the label
    assert len({x.numpy().tobytes() for x in pixels}) > 20  # each image drew its own crop (and flip)
    evaluated, _ = datamodule.transform_batch((batch, torch.zeros(64, dtype=torch.long)), train=False)
    torch.testing.assert_close(evaluated, augment.normalize(batch, datamodule.normalize_mean, datamodule.normalize_std))


def test_flip_and_none_augment_and_refusals():
    datamodule = ImageDataModule(source=ImageSource(dataset="fashion_mnist"), augment=AugmentConfig(policy="flip"))
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (64, 1, 28, 28), dtype=torch.uint8)
    out, _ = datamodule.transform_batch((batch, torch.zeros(64)), train=True)
    plain = augment.normalize(batch, datamodule.normalize_mean, datamodule.normalize_std)
    same = (out == plain).flatten(1).all(1)
    mirrored = (out == plain.flip(-1)).flatten(1).all(1)
    assert (same | mirrored).all() and 15 < mirrored.sum() < 49  # about half, each image on its own
    unaugmented = ImageDataModule(source=ImageSource(dataset="digits"), augment=AugmentConfig(policy="none"))
    digits_batch = torch.randint(0, 256, (8, 1, 8, 8), dtype=torch.uint8)
    torch.testing.assert_close(
        unaugmented.transform_batch((digits_batch, torch.zeros(8)), train=True)[0],
        unaugmented.transform_batch((digits_batch, torch.zeros(8)), train=False)[0],
    )
    with pytest.raises(ValueError, match="augment.policy='flip' does not suit dataset='mnist'"):
        ImageDataModule(source=ImageSource(dataset="mnist"), augment=AugmentConfig(policy="flip"))


def test_random_erasing_replaces_one_rectangle_of_about_the_drawn_share_of_each_chosen_image():
    datamodule = ImageDataModule(
        source=ImageSource(dataset="fashion_mnist"), augment=AugmentConfig(policy="none", random_erasing=0.25)
    )
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (4000, 1, 28, 28), dtype=torch.uint8)
    out, _ = datamodule.transform_batch((batch, torch.zeros(4000)), train=True)
    plain = augment.normalize(batch, datamodule.normalize_mean, datamodule.normalize_std)
    changed = (out != plain)[:, 0]  # (batch, H, W): the erased pixels (noise equal to the pixel: probability 0)
    erased = changed.flatten(1).any(1)
    assert abs(erased.float().mean().item() - 0.25) < 0.03  # 1,000 ± 27 expected
    shares = []
    for mask in changed[erased]:
        rows, cols = mask.any(1).nonzero()[:, 0], mask.any(0).nonzero()[:, 0]
        box = mask[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
        assert box.all() and box.sum() == mask.sum()  # one solid rectangle, nothing changed outside it
        shares.append(mask.float().mean().item())
    shares = torch.tensor(shares)
    assert shares.min() >= 1 / 784 and shares.max() < 0.4  # 2% to 33% of the area, up to rounding and cuts
    assert 0.16 < shares.mean() < 0.195  # a uniform share in [0.02, 1/3] has mean 0.177
    noise = out[:, 0][changed]
    assert abs(noise.mean().item()) < 0.05 and abs(noise.std().item() - 1) < 0.05  # N(0, 1) in normalised units
    evaluated, _ = datamodule.transform_batch((batch[:8], torch.zeros(8)), train=False)
    torch.testing.assert_close(evaluated, plain[:8])  # evaluation is never erased


@pytest.mark.parametrize("policy", ["trivialaugment", "randaugment"])
def test_per_image_augmentation_runs_in_the_loader_drawn_from_seed_epoch_and_index(policy):
    """TrivialAugment and RandAugment run on uint8 images in the loader; each image's draws come from (seed, epoch,
    index), so neither the loader's workers nor the global generator change them, and a resumed epoch is exact."""

    def loader(workers: int, global_seed: int):
        torch.manual_seed(global_seed)  # seeds the loader's workers, and the draws of a transform left unseeded
        datamodule = ImageDataModule(
            source=ImageSource(dataset="digits"),
            augment=AugmentConfig(policy=policy),
            loader=LoaderConfig(batch_size=16, num_workers=workers),
            image_size=16,
        )
        datamodule.setup()
        return datamodule, datamodule.train_dataloader()

    def epoch(loader, number: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        loader.sampler.set_epoch(number)
        return list(loader)  # whole: a worker left mid-epoch takes seconds to shut down

    datamodule, reference = loader(workers=0, global_seed=0)
    batches = epoch(reference, 1)
    images, labels = batches[0]
    assert images.shape == (16, 1, 16, 16) and images.dtype == torch.uint8
    train = datamodule.train_dataset
    keys = list(reference.sampler)[:16]
    assert all(epoch == 1 for _, epoch in keys)
    plain = train.source.tensors[0][[train.indices[index] for index, _ in keys]]
    assert plain.shape == images.shape  # resized once, at setup
    assert (images != plain).flatten(1).any(1).sum() >= 8  # most images are changed (an identity op is drawn too)
    assert datamodule.transform_batch(batches[0], train=True)[0].isfinite().all()

    _, with_workers = loader(workers=2, global_seed=1)
    for (got, got_labels), (want, want_labels) in zip(epoch(with_workers, 1), batches, strict=True):
        assert torch.equal(got, want) and torch.equal(got_labels, want_labels)

    _, resumed = loader(workers=2, global_seed=2)
    resumed.load_state_dict({"epoch": 1, "batches": 3})
    for (got, _), (want, _) in zip(epoch(resumed, 1), batches[3:], strict=True):
        assert torch.equal(got, want)

    index = keys[0][0]
    state = torch.get_rng_state()
    draws = [train[(index, number)][0] for number in range(1, 9)]
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is left as it was
    assert torch.equal(draws[0], images[0])
    assert any(not torch.equal(draw, draws[0]) for draw in draws[1:])  # another epoch, another draw


# ---------------------------------------------------------------- Fashion-MNIST from Debian's package


@pytest.fixture(scope="module")
def fashion_mnist(tmp_path_factory) -> ImageDataModule:
    if not HAS_DEBIAN_FASHION_MNIST:
        pytest.skip(f"{corpora.DEBIAN_FASHION_MNIST_DIR} absent: `apt-get install dataset-fashion-mnist`")
    datamodule = ImageDataModule(
        source=ImageSource(dataset="fashion_mnist", root=str(tmp_path_factory.mktemp("data"))),
        augment=AugmentConfig(policy="none"),
        loader=LoaderConfig(batch_size=512),
    )
    datamodule.prepare_data()
    datamodule.setup()
    return datamodule


def test_fashion_mnist_splits(fashion_mnist):
    assert len(fashion_mnist.train_dataset) + len(fashion_mnist.val_dataset) == 60000
    assert len(fashion_mnist.val_dataset) == 5000
    assert len(fashion_mnist.test_dataset) == 10000
    sizes = (fashion_mnist.num_classes, fashion_mnist.in_channels, fashion_mnist.image_size)
    assert sizes == (10, 1, 28)
    assert fashion_mnist.class_names == torchvision.datasets.FashionMNIST.classes
    raw_dir = Path(fashion_mnist.source.root) / "FashionMNIST" / "raw"
    assert sorted(path.name for path in raw_dir.iterdir()) == sorted(corpora.MNIST_RAW_FILES)


def test_fashion_mnist_batches_are_normalised(fashion_mnist):
    batch_images, labels = fashion_mnist.transform_batch(next(iter(fashion_mnist.train_dataloader())), train=True)
    assert batch_images.shape == (512, 1, 28, 28)
    assert batch_images.mean().abs() < 0.1
    assert (batch_images.std() - 1).abs() < 0.1
    assert labels.min() >= 0 and labels.max() < 10
    test_images, _ = next(iter(fashion_mnist.test_dataloader()))
    assert test_images.shape == (512, 1, 28, 28)


def test_fashion_mnist_without_files_or_internet_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "no-debian-files")
    datamodule = ImageDataModule(
        source=ImageSource(dataset="fashion_mnist", root=str(tmp_path / "data"), download=False)
    )
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        datamodule.setup()


def test_mnist_without_files_says_to_download(tmp_path):
    datamodule = ImageDataModule(source=ImageSource(dataset="mnist", root=str(tmp_path), download=False))
    with pytest.raises(DataError, match=r"^data.source.dataset=mnist: .* set data.source.download=true"):
        datamodule.setup()


# ---------------------------------------------------------------- image folders


def test_image_folder_with_one_folder(tmp_path):
    write_image_folder(tmp_path, ["cat", "dog", "bird"], images_per_class=4)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    datamodule = ImageDataModule(
        source=ImageSource(dataset="image_folder", image_folder=str(tmp_path)),
        loader=LoaderConfig(batch_size=4),
        prepare=PrepareConfig(dir=str(tmp_path / ".prepared")),  # a hidden folder is no class folder
        image_size=16,
    )
    assert datamodule.class_names == ["bird", "cat", "dog"]
    assert (datamodule.num_classes, datamodule.in_channels, datamodule.image_size) == (3, 3, 16)
    datamodule.setup()
    sizes = [len(datamodule.train_dataset), len(datamodule.val_dataset), len(datamodule.test_dataset)]
    assert sizes == [8, 2, 2]
    for loader in (datamodule.train_dataloader(), datamodule.test_dataloader()):
        batch_images, labels = datamodule.transform_batch(next(iter(loader)), train=False)
        assert batch_images.shape[1:] == (3, 16, 16) and batch_images.dtype == torch.float32
        assert labels.min() >= 0 and labels.max() < 3


def test_image_folder_with_split_folders(tmp_path):
    write_image_folder(tmp_path / "train", ["cat", "dog", "bird"], images_per_class=3)
    write_image_folder(tmp_path / "val", ["dog"], images_per_class=2)  # a class missing from val is fine
    write_image_folder(tmp_path / "test", ["bird", "cat", "dog"], images_per_class=1)
    datamodule = ImageDataModule(
        source=ImageSource(dataset="image_folder", image_folder=str(tmp_path), val_fraction=0.5),
        prepare=PrepareConfig(dir=str(tmp_path / ".prepared")),
    )
    assert datamodule.image_size == 224
    datamodule.setup()
    # val/ and test/ are used as they are; nothing is carved from train/.
    sizes = [len(datamodule.train_dataset), len(datamodule.val_dataset), len(datamodule.test_dataset)]
    assert sizes == [9, 2, 3]
    val_images, val_labels = next(iter(datamodule.val_dataloader()))
    assert val_images.shape == (2, 3, 224, 224)
    assert val_labels.tolist() == [2, 2]  # "dog" keeps its training index


def test_image_folder_errors(tmp_path):
    missing = tmp_path / "no-such-folder"
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        ImageDataModule(source=ImageSource(dataset="image_folder", image_folder=str(missing)))
    with pytest.raises(ValueError, match="needs image_folder"):
        ImageDataModule(source=ImageSource(dataset="image_folder"))
    (tmp_path / "flat").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "flat" / "lonely.png")
    with pytest.raises(ValueError, match="no class subfolders"):
        ImageDataModule(source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "flat")))
    with pytest.raises(ValueError, match="only read with dataset='image_folder'"):
        ImageDataModule(source=ImageSource(dataset="digits", image_folder=str(tmp_path)))

    write_image_folder(tmp_path / "bad_val" / "train", ["cat", "dog"], images_per_class=1)
    write_image_folder(tmp_path / "bad_val" / "val", ["cow"], images_per_class=1)
    with pytest.raises(ValueError, match=r"\['cow'\]"):
        ImageDataModule(source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "bad_val")))

    write_image_folder(tmp_path / "small", ["cat", "dog"], images_per_class=5)
    too_big = ImageDataModule(
        source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "small"), val_size=50),
        prepare=PrepareConfig(dir=str(tmp_path / "prepared")),
    )
    with pytest.raises(ValueError, match=r"val_size=50 .* has 8 images"):
        too_big.setup()


def test_an_image_folder_is_prepared_once_into_records_of_its_files(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "images", ["cat", "dog"], images_per_class=3)
    options = dict(
        source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "images")),
        augment=AugmentConfig(policy="none"),
        prepare=PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=2),
        image_size=12,
    )
    first = ImageDataModule(**options)
    first.prepare_data()
    first.setup()
    carve = json.loads((first.prepared / images.CARVE).read_text())  # each split's files, in record order
    assert sorted(sum(carve.values(), [])) == sorted(str(path) for path in (tmp_path / "images").rglob("*.png"))
    for split, files in carve.items():
        dataset = getattr(first, f"{split}_dataset")
        assert len(dataset) == len(files) > 0
        for index, path in enumerate(files):  # streamed back: the file's pixels, decoded and resized as the loader does
            image, label = dataset[index]
            assert torch.equal(image, v2.functional.pil_to_tensor(load_image(path, 3, 12)))
            assert label == first.class_names.index(Path(path).parent.name)

    def no_preparing(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(images, "write_records", no_preparing)
    second = ImageDataModule(**options)  # another process of the job, or a later run: reads what is there
    second.setup()
    assert second.prepared == first.prepared and len(second.train_dataset) == len(first.train_dataset)


# ---------------------------------------------------------------- argument errors and load_image


def test_a_val_size_larger_than_the_pool_names_the_pool_size():
    with pytest.raises(ValueError, match=r"data.source.val_size=5000 .* has 1527 images"):
        ImageDataModule(source=ImageSource(dataset="digits", val_size=5000))


@pytest.mark.parametrize(
    ("group", "options", "message"),
    [
        (ImageSource, dict(dataset="imagenet"), r"data.source.dataset='imagenet' is unknown; valid: .*'digits'"),
        (ImageSource, dict(val_size=-1), r"data.source.val_size=-1 must be at least 0"),
        (ImageSource, dict(val_fraction=1.5), r"data.source.val_fraction=1.5 must be in \[0, 1\)"),
        (ImageSource, dict(val_size=100, val_fraction=0.5), r"give val_size \(a count, here 100\) or val_fraction"),
        (ImageSource, dict(dataset="digits", image_folder="x"), "only read with dataset='image_folder'"),
        (ImageSource, dict(val_size=60000), r"data.source.val_size=60000 .* has 60000 images"),
        (AugmentConfig, dict(policy="mixup"), r"data.augment.policy='mixup' is unknown; valid: .*'flip_crop'"),
        (AugmentConfig, dict(random_erasing=1.5), r"data.augment.random_erasing=1.5 is a probability, in \[0, 1\]"),
        (LoaderConfig, dict(batch_size=0), "data.loader.batch_size=0 must be at least 1"),
        (LoaderConfig, dict(num_workers=-1), "data.loader.num_workers=-1 must be at least 0"),
    ],
)
def test_each_group_refuses_its_bad_values_naming_the_field(group, options, message):
    with pytest.raises(ValueError, match=message):
        group(**options)


def test_load_image_converts_modes_and_resizes(tmp_path):
    path = tmp_path / "rgba.png"
    Image.new("RGBA", (30, 20), (10, 20, 30, 128)).save(path)
    assert load_image(path, in_channels=3).mode == "RGB"
    grey = load_image(path, in_channels=1, image_size=12)
    assert grey.mode == "L" and grey.size == (12, 12)
    write_image_folder(tmp_path / "folder", ["cat", "dog"], images_per_class=1)
    datamodule = ImageDataModule(
        source=ImageSource(dataset="image_folder", image_folder=str(tmp_path / "folder")), image_size=12
    )
    tensor = datamodule.eval_transform()(load_image(path, datamodule.in_channels, datamodule.image_size))
    assert tensor.shape == (3, 12, 12)


def test_load_image_errors_name_the_file(tmp_path):
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("not pixels")
    with pytest.raises(ValueError, match="notes.png"):
        load_image(not_an_image, in_channels=3)
    with pytest.raises(FileNotFoundError, match="missing.png"):
        load_image(tmp_path / "missing.png", in_channels=1)
    with pytest.raises(ValueError, match="in_channels=2"):
        load_image(not_an_image, in_channels=2)


def test_cli_parses_the_constructor_arguments():
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_class_arguments(ImageDataModule, "data")
    args = ["--data.source.dataset=digits", "--data.source.val_fraction=0.2", "--data.augment.policy=none"]
    config = parser.parse_args(args)
    assert config.data.source.val_fraction == 0.2 and isinstance(config.data.source.val_fraction, float)
    parsed = parser.parse_args(["--data.source.val_size=200"]).data.source.val_size
    assert parsed == 200 and isinstance(parsed, int)  # a count: never a fraction, whatever the parser's version
    for not_a_count in ("0.2", "200.0"):
        with pytest.raises(SystemExit):
            parser.parse_args([f"--data.source.val_size={not_a_count}"])  # a fraction is val_fraction's
    with pytest.raises(SystemExit):
        parser.parse_args(["--data.source.dataset=imagenet"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--data.batch_size=8"])  # the options before the groups: jsonargparse's own error
