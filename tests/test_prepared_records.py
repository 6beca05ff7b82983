"""Records prepared by ``data.prepare.write_records`` and read by index by ``data.streaming.Records``: the layer that
translation pairs and labelled passages are prepared into; and ``records.prepare_records``, the one pipeline that the
classification, translation and image-text data modules prepare their records through; and the pins of what every
data module prepares (``pipeline_reference``), byte for byte."""

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
from lightformer.data.preparation import prepare
from lightformer.data.preparation.caching import content_hash
from lightformer.data.preparation.prepare import PrepareConfig, prepared_folder, write_records, write_shards
from lightformer.data.preparation.records import summed
from lightformer.data.sources.corpora import DING_FILE, CorpusUnavailableError, austen_text
from lightformer.data.sources.rendering import missing_typefaces, typefaces


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


# --- what every data module prepares, and the one pipeline the record-preparing ones go through ------------

# What the code of 42e7f06 prepared (before the data layer was reorganised into families and sources; the first five
# as b1bd12e's, each data module with its own ``_build``, did) from the tiny sources of ``pipeline_reference``: the
# folder's name (its fingerprint), the manifest, the files beside it and every split, hashed
# (``pipeline_reference.digest``); "palette": the Image GPT palette fitted on the prepared images. The same digests now
# say that the code prepares the same folders, byte for byte, so that the folders users prepared stay valid.
PINNED = {
    "classification": {
        "folder": "classify-labelled-54c1fe02a10612d2",
        "manifest": "bc4f95239c8cefc3bc0979a17c41562499a901686de47ffbafb5e4548379d6e0",
        "test": "32f5ac1d1b54b2615ec6472c8f5afa56cf3244c8ab91b4582d97e328ca8b05fb",
        "tokenizer.json": "6e80771d7d1922b2f92e5bb70d281c49697fd0391d2120305cae866c451d1698",
        "train": "4862d8f36e92b96e05e67d3d4a2ecf61bc9f99d443ce3d95e8a1d9145220e882",
        "val": "d19a02655a2df5edbde2904bcf600dfab2a0969feb5d69bc69a8c1b28ed15342",
    },
    "translation": {
        "folder": "translation-pairs-97182b23db6b2df4",
        "manifest": "3de90d95e164b76e5f22dd05276157707b0b392bd6a8e343061adadb9b6278dc",
        "test": "a62fa5ca00e901dbb57b9b96e0dc1334e87b80ea681ac895b424fc44629fa135",
        "tokenizer-first.json": "ad3a451dcc7dac9a7d27f92dbe963c0a2dc8d9389bc8429738d8250ea61e1161",
        "tokenizer-second.json": "059d4f66d83b3050e7df5f9782c2028b8daf4628b07560ffe223a4254823ce11",
        "train": "fef87e946df27fb2d0ad2f9b5f0806a90a08d293b6dcd1fa0e96b3e76d0b5472",
        "train-dropout-0": "e18f1396b4c67071dbda908e7826da4eea9f370461361ad51a31fc12f7d139e0",
        "train-dropout-1": "cc0f257f7831b6dfede2fab63c2d662a19ac93c7f20736e5cec5b23b5ecb117a",
        "val": "e0b95f75269440e4bc02026c11e4db15d595610b44f27d57beb0bd89aa2a7a29",
    },
    "image_text": {
        "folder": "image-text-austen-26d4319ed08e1b50",
        "manifest": "7819862eca3001042a31239601e594c867f0fa9a2762f810acc38a1b9ebdf946",
        "test": "88edc009f091a76829cd659d5afbec969a991566fa1f7dde93dbe4efa4126614",
        "test_seen": "b079ea84b1966db8b2604c610c17903bf8c11bf2b5d063fb88d6e533463b9e82",
        "train": "7f8d89d1f1aed3ecd32fafe7a2f99d5acbead4943c3be6669ac6d6433fb5a0a8",
        "val": "7b54450f2ef67cc875e752e082e939a192bdcc00a7259ef4dd0699cc2dd7642f",
    },
    "image_text_ding": {
        "folder": "image-text-ding-ff8ea1d2dccf9df5",
        "manifest": "ceab03d249a97aa74ffefc45f3b4aa9a86d049922241ddbec5401e942b1005c8",
        "test": "38cf9bf977975670c97dfbb6eab0ff5499138073e3e9fd221169b7b3e92618dc",
        "test_seen": "6766237ca146a76c8f379ee9909669f7427d07fdddf47cc90817352021108498",
        "tokenizer.json": "fb7e2a0834d114644ca31d3edcaadff63c05dc936be77e05c5d09d4d98aa2a65",
        "train": "b1637a1751ff8ebb21c1b94cbae42f180e663a293e5261dc8911b04c5a3dc51a",
        "val": "b55faf8632eb72116c0c9654e8e6203a36299e5ca652048a69d508336f5b108d",
    },
    "image_text_files": {
        "folder": "image-text-captions-b623a95c2b20d2ad",
        "manifest": "69c8b733d2d32457e511d8313ad5b37d3eacba9287fd7f2bfb62b623c3e2d3c7",
        "tokenizer.json": "fa13e334dfe4d83dd972cd382dadc7c5ccc5ff969a9a69be8bd9483fbaeb1d65",
        "train": "83386dbd6a106fac2018490e81e15facbcdacc017756ade887f73a0be4ca3f87",
        "val": "e7fc4039568c5605545b409f87ea4db17127ec5b456df1d3b7d7b60737d4e93d",
    },
    "text_char": {
        "folder": "corpus-da11053de7e167aa",
        "manifest": "89b903b9ddd4f770196c09c5b07201d8e58dda470250bf69a95c5f2399028fd5",
        "test": "1dcf4ad0b665649e1a94b62cc01e50e5498e8d6378434d54512a1ffe2bdf41e1",
        "tokenizer.json": "eb606ee01736de7f2cf01061a1ef273160bae8128fb1c6dc6a8eddf889aa94cf",
        "train": "811d1a63a04ce0d7b7d04c9f1ab9dd0bda7b98b20d9cfe66b2e1d49d52f8d515",
        "val": "cd449f05469b7a009817e1b351e27e678bcd5af616073025112760d85610581a",
    },
    "text_bpe": {
        "folder": "docs-23f92d1550a698f8",
        "manifest": "79314a0d5e1b21b5649882f9d3ca881dd74c5a415e3704faa403f96df9bd1220",
        "tokenizer.json": "755addceef087c7b37867c749c752ca305ee167a4c2a0bd6ac7aa6c187c3d2e0",
        "train": "0688358bf8f67a18a2e41cb26ea895f5b4993b5c2208f31562c4f2ef98718393",
        "val": "248365eaad8c3ba421a405f89561f6b29894c92764822e25220ae1e570c4b1f2",
    },
    "masked_lm": {
        "folder": "corpus-997f40dbbacd896c",
        "manifest": "bfa8daa21f7d4fc50ce5cdd1509b6ac4486345f473df7cf623ffacf9cfabf365",
        "test": "812ebee4ef5f674164788e9f5d8230590405fa6877b8845b4a4224d2087a595c",
        "tokenizer.json": "e80858d0e2bdc0dc7d0053285abe23f5adb8992711352b73a2815478f991db0a",
        "train": "15837e9f8ea156c50ec5b1ca43dbabb97302e53d0c1b8e0695ce94f64d16b8a5",
        "val": "0f58768cc32a3ebcec2b6ff20d34f067adf04368ad63b5ae5bec1cd755282161",
    },
    "span_corruption": {
        "folder": "corpus-33a68598978bccd5",
        "manifest": "617433c9b87c4b36d3d036af397694c3e6b1284a43796221cf7dba0917383026",
        "test": "cc8150a4b9833e31609675476dfe7b223d5f62bcbfd93df4faed95be51b715cb",
        "tokenizer.json": "f5b739343db4e94a49453a8e5ef9d266ad4bf2de4e66c00df3dcddce1358d9b3",
        "train": "70c28139990a5cfff28d9a3907fa9b59b75a0baa36b3da4bfdd8697231552d84",
        "val": "2e55ad0e54292fca8190247fbe463c017438dc20c39399b7ac40f4da90ec607d",
    },
    "image_folder": {
        "folder": "images-1e2c0c4bab2b7fd3",
        "manifest": "8efd461ae81b9d095ab1689ec153c677af52289dd22ffa1705cf71d2ea08b951",
        "carve.json": "5abec6e4ce9ad838f781a7befa6c39285ca084eb522a3e3477d12ca4a867c01c",
        "test": "6ee8b33ed65d42ddb6fe108c7df192ce38845c4d857ee8b855912e42f659be85",
        "train": "d717878515a171b3e043f29c0c94043371e1eb0380658dfd488ad16f43a7b334",
        "val": "59176ff7adffe80089d16db610e8945ee28020fcd49b71332d80cc49af239926",
    },
    "conversations": {
        "folder": "conversations-422740fefc60ed86",
        "manifest": "c612ad467d817ebe4bb9dcf0dc2788a9f5a0e149725406f2a7fcf3d36f721bb9",
        "test": "5e81afee307e5fb26367a84c721f48ce77870345dc7ce0bb441eab730be40a82",
        "tokenizer.json": "b16959933ae0454cd0dbd022ec30cd60f35a49bdd4ef17887116fc4fc64858db",
        "train": "5ea173fb56c8c8d8ecf2eddea5888743a471ec356c7d5af49f2437f05f7e539f",
        "val": "b361b6a5d5a17d74a85d40629427acfe0c677409aebae4474b4a39d42810de33",
    },
    "clipart": {
        "folder": "clipart-56747d0fa926312e",
        "manifest": "e9ea0aa1186b4f78d7452c1afa122b739212019d10fcf40c532291a9767a4614",
        "test": "e5b90d2969f5a91f36179947dfbdbc600f3bf5568962aa556bb3a18e2e509bb5",
        "tokenizer.json": "6d551283486b07fe5f96f8e8c844e3096caaacedd9d97c6127b94985ff5f6266",
        "train": "e89e1b04103cdf1c49caa1628ebafe11a4bc80ee992a42886e2f1644154c4ef5",
        "val": "4187d4863f6d5f0f4cd40293d63e9a3a5f96dfebcfb571a3f349b09654de7a44",
    },
    "emoji": {
        "folder": "emoji-symbola-7ae2e320899ba12a",
        "manifest": "8100acafbb8ecc121c61d9c23074f5c6a3c1e25df213541c76ed627cbdcabdd2",
        "test": "223a85f3fe05ad672c5b5adfc2b6e7b6ef14e58489db6756a54b2ebded9c2928",
        "tokenizer.json": "108089d7241b4e7a13d51af67f3b9c99636943b99e8960632bd7bfa0e0f7eb94",
        "train": "18b25ffdece2320afe79ecea18265133e3d9673f352f07268b6ac2f34b5aa83d",
        "val": "c5efbf6e1426a67e2f36b39548b2712c74b61b6a6b8f2142642577afc83fcf5e",
    },
    "visual_qa": {
        "folder": "visual-qa-70d7777dc9806e84",
        "manifest": "24d0bc161fa68d12c9d647e7ad44fa511df56e20652c637cf5affd7c08fe2ea6",
        "test": "4c72812c561182cefe1325ae8f81a7ac9ca2fcdef632cd55f206652983107db7",
        "train": "cdc2e2ffa2d6e5175f67df5f229be019690679fa54c3a302dec6a67cf88dc4ab",
        "val": "2a0cd95f5344d28c01286fe273d0b5a0582f0431659d9b7981beffb12d201a5d",
    },
    "visual_qa_lines": {
        "folder": "visual-qa-d4edfaa38d6edec6",
        "manifest": "b0776a9ba1399f2a09adadf39d88701691a6d185aa0a6e4fe82b467ba254d474",
        "test": "b84d79c1ce46ea9c8d46cd4d64cf2e14bbd9a0e96d408c43c4bfae4da3b475e2",
        "train": "7c1dabeb5982a7542c9170ee0550f8a063c7ee983e2ca53876853a6e6a829b3a",
        "val": "de4eb6cff664162a4c2cb965759f5e75bb7833f4cc0356a849fa089511aef16c",
    },
}
# Image GPT's data prepares the very folder of the image classifier's, and fits its palette on it.
PINNED["image_tokens"] = {
    **PINNED["image_folder"],
    "palette": "9309475ac015cf7c4798be7eefcc4ce78147bd17be8c6cc946106abdc934f343",
}
# The installed fonts (paths and sizes) the rendered lines were pinned with: other fonts render other images.
PINNED_FONTS = "4778255417b5909f"
# The sizes of the installed emoji fonts (Debian 12's fonts-noto-color-emoji 2.042, fonts-symbola 2.60) whose
# subsets the emoji were drawn from.
PINNED_EMOJI_FONTS = {"noto": 10980856, "symbola": 3165808}
# The one pipeline that record preparations go through, by its function's name (patched wherever it is imported),
# and the preparations that did not go through it at 42e7f06 (token shards; the image folder's records).
PIPELINE = "prepare_records"
OWN_PATHS = {"text_char", "text_bpe", "masked_lm", "span_corruption", "image_folder", "image_tokens"}
RENDERED = {"image_text", "image_text_ding", "visual_qa_lines"}  # lines drawn in the installed fonts
AUSTEN = {"image_text", "visual_qa_lines"}


DATA_ROOT = str(Path(__file__).resolve().parents[1] / "data")


def installed_fonts() -> str:
    if missing_typefaces():
        return ""
    fonts = typefaces()  # the declared ones: whatever else is installed, the same as when the lines were pinned
    return content_hash({family: [[p, os.path.getsize(p)] for p in paths] for family, paths in fonts.items()})


def skip_without_sources(name: str) -> None:
    """Skip a pin whose sources here are not those it was pinned with (fonts, the Ding, Austen's novels)."""
    if name in RENDERED and installed_fonts() != PINNED_FONTS:
        pytest.skip("the rendered lines were pinned with other fonts than those installed")
    if name == "image_text_ding" and not Path(DING_FILE).is_file():
        pytest.skip(f"the Ding dictionary {DING_FILE} is absent (apt-get install trans-de-en)")
    if name in AUSTEN:
        try:
            austen_text(Path(DATA_ROOT) / "austen")
        except CorpusUnavailableError as error:
            pytest.skip(f"could not fetch the Austen corpus: {error}")
    if name == "emoji":
        pytest.importorskip("fontTools", reason="the emoji fonts are subset with fontTools")
        if pipeline_reference.emoji_font_sizes() != PINNED_EMOJI_FONTS:
            pytest.skip("the emoji were pinned with other emoji fonts than those installed (or they are absent: "
                        "apt-get install fonts-noto-color-emoji fonts-symbola)")  # fmt: skip


@pytest.mark.parametrize("name", list(PINNED))
def test_each_data_module_prepares_what_it_prepared_before(name, tmp_path):
    skip_without_sources(name)
    calls = []

    def counted(real):
        return lambda *args, **kw: calls.append(args) or real(*args, **kw)

    with pipeline_reference.patched_everywhere(PIPELINE, counted) as patched:
        assert patched, f"no module of lightformer's holds {PIPELINE}: rename PIPELINE after the function"
        assert pipeline_reference.prepared_digests(tmp_path, DATA_ROOT, [name]) == {name: PINNED[name]}
    assert len(calls) <= 1 if name in OWN_PATHS else len(calls) == 1  # one pipeline, once per preparation


def test_the_inputs_summaries_are_summed_key_by_key_and_maxima_kept():
    parts = [{"pairs": 2, "words": [3, 4], "counts": {"a": 1}, "longest": {"chars": 5}}, None,
             {"pairs": 1, "words": [1, 1], "counts": {"b": 2, "a": 1}, "longest": {"chars": 3}}]  # fmt: skip
    total = summed(parts, maxima=("longest",))
    assert total == {"pairs": 3, "words": [4, 5], "counts": {"a": 2, "b": 2}, "longest": {"chars": 5}}
    assert list(total["counts"]) == ["a", "b"] and summed([None]) == {}
