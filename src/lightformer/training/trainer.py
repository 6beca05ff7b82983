"""Lightning's ``Trainer``, whose ``precision`` may also be ``"auto"``: the precision this device trains fastest in
(``lightformer.training.peaks.auto_precision``), decided once at start and said in the log."""

from __future__ import annotations

from typing import Literal

import lightning as L
from lightning.fabric.connector import _PRECISION_INPUT

from lightformer.training.peaks import resolve_precision


class Trainer(L.Trainer):
    """``lightning.Trainer`` with ``precision: auto`` (bf16-mixed where this device runs it faster, else 32-true on a
    CPU; 16-mixed on a GPU without bf16). Every other argument is Lightning's."""

    def __init__(self, *args, precision: _PRECISION_INPUT | Literal["auto"] | None = None, **kwargs) -> None:
        super().__init__(*args, precision=resolve_precision(precision, kwargs.get("accelerator", "auto")), **kwargs)
