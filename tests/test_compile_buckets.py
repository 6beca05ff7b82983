"""Translation batches padded to length buckets (``data.batches.length_multiple``): a compiled translator compiles one
static graph per bucket, whatever the batches' lengths and sizes, and the padding changes no loss."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from lightformer.data.families.pairs import PairBatches
from lightformer.data.loading.sequences import bucket_lengths, collate_pairs
from lightformer.facts import DataFacts
from lightformer.tasks import TranslationTask

VOCAB, PAD, BOS, EOS = 300, 0, 1, 2
LIMIT, MULTIPLE, MAX_TOKENS = 48, 16, 192  # buckets of 16, 32 and 48 tokens: 12, 6 and 4 rows
NET = dict(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD, d_model=32, n_heads=2, d_ff=64,
           n_encoder_layers=1, n_decoder_layers=1, max_len=LIMIT, dropout=0.0)  # fmt: skip


def items(generator: np.random.Generator, rows: int, longest: int) -> list[dict]:
    """``rows`` sentence pairs framed as the data module frames them (source + EOS, BOS + target + EOS), the
    longest side of the longest pair ``longest`` tokens."""
    pairs = []
    for row in range(rows):
        n = longest if row == 0 else int(generator.integers(3, longest + 1))
        src = np.append(generator.integers(3, VOCAB, n - 1 - int(generator.integers(0, 2))), EOS)
        tgt = np.concatenate([[BOS], generator.integers(3, VOCAB, int(generator.integers(1, n - 1))), [EOS]])
        pairs.append({"src": src, "tgt": tgt, "src_text": "s", "tgt_text": "t"})
    return pairs


def varied_batches(count: int) -> list[list[dict]]:
    """``count`` batches of distinct (rows, longest) within the token budget, in a random order."""
    generator = np.random.default_rng(0)
    shapes = set()
    while len(shapes) < count:
        longest = int(generator.integers(4, LIMIT + 1))
        shapes.add((int(generator.integers(1, MAX_TOKENS // bucket_lengths(longest, MULTIPLE, LIMIT) + 1)), longest))
    return [items(generator, rows, longest) for rows, longest in sorted(shapes, key=lambda _: generator.random())]


def bucketed(pairs: list[dict]) -> dict:
    return collate_pairs(pairs, PAD, length_multiple=MULTIPLE, limit=LIMIT, max_tokens=MAX_TOKENS)


def test_bucketed_batches_take_one_shape_per_bucket_and_keep_their_pairs():
    shapes = {tuple(bucketed(pairs)["src"].shape) + tuple(bucketed(pairs)["tgt"].shape) for pairs in varied_batches(30)}
    assert shapes <= {(MAX_TOKENS // n, n, MAX_TOKENS // n, n) for n in (16, 32, 48)}
    pairs = varied_batches(1)[0]
    batch = bucketed(pairs)
    assert len(batch["tgt_text"]) == len(pairs)
    for row, pair in enumerate(pairs):  # each pair's ids, then padding
        for side in ("src", "tgt"):
            assert batch[side][row, : len(pair[side])].tolist() == pair[side].tolist()
            assert (batch[side][row, len(pair[side]) :] == PAD).all()
    assert (batch["tgt"][len(pairs) :, 1:] == PAD).all()  # the extra rows have no target token


def test_batches_padded_to_buckets_have_the_loss_and_gradients_of_unpadded_ones():
    torch.manual_seed(0)
    task = TranslationTask(net=NET).eval()  # no dropout: the same draws whatever the shape
    for pairs in varied_batches(4):
        losses, grads = [], []
        for batch in (collate_pairs(pairs, PAD), bucketed(pairs)):
            task.zero_grad()
            loss, tokens = task._loss(batch)
            loss.backward()
            losses.append(loss.detach())
            grads.append(torch.cat([p.grad.flatten() for p in task.parameters() if p.grad is not None]))
            assert int(tokens) == sum(len(pair["tgt"]) - 1 for pair in pairs)
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_the_sampler_budgets_rows_by_their_buckets_length():
    batches = PairBatches(max_sentence_tokens=LIMIT, max_tokens=MAX_TOKENS, length_multiple=MULTIPLE)
    assert batches.padded(np.array([3, 16, 17, 40, 48])).tolist() == [16, 16, 32, 48, 48]
    assert PairBatches(max_sentence_tokens=LIMIT).padded(np.array([3, 17])).tolist() == [3, 17]


@pytest.mark.slow
def test_a_compiled_translator_compiles_one_graph_per_bucket_over_30_batches(capsys):
    """Through torch.compile's real (inductor) backend: 30 batches of distinct sizes and lengths, 3 buckets, at most 3
    graphs (each static); the compile time is printed."""
    torch.manual_seed(0)
    facts = DataFacts(max_length=LIMIT, length_multiple=MULTIPLE)
    task = TranslationTask(net=NET, compile=True, data_facts=facts)
    torch._dynamo.reset()
    counters.clear()
    seconds, compiling = [], []
    for i, pairs in enumerate(varied_batches(30)):
        graphs = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        loss = task.training_step(bucketed(pairs), i)
        loss.backward()
        seconds.append(time.perf_counter() - start)
        compiling.append(counters["stats"]["unique_graphs"] > graphs)
        assert torch.isfinite(loss)
    graphs = counters["stats"]["unique_graphs"]
    buckets = -(-LIMIT // MULTIPLE)
    with capsys.disabled():
        steady = np.median([s for s, c in zip(seconds, compiling, strict=True) if not c])
        print(f"\n{graphs} graphs for 30 batches in {buckets} buckets: the {sum(compiling)} steps that compiled took "
              f"{sum(s for s, c in zip(seconds, compiling, strict=True) if c):.1f} s (a compiled step: "
              f"{steady * 1e3:.1f} ms)")  # fmt: skip
    assert 1 <= graphs <= buckets, f"{graphs} graphs for 30 batches in {buckets} buckets"


@pytest.mark.parametrize("multiple", [None, MULTIPLE])
def test_bucketed_data_compiles_static_graphs_and_dynamo_keeps_one_per_bucket(multiple, monkeypatch):
    """With the data's ``length_multiple`` the translator compiles static (one graph per bucket: the test above counts
    them through inductor), and dynamo's recompile limit holds a training and an evaluation graph per bucket;
    without it, dynamic shapes as before."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda function, **options: calls.append(options) or function)
    facts = DataFacts(max_length=LIMIT * 2, length_multiple=multiple)
    task = TranslationTask(net={**NET, "max_len": LIMIT * 2}, compile=True, data_facts=facts)
    with torch._dynamo.config.patch(recompile_limit=8):
        task.training_step(bucketed(varied_batches(1)[0]), 0)
        limit = torch._dynamo.config.recompile_limit
    if multiple is None:
        assert calls == [{"dynamic": True, "options": {"triton.coalesce_tiling_analysis": False}}] and limit == 8
    else:
        assert calls == [{"dynamic": False}] and limit == 2 * 6 + 2  # 6 buckets of 16 up to 96 tokens


def test_a_translation_run_with_length_buckets_trains_on_one_shape_per_bucket(tmp_path):
    """The data module's batches (``data.batches.length_multiple=8``, the tiny run's budget of 128 tokens): each
    batch 128 / L rows of L tokens a side, every pair in one batch of the epoch; the facts say the padded length;
    a few steps of fit train on them."""
    from tiny_runs import build, task_args

    cli = build([*task_args("translation", tmp_path), "--data.batches.length_multiple=8", "--trainer.max_steps=3",
                 "--trainer.limit_val_batches=1"])  # fmt: skip
    datamodule = cli.datamodule
    assert datamodule.data_facts().length_multiple == 8 and datamodule.data_facts().max_length % 8 == 0
    datamodule.setup("fit")
    pairs = 0
    for batch in datamodule.train_dataloader():
        length = batch["src"].shape[1]
        assert length % 8 == 0 and batch["src"].shape == batch["tgt"].shape == (128 // length, length)
        pairs += len(batch["tgt_text"])
    assert pairs == len(datamodule.datasets["train"])
    cli.trainer.fit(cli.model, datamodule=datamodule)
    assert cli.trainer.global_step == 3
