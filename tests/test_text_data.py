"""TextDataModule over the preparation pipeline (sources → tokenizer + shards → streamed windows), and the corpus
sources, on small corpora written to tmp_path."""

import hashlib
import http.server
import json
import shutil
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn
from litdata import StreamingDataset, TokensLoader

from lightformer.data import pieces as sources
from lightformer.data.families.text import TextDataModule
from lightformer.data.loading.streaming import EvaluationWindows, LoaderConfig
from lightformer.data.pieces import format_of, read_piece, split_pieces
from lightformer.data.preparation import prepare
from lightformer.data.preparation.prepare import PrepareConfig, PreparedText, TokenizerConfig, prepare_text
from lightformer.data.sources import corpora
from lightformer.data.sources.corpora import CorpusUnavailableError, austen_text, download, source_files
from lightformer.data.sources.text import TextSource
from lightformer.tokenization.text import EOS_ID, Tokenizer

WORDS = ["the", "of", "and", "to", "a", "in", "was", "her", "it", "that", "she", "be", "not", "had", "he"]


def make_text(num_lines: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) for _ in range(num_lines)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(make_text(200), encoding="utf-8")
    return path


def make_module(
    tmp_path: Path,
    tokenizer: dict | None = None,
    loader: dict | None = None,
    block_size: int = 8,
    seed: int = 1337,
    **source,
) -> TextDataModule:
    return TextDataModule(
        source=TextSource(**{"data_root": str(tmp_path / "data"), **source}),
        tokenizer=TokenizerConfig(**(tokenizer or {})),
        loader=LoaderConfig(**{"batch_size": 4, **(loader or {})}),
        prepare=PrepareConfig(dir=str(tmp_path / "prepared"), num_workers=1),
        block_size=block_size,
        seed=seed,
    )


def split_ids(module: TextDataModule, split: str) -> list[int]:
    """Every token id of a prepared split, in order."""
    dataset = StreamingDataset(module.prepared.split_dir(split), item_loader=TokensLoader(block_size=1))
    return [int(dataset[i][0]) for i in range(len(dataset))]


def test_batches_have_shapes_and_shifted_targets(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)])
    module.setup("fit")
    x, y = next(iter(module.train_dataloader()))
    assert x.shape == y.shape == (4, 8)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    text = corpus.read_text()
    for row_x, row_y in zip(x, y, strict=True):
        window = module.decode(row_x) + module.decode(row_y[-1:])
        assert len(window) == 9 and window in text
    x_val, y_val = next(iter(module.val_dataloader()))
    assert x_val.shape == (4, 8) and torch.equal(x_val[:, 1:], y_val[:, :-1])


def test_vocab_size_is_known_right_after_construction(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)])
    facts = module.data_facts()
    assert facts.vocab_size == 4 + len(set(corpus.read_text()))
    assert facts.tokenizer == module.tokenizer.to_str() and module.tokenizer.kind == "char"
    assert module.block_size == facts.max_length == 8


def test_an_epoch_is_every_window_once_in_an_order_of_seed_and_epoch(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.0, loader={"batch_size": 1})
    loader = module.train_dataloader()
    epochs = [[tuple(x[0].tolist()) for x, _ in loader] for _ in range(2)]
    ids = split_ids(module, "train")
    windows = [tuple(ids[i : i + 8]) for i in range(0, len(ids) - 8, 9)]  # block_size + 1 = 9 ids a window
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(windows)
    assert epochs[0] != epochs[1] and epochs[0] != windows  # shuffled, anew each epoch
    again = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.0, loader={"batch_size": 1})
    assert [tuple(x[0].tolist()) for x, _ in again.train_dataloader()] == epochs[0]  # a function of the seed
    other = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.0, loader={"batch_size": 1}, seed=2)
    assert [tuple(x[0].tolist()) for x, _ in other.train_dataloader()] != epochs[0]


def test_evaluation_windows_cover_the_split_in_order(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)])
    ids = split_ids(module, "val")
    dataset = EvaluationWindows(module.prepared.split_dir("val"), 8)
    assert len(dataset) == len(ids) // 9
    assert torch.equal(dataset[1][0], torch.tensor(ids[9:17])) and torch.equal(dataset[1][1], torch.tensor(ids[10:18]))
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    val_x = torch.cat([x for x, _ in module.val_dataloader()])
    assert torch.equal(val_x, torch.stack([dataset[i][0] for i in range(len(dataset))]))


def test_val_and_test_are_the_end_of_the_text_cut_at_line_breaks(tmp_path, corpus):
    text = corpus.read_text()
    module = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.1, test_fraction=0.05)
    module.setup()
    texts = {split: module.tokenizer.decode(split_ids(module, split)) for split in ("train", "val", "test")}
    assert texts["train"] + texts["val"] + texts["test"] == text
    assert all(part.endswith("\n") for part in texts.values())  # each split is whole lines
    for split, share in (("val", 0.1), ("test", 0.05)):
        assert abs(len(texts[split]) - share * len(text)) <= 60  # within a line of the share
    assert len(list(module.test_dataloader())) > 0


def test_explicit_val_and_test_files(tmp_path, corpus):
    val_file, test_file = tmp_path / "val.txt", tmp_path / "test.txt"
    val_file.write_text(make_text(20, seed=1) + "Zebra!")  # characters the train text lacks
    test_file.write_text(make_text(20, seed=2))
    module = make_module(tmp_path, train_files=[str(corpus)], val_files=[str(val_file)], test_files=[str(test_file)])
    module.setup()
    assert split_ids(module, "train") == module.tokenizer.encode(corpus.read_text())
    val_ids = split_ids(module, "val")
    assert module.tokenizer.unk_id not in val_ids  # the char vocabulary covers every split's text
    assert module.decode(val_ids) == val_file.read_text() + "\n"  # a file ends with a line break


def test_no_validation_split_when_val_fraction_is_zero(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.0)
    module.setup("fit")
    assert not module.prepared.has("val")
    assert module.val_dataloader() == []
    with pytest.raises(ValueError, match="no test split"):
        module.setup("test")


def test_globs_and_folders_are_expanded_and_sorted(tmp_path):
    parts = tmp_path / "parts"
    (parts / "more").mkdir(parents=True)
    (parts / "b.txt").write_text("bbbb bbbb\n" * 20)
    (parts / "a.txt").write_text("aaaa aaaa" * 20)  # no final newline: one is added before b.txt
    (parts / "notes.md").write_text("ignored")
    module = make_module(tmp_path, train_files=[str(parts / "*.txt")], val_fraction=0.0)
    assert module.decode(split_ids(module, "train")) == "aaaa aaaa" * 20 + "\n" + "bbbb bbbb\n" * 20
    (parts / "more" / "c.txt").write_text("cc\n")
    folder = make_module(tmp_path, train_files=[str(parts)], val_fraction=0.0)
    expected = "aaaa aaaa" * 20 + "\n" + "bbbb bbbb\n" * 20 + "cc\n" + "ignored\n"  # a, b, more/c, notes
    assert folder.decode(split_ids(folder, "train")) == expected


def test_jsonl_and_parquet_records_are_documents_ended_by_eos(tmp_path):
    records = [{"text": f"document {i}: " + make_text(2, seed=i), "id": i} for i in range(40)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records[:20]) + "\n")  # a blank line is skipped
    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [r["text"] for r in records[20:]]}), parquet, row_group_size=7)
    assert (format_of(jsonl), format_of(parquet), format_of(tmp_path / "a.txt")) == ("jsonl", "parquet", "text")
    module = make_module(
        tmp_path, train_files=[str(jsonl), str(parquet)], val_fraction=0.0, tokenizer={"kind": "bpe", "vocab_size": 300}
    )
    ids = split_ids(module, "train")
    assert ids.count(EOS_ID) == 40
    documents = module.tokenizer.decode(ids, skip_special=False).split("<eos>")
    assert documents == [r["text"] for r in records] + [""]


def test_a_split_cut_falls_between_records_and_rows(tmp_path):
    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": [f"row {i} " * 20 for i in range(100)]}), parquet, row_group_size=30)
    pieces = split_pieces([parquet], {}, 0.2, 0.1, piece_bytes=400)
    rows = {split: [(p.start, p.end) for p in pieces[split]] for split in pieces}
    assert rows["train"][0][0] == 0 and rows["train"][-1][1] == rows["val"][0][0] == 70
    assert rows["val"][-1][1] == rows["test"][0][0] == 90 and rows["test"][-1][1] == 100
    assert len(rows["train"]) > 1  # cut into pieces of about 400 bytes
    texts = [t for split in ("train", "val", "test") for p in pieces[split] for t in read_piece(p, "body")]
    assert texts == [f"row {i} " * 20 for i in range(100)]


def test_bpe_module(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)], tokenizer={"kind": "bpe", "vocab_size": 300})
    assert module.tokenizer.kind == "bpe"
    assert module.data_facts().vocab_size <= 300
    module.setup("fit")
    x, y = next(iter(module.train_dataloader()))
    assert x.shape == (4, 8) and int(x.max()) < module.data_facts().vocab_size
    text = corpus.read_text()
    assert module.decode(split_ids(module, "train") + split_ids(module, "val")) == text


def test_the_tokenizer_trains_on_a_bounded_sample_of_every_piece(tmp_path, monkeypatch):
    big = tmp_path / "big.txt"
    big.write_text("".join(f"line {i} of the corpus\n" for i in range(20_000)))  # ~460 kB
    monkeypatch.setattr(sources, "PIECE_BYTES", 50_000)
    sampled = []
    real = Tokenizer.train_char

    def spy(texts, *args, **kwargs):
        texts = list(texts)
        sampled.extend(texts)
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "train_char", spy)
    source = TextSource(train_files=[str(big)], val_fraction=0.0)
    num_pieces = len(source.pieces(source_files(source))["train"])
    prepared = prepare_text(
        source, TokenizerConfig(sample_bytes=20_000), PrepareConfig(str(tmp_path / "prepared"), num_workers=2)
    )
    assert num_pieces == 10 and len(sampled) == num_pieces  # a part of every piece
    assert all(0 < len(text) <= 20_000 // num_pieces and text.endswith("\n") for text in sampled)
    assert sampled[-1].startswith("line 18")  # the sample reaches the end of the corpus
    assert prepared.num_tokens("train") == big.stat().st_size  # and every piece is encoded, by two processes
    assert len(list((prepared.folder / "train").glob("chunk-1-*.bin"))) >= 1


def test_tokenizer_file_is_loaded_not_trained(tmp_path, corpus, monkeypatch):
    path = Tokenizer.train_char([corpus.read_text() + "XYZ"]).save(tmp_path / "tok.json")
    monkeypatch.setattr(Tokenizer, "train_char", None)  # any training attempt would fail
    module = make_module(tmp_path, train_files=[str(corpus)], tokenizer={"file": str(path)})
    assert module.data_facts().vocab_size == 4 + len(set(corpus.read_text() + "XYZ"))
    module.setup("fit")


def test_preparing_again_does_nothing_and_a_changed_source_prepares_anew(tmp_path, corpus, monkeypatch):
    first = make_module(tmp_path, train_files=[str(corpus)])
    first.prepare_data()
    folders = list((tmp_path / "prepared").iterdir())
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "prepared").rglob("*") if p.is_file()}
    assert {p.name for p in folders} == {first.prepared.folder.name, first.prepared.folder.name + ".lock"}
    assert {"prepared.json", "tokenizer.json"} <= {p.name for p in first.prepared.folder.iterdir()}

    def no_work(*args, **kwargs):
        raise AssertionError("the prepared folder should have been used")

    monkeypatch.setattr(prepare, "_prepare_text", no_work)
    second = make_module(tmp_path, train_files=[str(corpus)])
    assert second.data_facts().vocab_size == first.data_facts().vocab_size
    second.setup("fit")
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "prepared").rglob("*") if p.is_file()} == files

    monkeypatch.undo()
    corpus.write_text(corpus.read_text() + "A new character: Q\n")
    third = make_module(tmp_path, train_files=[str(corpus)])
    assert third.data_facts().vocab_size > first.data_facts().vocab_size  # a changed file is a new folder
    assert third.prepared.folder != first.prepared.folder


def test_a_half_written_folder_is_prepared_again(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)])
    folder = module.prepared.folder
    (folder / "prepared.json").unlink()  # as a kill before the last write leaves it
    (folder / "train" / "index.json").unlink()
    again = make_module(tmp_path, train_files=[str(corpus)])
    assert again.prepared.folder == folder and (folder / "train" / "index.json").is_file()
    assert split_ids(again, "train") == split_ids(module, "train")


def test_a_missing_or_cut_short_shard_is_named(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)])
    shard = next((module.prepared.folder / "train").glob("chunk-*.bin"))
    shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(ValueError, match=rf"the shard .*{shard.name} is cut short \(10 bytes\): delete .* and prepare"):
        module.train_dataloader()
    shard.unlink()
    with pytest.raises(ValueError, match=rf"the shard .*{shard.name} is missing"):
        module.train_dataloader()


def test_a_folder_that_was_not_prepared_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a prepared folder .*lightformer prepare"):
        PreparedText(tmp_path)


def test_missing_file_is_named(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match=r"train_files: the file '.*missing\.txt' does not exist"):
        _ = make_module(tmp_path, train_files=[str(tmp_path / "missing.txt")]).data_facts()
    with pytest.raises(FileNotFoundError, match=r"val_files: the file '.*missing\.txt' does not exist"):
        _ = make_module(tmp_path, train_files=[str(corpus)], val_files=[str(tmp_path / "missing.txt")]).data_facts()


def test_glob_matching_nothing_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train_files: the pattern '.*\*\.nothing' matches no file"):
        _ = make_module(tmp_path, train_files=[str(tmp_path / "*.nothing")]).data_facts()


def test_empty_corpus_is_an_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"training text is empty \(.*empty\.txt\)"):
        _ = make_module(tmp_path, train_files=[str(empty)]).data_facts()


def test_non_utf8_file_names_file_and_offset(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf" + "é au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text: byte 0xe9 at byte offset 3"):
        _ = make_module(tmp_path, train_files=[str(latin1)]).data_facts()


def test_a_non_utf8_byte_only_a_preparation_worker_reads_names_file_and_offset(tmp_path, monkeypatch):
    """Past the tokenizer's sample (one line of each 200-byte piece), the byte is read by a LitData worker only."""
    monkeypatch.setattr(sources, "PIECE_BYTES", 200)
    latin1 = tmp_path / "latin1.txt"
    lines = "".join(f"line {i} of plain ASCII text here\n" for i in range(23))
    latin1.write_bytes(lines.encode() + "café\n".encode("latin-1"))
    module = make_module(tmp_path, train_files=[str(latin1)], val_fraction=0.0, tokenizer={"sample_bytes": 100})
    with pytest.raises(ValueError, match=rf"latin1\.txt is not UTF-8 text: byte 0xe9 at byte offset {len(lines) + 3} "):
        _ = module.data_facts()


def test_a_record_without_its_text_field_is_named(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(
        ValueError,
        match=r"docs\.jsonl: the record at byte offset 17 has no text field 'text' \(found fields \['body'\]\)",
    ):
        _ = make_module(tmp_path, train_files=[str(jsonl)], val_fraction=0.0).data_facts()
    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), parquet)
    with pytest.raises(ValueError, match=r"docs\.parquet has no column 'text' \(its columns: \['body'\]\)"):
        _ = make_module(tmp_path, train_files=[str(parquet)], val_fraction=0.0).data_facts()


def test_split_too_small_names_split_and_sizes(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("abcdefghi\n" * 10)  # 100 characters: val gets the last line, 10 tokens
    module = make_module(tmp_path, train_files=[str(short)], block_size=16)
    with pytest.raises(ValueError, match=r"the val split has 10 tokens, fewer than block_size \+ 1 = 17"):
        module.setup("fit")


@pytest.mark.parametrize("name", ["val_fraction", "test_fraction"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_fraction_out_of_range(tmp_path, corpus, name, value):
    with pytest.raises(ValueError, match=rf"{name}={value} must be in \[0, 1\)"):
        make_module(tmp_path, train_files=[str(corpus)], **{name: value})


def test_fractions_must_leave_training_text(tmp_path, corpus):
    with pytest.raises(ValueError, match="leaves no training text"):
        make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.6, test_fraction=0.4)


def test_exactly_one_source(tmp_path, corpus):
    with pytest.raises(ValueError, match="exactly one source.*got none"):
        make_module(tmp_path)
    with pytest.raises(ValueError, match="exactly one source.*got train_files, corpus"):
        make_module(tmp_path, train_files=[str(corpus)], corpus="austen")


def test_config_groups_check_their_values():
    with pytest.raises(ValueError, match="data.loader.val_windows=0 must be at least 1"):
        LoaderConfig(val_windows=0)
    with pytest.raises(ValueError, match="data.loader.batch_size=0 must be at least 1"):
        LoaderConfig(batch_size=0)
    with pytest.raises(ValueError, match="data.tokenizer.vocab_size=100 is too small for byte-level BPE"):
        TokenizerConfig(kind="bpe", vocab_size=100)
    with pytest.raises(FileNotFoundError, match="data.tokenizer.file: the tokenizer file 'nope.json' does not exist"):
        TokenizerConfig(file="nope.json")
    with pytest.raises(ValueError, match="data.prepare.num_workers=0 must be at least 1"):
        PrepareConfig(num_workers=0)


def test_val_windows_are_a_fixed_random_subset_while_fitting(tmp_path, corpus):
    data = make_module(tmp_path, train_files=[str(corpus)], loader={"val_windows": 5})
    whole = len(EvaluationWindows(data.prepared.split_dir("val"), 8))
    assert len(data.val_dataloader().dataset) == whole > 5  # outside fit (validate): the whole split
    data.trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING))
    chosen = data.val_dataloader().dataset
    assert len(chosen) == 5 and chosen.indices == data.val_dataloader().dataset.indices  # the same at every call
    assert chosen.indices != list(range(5)) and chosen.indices == sorted(chosen.indices)


def test_download_verifies_the_checksum(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    payload = make_text(50).encode()
    (served / "corpus.txt").write_bytes(payload)
    expected = hashlib.sha256(payload).hexdigest()
    handler = partial(QuietHandler, directory=str(served))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/corpus.txt"
        try:
            dest = download(url, tmp_path / "out" / "corpus.txt", sha256=expected)
            assert dest.read_bytes() == payload
            wrong = "0" * 64
            with pytest.raises(ValueError, match=rf"{url}.*expected sha256 {wrong}, got {expected}"):
                download(url, tmp_path / "out" / "other.txt", sha256=wrong)
            assert not (tmp_path / "out" / "other.txt").exists()
            assert [p.name for p in (tmp_path / "out").iterdir()] == ["corpus.txt"]  # no temporary left
            with pytest.raises(OSError, match="could not download .*/missing.txt"):
                download(url.replace("corpus", "missing"), tmp_path / "out" / "missing.txt", sha256=None)
            module = make_module(tmp_path, url=url, sha256=expected)
            assert module.data_facts().vocab_size == 4 + len(set(payload.decode()))
        finally:
            server.shutdown()
    # Present with the right hash: no request is made (the server is gone).
    assert download(url, dest, sha256=expected) == dest


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep pytest output clean
        pass


def test_austen_corpus(tmp_path):
    root = tmp_path / "austen"
    system_data = corpora.AUSTEN_SYSTEM_DATA_DIR
    if not (system_data / "Rdata.rdx").exists() and shutil.which("apt-get") is None:
        pytest.skip(f"needs {system_data} or apt-get to fetch {corpora.AUSTEN_DEB_PACKAGE}")
    try:
        path = austen_text(root)
    except CorpusUnavailableError as error:
        pytest.skip(f"could not fetch the Austen corpus: {error}")
    text = path.read_text(encoding="utf-8")
    # DATA.md: 4,025,032 characters, 81 distinct.
    assert len(text) == 4_025_032
    assert len(set(text)) == 81
    assert text.startswith("SENSE AND SENSIBILITY\n\nby Jane Austen")
    assert text.endswith("\n") is False
    assert austen_text(root) == path  # second call reuses the file


def test_austen_without_apt_get_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "AUSTEN_SYSTEM_DATA_DIR", tmp_path / "no-system-r")
    monkeypatch.setattr(corpora.shutil, "which", lambda tool: None)
    with pytest.raises(CorpusUnavailableError, match=r"apt-get download r-cran-janeaustenr && dpkg-deb -x"):
        austen_text(tmp_path / "austen")
