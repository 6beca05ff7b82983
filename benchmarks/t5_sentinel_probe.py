"""Does a span-corruption (T5) model read its input? Four measurements on a checkpoint's validation segments.

1. Loss per target token, split into sentinels, [EOS] and span tokens, with each segment's own corrupted input and
   with another segment's (the batch rolled by one): a decoder that reads the input loses far more without it.
2. Cross-attention, per decoder layer (mean over heads): the share of its weight that each span token puts on the
   input position of its own sentinel (and on the 5 positions around it), against uniform attention.
3. Exact-span accuracy of greedy decodes (``val/span_acc``) by span length.
4. How often the first token of a span is the decoder's argmax (teacher-forced, after its sentinel), and how often
   the argmax of the encoder's output at the sentinel through the output layer (what ``encoder_loss_weight``
   trains) is one of the span's tokens.

python benchmarks/t5_sentinel_probe.py --ckpt_path runs/t5_austen/version_0/checkpoints/last.ckpt

The data module is rebuilt from the checkpoint's own settings (corpus, split, segment length, noise), so the
segments and their spans are the ones validation used.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from lightformer.data import SpanCorruptionDataModule
from lightformer.nn.attention import record_attention
from lightformer.tasks import DenoisingTask
from lightformer.tasks.denoising import sentinel_numbers, sentinel_spans


def measure(
    datamodule: SpanCorruptionDataModule, task: DenoisingTask, batches: int
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[float, float]], float]:
    """Mean loss per target token {input: {kind: nats}}, cross-attention {layer: (on own sentinel, on the 5
    positions around it)} and the mean weight of uniform attention (one over the input's length)."""
    sentinels = set(sentinel_numbers(task.tgt_tokenizer))
    pad, eos = task.pad_id, task.tgt_tokenizer.eos_id

    sums: dict[str, dict[str, tuple[float, int]]] = {"own input": {}, "another segment's input": {}}
    attention: dict[str, tuple[float, float, int]] = {}  # layer: (weight on the sentinel, around it, tokens)
    uniform = []
    for batch in itertools.islice(datamodule.val_dataloader(), batches):
        src, tgt_in, target = batch["src"], batch["tgt"][:, :-1], batch["tgt"][:, 1:]
        uniform += (1 / (src != pad).sum(1).float()).tolist()
        is_sentinel = torch.isin(target, torch.tensor(sorted(sentinels)))
        rows, steps, positions = _sentinel_positions(src, tgt_in, sentinels, pad)
        window = positions[:, None] + torch.arange(-2, 3)  # the 5 input positions centred on the sentinel
        in_source = (window >= 0) & (window < src.shape[1])
        window = window.clamp(0, src.shape[1] - 1)
        kinds = {
            "sentinel": is_sentinel,
            "[EOS]": target == eos,
            "span token": (target != pad) & (target != eos) & ~is_sentinel,
        }
        for name, source in (("own input", src), ("another segment's input", src.roll(1, 0))):
            with torch.no_grad(), record_attention(task.model) as weights:
                logits = task.model(source, tgt_in)
            token_loss = F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")
            for kind, mask in kinds.items():
                total, count = sums[name].get(kind, (0.0, 0))
                sums[name][kind] = (total + token_loss[mask].sum().item(), count + int(mask.sum()))
            if name == "own input":
                for layer, w in weights.items():
                    if layer.endswith("cross_attn"):
                        w = w.float().mean(1)  # (batch, tgt, src): mean over heads
                        at, near, tokens = attention.get(layer, (0.0, 0.0, 0))
                        attention[layer] = (
                            at + w[rows, steps, positions].sum().item(),
                            near + (w[rows[:, None], steps[:, None], window] * in_source).sum().item(),
                            tokens + len(rows),
                        )
    losses = {name: {kind: total / count for kind, (total, count) in by_kind.items()} for name, by_kind in sums.items()}
    shares = {name: (at / n, near / n) for name, (at, near, n) in attention.items()}
    return losses, shares, sum(uniform) / len(uniform)


def span_accuracy_by_length(
    datamodule: SpanCorruptionDataModule, task: DenoisingTask, batches: int
) -> dict[int, tuple[int, int]]:
    """{span length: (spans the greedy decode writes back exactly, spans)}, as ``val/span_acc`` counts them."""
    eos = task.tgt_tokenizer.eos_id
    counts: dict[int, tuple[int, int]] = {}
    for batch in itertools.islice(datamodule.val_dataloader(), batches):
        with torch.no_grad():
            decodes = task.decode_ids(batch["src"], beam_size=1)
        for target, decode in zip(batch["tgt"].tolist(), decodes, strict=True):
            expected, written = task._spans(target[1 : target.index(eos)]), task._spans(decode)
            for key, span in expected.items():
                right, total = counts.get(len(span), (0, 0))
                counts[len(span)] = (right + (written.get(key) == span), total + 1)
    return dict(sorted(counts.items()))


def sentinel_accuracy(
    datamodule: SpanCorruptionDataModule, task: DenoisingTask, batches: int
) -> tuple[float, float, int]:
    """(the share of spans whose first token is the decoder's argmax, teacher-forced after the sentinel; the share
    of sentinels where the argmax of the encoder's output through the output layer is one of the span's tokens;
    spans)."""
    sentinel_ids = torch.tensor(sorted(sentinel_numbers(task.tgt_tokenizer)))
    decoder = encoder = total = 0
    for batch in itertools.islice(datamodule.val_dataloader(), batches):
        src, tgt = batch["src"], batch["tgt"]
        at_sentinels, span_of, tokens = sentinel_spans(src, tgt, sentinel_ids, task.tgt_tokenizer.eos_id)
        with torch.no_grad():
            logits, encoder_logits = task.model(src, tgt[:, :-1], at_sentinels)
        starts = torch.cat([torch.ones(1, dtype=torch.bool), span_of[1:] != span_of[:-1]])  # each span's first token
        after_sentinel = torch.isin(tgt[:, :-1], sentinel_ids)
        decoder += int((logits[after_sentinel].argmax(-1) == tokens[starts]).sum())
        in_span = encoder_logits.argmax(-1)[span_of] == tokens
        encoder += int(torch.zeros(len(encoder_logits)).index_add_(0, span_of, in_span.float()).gt(0).sum())
        total += len(encoder_logits)
    return decoder / total, encoder / total, total


def load(ckpt_path: str) -> tuple[SpanCorruptionDataModule, DenoisingTask]:
    """The checkpoint's task (in eval mode) and its data module, rebuilt from the checkpoint's own settings."""
    checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    settings = {k: v for k, v in checkpoint["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    datamodule = SpanCorruptionDataModule(**settings)
    datamodule.prepare_data()
    datamodule.setup("validate")
    return datamodule, DenoisingTask.load_from_checkpoint(ckpt_path, map_location="cpu").eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", required=True, help="a DenoisingTask checkpoint")
    parser.add_argument("--batches", type=int, default=8, help="validation batches to probe")
    args = parser.parse_args()
    datamodule, task = load(args.ckpt_path)
    losses, shares, uniform = measure(datamodule, task, args.batches)
    print(f"{args.ckpt_path}: loss per target token (nats)")
    for name, by_kind in losses.items():
        print(f"  {name:>24}: " + ", ".join(f"{kind} {loss:.3f}" for kind, loss in by_kind.items()))
    print(
        "cross-attention weight of a decoded token on its own sentinel / on the 5 positions around it "
        f"(uniform: {uniform:.3f} / {5 * uniform:.3f})"
    )
    for name, (at, near) in shares.items():
        print(f"  {name}: {at:.3f} / {near:.3f}")
    print("spans written back exactly by the greedy decode, by span length (tokens):")
    for length, (right, total) in span_accuracy_by_length(datamodule, task, args.batches).items():
        print(f"  {length:>2}: {right:>5} of {total:>5} = {right / total:.1%}")
    decoder, encoder, total = sentinel_accuracy(datamodule, task, args.batches)
    print(
        f"{total} spans: the decoder's argmax is the first token {decoder:.1%}; "
        f"the encoder's argmax at the sentinel is in the span {encoder:.1%}"
    )


def _sentinel_positions(src: Tensor, tgt_in: Tensor, sentinels: set[int], pad: int) -> tuple[Tensor, Tensor, Tensor]:
    """For every target token from the first sentinel on: its row, its target position and the input position of
    the sentinel it follows (the last one written up to and including it), as three index tensors."""
    rows, steps, positions = [], [], []
    for b, (source, target) in enumerate(zip(src.tolist(), tgt_in.tolist(), strict=True)):
        current = None
        for t, token in enumerate(target):
            current = token if token in sentinels else current
            if current is not None and token != pad and current in source:
                rows.append(b)
                steps.append(t)
                positions.append(source.index(current))
    return torch.tensor(rows), torch.tensor(steps), torch.tensor(positions)


if __name__ == "__main__":
    main()
