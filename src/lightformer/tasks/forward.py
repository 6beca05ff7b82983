"""How a task calls its model: eagerly or through ``torch.compile``, with the checkpoint's keys unchanged."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

LEGACY_ALIAS = "forward_fn."


def model_forward(model: nn.Module, compile: bool) -> Callable:
    """The function a task calls to run its model: the module's ``__call__`` (hooks included), compiled with
    ``torch.compile`` when ``compile``.

    A bound method, not a module: a module stored on the task would be registered a second time, so every
    checkpoint would hold each weight twice (as ``_orig_mod.*`` when compiled, keys that an eager model does
    not load). Only the training/evaluation forward pass goes through it; generation and beam search (growing
    lengths, a cache) call the model eagerly.
    """
    return torch.compile(model).__call__ if compile else model.__call__


def drop_legacy_alias(checkpoint: dict) -> None:
    """Checkpoints written before the model's forward function stopped being a registered module held every
    weight a second time under ``forward_fn.`` (``forward_fn._orig_mod.`` when compiled); drop those copies."""
    state = checkpoint.get("state_dict", {})
    for key in [k for k in state if k.startswith(LEGACY_ALIAS)]:
        del state[key]
