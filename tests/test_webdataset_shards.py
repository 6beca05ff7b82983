"""Webdataset ``.tar`` shards as img2dataset writes them, read by ImageTextFilesDataModule: a shard, a glob or a folder
of them, each shard one piece read as a stream, captions from ``.txt`` or ``.json``, validation carved by the hash of
the key, and each bad sample refused naming the shard and the key."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lightformer.data.families.image_text import ImageTextFilesDataModule
from lightformer.data.loading.streaming import LoaderConfig, Records
from lightformer.data.preparation.prepare import PrepareConfig
from lightformer.data.sources.captions import ImageTextFiles, carved, is_shards, shard_samples
from lightformer.errors import DataError

FORMATS = {".jpg": "JPEG", ".png": "PNG", ".webp": "WEBP"}


def image_bytes(index: int, suffix: str) -> bytes:
    image = Image.new("RGB", (30 + index % 7, 20), (20 * (index % 12), 100, 255 - 10 * (index % 20)))
    out = io.BytesIO()
    image.save(out, FORMATS[suffix])
    return out.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(folder: Path, shards: int = 2, per_shard: int = 12, members=None) -> list[Path]:
    """img2dataset's layout: ``00000.tar`` holding ``<key>.jpg|png|webp`` with ``<key>.txt`` and/or ``<key>.json``
    (and a ``.json`` of other fields), keys numbered across the shards."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = folder / f"{s:05d}.tar"
        with tarfile.open(path, "w") as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                key = f"{i:09d}"
                for name, data in (members or default_members)(i, key):
                    add(tar, name, data)
        paths.append(path)
    return paths


def caption(i: int) -> str:
    return f"a picture number {i}"


def default_members(i: int, key: str) -> list[tuple[str, bytes]]:
    suffix = list(FORMATS)[i % 3]
    members = [(key + suffix, image_bytes(i, suffix))]
    if i % 2:  # a caption in .txt, and img2dataset's .json of other fields
        members += [(key + ".txt", caption(i).encode()), (key + ".json", json.dumps({"url": "x", "key": key}).encode())]
    else:
        members.append((key + ".json", json.dumps({"caption": caption(i), "status": "success"}).encode()))
    return members


def module(train: str, tmp_path: Path, **options) -> ImageTextFilesDataModule:
    source = ImageTextFiles(train=train, height=16, width=16, channels=3, fit="resize", **options)
    return ImageTextFilesDataModule(source, loader=LoaderConfig(batch_size=4),
                                    prepare=PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=2))  # fmt: skip


def read_back(data: ImageTextFilesDataModule, split: str) -> dict[str, list[str]]:
    records = Records(str(data.prepared / split))
    return {records[i]["file"]: json.loads(records[i]["texts"]) for i in range(len(records))}


def test_shards_round_trip_with_validation_carved_by_the_key(tmp_path):
    write_shards(tmp_path / "shards")
    data = module(str(tmp_path / "shards"), tmp_path, val_fraction=0.25)
    data.prepare_data()
    train, val = read_back(data, "train"), read_back(data, "val")
    expected = {f"{i // 12:05d}.tar/{i:09d}": [caption(i)] for i in range(24)}
    assert train | val == expected and not train.keys() & val.keys()
    assert sorted(val) == sorted(k for k in expected if carved(k.split("/")[1], 0.25)) and val
    assert data.manifest["images"] == {"train": len(train), "val": len(val), "test": 0}
    data.setup()
    batch = next(iter(data.train_dataloader()))
    assert batch["images"].shape == (4, 3, 16, 16) and batch["references"] == [[t] for t in batch["text"]]
    for spelled in (str(tmp_path / "shards" / "*.tar"), str(tmp_path / "shards" / "0000[01].tar")):  # a glob
        again = module(spelled, tmp_path / spelled[-8:], val_fraction=0.25)
        assert read_back(again, "train") == train and read_back(again, "val") == val


def test_a_single_shard_and_shards_for_each_split(tmp_path):
    train, test = write_shards(tmp_path / "shards")
    data = module(str(train), tmp_path, val_fraction=0, test=str(test))
    data.prepare_data()
    assert sorted(read_back(data, "test")) == [f"00001.tar/{i:09d}" for i in range(12, 24)]
    assert data.manifest["images"] == {"train": 12, "val": 0, "test": 12}
    record = Records(str(data.prepared / "train"))[0]
    assert np.asarray(Image.open(io.BytesIO(record["image"]))).shape == (16, 16, 3)


def test_a_shard_is_read_as_a_stream_one_sample_at_a_time(tmp_path):
    """The first samples come out before a bad one further on is read: nothing of the shard is gathered first."""

    def members(i: int, key: str):
        return default_members(i, key) if i < 3 else [(key + ".jpg", image_bytes(i, ".jpg"))]

    (path,) = write_shards(tmp_path, shards=1, per_shard=5, members=members)
    samples = shard_samples(path, "train")
    assert [next(samples)[0] for _ in range(3)] == ["000000000", "000000001", "000000002"]
    with pytest.raises(DataError, match="key '000000003': the image has no caption"):
        next(samples)


@pytest.mark.parametrize(
    "members, match",
    [
        (lambda i, key: [(key + ".png", image_bytes(i, ".png"))] if i == 5 else default_members(i, key),
         r"00000.tar, key '000000005': the image has no caption"),
        (lambda i, key: [(key + ".txt", b"lonely")] if i == 7 else default_members(i, key),
         r"00000.tar, key '000000007': the caption has no image"),
        (lambda i, key: [(key + ".jpg", b"not an image"), (key + ".txt", b"x")] if i == 4 else default_members(i, key),
         r"00000.tar, key '000000004': the image is not readable"),
        (lambda i, key: [(key + ".jpg", image_bytes(i, ".jpg")), (key + ".json", b"{not json")],
         r"00000.tar, key '000000000': the caption member.json is not readable"),
    ],
)  # fmt: skip
def test_each_bad_sample_is_refused_naming_the_shard_and_the_key(members, match, tmp_path):
    write_shards(tmp_path / "shards", shards=1, members=members)
    with pytest.raises(DataError, match=f"data.source.train: .*{match}"):
        module(str(tmp_path / "shards"), tmp_path, val_fraction=0).prepare_data()


def test_a_path_names_shards_by_its_tar_suffix_a_glob_or_a_folder_never_an_annotation_file(tmp_path):
    assert is_shards("data/00000.tar") and is_shards("data/*.tar") and is_shards("data/shards")
    assert is_shards(str(tmp_path))  # an existing folder, whatever its name
    assert not is_shards("data/captions[1].jsonl") and not is_shards("data/*.csv")


def test_no_shard_or_no_tar_is_refused_naming_the_option(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="data.source.train=.*names no webdataset shard"):
        module(str(tmp_path / "empty"), tmp_path).prepare_data()
    (tmp_path / "bad.tar").write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(DataError, match="bad.tar is not a readable tar file"):
        module(str(tmp_path / "bad.tar"), tmp_path).prepare_data()
    with pytest.raises(ValueError, match="data.source.train='train.parquet' is not an annotation file"):
        ImageTextFiles(train="train.parquet")


@pytest.mark.parametrize("layout", ["shards", "llava"])
def test_the_preparation_benchmark_builds_prepares_and_measures_on_a_tiny_budget(tmp_path, layout):
    """benchmarks/image_text_preparation.py end to end, both layouts: the drawings repeated into shards or LLaVA
    records, prepared in a fresh process, its peaks printed (no figure asserted)."""
    import subprocess
    import sys

    if not Path("/usr/share/openclipart/png").is_dir():
        pytest.skip("apt-get install openclipart-png openclipart-svg")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "image_text_preparation.py"
    options = ["--layout", layout, "--pairs", "30", "--drawings", "4", "--size", "16", "--workers", "1",
               "--val-fraction", "0.3"]  # fmt: skip
    out = subprocess.run([sys.executable, str(script), *options, "--work", str(tmp_path)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    row = json.loads(out.stdout.splitlines()[0])
    assert row["pairs"] == 30 and sum(row["images"].values()) == 30
    assert row["parent_peak_gb"] > 0 and row["sum_peak_gb"] >= row["largest_worker_peak_gb"] > 0
    if layout == "shards":
        with tarfile.open(tmp_path / "shards-30" / "00000.tar") as tar:
            assert len(tar.getnames()) == 60  # an image and a caption each
    else:
        records = [json.loads(line) for line in (tmp_path / "llava-30" / "train.jsonl").read_text().splitlines()]
        assert len(records) == 30 and len(list((tmp_path / "llava-30" / "images").glob("*.jpg"))) == 4
        assert [turn["from"] for turn in records[5]["conversations"]] == ["human", "gpt", "human", "gpt"]
        assert records[5]["conversations"][3]["value"] == "1"  # the second copy of drawing 1
