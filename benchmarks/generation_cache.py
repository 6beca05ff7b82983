"""Generation with and without the KV cache: speed-up for N new tokens, and identical greedy outputs.

python benchmarks/generation_cache.py                          # random GPT of austen_char's shape
python benchmarks/generation_cache.py --ckpt runs/.../last.ckpt  # a trained language model
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lightformer.generation import generate
from lightformer.models import GPT, GPTConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", help="a LanguageModelTask checkpoint; default: a random model")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.ckpt:
        from lightformer.tasks import LanguageModelTask

        model = LanguageModelTask.load_from_checkpoint(args.ckpt, map_location="cpu").model
    else:  # austen_char.yaml's shape, with room for the prompt and all new tokens in one block
        block_size = args.prompt_tokens + args.new_tokens
        model = GPT(GPTConfig(vocab_size=85, block_size=block_size, n_layers=4, n_heads=4, d_model=128))
    model.eval()
    prompt = torch.randint(4, model.vocab_size, (args.batch_size, args.prompt_tokens))

    outputs, seconds = {}, {}
    for use_cache in (True, False):
        generate(model, prompt, 8, temperature=0, use_cache=use_cache)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            outputs[use_cache] = generate(model, prompt, args.new_tokens, temperature=0, use_cache=use_cache)
            times.append(time.perf_counter() - start)
        seconds[use_cache] = statistics.median(times)

    print(
        f"greedy generation of {args.new_tokens} tokens after a {args.prompt_tokens}-token prompt, block size "
        f"{model.block_size}, batch {args.batch_size}, {torch.get_num_threads()} threads"
    )
    print(f"with KV cache:    {seconds[True]:.3f} s  ({args.new_tokens / seconds[True]:,.0f} tokens/s)")
    print(f"without KV cache: {seconds[False]:.3f} s  ({args.new_tokens / seconds[False]:,.0f} tokens/s)")
    identical = torch.equal(outputs[True], outputs[False])
    print(f"speed-up: {seconds[False] / seconds[True]:.1f}x; identical outputs: {identical}")


if __name__ == "__main__":
    main()
