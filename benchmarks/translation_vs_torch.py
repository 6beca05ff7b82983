"""Our encoder-decoder against a plain ``torch.nn.Transformer`` on the Ding de→en split.

Both see the same data, joint BPE tokenizer, token-budget batches, model size, optimizer, schedule,
number of steps, precision and greedy decoding, in the same process. The baseline is the model of
PyTorch's translation tutorial: scaled embeddings + sinusoidal positions around ``nn.Transformer`` with
its defaults (post-norm, its own initialisation), output layer tied to the target embedding. Ours is
``EncoderDecoder`` with the options of ``configs/translation/ding_de_en.yaml``. Prints test BLEU
(SacreBLEU, detokenized) and ms per training step for each.

    python benchmarks/translation_vs_torch.py --steps 300     # quick look
    python benchmarks/translation_vs_torch.py --steps 3000    # a fuller comparison (tens of minutes)
"""

from __future__ import annotations

import argparse
import itertools
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.text import SacreBLEUScore

from lightformer.data import TranslationDataModule
from lightformer.data.families.pairs import PairBatches
from lightformer.data.preparation.prepare import TokenizerConfig
from lightformer.data.sources.pairs import PairSource
from lightformer.generation import generate
from lightformer.models import EncoderDecoder, EncoderDecoderConfig
from lightformer.nn import SinusoidalPositionalEmbedding, TokenEmbedding, causal_mask
from lightformer.tasks.optim import OptimizerConfig, configure_adamw


class TorchTransformer(nn.Module):
    """PyTorch's tutorial translator: embeddings + sinusoidal positions + ``nn.Transformer`` + output layer."""

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab_size, d_model, scale=True, padding_idx=0)
        self.position = SinusoidalPositionalEmbedding(d_model, 512)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout, batch_first=True)
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        self.output.weight = self.embed.weight
        self.block_size = 512

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.position(self.embed(ids)))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        future = ~causal_mask(tgt_in.shape[1], tgt_in.shape[1], src.device)  # torch: True = masked out
        out = self.transformer(
            self._embed(src),
            self._embed(tgt_in),
            tgt_mask=future,
            src_key_padding_mask=src == 0,
            memory_key_padding_mask=src == 0,
            tgt_is_causal=True,
        )
        return self.output(out)


def build_model(
    name: str, vocab_size: int, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float
) -> nn.Module:
    """``"lightformer"`` (the options of ding_de_en.yaml) or ``"torch.nn.Transformer"``, joint vocabulary."""
    if name == "lightformer":
        return EncoderDecoder(
            EncoderDecoderConfig(
                src_vocab_size=vocab_size,
                tgt_vocab_size=vocab_size,
                max_len=256,
                n_encoder_layers=n_layers,
                n_decoder_layers=n_layers,
                d_model=d_model,
                n_heads=n_heads,
                d_ff=d_ff,
                dropout=dropout,
                norm_first=True,
                share_embeddings=True,
            )
        )
    return TorchTransformer(vocab_size, d_model, n_heads, n_layers, d_ff, dropout)


class Recompute:
    """A decoder for ``generate`` without a cache: reruns the whole target prefix each step."""

    def __init__(self, model: nn.Module, src: torch.Tensor) -> None:
        self.model, self.src, self.block_size = model, src, 512

    def __call__(self, ids: torch.Tensor, cache=None) -> torch.Tensor:
        return self.model(self.src, ids)

    def new_cache(self, max_length=None):
        return None


def train(model, batches, steps, lr, warmup, autocast) -> float:
    """Train for ``steps`` batches; returns the median seconds per step."""
    optimizer = OptimizerConfig(
        lr=lr, weight_decay=0.0, betas=(0.9, 0.98), schedule="inverse_sqrt", warmup_steps=warmup
    )
    config = configure_adamw(model, optimizer, steps)
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    model.train()
    times = []
    for batch in itertools.islice(batches, steps):
        start = time.perf_counter()
        src, tgt = batch["src"], batch["tgt"]
        with autocast:
            logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), ignore_index=0, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


@torch.no_grad()
def bleu(model, data: TranslationDataModule, autocast, cached: bool) -> float:
    model.eval()
    metric = SacreBLEUScore(tokenize="13a")
    tokenizer = data.tgt_tokenizer
    for batch in data.test_dataloader():
        src = batch["src"]
        max_new = min(int(1.5 * src.shape[1] + 10), 200)
        decoder = model.incremental_decoder(src) if cached else Recompute(model, src)
        with autocast:
            out = generate(
                decoder,
                torch.full((src.shape[0], 1), tokenizer.bos_id),
                max_new,
                temperature=0,
                stop_tokens=[tokenizer.eos_id],
                use_cache=cached,
            )
        hyps = [_cut_at(row[1:], tokenizer.eos_id) for row in out.tolist()]
        metric.update(tokenizer.decode_batch(hyps), [[t] for t in batch["tgt_text"]])
    return metric.compute().item() * 100


def _cut_at(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos)] if eos in row else row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # defaults: the shape, data and optimisation of configs/translation/ding_de_en.yaml
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--phrases", action=argparse.BooleanOptionalAction, default=False, help="add Ding phrases")
    parser.add_argument("--sentence-repeats", type=int, default=1)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    args = parser.parse_args()
    # nn.Transformer's inference fast path does not run under CPU bf16 autocast; decode on the regular path.
    torch.backends.mha.set_fastpath_enabled(False)

    data = TranslationDataModule(
        PairSource(corpus="ding", ding_phrases=args.phrases, sentence_repeats=args.sentence_repeats),
        TokenizerConfig(kind="bpe", vocab_size=4000),
        PairBatches(max_tokens=args.max_tokens),
    )
    data.setup()
    vocab = data.tgt_vocab_size
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.precision == "bf16" else nullcontext()

    def batches():
        loader = data.train_dataloader()
        for epoch in itertools.count():
            loader.batch_sampler.set_epoch(epoch)
            yield from loader

    results = {}
    for name in ("lightformer", "torch.nn.Transformer"):
        torch.manual_seed(0)
        model = build_model(name, vocab, args.layers, args.d_model, args.heads, args.d_ff, args.dropout)
        seconds = train(model, batches(), args.steps, args.lr, args.warmup, autocast)
        results[name] = (bleu(model, data, autocast, cached=name == "lightformer"), seconds)

    print(
        f"Ding de→en test ({len(data.datasets['test'])} pairs), {args.steps} steps, "
        f"{args.layers}+{args.layers} layers, d_model {args.d_model}, {args.precision}, greedy"
    )
    print(f"{'model':<22}{'BLEU':>8}{'ms/step':>10}")
    for name, (score, seconds) in results.items():
        print(f"{name:<22}{score:>8.2f}{1000 * seconds:>10.1f}")
    ours, theirs = results["lightformer"], results["torch.nn.Transformer"]
    print(f"BLEU difference: {ours[0] - theirs[0]:+.2f}; step-time ratio torch/lightformer: {theirs[1] / ours[1]:.2f}")


if __name__ == "__main__":
    main()
