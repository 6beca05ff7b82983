"""Records prepared by ``data.prepare.write_records`` and read by index by ``data.streaming.Records``: the layer that
translation pairs and labelled passages are prepared into; and ``records.prepare_records``, the one pipeline that the
classification, translation and image-text data modules prepare their records through."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import pipeline_reference
from lightformer.data.loading.streaming import Records
from lightformer.data.modules import classification, image_text, image_text_files, translation
from lightformer.data.preparation import prepare
from lightformer.data.preparation.caching import content_hash
from lightformer.data.preparation.prepare import PrepareConfig, prepared_folder, write_records, write_shards
from lightformer.data.preparation.records import summed
from lightformer.data.raw.corpora import DING_FILE, CorpusUnavailableError, austen_text
from lightformer.data.raw.rendering import discover_fonts


def records_of(piece: tuple[int, int]):
    first, count = piece
    for i in range(first, first + count):
        yield {"src": np.arange(i % 7 + 1, dtype=np.uint16), "tgt": np.full(i % 5 + 2, i, np.int32), "text": f"#{i}"}


def test_records_keep_the_inputs_order_and_their_lengths_across_workers(tmp_path):
    pieces = [(i * 300, 300 - i) for i in range(9)]  # uneven pieces, split over 2 writing processes
    count = write_records(tmp_path / "train", records_of, pieces, workers=2, length_fields=("src", "tgt"))
    expected = [record for piece in pieces for record in records_of(piece)]
    assert count == len(expected)
    records = Records(str(tmp_path / "train"))
    assert len(records) == count
    assert records.lengths.tolist() == [[len(r["src"]), len(r["tgt"])] for r in expected]
    for index in (0, 1, 299, 300, 1500, count - 1):
        assert records[index]["text"] == expected[index]["text"]
        np.testing.assert_array_equal(records[index]["tgt"], expected[index]["tgt"])
    with pytest.raises(IndexError, match="out of range"):
        records[count]


def test_a_batch_of_records_comes_in_the_order_asked_and_a_worker_gets_only_the_path(tmp_path):
    write_records(tmp_path / "val", records_of, [(0, 50), (50, 50)], workers=1, length_fields=("src",))
    records = Records(str(tmp_path / "val"))
    batch = records.__getitems__([42, 3, 97, 3])
    assert [record["text"] for record in batch] == ["#42", "#3", "#97", "#3"]
    assert len(pickle.dumps(records)) < 500  # the path, not the lengths or an open dataset
    loader = DataLoader(records, batch_size=8, num_workers=1, collate_fn=lambda items: [r["text"] for r in items])
    assert [text for batch in loader for text in batch] == [f"#{i}" for i in range(100)]


def image_records(piece: tuple[int, int]):
    for i in range(*piece):
        yield {"image": bytes((i * 7 + k) % 256 for k in range(i % 13 + 40)), "text": f"#{i}"}  # a file's bytes


def test_bytes_fields_are_written_as_litdata_file_leaves_and_read_back_as_the_same_bytes(tmp_path):
    """LitData stores plain ``bytes`` fields in an Arrow footer, which a random read decodes 256 rows at a time;
    as ``litdata.File`` leaves each record is read alone (benchmarks/record_reads.py: 18x faster)."""
    write_records(tmp_path / "train", image_records, [(0, 300), (300, 600)], workers=1, length_fields=("image",))
    index = json.loads((tmp_path / "train" / "index.json").read_text())
    assert index["config"]["data_format"][0].split(":")[0] == "file"
    records = Records(str(tmp_path / "train"))
    expected = [record for piece in [(0, 300), (300, 600)] for record in image_records(piece)]
    assert records.lengths[:, 0].tolist() == [len(r["image"]) for r in expected]
    for i in (0, 257, 599, 3):
        assert records[i] == expected[i] and isinstance(records[i]["image"], bytes)


def test_a_prepared_folder_is_built_once_and_a_half_written_one_again(tmp_path):
    built = []

    def build(folder):
        built.append(folder)
        (folder / "data").write_text("x")
        return {"count": len(built)}

    prepare = PrepareConfig(dir=str(tmp_path))
    folder = prepared_folder(prepare, "name", {"source": 1}, build)
    assert prepared_folder(prepare, "name", {"source": 1}, build) == folder and len(built) == 1
    assert folder.name.startswith("name-") and (folder / "prepared.json").is_file()
    (folder / "prepared.json").unlink()  # as a preparation killed before its last write leaves it
    (folder / "leftover").write_text("from the killed run")
    assert prepared_folder(prepare, "name", {"source": 1}, build) == folder and len(built) == 2
    assert not (folder / "leftover").exists()
    assert prepared_folder(prepare, "name", {"source": 2}, build) != folder  # another fingerprint, another folder


def test_an_interrupted_preparation_leaves_no_error_folder_beside_the_users(tmp_path, monkeypatch):
    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "optimize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_shards(tmp_path / "shards", lambda item: iter([item]), inputs=[1, 2], workers=1)
    assert not list(tmp_path.iterdir())


def test_preparing_leaves_the_temporary_directorys_data_and_chunks_folders_alone(tmp_path, monkeypatch):
    """LitData's ``optimize`` empties its cache folders as it starts, by default ``$TMPDIR/data`` and
    ``$TMPDIR/chunks``: a corpus kept in /tmp/data, or the data folder of a run started in /tmp, would go.
    Preparation gives it folders of its own, removed after; the environment is left as it was."""
    temporary = tmp_path / "tmp"
    for folder in ("data", "chunks"):
        (temporary / folder).mkdir(parents=True)
        (temporary / folder / "corpus.txt").write_text("the user's")
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    ours = ("TOKENIZERS_PARALLELISM", "DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER")
    before = [os.environ.get(key) for key in ours]
    count = write_records(tmp_path / "train", records_of, [(0, 50), (50, 50)], workers=2, length_fields=("src",))
    assert count == 100 and len(Records(str(tmp_path / "train"))) == 100
    for folder in ("data", "chunks"):
        assert (temporary / folder / "corpus.txt").read_text() == "the user's"
    assert sorted(path.name for path in temporary.iterdir()) == ["chunks", "data"]  # its own folders are gone
    assert [os.environ.get(key) for key in ours] == before


# --- the one pipeline the record-preparing data modules go through ----------------------------------------------

# What b1bd12e's code prepared (each data module with its own ``_build``) from the tiny sources of
# ``pipeline_reference``: the folder's name (its fingerprint), the manifest, the tokenizers and every record split,
# hashed (``pipeline_reference.digest``). The same digests now say that ``prepare_records`` prepares the same folders,
# so that the folders users prepared stay valid.
PINNED = {
    "classification": {
        "folder": "classify-labelled-54c1fe02a10612d2",
        "manifest": "e66b2ca9db0f63e2a44420f2c9bdfd10814dc05c10412fdde4dba7e76ecb2f6a",
        "tokenizer.json": "6e80771d7d1922b2f92e5bb70d281c49697fd0391d2120305cae866c451d1698",
        "test": "32f5ac1d1b54b2615ec6472c8f5afa56cf3244c8ab91b4582d97e328ca8b05fb",
        "train": "4862d8f36e92b96e05e67d3d4a2ecf61bc9f99d443ce3d95e8a1d9145220e882",
        "val": "d19a02655a2df5edbde2904bcf600dfab2a0969feb5d69bc69a8c1b28ed15342",
    },
    "translation": {
        "folder": "translation-pairs-97182b23db6b2df4",
        "manifest": "637673549120c518ae584acbe6b9b81f199c2d70c5c9e715848446cd4d60a7ab",
        "tokenizer-first.json": "ad3a451dcc7dac9a7d27f92dbe963c0a2dc8d9389bc8429738d8250ea61e1161",
        "tokenizer-second.json": "059d4f66d83b3050e7df5f9782c2028b8daf4628b07560ffe223a4254823ce11",
        "test": "a62fa5ca00e901dbb57b9b96e0dc1334e87b80ea681ac895b424fc44629fa135",
        "train": "fef87e946df27fb2d0ad2f9b5f0806a90a08d293b6dcd1fa0e96b3e76d0b5472",
        "train-dropout-0": "e18f1396b4c67071dbda908e7826da4eea9f370461361ad51a31fc12f7d139e0",
        "train-dropout-1": "cc0f257f7831b6dfede2fab63c2d662a19ac93c7f20736e5cec5b23b5ecb117a",
        "val": "e0b95f75269440e4bc02026c11e4db15d595610b44f27d57beb0bd89aa2a7a29",
    },
    "image_text": {
        "folder": "image-text-austen-26d4319ed08e1b50",
        "manifest": "0401cc9871f6d2fb4db3cae8f6e16b9c22b20977e2fdbdd5fdd4bd933d648cad",
        "test": "88edc009f091a76829cd659d5afbec969a991566fa1f7dde93dbe4efa4126614",
        "test_seen": "b079ea84b1966db8b2604c610c17903bf8c11bf2b5d063fb88d6e533463b9e82",
        "train": "7f8d89d1f1aed3ecd32fafe7a2f99d5acbead4943c3be6669ac6d6433fb5a0a8",
        "val": "7b54450f2ef67cc875e752e082e939a192bdcc00a7259ef4dd0699cc2dd7642f",
    },
    "image_text_ding": {
        "folder": "image-text-ding-ff8ea1d2dccf9df5",
        "manifest": "9c53c78aeb80c6b6966a083640e42346f3322fc389e4ce303f4bb591a1e4268b",
        "tokenizer.json": "fb7e2a0834d114644ca31d3edcaadff63c05dc936be77e05c5d09d4d98aa2a65",
        "test": "38cf9bf977975670c97dfbb6eab0ff5499138073e3e9fd221169b7b3e92618dc",
        "test_seen": "6766237ca146a76c8f379ee9909669f7427d07fdddf47cc90817352021108498",
        "train": "b1637a1751ff8ebb21c1b94cbae42f180e663a293e5261dc8911b04c5a3dc51a",
        "val": "b55faf8632eb72116c0c9654e8e6203a36299e5ca652048a69d508336f5b108d",
    },
    "image_text_files": {
        "folder": "image-text-captions-b623a95c2b20d2ad",
        "manifest": "ee8cd04e708d79c1071428d98e9edc576a82129a40bb03537cf36a093c1a683b",
        "tokenizer.json": "fa13e334dfe4d83dd972cd382dadc7c5ccc5ff969a9a69be8bd9483fbaeb1d65",
        "train": "83386dbd6a106fac2018490e81e15facbcdacc017756ade887f73a0be4ca3f87",
        "val": "e7fc4039568c5605545b409f87ea4db17127ec5b456df1d3b7d7b60737d4e93d",
    },
}
# The installed fonts (paths and sizes) the rendered lines were pinned with: other fonts render other images.
PINNED_FONTS = "4778255417b5909f"


DATA_ROOT = str(Path(__file__).resolve().parents[1] / "data")


def installed_fonts() -> str:
    fonts = discover_fonts()
    return content_hash({family: [[p, os.path.getsize(p)] for p in paths] for family, paths in fonts.items()})


@pytest.mark.parametrize("name", list(PINNED))
def test_each_record_module_prepares_through_the_one_pipeline_what_it_prepared_before(name, tmp_path, monkeypatch):
    if name in ("image_text", "image_text_ding") and installed_fonts() != PINNED_FONTS:
        pytest.skip("the rendered lines were pinned with other fonts than those installed")
    if name == "image_text_ding" and not Path(DING_FILE).is_file():
        pytest.skip(f"the Ding dictionary {DING_FILE} is absent (apt-get install trans-de-en)")
    if name == "image_text":
        try:
            austen_text(Path(DATA_ROOT) / "austen")
        except CorpusUnavailableError as error:
            pytest.skip(f"could not fetch the Austen corpus: {error}")
    calls = []
    for module in (classification, translation, image_text, image_text_files):
        real = module.prepare_records
        monkeypatch.setattr(
            module, "prepare_records", lambda *args, real=real, **kw: calls.append(args) or real(*args, **kw)
        )
    assert pipeline_reference.prepared_digests(tmp_path, DATA_ROOT, [name]) == {name: PINNED[name]}
    assert len(calls) == 1  # one pipeline, once per preparation


def test_the_inputs_summaries_are_summed_key_by_key_and_maxima_kept():
    parts = [{"pairs": 2, "words": [3, 4], "counts": {"a": 1}, "longest": {"chars": 5}}, None,
             {"pairs": 1, "words": [1, 1], "counts": {"b": 2, "a": 1}, "longest": {"chars": 3}}]  # fmt: skip
    total = summed(parts, maxima=("longest",))
    assert total == {"pairs": 3, "words": [4, 5], "counts": {"a": 2, "b": 2}, "longest": {"chars": 5}}
    assert list(total["counts"]) == ["a", "b"] and summed([None]) == {}
