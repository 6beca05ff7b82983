"""Training throughput of our GPT against Hugging Face ``GPT2LMHeadModel`` at the identical configuration.

Both models train (forward, backward, AdamW step) on the same random batches in the same process, in
alternating rounds, so machine noise hits both alike. Prints tokens/s for each and the ratio ours/HF.

    python benchmarks/gpt_vs_hf.py                       # nanoGPT's CPU shape (austen_char.yaml)
    python benchmarks/gpt_vs_hf.py --precision bf16      # autocast to bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from lightformer.models import GPT, GPTConfig


def build_models(
    vocab_size: int, block_size: int, n_layers: int, n_heads: int, d_model: int
) -> dict[str, torch.nn.Module]:
    """Our GPT and Hugging Face's GPT-2 at one shape, without dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=block_size,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = GPT2LMHeadModel(config)
    ours = GPT(
        GPTConfig(
            vocab_size=vocab_size,
            block_size=block_size,
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=d_model,
            activation="gelu_tanh",  # GPT-2's activation, so both compute the same function
        )
    )
    return {"lightformer": ours, "huggingface": hf}


def logits_of(name: str, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x) if name == "lightformer" else model(x).logits


def train_steps(name, model, optimizer, batches, autocast) -> float:
    """Seconds for one optimizer step per batch."""
    start = time.perf_counter()
    for x, y in batches:
        with autocast:
            logits = logits_of(name, model, x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=85)  # Austen characters + 4 special tokens
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    built = build_models(args.vocab_size, args.block_size, args.n_layers, args.n_heads, args.d_model)
    models = {name: m.to(args.device).train() for name, m in built.items()}
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-3) for name, m in models.items()}
    batches = [
        (
            torch.randint(0, args.vocab_size, (args.batch_size, args.block_size), device=args.device),
            torch.randint(0, args.vocab_size, (args.batch_size, args.block_size), device=args.device),
        )
        for _ in range(args.steps)
    ]
    autocast = (
        torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16)
        if args.precision == "bf16"
        else nullcontext()
    )
    for name, model in models.items():  # warm-up
        train_steps(name, model, optimizers[name], batches[:5], autocast)
    seconds = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            seconds[name].append(train_steps(name, model, optimizers[name], batches, autocast))

    tokens = args.steps * args.batch_size * args.block_size
    rate = {name: tokens / statistics.median(s) for name, s in seconds.items()}
    print(
        f"GPT training, {args.n_layers} layers × {args.d_model} dims, {args.n_heads} heads, block {args.block_size}, "
        f"batch {args.batch_size}, {args.precision}, {args.device}, {torch.get_num_threads()} threads"
    )
    print(f"{'model':<14}{'tokens/s':>12}{'ms/step':>10}")
    for name, r in rate.items():
        print(f"{name:<14}{r:>12,.0f}{1000 * statistics.median(seconds[name]) / args.steps:>10.1f}")
    print(f"ratio lightformer/huggingface: {rate['lightformer'] / rate['huggingface']:.2f}")


if __name__ == "__main__":
    main()
