"""What a task's batch holds and costs, for the throughput lines and FLOP/s
(``lightformer.training.callbacks.Throughput``): the tensors its model takes (``model_inputs``), the samples and items
it counts (``throughput_counts``: each task says both) and the model's floating-point operations on it
(``batch_flops``).

``BatchCosts`` is a part of ``lightformer.tasks.Task`` (which sets ``_flop_counter`` up and calls ``batch_flops``
before each training and validation batch), not a class of its own use.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from lightformer.training.flops import FlopCounter


class BatchCosts:
    """The methods of a ``Task`` that count a batch (see the module's docstring)."""

    model: nn.Module
    _flop_counter: FlopCounter | None

    def model_inputs(self, batch: Any) -> tuple[Tensor, ...]:
        """The tensors of ``batch`` that ``forward`` takes, batch dimension first."""
        raise NotImplementedError

    def throughput_counts(self, batch: Any) -> tuple[int, int | Tensor]:
        """(samples, items) in ``batch``: items are what the task's throughput counts (tokens or images); a count
        that depends on the batch's values (tokens that are not padding) stays a tensor on the device, which the
        throughput and progress lines read back only when they are written."""
        raise NotImplementedError

    def batch_flops(self, batch: Any, backward: bool) -> int:
        """Floating-point operations of the model on ``batch``: the forward pass, and the backward pass if
        ``backward``. Counted by PyTorch's ``FlopCounterMode`` on a copy of the model on the meta device (no
        compute) at a few shapes, then by a polynomial in the sequence lengths (``lightformer.training.flops``): a
        batch of a new shape costs no count."""
        if self._flop_counter is None:
            # FSDP2's fully_shard makes the model an instance of a subclass of FSDPModule and the model's own class
            model_class = next(c for c in type(self.model).__mro__ if not issubclass(c, FSDPModule))
            self._flop_counter = FlopCounter(lambda: model_class(self.model.config))
        inputs = self.model_inputs(batch)
        return self._flop_counter.per_example(inputs, backward) * len(inputs[0])
