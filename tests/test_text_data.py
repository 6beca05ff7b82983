"""TextDataModule, its datasets and the corpus sources, on small corpora written to tmp_path."""

import hashlib
import http.server
import pickle
import shutil
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn

from lightformer.data import corpora
from lightformer.data.corpora import CorpusUnavailableError, austen_text, download
from lightformer.data.text import ContiguousWindowDataset, RandomWindowDataset, TextDataModule
from lightformer.data.tokenizers import Tokenizer

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


def make_module(tmp_path: Path, **kwargs) -> TextDataModule:
    defaults = dict(block_size=8, batch_size=4, cache_dir=str(tmp_path / "cache"), data_root=str(tmp_path / "data"))
    return TextDataModule(**{**defaults, **kwargs})


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
    assert module.vocab_size == 4 + len(set(corpus.read_text()))
    assert module.tokenizer.kind == "char"
    assert module.block_size == 8
    # The BPE target is `bpe_vocab_size`, so hparams never clash with the model's linked vocab_size.
    assert "vocab_size" not in module.hparams and module.hparams.block_size == 8


def test_windows_are_reproducible_for_a_seed(tmp_path, corpus):
    def first_batches(seed: int) -> list[torch.Tensor]:
        module = make_module(tmp_path, train_files=[str(corpus)], seed=seed)
        module.setup("fit")
        return [x for x, _ in list(module.train_dataloader())[:3]]

    same = first_batches(1)
    assert all(torch.equal(a, b) for a, b in zip(same, first_batches(1), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(same, first_batches(2), strict=True))


def test_random_window_item_depends_only_on_seed_and_index():
    tokens = np.arange(1000, dtype=np.uint16)
    dataset = RandomWindowDataset(tokens, block_size=16, num_samples=50, seed=7)
    again = RandomWindowDataset(tokens, block_size=16, num_samples=50, seed=7)
    other = RandomWindowDataset(tokens, block_size=16, num_samples=50, seed=8)
    for i in (0, 13, 49):
        x, y = dataset[i]
        assert torch.equal(x, again[i][0])
        assert torch.equal(y, x + 1)  # arange: the target is the next id
    assert any(not torch.equal(dataset[i][0], other[i][0]) for i in range(50))
    with pytest.raises(IndexError):
        dataset[50]


def test_contiguous_windows_cover_the_split_in_order():
    tokens = np.arange(35, dtype=np.uint16)
    dataset = ContiguousWindowDataset(tokens, block_size=8)
    assert len(dataset) == 4  # (35 - 1) // 8; the last 2 tokens do not fill a window
    xs = torch.cat([dataset[i][0] for i in range(len(dataset))])
    assert torch.equal(xs, torch.arange(32))
    assert torch.equal(dataset[3][1], torch.arange(25, 33))


def test_dataset_pickles_without_its_tokens(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(100_000, dtype=np.uint16))
    dataset = RandomWindowDataset(path, block_size=8, num_samples=10, seed=0)
    _ = dataset[0]  # memory-maps the file
    payload = pickle.dumps(dataset)
    assert len(payload) < 2_000  # the path travels to DataLoader workers, not 200 kB of ids
    assert torch.equal(pickle.loads(payload)[3][0], dataset[3][0])


def test_val_and_test_are_the_end_of_the_text(tmp_path, corpus):
    text = corpus.read_text()
    module = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.1, test_fraction=0.05)
    module.setup()
    n = len(text)
    n_val, n_test = int(n * 0.1), int(n * 0.05)
    tokenizer = module.tokenizer
    tokens = {split: np.asarray(module.datasets[split].tokens) for split in ("train", "val", "test")}
    assert tokens["train"].tolist() == tokenizer.encode(text[: n - n_val - n_test])
    assert tokens["val"].tolist() == tokenizer.encode(text[n - n_val - n_test : n - n_test])
    assert tokens["test"].tolist() == tokenizer.encode(text[n - n_test :])
    assert tokens["train"].dtype == np.uint16
    val_x = torch.cat([x.flatten() for x, _ in module.val_dataloader()])
    assert torch.equal(val_x, torch.from_numpy(tokens["val"][: len(val_x)].astype(np.int64)))  # in order
    assert len(list(module.test_dataloader())) > 0


def test_explicit_val_and_test_files(tmp_path, corpus):
    val_file, test_file = tmp_path / "val.txt", tmp_path / "test.txt"
    val_file.write_text(make_text(20, seed=1) + "Zebra!")  # characters the train text lacks
    test_file.write_text(make_text(20, seed=2))
    module = make_module(tmp_path, train_files=[str(corpus)], val_files=[str(val_file)], test_files=[str(test_file)])
    module.setup()
    assert np.asarray(module.datasets["train"].tokens).tolist() == module.tokenizer.encode(corpus.read_text())
    val_ids = np.asarray(module.datasets["val"].tokens).tolist()
    assert module.tokenizer.unk_id not in val_ids  # the char vocabulary covers every split's text
    assert module.decode(val_ids) == val_file.read_text()


def test_no_validation_split_when_val_fraction_is_zero(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)], val_fraction=0.0)
    module.setup("fit")
    assert "val" not in module.datasets
    assert module.val_dataloader() == []
    with pytest.raises(ValueError, match="no test split"):
        module.test_dataloader()


def test_globs_are_expanded_and_sorted(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "b.txt").write_text("bbbb bbbb\n" * 20)
    (parts / "a.txt").write_text("aaaa aaaa" * 20)  # no final newline: one is added before b.txt
    (parts / "notes.md").write_text("ignored")
    module = make_module(tmp_path, train_files=[str(parts / "*.txt")], val_fraction=0.0)
    module.setup("fit")
    ids = np.asarray(module.datasets["train"].tokens)
    assert module.decode(ids) == "aaaa aaaa" * 20 + "\n" + "bbbb bbbb\n" * 20


def test_bpe_module(tmp_path, corpus):
    module = make_module(tmp_path, train_files=[str(corpus)], tokenizer="bpe", bpe_vocab_size=300)
    assert module.tokenizer.kind == "bpe"
    assert module.vocab_size <= 300
    module.setup("fit")
    x, y = next(iter(module.train_dataloader()))
    assert x.shape == (4, 8) and int(x.max()) < module.vocab_size
    text = corpus.read_text()
    n_val = int(len(text) * 0.1)
    assert module.decode(module.datasets["val"].tokens) == text[len(text) - n_val :]


def test_tokenizer_file_is_loaded_not_trained(tmp_path, corpus, monkeypatch):
    path = Tokenizer.train_char([corpus.read_text() + "XYZ"]).save(tmp_path / "tok.json")
    monkeypatch.setattr(Tokenizer, "train_char", None)  # any training attempt would fail
    module = make_module(tmp_path, train_files=[str(corpus)], tokenizer_file=str(path))
    assert module.vocab_size == 4 + len(set(corpus.read_text() + "XYZ"))
    module.setup("fit")


def test_caches_are_reused_and_follow_the_corpus(tmp_path, corpus, monkeypatch):
    first = make_module(tmp_path, train_files=[str(corpus)])
    first.prepare_data()
    cache_files = sorted((tmp_path / "cache").iterdir())
    assert sorted(p.suffix for p in cache_files) == [".json", ".npy", ".npy"]  # tokenizer, train and val ids
    mtimes = {p: p.stat().st_mtime_ns for p in cache_files}

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been used")

    monkeypatch.setattr(Tokenizer, "train_char", no_training)
    monkeypatch.setattr(Tokenizer, "encode_to_array", no_training)
    second = make_module(tmp_path, train_files=[str(corpus)])
    assert second.vocab_size == first.vocab_size
    second.prepare_data()
    second.setup("fit")
    assert {p: p.stat().st_mtime_ns for p in cache_files} == mtimes
    assert sorted((tmp_path / "cache").iterdir()) == cache_files

    monkeypatch.undo()
    corpus.write_text(corpus.read_text() + "A new character: Q\n")
    third = make_module(tmp_path, train_files=[str(corpus)])
    assert third.vocab_size > first.vocab_size  # a changed file is a new cache key
    third.setup("fit")


def test_missing_file_is_named(tmp_path, corpus):
    with pytest.raises(FileNotFoundError, match=r"train_files: the file '.*missing\.txt' does not exist"):
        _ = make_module(tmp_path, train_files=[str(tmp_path / "missing.txt")]).vocab_size
    with pytest.raises(FileNotFoundError, match=r"val_files: the file '.*missing\.txt' does not exist"):
        _ = make_module(tmp_path, train_files=[str(corpus)], val_files=[str(tmp_path / "missing.txt")]).vocab_size


def test_glob_matching_nothing_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"train_files: the pattern '.*\*\.nothing' matches no file"):
        _ = make_module(tmp_path, train_files=[str(tmp_path / "*.nothing")]).vocab_size


def test_empty_corpus_is_an_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"training text is empty: .*empty\.txt"):
        _ = make_module(tmp_path, train_files=[str(empty)]).vocab_size


def test_non_utf8_file_names_file_and_offset(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf" + "é au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8 text: byte 0xe9 at byte offset 3"):
        _ = make_module(tmp_path, train_files=[str(latin1)]).vocab_size


def test_split_too_small_names_split_and_sizes(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("abcdefghij" * 10)  # 100 characters: val gets 10 tokens
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
            assert module.vocab_size == 4 + len(set(payload.decode()))
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


def test_val_windows_are_a_fixed_random_subset_while_fitting(tmp_path, corpus):
    data = TextDataModule(train_files=[str(corpus)], cache_dir=str(tmp_path), block_size=8, val_windows=5)
    data.setup("fit")
    whole = len(data.datasets["val"])
    assert len(data.val_dataloader().dataset) == whole > 5  # outside fit (validate): the whole split
    data.trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING))
    chosen = data.val_dataloader().dataset
    assert len(chosen) == 5 and chosen.indices == data.val_dataloader().dataset.indices  # the same at every call
    assert chosen.indices != list(range(5)) and chosen.indices == sorted(chosen.indices)
    with pytest.raises(ValueError, match="val_windows=0 must be at least 1"):
        TextDataModule(train_files=[str(corpus)], cache_dir=str(tmp_path), val_windows=0)
