"""A model's floating-point operations per example, counted once and never again per step (throughput and MFU).

PyTorch's ``FlopCounterMode`` counts a forward (and backward) pass exactly, on a copy of the model on the meta device,
but takes 0.1–0.2 s: once per new batch shape, that is dozens of GPU steps each time a token-budget batch brings a new
(source, target) length pair. A transformer's count is a polynomial of degree at most 2 in its sequence lengths:
every matrix product is linear in a length, attention is quadratic (T² within a sequence, S·T across). So for inputs
that are sequences of ids the count is measured at a few short lengths (1 to 4), the polynomial fitted exactly, and
every later length costs a dot product. The fit is checked on every measured point; a model whose count it does not
reproduce is counted per shape instead. Other inputs (images) have one shape per run and are counted per shape.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from lightning.fabric.utilities.throughput import measure_flops
from torch import Tensor, nn

# Lengths the polynomial is measured at: every combination of 1, 2, 3 (enough for its coefficients), plus all 4s to
# check it (4 counts for one length, 10 for a source and a target length).
FIT_LENGTHS = (1, 2, 3)
CHECK_LENGTH = 4


class FlopCounter:
    """FLOPs per example of the model ``make_twin()`` builds on the meta device, for inputs shaped like ``inputs``.

    ``per_example(inputs, backward)``: the forward pass, plus the backward pass if ``backward``. Inputs of shape
    (batch, length) are sequences: those of equal length in a batch are taken to share it (a masked-LM's ids and
    segment ids), and one polynomial is fitted per such pattern of shared lengths (a translation batch whose source
    and target lengths happen to be equal gets its own: it is exact too).
    """

    def __init__(self, make_twin: Callable[[], nn.Module]) -> None:
        self.make_twin = make_twin
        self.measurements = 0  # FlopCounterMode runs so far (a test checks they do not grow with the shapes seen)
        self._per_shape: dict[tuple, int] = {}
        self._polynomials: dict[tuple, tuple[np.ndarray, list[tuple[int, ...]]] | None] = {}

    def per_example(self, inputs: Sequence[Tensor], backward: bool) -> int:
        shapes = [tuple(x.shape[1:]) for x in inputs]
        dtypes = tuple(x.dtype for x in inputs)
        if not all(len(shape) == 1 for shape in shapes):
            return self._counted(shapes, dtypes, backward)
        lengths = sorted({shape[0] for shape in shapes})
        pattern = tuple(lengths.index(shape[0]) for shape in shapes)  # which inputs share which length
        key = (pattern, dtypes, backward)
        if key not in self._polynomials:
            self._polynomials[key] = self._fit(pattern, dtypes, backward)
        if self._polynomials[key] is None:  # not a polynomial of degree 2: counted per shape
            return self._counted(shapes, dtypes, backward)
        coefficients, exponents = self._polynomials[key]
        return round(float(coefficients @ _monomials(lengths, exponents)))

    def _fit(self, pattern: tuple[int, ...], dtypes: tuple, backward: bool):
        variables = max(pattern) + 1
        exponents = [e for e in itertools.product(range(3), repeat=variables) if sum(e) <= 2]
        points = [*itertools.product(FIT_LENGTHS, repeat=variables), (CHECK_LENGTH,) * variables]
        counts = np.array([self._counted([(p[i],) for i in pattern], dtypes, backward) for p in points], np.float64)
        design = np.stack([_monomials(p, exponents) for p in points])
        coefficients = np.linalg.lstsq(design, counts, rcond=None)[0]
        if np.abs(design @ coefficients - counts).max() > 0.5:
            return None
        return coefficients, exponents

    def _counted(self, shapes: list[tuple[int, ...]], dtypes: tuple, backward: bool) -> int:
        key = (tuple(shapes), dtypes, backward)
        if key not in self._per_shape:
            with torch.device("meta"):
                twin = self.make_twin()
                example = [torch.zeros(1, *shape, dtype=dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
            loss = (lambda out: sum(o.float().sum() for o in _outputs(out))) if backward else None
            self._per_shape[key] = measure_flops(twin, lambda: twin(*example), loss)
            self.measurements += 1
        return self._per_shape[key]


def _monomials(values: Sequence[int], exponents: list[tuple[int, ...]]) -> np.ndarray:
    return np.array([np.prod([float(v) ** e for v, e in zip(values, powers, strict=True)]) for powers in exponents])


def _outputs(out: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """A model's output as a tuple (BERT pre-training returns masked-LM and next-sentence logits)."""
    return out if isinstance(out, tuple) else (out,)
