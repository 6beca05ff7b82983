"""Text classification: Austen passages split by position, TSV files and their errors, the prepared records (once,
the same from pieces of any size, cut to max_tokens as read), batches, a tiny classifier trained through the command
line, and fine-tuning from a masked-LM-shaped checkpoint (weights loaded by name, a checkpoint of another tokenizer
refused)."""

from __future__ import annotations

import random
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lightformer.data.families.labelled as classification
import lightformer.data.pieces as sources
from lightformer.cli.main import cli_main
from lightformer.data.families.labelled import MIN_VOCAB_SIZE, SPLITS, TextClassificationDataModule
from lightformer.data.loading.sampling import EpochShuffleSampler
from lightformer.data.loading.streaming import LoaderConfig
from lightformer.data.pieces import read_piece
from lightformer.data.preparation.prepare import MANIFEST, PrepareConfig, TokenizerConfig
from lightformer.data.sources.corpora import (
    AUSTEN_NOVELS,
    CorpusUnavailableError,
    austen_passages,
    austen_text,
    novel_sentences,
    source_files,
    split_austen_text,
    split_of,
    split_sentences,
)
from lightformer.data.sources.labelled import PassageSource, read_labelled_tsv
from lightformer.data.sources.text import TextSource
from lightformer.facts import DataFacts
from lightformer.models.bert import BertConfig, BertForPreTraining
from lightformer.tasks.text_classification import TextClassificationTask
from lightformer.tokenization.text import BOS_ID, EOS_ID, MASK, PAD_ID, Tokenizer

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "classify" / "austen_scratch.yaml"
FRUIT = ["apple", "pear", "plum", "cherry", "melon", "grape", "lemon", "peach", "mango", "fig", "kiwi", "lime"]
METAL = ["iron", "copper", "zinc", "tin", "lead", "nickel", "cobalt", "silver", "gold", "chrome", "steel", "brass"]
TINY_NET = {"n_layers": 1, "n_heads": 2, "d_model": 32, "d_ff": 64, "max_len": 32, "norm_first": True}
TINY_NET["position"] = "rope"  # as the shipped classify and mlm configs


# --- Austen --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def austen(tmp_path_factory) -> TextClassificationDataModule:
    root = REPO / "data"
    try:
        austen_text(root / "austen")
    except CorpusUnavailableError as error:
        pytest.skip(f"could not fetch the Austen corpus: {error}")
    return TextClassificationDataModule(
        PassageSource(data_root=str(root)), prepare=PrepareConfig(dir=str(tmp_path_factory.mktemp("prepared")))
    )


@pytest.fixture(scope="module")
def passages() -> dict[str, list[tuple[str, int, int]]]:
    """Each split's (passage, novel, position) of Austen's novels, three sentences per passage."""
    return austen_passages(austen_text(REPO / "data" / "austen").read_text(encoding="utf-8"), 3)


def records(data: TextClassificationDataModule, split: str) -> list[tuple[list[int], int]]:
    """(ids, label) of each record of a prepared split, in order."""
    return [(np.asarray(r["ids"]).tolist(), int(r["label"])) for r in data.dataset(split)]


def test_austen_passages_are_split_by_position(austen, passages):
    examples = passages
    assert austen.class_names == [title for _, title in AUSTEN_NOVELS]
    assert austen.num_classes == 6
    texts = {split: {text for text, _, _ in examples[split]} for split in SPLITS}
    assert not texts["train"] & texts["val"] and not texts["train"] & texts["test"] and not texts["val"] & texts["test"]
    text = austen_text(REPO / "data" / "austen").read_text(encoding="utf-8")
    normalized = " ".join(text.split())
    for label, novel in enumerate(split_austen_text(text).values()):
        positions = {split: [p for _, c, p in examples[split] if c == label] for split in SPLITS}
        count = sum(map(len, positions.values()))
        assert sorted(p for split in SPLITS for p in positions[split]) == list(range(count))
        assert (len(positions["train"]), len(positions["val"])) == (
            int(0.8 * count),
            int(0.9 * count) - int(0.8 * count),
        )
        assert max(positions["train"]) < min(positions["val"]) <= max(positions["val"]) < min(positions["test"])
        # train, then val, then test: the novel's sentences, three by three, in the order of the text
        sentences = novel_sentences(novel)
        passages = [text for split in SPLITS for text, c, _ in examples[split] if c == label]
        assert passages == [" ".join(sentences[i : i + 3]) for i in range(0, 3 * count, 3)]
        offset = 0
        for sentence in sentences:
            offset = normalized.find(sentence, offset)
            assert offset >= 0, f"{austen.class_names[label]}: {sentence!r} is not after the previous sentence"
    counts = austen.class_counts
    assert sum(counts["test"].values()) == len(examples["test"]) > 1000
    assert austen.chance_accuracy == max(counts["test"].values()) / len(examples["test"])
    assert 0.2 < austen.chance_accuracy < 0.25  # Emma, the longest novel
    # the records: each split's passages in order, encoded whole as [CLS] text [SEP]
    for split in SPLITS:
        prepared = records(austen, split)
        assert [label for _, label in prepared] == [label for _, label, _ in examples[split]]
        for index in (0, len(prepared) // 2, len(prepared) - 1):
            text = examples[split][index][0]
            assert prepared[index][0] == austen.tokenizer.encode(text, add_bos=True, add_eos=True)


def test_novel_body_without_headings_and_fragments():
    novel = (
        "EMMA\n\nBy Jane Austen\n\n\nVOLUME I\n\nCHAPTER I\n\nThe first sentence is here.  And a\nsecond one"
        ' here! "Yes." Then\n\n* * *\n\nCHAPTER II\n\n"A third, by Mr. Knightley?" said she, smiling.\n\n'
        "THE END\n\nA NOTE."
    )
    assert novel_sentences(novel) == [
        "The first sentence is here.",
        "And a second one here!",
        '"A third, by Mr. Knightley?"',
        "said she, smiling.",
    ]


def test_sentence_rule():
    assert split_sentences('"Oh!" said he. "Mr. Darcy is here?" she asked.\nIt was\n(so he said.) fine') == [
        '"Oh!"',
        "said he.",
        '"Mr. Darcy is here?"',
        "she asked.",
        "It was (so he said.)",
        "fine",
    ]


def test_austen_passages_have_three_sentences_and_no_front_matter(passages):
    passages = [text for split in SPLITS for text, _, _ in passages[split]]
    assert not any(text.upper().startswith(("CHAPTER", "VOLUME")) or "Jane Austen" in text for text in passages)
    first = passages[0]
    assert first.startswith("The family of Dashwood had long been settled in Sussex.")
    assert len(split_sentences(first)) == 3


# --- TSV files -----------------------------------------------------------------------------------------------


def toy_lines(count: int, seed: int) -> list[str]:
    """Lines of two easily told apart classes: texts of fruit words and texts of metal words."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        label, words = ("fruit", FRUIT) if i % 2 else ("metal", METAL)
        lines.append(f"{' '.join(rng.choices(words, k=rng.randint(3, 8)))}\t{label}")
    return lines


def write_toy(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, count, seed in (("train", 240, 0), ("val", 40, 1), ("test", 40, 2)):
        files[split] = folder / f"{split}.tsv"
        files[split].write_text("\n".join(toy_lines(count, seed)) + "\n", encoding="utf-8")
    return files


def toy_module(
    files: dict[str, Path], prepared: Path, max_tokens: int = 128, batch_size: int = 32, seed: int = 0
) -> TextClassificationDataModule:
    return TextClassificationDataModule(
        PassageSource(
            corpus=None,
            tsv_files=[str(files["train"])],
            val_tsv_files=[str(files["val"])],
            test_tsv_files=[str(files["test"])],
        ),
        TokenizerConfig(kind="bpe", vocab_size=MIN_VOCAB_SIZE + 20),
        LoaderConfig(batch_size=batch_size),
        max_tokens,
        PrepareConfig(dir=str(prepared)),
        seed,
    )


def tsv_module(train: Path, prepared: Path, vocab_size: int = 8192) -> TextClassificationDataModule:
    """A module of one training TSV file, val and test cut from it by hash."""
    return TextClassificationDataModule(
        PassageSource(corpus=None, tsv_files=[str(train)]),
        TokenizerConfig(kind="bpe", vocab_size=vocab_size),
        prepare=PrepareConfig(dir=str(prepared)),
    )


def test_tsv_labels_are_sorted_and_batches_framed_and_cut_as_read(tmp_path):
    files = write_toy(tmp_path / "toy")
    data = toy_module(files, tmp_path / "prepared", max_tokens=6, batch_size=8)
    facts = data.data_facts()
    assert data.class_names == ["fruit", "metal"] and data.num_classes == 2 and facts.pad_id == PAD_ID
    assert facts.class_names == ("fruit", "metal") and facts.num_classes == 2 and facts.max_length == 6
    assert facts.vocab_size == MIN_VOCAB_SIZE + 20 and data.tokenizer.token_id(MASK) == 4
    assert facts.tokenizer == data.tokenizer.to_str()
    assert data.class_counts == {"train": {"fruit": 120, "metal": 120}, "val": {"fruit": 20, "metal": 20}} | {
        "test": {"fruit": 20, "metal": 20}
    }
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    ids, labels = batch["ids"], batch["labels"]
    assert ids.dtype == labels.dtype == torch.int64 and ids.shape[0] == labels.shape[0] == 8
    assert ids.shape[1] == 8  # the longest, 6, rounded up to a multiple of 8
    first = list(EpochShuffleSampler(len(data.dataset("train")), seed=0))[:8]
    whole = [records(data, "train")[i] for i in first]
    assert any(len(full) > 6 for full, _ in whole)  # the records hold whole texts; the batch cuts them
    for row, label, (full, record_label) in zip(ids.tolist(), labels.tolist(), whole, strict=True):
        real = [i for i in row if i != PAD_ID]
        assert row[: len(real)] == real and real[0] == BOS_ID and real[-1] == EOS_ID and len(real) <= 6
        assert full[0] == BOS_ID and full[-1] == EOS_ID
        assert real[:-1] == full[: len(real) - 1] and len(real) == min(len(full), 6)  # cut, [SEP] kept last
        text = data.tokenizer.decode(full)
        assert label == record_label and data.class_names[label] == ("fruit" if text.split()[0] in FRUIT else "metal")
    # the order of an epoch depends on (seed, epoch) only; another max_tokens reads the same prepared folder
    again = toy_module(files, tmp_path / "prepared", max_tokens=64, batch_size=8)
    assert again.prepared == data.prepared
    longer = next(iter(again.train_dataloader()))
    assert torch.equal(longer["labels"], labels) and longer["ids"].shape[1] > 8
    for row, (full, _) in zip(longer["ids"].tolist(), whole, strict=True):
        assert row[: len(full)] == full and set(row[len(full) :]) <= {PAD_ID}


def test_tsv_without_val_and_test_files_is_split_by_text_hash(tmp_path):
    train = tmp_path / "train.tsv"
    lines = toy_lines(400, 3) + ["\t".join(["a text with\ta tab", "metal"])] + [""]
    train.write_text("\n".join(lines), encoding="utf-8")
    data = tsv_module(train, tmp_path / "prepared")
    examples = {split: [(data.tokenizer.decode(ids), label) for ids, label in records(data, split)] for split in SPLITS}
    sizes = {split: len(examples[split]) for split in SPLITS}
    assert sizes == {split: sum(data.class_counts[split].values()) for split in SPLITS}
    assert sum(sizes.values()) == 401 and sizes["val"] > 5 and sizes["test"] > 5 and sizes["train"] > 320
    texts = {split: {text for text, _ in examples[split]} for split in SPLITS}
    assert not texts["train"] & texts["val"] and not texts["train"] & texts["test"] and not texts["val"] & texts["test"]
    assert ("a text with\ta tab", 1) in {example for split in SPLITS for example in examples[split]}
    for split in SPLITS:  # each text in the split of its hash, in the order of the file
        expected = [(text, label) for text, label in (line.rsplit("\t", 1) for line in lines if line)]
        expected = [(text, ["fruit", "metal"].index(label)) for text, label in expected if split_of(text) == split]
        assert examples[split] == expected


def test_tsv_errors_name_the_file_and_line(tmp_path, monkeypatch):
    bad = tmp_path / "bad.tsv"
    bad.write_text("good text\tfruit\nno tab on this line\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=rf"data.source.tsv_files: {bad}, line 2: no tab; each line must be 'text<TAB>label'"
    ):
        list(read_labelled_tsv(bad))
    monkeypatch.setattr(sources, "PIECE_BYTES", 64)  # the same errors in a later piece of a file: its line in the file
    late = tmp_path / "late.tsv"
    late.write_bytes(b"good text\tfruit\n" * 20 + b"a label missing\n" + b"good text\tfruit\n" * 5)
    assert len(sources.line_pieces(late)) > 3
    with pytest.raises(ValueError, match=rf"data.source.val_tsv_files: {late}, line 21: no tab"):
        list(read_labelled_tsv(late, "data.source.val_tsv_files"))
    late.write_bytes(b"good text\tfruit\n" * 20 + "caf\u00e9\tfruit\n".encode("latin-1"))
    with pytest.raises(
        ValueError, match=rf"tsv_files: {late} is not UTF-8 text: byte 0xe9 at byte offset 323 \(line 21"
    ):
        list(read_labelled_tsv(late))
    empty = tmp_path / "empty.tsv"
    empty.write_text("good text\tfruit\n\t\tmetal\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: the text is empty"):
        list(read_labelled_tsv(empty))
    latin = tmp_path / "latin1.tsv"
    latin.write_bytes("good text\tfruit\n\ncaf\u00e9 au lait\tfruit\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.tsv is not UTF-8 text: byte 0xe9 at byte offset 20 \(line 3"):
        tsv_module(latin, tmp_path).prepare_data()
    single = tmp_path / "single.tsv"
    single.write_text("one text\tfruit\nanother text\tfruit\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"every line has the label 'fruit'; a classifier needs two or more"):
        tsv_module(single, tmp_path).prepare_data()


def test_unknown_val_label_is_refused_before_anything_is_encoded(tmp_path, monkeypatch):
    files = write_toy(tmp_path / "toy")
    files["val"].write_text("some fruit\tfruit\n\nsome text\tvegetable\n", encoding="utf-8")
    encoded = []
    monkeypatch.setattr(classification, "prepare_records", lambda *args: encoded.append(args))
    with pytest.raises(ValueError, match=r"val_tsv_files: .*val.tsv, line 3: the label 'vegetable' is not one of"):
        toy_module(files, tmp_path / "prepared").prepare_data()
    assert not encoded and not list((tmp_path / "prepared").glob(f"*/{MANIFEST}"))


def test_tsv_read_in_tiny_pieces_gives_the_same_records(tmp_path, monkeypatch):
    train = tmp_path / "train.tsv"
    lines = toy_lines(600, 4) + [" ".join(["plum"] * 400) + "\tfruit", "", "fig\tfruit"]  # a line of 2 KB
    train.write_bytes(("\ufeff" + "\r\n".join(lines)).encode("utf-8"))  # a byte-order mark, CRLF, no final break

    def prepared(folder: str) -> TextClassificationDataModule:
        data = tsv_module(train, tmp_path / folder, MIN_VOCAB_SIZE + 20)
        data.prepare_data()
        return data

    whole = prepared("whole")
    assert len(sources.line_pieces(train)) == 1
    monkeypatch.setattr("lightformer.data.pieces.PIECE_BYTES", 1024)
    assert len(sources.line_pieces(train)) > 10
    pieces = prepared("pieces")
    assert pieces.tokenizer.to_str() == whole.tokenizer.to_str()
    assert pieces.class_counts == whole.class_counts
    for split in SPLITS:
        assert records(pieces, split) == records(whole, split)
    texts = [whole.tokenizer.decode(ids) for split in SPLITS for ids, _ in records(whole, split)]
    assert sorted(texts) == sorted(line.rsplit("\t", 1)[0] for line in lines if line)


def test_preparing_twice_does_nothing_the_second_time(tmp_path, monkeypatch):
    files = write_toy(tmp_path / "toy")
    first = toy_module(files, tmp_path / "prepared")
    first.prepare_data()
    manifest = (first.prepared / MANIFEST).read_bytes()
    monkeypatch.setattr(classification, "scan_tsv", lambda *args: pytest.fail("prepared again"))
    again = toy_module(files, tmp_path / "prepared", max_tokens=16, batch_size=4, seed=3)
    again.prepare_data()
    assert again.prepared == first.prepared and (again.prepared / MANIFEST).read_bytes() == manifest
    assert again.tokenizer.to_str() == first.tokenizer.to_str() and again.class_counts == first.class_counts
    files["train"].write_text(files["train"].read_text(encoding="utf-8") + "one more plum\tfruit\n", encoding="utf-8")
    with pytest.raises(pytest.fail.Exception, match="prepared again"):  # a changed file is prepared again
        toy_module(files, tmp_path / "prepared").prepare_data()


@pytest.mark.parametrize(
    ("group", "fields", "message"),
    [
        (LoaderConfig, {"batch_size": 0}, r"data.loader.batch_size=0 must be at least 1"),
        (PrepareConfig, {"num_workers": 0}, r"data.prepare.num_workers=0 must be at least 1, or null for every core"),
        (PassageSource, {"passage_sentences": 0}, r"data.source.passage_sentences=0 must be at least 1"),
        (PassageSource, {"train_examples": 0}, r"data.source.train_examples=0 must be at least 1"),
        (PassageSource, {"corpus": "emma"}, r"data.source.corpus='emma' is not a built-in corpus; valid: 'austen'"),
        (PassageSource, {"tsv_files": ["x.tsv"]}, r"got both: set corpus to null to read tsv_files"),
        (PassageSource, {"corpus": None}, r"data.source needs exactly one source of labelled texts.*got neither"),
        (PassageSource, {"corpus": None, "tsv_files": []}, r"data.source.tsv_files is an empty list"),
        (PassageSource, {"val_tsv_files": ["v.tsv"]}, r"corpus='austen' has its own val/test split.*val_tsv_files"),
        (
            TextClassificationDataModule,
            {"tokenizer": {"vocab_size": 300}},
            rf"data.tokenizer.vocab_size=300 is too small.*least {MIN_VOCAB_SIZE}",
        ),
        (TokenizerConfig, {"file": "missing.json"}, r"data.tokenizer.file: the tokenizer file 'missing.json' does not"),
        (
            TextClassificationDataModule,
            {"tokenizer": TokenizerConfig(kind="char")},
            r"data.tokenizer.kind='char': TextClassificationDataModule prepares its text with kind 'bpe'",
        ),
        (
            TextClassificationDataModule,
            {"tokenizer": TokenizerConfig(kind="bpe", bpe_dropout=0.1)},
            r"data.tokenizer.bpe_dropout=0.1 applies to sentence pairs",
        ),
        (TextClassificationDataModule, {"max_tokens": 2}, r"data.max_tokens=2 must be at least 3"),
        (
            TextClassificationDataModule,
            {"loader": LoaderConfig(val_windows=4)},
            r"data.loader.val_windows=4 is for windows of text",
        ),
        (
            TextClassificationDataModule,
            {"source": PassageSource(corpus=None, tsv_files=["missing.tsv"])},
            r"data.source.tsv_files: the file 'missing.tsv' does not exist",
        ),
    ],
)
def test_options_are_checked_at_construction(group, fields, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        group(**fields)


# --- training through the command line -----------------------------------------------------------------------


def tiny_args(files: dict[str, Path], tmp_path: Path, *extra: str) -> list[str]:
    return [
        f"--config={CONFIG}",
        "--data.source.corpus=null",
        f"--data.source.tsv_files=[{files['train']}]",
        f"--data.source.val_tsv_files=[{files['val']}]",
        f"--data.source.test_tsv_files=[{files['test']}]",
        f"--data.tokenizer.vocab_size={MIN_VOCAB_SIZE + 20}",
        "--data.max_tokens=16",
        "--data.loader.batch_size=16",
        f"--data.prepare.dir={tmp_path / 'prepared'}",
        *(f"--model.net.{name}={value}" for name, value in TINY_NET.items()),
        "--model.optimizer.lr=3e-3",
        "--model.optimizer.warmup_steps=5",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.precision=32-true",
        "--trainer.max_time=null",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.log_every_n_steps=5",
        *extra,
    ]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One tiny fit on the toy TSV (4 epochs of 15 steps, a few seconds), then its test: the CLI objects and the
    last checkpoint."""
    tmp_path = tmp_path_factory.mktemp("fit")
    files = write_toy(tmp_path / "toy")
    fit = cli_main(["fit", *tiny_args(files, tmp_path, "--trainer.max_epochs=4")])
    checkpoint = Path(fit.trainer.checkpoint_callback.last_model_path)
    test = cli_main(["test", *tiny_args(files, tmp_path), f"--ckpt_path={checkpoint}"])
    return fit, test, checkpoint


def test_tiny_classifier_learns_and_logs(fitted):
    fit, test, _ = fitted
    metrics = fit.trainer.callback_metrics
    assert metrics["val/acc"] >= 0.9, f"val/acc {metrics['val/acc']:.3f} on two easily separable classes"
    assert metrics["val/f1"] >= 0.9 and metrics["val/loss"] < 0.4
    assert test.trainer.callback_metrics["test/acc"] >= 0.9 and test.trainer.callback_metrics["test/f1"] >= 0.9
    logged = EventAccumulator(fit.trainer.logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    logged.Reload()
    scalars = set(logged.Tags()["scalars"])
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "val/f1", "test/acc", "test/f1"} <= scalars
    (confusion,) = logged.Images("test/confusion_matrix")
    assert confusion.step == logged.Scalars("test/acc")[0].step
    assert fit.model.hparam_metrics == ("val/acc", "val/f1", "val/loss", "test/acc", "test/f1")


def test_checkpoint_carries_tokenizer_and_classes(fitted):
    fit, _, checkpoint = fitted
    raw = torch.load(checkpoint, weights_only=True)
    facts = raw["hyper_parameters"]["data_facts"]  # everything the data told the model
    assert (facts["class_names"], facts["max_length"]) == (["fruit", "metal"], 16)
    assert Tokenizer.from_str(facts["tokenizer"]).difference(fit.datamodule.tokenizer) is None
    assert raw["hyper_parameters"]["net"]["num_classes"] == 2
    task = TextClassificationTask.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    ranked = task.classify_texts(["plum cherry fig melon", "iron zinc copper tin lead"], top_k=5)
    assert [row[0][0] for row in ranked] == ["fruit", "metal"]
    assert len(ranked[0]) == 2 and abs(sum(p for _, p in ranked[0]) - 1) < 1e-5 and ranked[0][0][1] > 0.5
    assert task.max_tokens == 16 and task.class_names == ["fruit", "metal"]
    assert task.classify_texts(["apple " * 100])[0][0][0] == "fruit"  # cut to max_tokens
    assert (Path(fit.trainer.logger.log_dir) / "tokenizer.json").is_file()


def test_checkpoint_refuses_data_of_other_classes(fitted, tmp_path):
    fit, _, checkpoint = fitted
    files = write_toy(tmp_path / "toy")
    for path in files.values():  # the same texts and tokenizer, but the fruit are now called berries
        path.write_text(path.read_text(encoding="utf-8").replace("\tfruit", "\tberry"), encoding="utf-8")
    tokenizer_file = Path(fit.trainer.logger.log_dir) / "tokenizer.json"
    args = tiny_args(files, tmp_path, f"--data.tokenizer.file={tokenizer_file}", f"--ckpt_path={checkpoint}")
    refused = (
        r"the data differs from what the checkpoint's model was trained with \(the checkpoint's model vs the data: "
        r"class_names: \['fruit', 'metal'\] vs \['berry', 'metal'\]\)"
    )
    with pytest.raises(ValueError, match=refused):
        cli_main(["test", *args])


# --- fine-tuning from a masked-LM checkpoint ------------------------------------------------------------------


class WeightsAtStart(Callback):
    """The model's weights when fitting starts (after ``setup`` loaded ``init.checkpoint``)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        self.weights = {name: value.detach().clone() for name, value in pl_module.model.state_dict().items()}
        self.pretrained = set(pl_module.pretrained)


def pretraining_checkpoint(run_dir: Path, tokenizer: Tokenizer) -> tuple[Path, dict[str, torch.Tensor]]:
    """A masked-LM run's files as the pretraining task writes them: ``checkpoints/last.ckpt`` (a
    ``BertForPreTraining`` under ``model.``, its hyperparameters, the tokenizer JSON among their data facts) and
    ``tokenizer.json``."""
    torch.manual_seed(1)
    config = BertConfig(vocab_size=tokenizer.vocab_size, **TINY_NET)
    state = BertForPreTraining(config).state_dict()
    path = run_dir / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(
        {
            "state_dict": {f"model.{name}": value for name, value in state.items()},
            "hyper_parameters": {
                "net": asdict(config),
                "data_facts": DataFacts(
                    tokenizer=tokenizer.to_str(), vocab_size=tokenizer.vocab_size, pad_id=PAD_ID
                ).as_dict(),
            },
            "global_step": 10,
        },
        path,
    )
    tokenizer.save(run_dir / "tokenizer.json")
    return path, state


def test_fine_tuning_loads_the_encoder_and_refuses_another_tokenizer(tmp_path):
    files = write_toy(tmp_path / "toy")
    other_texts = ["Some other corpus entirely, with other words and other merges."] * 50
    pretraining_tokenizer = Tokenizer.train_bpe(other_texts, MIN_VOCAB_SIZE + 20, extra_special_tokens=[MASK])
    checkpoint, pretrained = pretraining_checkpoint(tmp_path / "mlm" / "version_0", pretraining_tokenizer)
    init = [f"--model.init.checkpoint={checkpoint}", "--trainer.max_steps=2", "--trainer.val_check_interval=2"]

    # the data's own BPE: its ids would stand for other tokens in the loaded weights
    with pytest.raises(ValueError) as refused:
        cli_main(["fit", *tiny_args(files, tmp_path, *init)])
    message = str(refused.value)
    assert f"model.init.checkpoint {checkpoint} was trained with another tokenizer" in message
    assert re.search(r"another tokenizer than the data's \(checkpoint vs data: bpe tokenizer of \d+ tokens vs bpe "
                     r"tokenizer of \d+ tokens; id \d+ is .* in the first, .* in the second\)", message)  # fmt: skip
    assert f"data.init_args.tokenizer.file={tmp_path / 'mlm' / 'version_0' / 'tokenizer.json'}" in message

    # with the pretraining run's tokenizer: the encoder and pooler are loaded, the classifier is new
    probe = WeightsAtStart()
    tokenizer_file = tmp_path / "mlm" / "version_0" / "tokenizer.json"
    cli = cli_main(tiny_args(files, tmp_path, *init, f"--data.tokenizer.file={tokenizer_file}"), run=False)
    cli.trainer.callbacks.insert(0, probe)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    shared = {name for name in pretrained if name.startswith(("bert.", "pooler."))}
    assert shared and shared <= set(probe.weights) and probe.pretrained == shared
    for name in shared:
        assert torch.equal(probe.weights[name], pretrained[name]), name
    new = set(probe.weights) - set(pretrained)
    assert new == {"classifier.weight", "classifier.bias"}
    assert cli.trainer.global_step == 2
    saved = torch.load(cli.trainer.checkpoint_callback.last_model_path, weights_only=True)
    assert (
        Tokenizer.from_str(saved["hyper_parameters"]["data_facts"]["tokenizer"]).difference(pretraining_tokenizer)
        is None
    )


def test_pretraining_split_by_novel_reads_no_passage_the_classifier_is_tested_on(passages):
    """configs/mlm/austen.yaml cuts val and test from the end of each novel (split="each_file"), so the pretrained
    encoder has read most of every novel's training passages and none of its test passages; cut from the end of the
    whole text, it would read the test passages of the first novels and little of Persuasion."""
    examples = passages

    def read_by_pretraining(split: str) -> tuple[float, float]:
        source = TextSource(
            corpus="austen", data_root=str(REPO / "data"), val_fraction=0.1, test_fraction=0.1, split=split
        )
        text = " ".join(
            "".join(t for piece in source.pieces(source_files(source))["train"] for t in read_piece(piece)).split()
        )
        return tuple(np.mean([passage in text for passage, _, _ in examples[name]]) for name in ("train", "test"))

    train_read, test_read = read_by_pretraining("each_file")
    assert train_read > 0.85 and test_read == 0
    train_read, test_read = read_by_pretraining("end")
    assert test_read > 0.3


def test_train_examples_labels_a_fixed_subset_of_the_training_passages(austen, passages):
    source = PassageSource(data_root=str(REPO / "data"), train_examples=100)
    few = TextClassificationDataModule(source, prepare=austen.prepare_config, seed=1)
    again = TextClassificationDataModule(source, prepare=austen.prepare_config, seed=2)
    chosen = few.dataset("train").indices
    assert chosen == again.dataset("train").indices and len(chosen) == 100  # the same labels whatever the seed
    assert chosen == sorted(set(chosen)) and max(chosen) < len(passages["train"])
    train = passages["train"]
    assert [label for _, label in records(few, "train")] == [train[i][1] for i in chosen]
    first = train[chosen[0]][0]
    assert records(few, "train")[0][0] == few.tokenizer.encode(first, add_bos=True, add_eos=True)
    assert sum(few.class_counts["train"].values()) == 100 and all(few.class_counts["train"].values())
    assert (
        few.class_counts["val"] == austen.class_counts["val"]
        and few.class_counts["test"] == austen.class_counts["test"]
    )
    assert records(few, "test") != records(austen, "test")  # its BPE is trained on the 100 chosen passages only
