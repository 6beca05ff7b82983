"""Records prepared by ``data.prepare.write_records`` and read by index by ``data.streaming.Records``: the layer that
translation pairs and labelled passages are prepared into."""

from __future__ import annotations

import json
import os
import pickle
import tempfile

import numpy as np
import pytest
from torch.utils.data import DataLoader

from lightformer.data.loading.streaming import Records
from lightformer.data.preparation import prepare
from lightformer.data.preparation.prepare import PrepareConfig, prepared_folder, write_records, write_shards


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
