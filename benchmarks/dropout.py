"""Dropout's forward and backward on CPU: ``lightformer.nn.dropout`` against ``torch.nn.functional.dropout``.

PyTorch's CPU dropout draws one Bernoulli sample per element; ours draws four 16-bit uniform integers from each
random 64-bit integer (``lightformer/nn/dropout.py``). Shapes are those of configs/translation/ding_de_en.yaml
(a batch of 2048 tokens): the sublayer outputs (2048 × 256, dropout 0.3) and the attention weights of 64
sentences × 8 heads × 32 × 32 positions (dropout 0.2). Both run in one process in alternating timed rounds;
each keeps its median round. The effect on whole training steps is in ``benchmarks/peers.py`` (translation).

    python benchmarks/dropout.py                # ~1 minute on 2 cores
    python benchmarks/dropout.py --rounds 1 --repeats 2   # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lightformer.nn import dropout

SHAPES = {"sublayer output": ((2048, 256), 0.3), "attention weights": ((64, 8, 32, 32), 0.2)}


def seconds_per_call(fn, x: torch.Tensor, p: float, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn(x, p).sum().backward()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=50, help="calls (forward + backward) per timed round")
    args = parser.parse_args()
    candidates = {"ours": dropout, "torch": lambda x, p: F.dropout(x, p, training=True)}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; forward + backward, median of rounds\n")
    print("| tensor | dtype | ours (µs) | torch (µs) | speed ours/torch |")
    print("|---|---|---|---|---|")
    for name, (shape, p) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape, dtype=dtype, requires_grad=True)
            times: dict[str, list[float]] = {key: [] for key in candidates}
            for fn in candidates.values():  # warm-up
                seconds_per_call(fn, x, p, 2)
            for _ in range(args.rounds):
                for key, fn in candidates.items():
                    times[key].append(seconds_per_call(fn, x, p, args.repeats))
            ours, peer = (statistics.median(times[key]) * 1e6 for key in ("ours", "torch"))
            dtype_name = str(dtype).removeprefix("torch.")
            print(f"| {name} {tuple(shape)}, p={p} | {dtype_name} | {ours:,.0f} | {peer:,.0f} | {peer / ours:.2f} |")


if __name__ == "__main__":
    main()
