"""A device's peak FLOP/s (the denominator of MFU) and the precision it trains fastest in (``precision: auto``).

The peak of one device at a precision comes from the first of:

1. ``SPEC_FLOPS``, this project's table of dense tensor-core peaks from the vendors' datasheets (no sparsity). It comes
   first because Lightning's table (``lightning.fabric.utilities.throughput``) lists the sparse figures for some cards
   (H200, H100 NVL: twice the dense peak, which would halve their MFU) and lacks others (``"NVIDIA H200"`` matches
   none of its names).
2. Lightning's table, for the cards ours lacks.
3. A measurement: the fastest of a few n × n matrix multiplies at that precision, taking about a quarter of a second,
   once per process (a CPU, or a card in no table). Said once in the log.

``auto_precision`` picks the precision a config's ``precision: auto`` trains in: on a GPU bf16-mixed where the card
has bf16, else 16-mixed; on a CPU, bf16-mixed where its bf16 matrix multiplies are measurably faster than fp32's (a CPU
with avx512_bf16 or AMX), else 32-true (a CPU without bf16 units emulates it, several times slower; some with them
still run bf16 at half the fp32 rate). The measurement is the same one as the MFU peak's.
"""

from __future__ import annotations

import functools
import os
import re
import time

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.utilities import rank_zero_info

TF = 1e12
# Dense peaks per precision ("tf32": a 32-true matmul on tensor cores), first match of a pattern in the lowercased name.
# Sources: NVIDIA's H100/H200/GH200, A100, A10, L4, L40/L40S, Ada (RTX 4090) and Ampere (RTX 3090) datasheets and
# whitepapers, AMD's MI300X datasheet; sparse figures halved.
SPEC_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"gh200", {"fp32": 67 * TF, "tf32": 494.7 * TF, "bf16": 989.4 * TF, "fp16": 989.4 * TF}),
    (r"h200 nvl", {"fp32": 60 * TF, "tf32": 417.5 * TF, "bf16": 835.5 * TF, "fp16": 835.5 * TF}),
    (r"h200", {"fp32": 67 * TF, "tf32": 494.7 * TF, "bf16": 989.4 * TF, "fp16": 989.4 * TF}),
    (r"h100 nvl", {"fp32": 60 * TF, "tf32": 417.5 * TF, "bf16": 835.5 * TF, "fp16": 835.5 * TF}),
    (r"h100 pcie", {"fp32": 51.2 * TF, "tf32": 378 * TF, "bf16": 756 * TF, "fp16": 756 * TF}),
    (r"h100", {"fp32": 66.9 * TF, "tf32": 494.7 * TF, "bf16": 989.4 * TF, "fp16": 989.4 * TF}),  # SXM (HBM3)
    (r"b200", {"tf32": 1100 * TF, "bf16": 2250 * TF, "fp16": 2250 * TF}),
    (r"a100", {"fp32": 19.5 * TF, "tf32": 156 * TF, "bf16": 312 * TF, "fp16": 312 * TF}),
    (r"a10g", {"fp32": 31.2 * TF, "tf32": 35 * TF, "bf16": 70 * TF, "fp16": 70 * TF}),
    (r"\ba10\b", {"fp32": 31.2 * TF, "tf32": 62.5 * TF, "bf16": 125 * TF, "fp16": 125 * TF}),
    (r"l40s", {"fp32": 91.6 * TF, "tf32": 183 * TF, "bf16": 362 * TF, "fp16": 362 * TF}),
    (r"\bl40\b", {"fp32": 90.5 * TF, "tf32": 90.5 * TF, "bf16": 181 * TF, "fp16": 181 * TF}),
    (r"\bl4\b", {"fp32": 30.3 * TF, "tf32": 60 * TF, "bf16": 121 * TF, "fp16": 121 * TF}),
    (r"rtx 4090", {"fp32": 82.6 * TF, "tf32": 82.6 * TF, "bf16": 165.2 * TF, "fp16": 165.2 * TF}),
    (r"rtx 3090", {"fp32": 35.6 * TF, "tf32": 35.6 * TF, "bf16": 71 * TF, "fp16": 71 * TF}),
    (r"v100", {"fp32": 15.7 * TF, "fp16": 125 * TF}),
    (r"\bt4\b", {"fp32": 8.1 * TF, "fp16": 65 * TF}),
    (r"mi300x", {"fp32": 163.4 * TF, "tf32": 653.7 * TF, "bf16": 1307.4 * TF, "fp16": 1307.4 * TF}),
)
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
MATMUL_SIZES = {"cpu": (512, 1024), "cuda": (4096, 8192)}  # n × n products; the fastest gives the measured peak
# bf16 must beat fp32 by this factor for ``precision: auto`` to pick it on a CPU: a tie keeps full precision.
BF16_MARGIN = 1.1
AUTO_PRECISION_VARIABLE = "LIGHTFORMER_AUTO_PRECISION"  # the choice, for the processes a run launches


def precision_dtype(precision: str | int | None) -> torch.dtype:
    """The dtype of a Trainer ``precision``'s matrix multiplies ("bf16-mixed" → bfloat16, "32-true" → float32)."""
    text = str(precision)
    if text.startswith("bf16"):
        return torch.bfloat16
    if text.startswith("16"):
        return torch.float16
    return torch.float32


def spec_flops(device_name: str, dtype: torch.dtype, tf32: bool = False) -> float | None:
    """The dense peak FLOP/s of the card named ``device_name`` at ``dtype`` from ``SPEC_FLOPS`` (``tf32``: a float32
    matmul runs on the tensor cores), or None where the table lacks the card or the precision."""
    name = device_name.lower()
    key = "tf32" if dtype is torch.float32 and tf32 else DTYPE_NAMES.get(dtype)
    for pattern, peaks in SPEC_FLOPS:
        if re.search(pattern, name):
            return peaks.get(key)
    return None


def _uses_tf32(device: torch.device) -> bool:
    return device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


@functools.cache
def measured_flops(device: torch.device, dtype: torch.dtype, seconds: float = 0.25) -> float:
    """FLOP/s of the fastest of ``MATMUL_SIZES``' square matrix multiplies at ``dtype`` on ``device``, the products
    of each repeated for ``seconds / len(sizes)``; measured once per process for each (device, dtype, seconds)."""
    sizes = MATMUL_SIZES["cuda" if device.type == "cuda" else "cpu"]
    return max(matmul_rate(n, dtype, device, seconds / len(sizes)) for n in sizes)


def matmul_rate(n: int, dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    """FLOP/s of ``n × n`` by ``n × n`` products at ``dtype`` on ``device``, repeated ``seconds`` after a warm-up."""
    generator = torch.Generator(device).manual_seed(0)  # the run's own random numbers are left as they were
    a, b = (torch.randn(n, n, device=device, generator=generator).to(dtype) for _ in range(2))
    for _ in range(2):
        a @ b
    _synchronize(device)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or count == 0:
        a @ b
        _synchronize(device)
        count += 1
    return 2 * n**3 * count / elapsed


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device: torch.device, precision: str | int | None) -> tuple[float, str]:
    """(peak FLOP/s of one ``device`` at the Trainer ``precision``, where it comes from) for MFU: the spec table,
    Lightning's, or a measurement (see the module's docstring)."""
    dtype, name = precision_dtype(precision), device_name(device)
    tf32 = dtype is torch.float32 and _uses_tf32(device)
    kind = "tf32" if tf32 else DTYPE_NAMES[dtype]
    spec = spec_flops(name, dtype, tf32) if device.type == "cuda" else None
    if spec is not None:
        return spec, f"the {name}'s dense {kind} peak (datasheet)"
    if device.type == "cuda":
        import warnings

        with warnings.catch_warnings():  # Lightning warns for a card it lacks: we measure it instead
            warnings.simplefilter("ignore")
            listed = get_available_flops(device, dtype)
        if listed:
            return float(listed), f"the {name}'s {kind} peak (Lightning's table)"
    measured = measured_flops(device, dtype)
    return measured, f"{kind} matrix multiplies measured on this {name} now"


def auto_precision(device_type: str) -> tuple[str, str]:
    """(the Trainer precision ``precision: auto`` trains in on a ``device_type`` ("cpu" or "cuda") device, why)."""
    if device_type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16-mixed", "the GPU has bf16 tensor cores"
        return "16-mixed", "the GPU has no bf16: fp16 with loss scaling"
    device = torch.device("cpu")
    bf16, fp32 = measured_flops(device, torch.bfloat16), measured_flops(device, torch.float32)
    rates = f"bf16 matrix multiplies {bf16 / TF:.2f} TFLOP/s, fp32 {fp32 / TF:.2f} on this CPU"
    if bf16 > BF16_MARGIN * fp32:
        return "bf16-mixed", rates
    return "32-true", rates


def resolve_precision(
    precision: str | int | None, accelerator: str | None, resumed_in: str | None = None
) -> str | int | None:
    """A Trainer's ``precision``, with "auto" replaced by the precision to train in on the device the ``accelerator``
    ("cpu", "gpu", "cuda", "auto" or None) runs on, said once in the log: ``resumed_in`` (the precision a resumed run
    trained in, from its checkpoint: resuming is exact only in it), else the one the process that launched this one
    chose (the processes of a DDP run must agree, and would not all measure the same), else ``auto_precision``'s."""
    if precision != "auto":
        return precision
    if resumed_in is not None:
        chosen, why = resumed_in, "the precision the resumed run trained in"
    elif AUTO_PRECISION_VARIABLE in os.environ:
        chosen, why = os.environ[AUTO_PRECISION_VARIABLE], "as the launching process chose"
    else:
        accelerator = str(accelerator or "auto")
        on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
        chosen, why = auto_precision("cuda" if on_gpu else "cpu")
    os.environ[AUTO_PRECISION_VARIABLE] = chosen  # inherited by the processes this one launches
    rank_zero_info(f"precision: auto → {chosen} ({why})")
    return chosen
