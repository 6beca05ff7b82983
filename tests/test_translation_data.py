"""TranslationDataModule: Ding extraction and split, token-budget batching (single and multi-rank), collation,
tokenizers, the prepared folder and error messages. Small corpora are written to tmp_path; the Ding tests read the
installed dictionary and are skipped without it."""

from __future__ import annotations

import itertools
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.data import _update_dataloader
from torch.utils.data import BatchSampler
from torch.utils.data.distributed import DistributedSampler

from lightformer.data import pieces as sources
from lightformer.data.families.pairs import PairBatches, TranslationDataModule
from lightformer.data.loading.sampling import TokenBudgetBatchSampler
from lightformer.data.loading.sequences import collate_pairs
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig
from lightformer.data.sources.corpora import (
    DING_FILE,
    CorpusUnavailableError,
    clean_ding_entry,
    extract_ding_pairs,
    is_sentence,
    split_bucket,
    split_of,
)
from lightformer.data.sources.pairs import PairSource
from lightformer.tokenization.text import BOS_ID, EOS_ID, PAD_ID, Tokenizer

needs_ding = pytest.mark.skipif(
    not Path(DING_FILE).is_file(), reason=f"the Ding dictionary {DING_FILE} is absent (apt-get install trans-de-en)"
)

NOUNS = [("Hund", "dog"), ("Katze", "cat"), ("Straße", "street"), ("Brücke", "bridge"), ("Bäcker", "baker")]
ADJECTIVES = [("große", "big"), ("kleine", "small"), ("müde", "tired"), ("grüne", "green")]
VERBS = [("schläft", "sleeps"), ("wartet", "waits"), ("läuft", "runs"), ("singt „laut“", "sings “loudly”")]


def make_pairs(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """Distinct German-like / English-like sentence pairs of varying length."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(count):
        (de_noun, en_noun), (de_adj, en_adj), (de_verb, en_verb) = (
            NOUNS[rng.integers(len(NOUNS))],
            ADJECTIVES[rng.integers(len(ADJECTIVES))],
            VERBS[rng.integers(len(VERBS))],
        )
        repeat = int(rng.integers(0, 6))
        pairs.append(
            (
                f"Die {de_adj} {de_noun} Nummer {i} {de_verb}" + " und wartet" * repeat + ".",
                f"The {en_adj} {en_noun} number {i} {en_verb}" + " and waits" * repeat + ".",
            )
        )
    return pairs


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{src}\t{tgt}\n" for src, tgt in pairs), encoding="utf-8")
    return path


@pytest.fixture
def tsv(tmp_path) -> Path:
    return write_tsv(tmp_path / "pairs.tsv", make_pairs(300))


def make_module(
    tmp_path: Path, tokenizer: dict | None = None, batches: dict | None = None, **source
) -> TranslationDataModule:
    """A module of the source fields ``source`` with a small vocabulary and budget, prepared under tmp_path."""
    return TranslationDataModule(
        source=PairSource(**source),
        tokenizer=TokenizerConfig(**{"kind": "bpe", "vocab_size": 300, **(tokenizer or {})}),
        batches=PairBatches(**{"max_tokens": 256, "max_sentence_tokens": 64, **(batches or {})}),
        prepare=PrepareConfig(dir=str(tmp_path / "prepared")),
    )


def column(dataset, key: str) -> list:
    """Every item's `key` of a prepared dataset, in order: texts, or ids as lists."""
    items = dataset.__getitems__(list(range(len(dataset))))
    return [item[key] if isinstance(item[key], str) else item[key].tolist() for item in items]


def pairs_of(module: TranslationDataModule) -> dict[str, list[tuple[str, str]]]:
    """Each split's (first side, second side) texts of a de-en module, in order."""
    module.setup()
    return {
        split: list(zip(column(dataset, "src_text"), column(dataset, "tgt_text"), strict=True))
        for split, dataset in module.datasets.items()
    }


def read_sources(module: TranslationDataModule) -> int:
    """Make the module read its sources (what the command line does when it hands the data's facts to the task)."""
    return module.data_facts().src_vocab_size


# --- Ding: extraction rules on small inputs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "cleaned"),
    [
        ("Aal {m} (auf der Speisekarte) [cook.]", "Aal"),
        ("Er scheint (sehr) krank zu sein.", "Er scheint krank zu sein."),
        ("to seek {sought; sought} sth. (from sb.)", "to seek sth."),
        ("Benimm dich!; Benehmen Sie sich!", "Benimm dich!"),
        ("Entschuldigung, ich verstehe nicht. /SIDU/", "Entschuldigung, ich verstehe nicht."),
        ("Life’s no beach. [fig.]", "Life’s no beach."),
        ("Mein Name ist Hase (, ich weiß von nichts).", "Mein Name ist Hase."),
        ("Wort (mit (innerer) Klammer) hier <Variante>", "Wort hier"),
        (" {m}; Ersatz ", "Ersatz"),
    ],
)
def test_clean_ding_entry_strips_annotations_and_keeps_the_first_synonym(entry, cleaned):
    assert clean_ding_entry(entry) == cleaned


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Das ist gut.", True),
        ("Wo ist das Haus?", True),
        ("Komm sofort her!", True),
        ("das ist gut.", False),  # no capital
        ("Das ist gut", False),  # no final punctuation
        ("Gut gemacht!", False),  # two words
        ("Am Ende/zuletzt gab sie nach.", False),  # alternatives
        ("Dem steht entgegen, dass …", False),  # elision
        ("Er gibt jdm. etw. zurück.", False),  # placeholders
    ],
)
def test_is_sentence(text, expected):
    assert is_sentence(text) is expected


def test_extract_ding_pairs_aligns_sub_entries_and_deduplicates(tmp_path):
    ding = tmp_path / "de-en"
    ding.write_text(
        "# Version :: test\n"
        "Haus {n} | Das Haus ist groß. | Wo ist das Haus? :: house | The house is big. | Where is the house?\n"
        "Er kam zurück. | Sie ging. :: He came back.\n"  # 2 German sub-entries, 1 English: skipped
        "Es regnet heute sehr stark. [ugs.] :: It is raining very hard today. [coll.]\n"
        "Es regnet heute sehr stark. :: It is raining very hard today.\n"  # duplicate after cleaning
        "Nein. :: No.\n",
        encoding="utf-8",
    )
    sentences, phrases, counts = extract_ding_pairs(ding)
    assert sentences == [
        ("Das Haus ist groß.", "The house is big."),
        ("Wo ist das Haus?", "Where is the house?"),
        ("Es regnet heute sehr stark.", "It is raining very hard today."),
    ]
    assert phrases == [("Haus", "house"), ("Nein.", "No.")]
    assert counts["misaligned_lines"] == 1 and counts["entry_lines"] == 5


def synthetic_ding(path: Path, count: int = 200) -> tuple[Path, set[str]]:
    """A Ding-format file of `count` sentence pairs, word pairs, and phrase pairs whose German side repeats a
    sentence (English not a sentence); returns the file and the German sentences that are in val or test."""
    lines, held_out = [], set()
    for i in range(count):
        german = f"Der Hund Nummer {i} schläft."
        lines.append(f"Hund {{m}} | {german} :: dog | Dog number {i} sleeps.")
        if split_of(german) != "train":
            held_out.add(german)
        lines.append(f"{german} :: dog {i} asleep")  # a phrase pair (English side is no sentence)
    lines.append("Katze {f} [zool.] :: cat")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, held_out


def test_ding_phrases_are_added_to_train_only_without_held_out_german(tmp_path):
    ding, held_out = synthetic_ding(tmp_path / "de-en")
    assert held_out, "the synthetic corpus needs val/test sentences"
    plain = make_module(tmp_path, corpus="ding", ding_file=str(ding))
    plain.setup()
    with_phrases = make_module(tmp_path, corpus="ding", ding_file=str(ding), ding_phrases=True)
    with_phrases.setup()
    train = set(pairs_of(with_phrases)["train"])
    assert {("Hund", "dog"), ("Katze", "cat")} <= train
    assert not held_out & {german for german, _ in train}
    assert with_phrases.stats["phrase_pairs_held_out"] == len(held_out)
    phrase_count = 2 + 200 - len(held_out)
    assert with_phrases.stats["train_phrase_pairs"] == phrase_count
    assert len(with_phrases.datasets["train"]) == len(plain.datasets["train"]) + phrase_count
    for split in ("val", "test"):
        assert column(with_phrases.datasets[split], "src_text") == column(plain.datasets[split], "src_text")
        assert all(is_sentence(text) for text in column(with_phrases.datasets[split], "src_text"))

    repeated = make_module(tmp_path, corpus="ding", ding_file=str(ding), ding_phrases=True, sentence_repeats=3)
    repeated.setup()
    train = repeated.datasets["train"]
    assert len(train) == 3 * len(plain.datasets["train"]) + phrase_count
    pairs = list(zip(column(train, "src_text"), column(train, "tgt_text"), strict=True))
    sentences = pairs_of(plain)["train"]
    assert all(pairs.count(pair) == 3 for pair in sentences)
    assert column(repeated.datasets["val"], "src_text") == column(plain.datasets["val"], "src_text")


def test_ding_extraction_is_deterministic(tmp_path):
    ding, _ = synthetic_ding(tmp_path / "de-en")
    if Path(DING_FILE).is_file():  # an excerpt of the real dictionary, in tmp_path only (GPL: not in the repo)
        with open(DING_FILE, encoding="utf-8") as f:
            ding.write_text("".join(itertools.islice(f, 20_000)), encoding="utf-8")
    first = make_module(tmp_path / "a", corpus="ding", ding_file=str(ding))
    second = make_module(tmp_path / "b", corpus="ding", ding_file=str(ding))
    first.setup("test")
    second.setup("test")
    assert pairs_of(first) == pairs_of(second)
    assert column(first.datasets["test"], "src_text") == column(second.datasets["test"], "src_text")
    assert first.src_tokenizer.to_str() == second.src_tokenizer.to_str()


def test_missing_ding_file_says_how_to_install_it(tmp_path):
    module = make_module(tmp_path, corpus="ding", ding_file=str(tmp_path / "nowhere" / "de-en"))
    with pytest.raises(CorpusUnavailableError, match=r"apt-get install trans-de-en") as error:
        read_sources(module)
    assert str(tmp_path / "nowhere" / "de-en") in str(error.value)


# --- Ding: the real dictionary ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ding(tmp_path_factory) -> TranslationDataModule:
    if not Path(DING_FILE).is_file():
        pytest.skip(f"the Ding dictionary {DING_FILE} is absent (apt-get install trans-de-en)")
    module = TranslationDataModule(
        PairSource(corpus="ding"),
        TokenizerConfig(kind="bpe", vocab_size=1000),
        prepare=PrepareConfig(dir=str(tmp_path_factory.mktemp("ding-prepared"))),
    )
    module.setup()
    return module


@needs_ding
def test_ding_split_sizes_match_data_md(ding):
    # DATA.md: about 17,000 unique pairs of about 7.5 words; 15,100 / 870 / 870 with the md5 split.
    for split, expected in (("train", 15_100), ("val", 870), ("test", 870)):
        assert abs(len(ding.datasets[split]) - expected) <= 0.05 * expected, (split, len(ding.datasets[split]))
        assert ding.stats[f"{split}_pairs"] == len(ding.datasets[split])
    assert 7.0 <= ding.stats["train_german_words_per_sentence"] <= 8.0
    assert ding.stats["train_dropped_too_long"] == 0


@needs_ding
def test_ding_splits_follow_the_md5_buckets_of_the_german_sentence(ding):
    german = {split: column(ding.datasets[split], "src_text") for split in ("train", "val", "test")}
    assert all(split_bucket(sentence) < 5 for sentence in german["test"])
    assert all(5 <= split_bucket(sentence) < 10 for sentence in german["val"])
    assert all(split_bucket(sentence) >= 10 for sentence in german["train"])
    assert not set(german["train"]) & set(german["val"])
    assert not set(german["train"]) & set(german["test"])
    assert not set(german["val"]) & set(german["test"])
    pairs = list(zip(german["train"], column(ding.datasets["train"], "tgt_text"), strict=True))
    assert len(set(pairs)) == len(pairs)  # deduplicated
    assert all(is_sentence(text) for text in column(ding.datasets["test"], "tgt_text"))


@needs_ding
def test_ding_en_de_swaps_sides(ding):
    reverse = TranslationDataModule(
        PairSource(corpus="ding", direction="en-de"),
        TokenizerConfig(kind="bpe", vocab_size=1000),
        prepare=ding.prepare_config,
    )  # the same folder: the pairs and the joint tokenizer serve both directions
    reverse.setup("test")
    assert reverse.prepared == ding.prepared
    assert column(reverse.datasets["test"], "src_text") == column(ding.datasets["test"], "tgt_text")
    assert column(reverse.datasets["test"], "tgt_text") == column(ding.datasets["test"], "src_text")
    assert reverse.src_tokenizer.to_str() == ding.tgt_tokenizer.to_str()
    batch = next(iter(reverse.test_dataloader()))
    assert reverse.src_tokenizer.decode(batch["src"][0]) == batch["src_text"][0]


# --- the token-budget batch sampler -----------------------------------------------------------------------------


def random_lengths(count: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 60, size=count)


def test_batches_stay_within_the_budget_and_cover_every_example_once():
    lengths = random_lengths()
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert all(len(batch) * lengths[batch].max() <= 200 for batch in batches)
        assert sorted(itertools.chain.from_iterable(batches)) == list(range(len(lengths)))


def test_batches_differ_between_epochs_and_repeat_for_the_same_seed():
    lengths = random_lengths()
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, seed=3)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch0 != epoch1
    assert sorted(map(sorted, epoch0)) != sorted(map(sorted, epoch1))  # different groups, not just another order
    again = TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, seed=3)
    assert list(again) == epoch0
    again.set_epoch(1)
    assert list(again) == epoch1
    assert list(TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, seed=4)) != epoch0


def test_evaluation_batches_are_sorted_by_length_and_fixed():
    lengths = random_lengths()
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=200)
    batches = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) == batches
    flat = list(itertools.chain.from_iterable(batches))
    assert np.all(np.diff(lengths[flat]) >= 0)


def test_an_example_longer_than_the_budget_gets_its_own_batch():
    sampler = TokenBudgetBatchSampler([3, 50, 3], max_tokens=10)
    assert list(sampler) == [[0, 2], [1]]


@pytest.mark.parametrize(("num_replicas", "count"), [(2, 1000), (2, 997), (3, 1000), (4, 50)])
def test_ranks_get_disjoint_batches_of_equal_number(num_replicas, count):
    lengths = random_lengths(count, seed=count)
    single = TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, seed=1)
    ranks = [
        TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, seed=1, num_replicas=num_replicas, rank=r)
        for r in range(num_replicas)
    ]
    for epoch in range(2):
        for sampler in ranks:
            sampler.set_epoch(epoch)
        batches = [list(sampler) for sampler in ranks]
        assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(ranks[0]) > 0
        indices = [list(itertools.chain.from_iterable(b)) for b in batches]
        assert sorted(itertools.chain.from_iterable(indices)) == list(range(count))  # disjoint and complete
        assert all(len(batch) * lengths[batch].max() <= 200 for b in batches for batch in b)
    assert len(single) <= len(ranks[0]) * num_replicas < len(single) + num_replicas


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_blocks_give_each_epoch_one_block_in_as_many_batches(num_replicas):
    size, blocks = 400, 3
    lengths = np.concatenate([random_lengths(size, seed=block) for block in range(blocks)])
    ranks = [
        TokenBudgetBatchSampler(lengths, 200, shuffle=True, seed=1, num_replicas=num_replicas, rank=r, blocks=blocks)
        for r in range(num_replicas)
    ]
    counts = [len(TokenBudgetBatchSampler(lengths[b * size : (b + 1) * size], 200)) for b in range(blocks)]
    assert len(set(counts)) > 1  # the blocks group into different numbers of batches ...
    for epoch in range(2 * blocks):
        for sampler in ranks:
            sampler.set_epoch(epoch)
        batches = [list(sampler) for sampler in ranks]
        assert [len(b) for b in batches] == [len(ranks[0])] * num_replicas  # ... yet every epoch has as many
        assert len(ranks[0]) * num_replicas >= max(counts)
        block = epoch % blocks
        indices = sorted(itertools.chain.from_iterable(itertools.chain.from_iterable(batches)))
        assert indices == list(range(block * size, (block + 1) * size))
        assert all(len(batch) * lengths[batch].max() <= 200 for b in batches for batch in b)


def test_blocks_must_divide_the_examples():
    with pytest.raises(ValueError, match="blocks=3 must be at least 1 and divide the 10 examples"):
        TokenBudgetBatchSampler(np.ones(10), 100, blocks=3)


def test_ranks_and_epoch_come_from_an_injected_distributed_sampler():
    lengths = random_lengths()
    explicit = TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, num_replicas=2, rank=1)
    explicit.set_epoch(4)
    distributed = DistributedSampler(range(len(lengths)), num_replicas=2, rank=1)
    injected = TokenBudgetBatchSampler(lengths, max_tokens=200, shuffle=True, sampler=distributed)
    distributed.set_epoch(4)  # what Lightning's loops do: batch_sampler.sampler.set_epoch
    assert injected.replicas() == (2, 1)
    assert list(injected) == list(explicit)


def test_fewer_examples_than_ranks_still_gives_each_rank_a_batch():
    ranks = [TokenBudgetBatchSampler([5, 6], max_tokens=100, num_replicas=3, rank=r) for r in range(3)]
    assert [len(list(sampler)) for sampler in ranks] == [1, 1, 1]


def test_lightning_sets_the_epoch_and_can_inject_a_distributed_sampler(tmp_path, tsv):
    module = make_module(tmp_path, tsv_files=[str(tsv)])
    loader = module.train_dataloader()
    assert isinstance(loader.batch_sampler, BatchSampler)
    _set_sampler_epoch(loader, 7)  # what Lightning's fit loop calls each epoch
    assert loader.batch_sampler.epoch == 7
    # With use_distributed_sampler=True, Lightning rebuilds the batch sampler with a DistributedSampler.
    from lightning.pytorch.trainer.connectors.data_connector import _request_dataloader

    class Source:
        def dataloader(self):
            return module.train_dataloader()

    captured = _request_dataloader(Source())
    distributed = DistributedSampler(captured.dataset, num_replicas=2, rank=1, shuffle=True)
    rebuilt = _update_dataloader(captured, distributed, mode=RunningStage.TRAINING)
    assert isinstance(rebuilt.batch_sampler, TokenBudgetBatchSampler)
    assert rebuilt.batch_sampler.replicas() == (2, 1)
    assert len(rebuilt) == len(rebuilt.batch_sampler) == -(-len(loader) // 2)


# --- collation and the module's batches -------------------------------------------------------------------------


def test_pad_collator_pads_and_keeps_texts():
    items = [
        {
            "src": torch.tensor([5, 6, EOS_ID]),
            "tgt": torch.tensor([BOS_ID, 7, EOS_ID]),
            "src_text": "a",
            "tgt_text": "b",
        },
        {"src": np.array([8, EOS_ID]), "tgt": np.array([BOS_ID, 9, 10, 11, EOS_ID]), "src_text": "c", "tgt_text": "d"},
    ]
    batch = collate_pairs(items, pad_id=PAD_ID)
    assert batch["src"].dtype == batch["tgt"].dtype == torch.int64
    assert batch["src"].tolist() == [[5, 6, EOS_ID], [8, EOS_ID, PAD_ID]]
    assert batch["tgt"].tolist() == [[BOS_ID, 7, EOS_ID, PAD_ID, PAD_ID], [BOS_ID, 9, 10, 11, EOS_ID]]
    assert batch["src_text"] == ["a", "c"] and batch["tgt_text"] == ["b", "d"]


def test_batches_frame_source_and_target_and_keep_the_texts(tmp_path, tsv):
    module = make_module(tmp_path, tsv_files=[str(tsv)])
    module.setup("fit")
    for split, loader in (("train", module.train_dataloader()), ("val", module.val_dataloader())):
        seen = []
        for batch in loader:
            src, tgt = batch["src"], batch["tgt"]
            assert src.shape[0] == tgt.shape[0] == len(batch["src_text"]) == len(batch["tgt_text"])
            assert src.numel() <= module.batches.max_tokens and tgt.numel() <= module.batches.max_tokens
            src_lengths, tgt_lengths = (src != PAD_ID).sum(1), (tgt != PAD_ID).sum(1)
            assert src_lengths.max() == src.shape[1] and tgt_lengths.max() == tgt.shape[1]
            for row in range(src.shape[0]):
                s, t = src[row, : src_lengths[row]], tgt[row, : tgt_lengths[row]]
                assert s[-1] == EOS_ID and BOS_ID not in s.tolist() and (src[row, src_lengths[row] :] == PAD_ID).all()
                assert t[0] == BOS_ID and t[-1] == EOS_ID and (tgt[row, tgt_lengths[row] :] == PAD_ID).all()
                assert module.src_tokenizer.decode(s) == batch["src_text"][row]
                assert module.tgt_tokenizer.decode(t) == batch["tgt_text"][row]
            seen += batch["src_text"]
        assert sorted(seen) == sorted(column(module.datasets[split], "src_text"))


def test_long_train_pairs_are_dropped_and_long_eval_pairs_cut(tmp_path):
    pairs = make_pairs(300)
    pairs += [(f"Ein sehr langer Satz Nummer {i} " + "und noch mehr " * 30 + ".", "A long one.") for i in range(40)]
    module = make_module(
        tmp_path, tsv_files=[str(write_tsv(tmp_path / "long.tsv", pairs))], batches={"max_sentence_tokens": 40}
    )
    module.setup()
    tokenizer = module.src_tokenizer  # joint

    def too_long(pair: tuple[str, str]) -> bool:
        return len(tokenizer.encode(pair[0])) + 1 > 40 or len(tokenizer.encode(pair[1])) + 2 > 40

    train = [pair for pair in pairs if split_of(pair[0]) == "train"]
    assert module.stats["train_dropped_too_long"] == sum(map(too_long, train)) >= 30
    assert set(column(module.datasets["train"], "src_text")) == {src for src, tgt in train if not too_long((src, tgt))}
    assert module.datasets["train"].lengths.max() <= 40
    for split in ("val", "test"):
        dataset = module.datasets[split]
        expected = [pair for pair in pairs if split_of(pair[0]) == split]
        assert pairs_of(module)[split] == expected  # all kept, texts whole
        assert module.stats[f"{split}_truncated"] == sum(map(too_long, expected))
        assert dataset.lengths.max() <= 40
        for i in range(len(dataset)):
            assert dataset[i]["src"][-1] == EOS_ID and dataset[i]["tgt"][-1] == EOS_ID
    assert module.stats["val_truncated"] + module.stats["test_truncated"] > 0


def test_tokenizers_and_sizes_exist_right_after_construction(tmp_path, tsv):
    module = make_module(tmp_path, tsv_files=[str(tsv)])
    assert module.src_tokenizer is module.tgt_tokenizer
    facts = module.data_facts()
    assert facts.src_tokenizer == facts.tgt_tokenizer == module.src_tokenizer.to_str()
    assert facts.src_vocab_size == facts.tgt_vocab_size == module.src_tokenizer.vocab_size <= 300
    assert facts.pad_id == PAD_ID == 0
    assert "tokenizer" in module.hparams and "vocab_size" not in module.hparams


@pytest.mark.parametrize("joint_vocab", [True, False])
def test_joint_and_separate_vocabularies_round_trip(tmp_path, tsv, joint_vocab):
    module = make_module(tmp_path, tsv_files=[str(tsv)], tokenizer={"joint_vocab": joint_vocab})
    module.setup("fit")
    assert (module.src_tokenizer is module.tgt_tokenizer) is joint_vocab
    if not joint_vocab:
        assert module.src_tokenizer.to_str() != module.tgt_tokenizer.to_str()
        # Each side's BPE learned its own language: German words encode shorter with the source tokenizer.
        german = "Die müde Straße wartet."
        assert len(module.src_tokenizer.encode(german)) < len(module.tgt_tokenizer.encode(german))
    dataset = module.datasets["train"]
    for text in column(dataset, "src_text")[:50] + ["Grüße, “Anführungszeichen” – 10 € ✓"]:
        assert module.src_tokenizer.decode(module.src_tokenizer.encode(text)) == text
    for text in column(dataset, "tgt_text")[:50]:
        assert module.tgt_tokenizer.decode(module.tgt_tokenizer.encode(text)) == text


def test_prepared_folder_is_reused_and_follows_the_files(tmp_path, tsv, monkeypatch):
    first = make_module(tmp_path, tsv_files=[str(tsv)])
    first.setup()
    created = (first.prepared / "prepared.json").stat().st_mtime_ns

    def no_preparing(self, folder):
        raise AssertionError("the folder should be prepared already")

    monkeypatch.setattr(TranslationDataModule, "_build", no_preparing)
    second = make_module(tmp_path, tsv_files=[str(tsv)])
    second.setup()
    assert second.prepared == first.prepared
    assert (second.prepared / "prepared.json").stat().st_mtime_ns == created
    assert second.src_tokenizer.to_str() == first.src_tokenizer.to_str()
    assert column(second.datasets["val"], "src_text") == column(first.datasets["val"], "src_text")
    assert second.stats == first.stats
    assert list(second.train_dataloader().batch_sampler) == list(first.train_dataloader().batch_sampler)
    write_tsv(tsv, make_pairs(300, seed=1))  # new content: a new fingerprint, so a new folder is prepared
    with pytest.raises(AssertionError, match="should be prepared already"):
        read_sources(make_module(tmp_path, tsv_files=[str(tsv)]))


def test_a_half_written_folder_is_prepared_again(tmp_path, tsv):
    first = make_module(tmp_path, tsv_files=[str(tsv)])
    expected = pairs_of(first)
    (first.prepared / "prepared.json").unlink()  # what a killed preparation leaves
    (first.prepared / "val" / "index.json").unlink()
    again = make_module(tmp_path, tsv_files=[str(tsv)])
    assert pairs_of(again) == expected and again.prepared == first.prepared


def test_bpe_dropout_trains_on_a_new_segmentation_each_epoch(tmp_path, tsv):
    module = make_module(tmp_path, tsv_files=[str(tsv)], tokenizer={"bpe_dropout": 0.1, "bpe_dropout_segmentations": 3})
    module.setup("fit")
    plain = make_module(tmp_path, tsv_files=[str(tsv)])
    plain.setup("fit")
    train, size = module.datasets["train"], len(plain.datasets["train"])
    assert len(train) == 3 * size and column(train, "src_text") == column(plain.datasets["train"], "src_text") * 3
    assert column(module.datasets["val"], "src") == column(plain.datasets["val"], "src")  # plain BPE there
    tokenizer = module.src_tokenizer  # joint
    src_ids, src_texts = column(train, "src"), column(train, "src_text")
    for ids, text in zip(src_ids, src_texts, strict=True):
        assert tokenizer.decode(ids) == text
    for ids, text in zip(column(train, "tgt"), column(train, "tgt_text"), strict=True):
        assert tokenizer.decode(ids) == text
    segmentations = [[src_ids[k * size + i] for k in range(3)] for i in range(size)]
    assert sum(len(set(map(tuple, versions))) > 1 for versions in segmentations) > size // 2
    # dropout splits words into more tokens
    assert train.src_lengths.sum() > 3 * plain.datasets["train"].src_lengths.sum()

    loader = module.train_dataloader()
    for epoch in range(4):
        _set_sampler_epoch(loader, epoch)
        batches = list(loader)
        assert len(batches) == len(loader)
        texts = [text for batch in batches for text in batch["src_text"]]
        assert sorted(texts) == sorted(column(plain.datasets["train"], "src_text"))  # every pair once an epoch
        block = epoch % 3
        block_of = slice(block * size, (block + 1) * size)
        expected = dict(zip(src_texts[block_of], src_ids[block_of], strict=True))
        for batch in batches:
            for row, text in enumerate(batch["src_text"]):
                ids = batch["src"][row].tolist()
                assert ids[: len(expected[text])] == expected[text]

    again = make_module(
        tmp_path / "elsewhere", tsv_files=[str(tsv)], tokenizer={"bpe_dropout": 0.1, "bpe_dropout_segmentations": 3}
    )
    again.setup("fit")  # drawn afresh in another folder: the same segmentations
    assert column(again.datasets["train"], "src") == src_ids
    assert column(again.datasets["train"], "tgt") == column(train, "tgt")


# --- file sources and their splits --------------------------------------------------------------------------------


def test_files_are_split_by_the_md5_bucket_of_the_source(tmp_path, tsv):
    module = make_module(tmp_path, tsv_files=[str(tsv)])
    module.setup()
    for split in ("train", "val", "test"):
        assert all(split_of(src) == split for src in column(module.datasets[split], "src_text"))
    assert sum(len(module.datasets[split]) for split in ("train", "val", "test")) == 300


def test_explicit_val_files_leave_only_test_to_the_buckets(tmp_path, tsv):
    val = write_tsv(tmp_path / "val.tsv", make_pairs(20, seed=9))
    module = make_module(tmp_path, tsv_files=[str(tsv)], val_tsv_files=[str(val)])
    module.setup()
    assert column(module.datasets["val"], "src_text") == [src for src, _ in make_pairs(20, seed=9)]
    assert all(split_of(src) == "test" for src in column(module.datasets["test"], "src_text"))
    assert len(module.datasets["train"]) + len(module.datasets["test"]) == 300


def test_line_aligned_files_give_the_same_pairs_as_tsv(tmp_path, tsv):
    pairs = make_pairs(300)
    src, tgt = tmp_path / "train.de", tmp_path / "train.en"
    src.write_text("\n".join(s for s, _ in pairs) + "\n\n", encoding="utf-8")  # a blank pair: skipped
    tgt.write_text("\n".join(t for _, t in pairs) + "\n\n", encoding="utf-8")
    parallel = make_module(tmp_path, src_file=str(src), tgt_file=str(tgt))
    from_tsv = make_module(tmp_path, tsv_files=[str(tsv)])
    assert pairs_of(parallel) == pairs_of(from_tsv)
    assert parallel.stats["train_skipped_empty"] == 1


def test_small_pieces_give_the_same_pairs_as_one_piece(tmp_path, tsv, monkeypatch):
    pairs = make_pairs(300)
    src, tgt = tmp_path / "train.de", tmp_path / "train.en"
    src.write_text("".join(f"{s}\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(f"{t}\n" for _, t in pairs), encoding="utf-8")
    whole = {kind: make_module(tmp_path / "whole", **kwargs) for kind, kwargs in file_sources(tsv, src, tgt).items()}
    expected = {kind: pairs_of(module) for kind, module in whole.items()}
    assert expected["tsv"] == expected["parallel"]
    monkeypatch.setattr(sources, "PIECE_BYTES", 1024)
    pieces = make_module(tmp_path / "pieces", tsv_files=[str(tsv)])._pieces("train")
    assert len(pieces) >= 10 and all(piece.weight <= 1024 + 200 for piece in pieces)
    aligned = make_module(tmp_path / "pieces", src_file=str(src), tgt_file=str(tgt))._pieces("train")
    assert len(aligned) >= 10 and all(piece.src.weight <= 1024 + 200 for piece in aligned)
    for kind, kwargs in file_sources(tsv, src, tgt).items():
        module = make_module(tmp_path / "pieces", **kwargs)
        assert pairs_of(module) == expected[kind]
        assert module.stats == whole[kind].stats


def test_tokenizers_train_on_a_bounded_sample_of_large_files(tmp_path, tsv, monkeypatch):
    sampled = []
    train_bpe = Tokenizer.train_bpe.__func__

    def recording(cls, texts, *args, **kwargs):
        texts = list(texts)
        sampled.append(sum(len(text.encode("utf-8")) for text in texts))
        return train_bpe(cls, texts, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "train_bpe", classmethod(recording))
    monkeypatch.setattr(sources, "PIECE_BYTES", 2048)
    module = make_module(tmp_path, tokenizer={"sample_bytes": 4096}, tsv_files=[str(tsv)])
    assert sum(map(len, pairs_of(module).values())) == 300  # every pair prepared
    assert 0 < sampled[0] <= 4096 < tsv.stat().st_size


def file_sources(tsv: Path, src: Path, tgt: Path) -> dict[str, dict]:
    return {"tsv": {"tsv_files": [str(tsv)]}, "parallel": {"src_file": str(src), "tgt_file": str(tgt)}}


def test_tsv_globs_and_extra_columns(tmp_path):
    pairs = make_pairs(60)
    (tmp_path / "parts").mkdir()
    write_tsv(tmp_path / "parts" / "a.tsv", pairs[:30])
    (tmp_path / "parts" / "b.tsv").write_text(
        "".join(f"{s}\t{t}\tCC-BY 2.0 (France) Attribution\n" for s, t in pairs[30:]), encoding="utf-8"
    )
    module = make_module(tmp_path, tsv_files=[str(tmp_path / "parts" / "*.tsv")])
    found = [pair for split in ("train", "val", "test") for pair in pairs_of(module)[split]]
    assert sorted(found) == sorted(pairs)


# --- errors name the offending file, field or value ---------------------------------------------------------------


def test_missing_files_and_empty_globs_are_named(tmp_path):
    missing = tmp_path / "missing.tsv"
    with pytest.raises(FileNotFoundError, match=r"tsv_files: the file .*missing\.tsv"):
        read_sources(make_module(tmp_path, tsv_files=[str(missing)]))
    with pytest.raises(FileNotFoundError, match=r"val_tsv_files: the pattern .*nothing.*matches no file"):
        train = write_tsv(tmp_path / "a.tsv", make_pairs(10))
        read_sources(make_module(tmp_path, tsv_files=[str(train)], val_tsv_files=["nothing/*.tsv"]))
    with pytest.raises(FileNotFoundError, match=r"tgt_file: the file .*absent\.en"):
        make_module(tmp_path, src_file=str(tmp_path / "a.tsv"), tgt_file=str(tmp_path / "absent.en")).setup()


def test_empty_corpus_is_an_error_naming_the_file(tmp_path):
    empty = tmp_path / "empty.tsv"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"no sentence pairs in tsv .*empty\.tsv"):
        read_sources(make_module(tmp_path, tsv_files=[str(empty)]))


GOOD_LINES = "".join(f"Satz {i} ist gut.\tSentence {i} is good.\n" for i in range(20))  # lines 1-20: 4 pieces


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"tsv_files": GOOD_LINES.encode() + "Grüße.\tGreetings.\n".encode("latin-1")},
            rf"data.source.tsv_files: \S*train\.tsv is not UTF-8 text: byte 0xfc at byte offset {len(GOOD_LINES) + 2} "
            r"\(line 21: ",
        ),
        (
            {"tsv_files": (GOOD_LINES + "Nur eine Spalte hier\nJa.\tYes.\n").encode()},
            r"data.source.tsv_files: \S*train\.tsv, line 21: no tab; each line must be 'source<TAB>target'",
        ),
        (
            {"src_file": (GOOD_LINES.replace("\t", "\n") + "Grüße.\n").encode("latin-1"), "tgt_file": b"x\n" * 41},
            r"data.source.src_file: \S*train\.src is not UTF-8 text: byte 0xfc at byte offset \d+ \(line 41: ",
        ),
        (
            {"src_file": b"Eins.\nZwei.\nDrei.\n", "tgt_file": b"One.\nTwo.\n"},
            r"the line-aligned files differ in length: \S*train\.src has 3 lines, \S*train\.tgt has 2; line i of one",
        ),
        (
            {"tsv_files": GOOD_LINES.encode(), "val_tsv_files": (GOOD_LINES + "Nur eine Spalte hier\n").encode()},
            r"data.source.val_tsv_files: \S*val\.tsv, line 21: no tab; each line must be 'source<TAB>target'",
        ),
    ],
    ids=["not-utf8", "no-tab", "aligned-not-utf8", "unequal-lines", "val-no-tab"],
)
def test_reading_errors_name_the_option_file_and_line(tmp_path, monkeypatch, files, message):
    """Files read in pieces of 200 bytes: an error in a later piece names its line in the whole file."""
    monkeypatch.setattr(sources, "PIECE_BYTES", 200)
    names = {"tsv_files": "train.tsv", "val_tsv_files": "val.tsv", "src_file": "train.src", "tgt_file": "train.tgt"}
    for option, content in files.items():
        (tmp_path / names[option]).write_bytes(content)
    options = {key: [str(tmp_path / name)] if key.endswith("tsv_files") else str(tmp_path / name)
               for key, name in names.items() if key in files}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        make_module(tmp_path, **options).setup()


def test_a_bad_line_only_a_preparation_worker_reads_is_the_same_error(tmp_path, monkeypatch):
    """Pieces of about 200 bytes (5 lines), a tokenizer sample of 60 bytes of each: only a LitData worker reads line
    28, the last of its piece."""
    monkeypatch.setattr(sources, "PIECE_BYTES", 200)
    train = tmp_path / "train.tsv"
    more = "".join(f"Satz {i} ist gut.\tSentence {i} is good.\n" for i in range(20, 27))
    train.write_text(GOOD_LINES + more + "Nur eine Spalte hier\n", encoding="utf-8")
    message = r"data.source.tsv_files: \S*train\.tsv, line 28: no tab; each line must be 'source<TAB>target'"
    with pytest.raises(ValueError, match=message):
        make_module(tmp_path, tokenizer={"sample_bytes": 300}, tsv_files=[str(train)]).setup()
    assert not list(tmp_path.glob("prepared/*/prepared.json"))
    assert not list(tmp_path.glob("prepared/**/.*-errors"))  # the worker's saved error goes with it


@pytest.mark.parametrize(
    ("group", "fields", "message"),
    [
        (PairSource, {}, r"data.source needs exactly one source .*got none"),
        (PairSource, {"corpus": "ding", "tsv_files": ["x.tsv"]}, r"exactly one source .*got corpus, tsv_files"),
        (PairSource, {"corpus": "wmt"}, r"data.source.corpus='wmt' is not a built-in corpus"),
        (PairSource, {"src_file": "x.de"}, r"data.source.src_file='x.de' needs tgt_file"),
        (PairSource, {"tsv_files": ["x.tsv"], "val_tgt_file": "v.en"}, r"val_tgt_file='v.en' needs val_src_file"),
        (PairSource, {"tsv_files": []}, r"data.source.tsv_files is an empty list"),
        (PairSource, {"tsv_files": ["x.tsv"], "direction": "en-de"}, r"direction='en-de' applies to corpus='ding'"),
        (PairSource, {"corpus": "ding", "val_tsv_files": ["v.tsv"]}, r"remove val_tsv_files"),
        (PairSource, {"tsv_files": ["x.tsv"], "ding_phrases": True}, r"ding_phrases=True applies to corpus='ding'"),
        (PairSource, {"corpus": "ding", "sentence_repeats": 0}, r"data.source.sentence_repeats=0 must be at least 1"),
        (TokenizerConfig, {"kind": "bpe", "vocab_size": 100}, r"data.tokenizer.vocab_size=100 is too small"),
        (TokenizerConfig, {"bpe_dropout": 1.0}, r"data.tokenizer.bpe_dropout=1.0 must be in \[0, 1\)"),
        (TokenizerConfig, {"bpe_dropout_segmentations": 0}, r"bpe_dropout_segmentations=0 must be at least 1"),
        (
            partial(TranslationDataModule, PairSource(tsv_files=["x.tsv"])),
            {"tokenizer": TokenizerConfig(kind="char")},
            r"data.tokenizer.kind='char': TranslationDataModule prepares its text with kind 'bpe'$",
        ),
        (
            partial(TranslationDataModule, PairSource(tsv_files=["x.tsv"])),
            {"tokenizer": {"file": __file__}},
            r"data.tokenizer.file='.*': TranslationDataModule trains its own tokenizers on its train split",
        ),
        (PairBatches, {"max_sentence_tokens": 2}, r"data.batches.max_sentence_tokens=2 must be at least 3"),
        (PairBatches, {"max_tokens": 100}, r"data.batches.max_tokens=100 is smaller than max_sentence_tokens=128"),
        (PairBatches, {"num_workers": -1}, r"data.batches.num_workers=-1 must be at least 0"),
    ],
)
def test_invalid_options_are_named(group, fields, message):
    with pytest.raises(ValueError, match=message):
        group(**fields)
