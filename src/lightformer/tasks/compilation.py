"""A task's compiled forward pass (``compile: true``): the model, and the loss after it (``compiled``), through
``torch.compile``, dynamic from the start for batches of varying shapes.

``CompiledForward`` is a part of ``lightformer.tasks.Task`` (which sets ``compile``, ``_forward`` and ``_compiled``
up), not a class of its own use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch._dynamo
from torch import Tensor, nn

from lightformer.facts import DataFacts

DYNAMIC_COMPILE_OPTIONS = {"triton.coalesce_tiling_analysis": False}  # inductor options, dynamic graphs (_compile)


class CompiledForward:
    """The methods of a ``Task`` that run its model, compiled or not (see the module's docstring)."""

    model: nn.Module
    compile: bool
    data_facts: DataFacts | None
    variable_shapes: bool  # do the batches' sizes or lengths vary from batch to batch (``forward``)
    _forward: Callable | None  # the model's __call__, compiled or not; a method, never a registered module
    _compiled: dict[str, Callable]  # the methods ``compiled`` compiled, by name

    def forward(self, *inputs: Tensor) -> Tensor:
        """The model's forward pass, compiled on first use when ``compile`` (see the model for the shapes).

        A task whose batches vary in shape (``variable_shapes``: token-budget batches, padding to the longest in the
        batch) compiles with dynamic shapes from the start: one graph serves every batch size and length. Left to
        itself, ``torch.compile`` compiles the first shape static and the second dynamic, and a model with a graph
        break (the masked-LM head's gather of the masked positions) twice more; each compile costs a minute of a CPU
        or of a GPU's host (``tests/test_compile.py`` counts them). A task of fixed shapes compiles them static.

        The compiled function is kept as a bound method, not a module: a second registered module would store
        every weight twice in checkpoints, under keys an eager model cannot load. Generation and beam search
        (growing lengths, a cache) call ``self.model`` eagerly.
        """
        if self._forward is None:
            self._forward = (self._compile(self.model) if self.compile else self.model).__call__
        return self._forward(*inputs)

    def _compile(self, function: Callable) -> Callable:
        """``torch.compile(function)``: dynamic from the start for a task of ``variable_shapes``, else static (then
        dynamic if a second shape comes). A dynamic graph compiles without inductor's memory-coalescing tiling
        analysis, which inductor does not apply to dynamic shapes by design but reaches anyway through a fused
        reduction on CUDA, and there fails an assertion (``get_pw_red_splits``, pytorch/pytorch#197077): the
        label-smoothed loss of ``configs/translation/ding_de_en_gpu.yaml`` stopped its first step on an H100 with
        torch 2.11 (docs/scaling.md, the GPU check).

        Batches padded to length buckets (the data's ``length_multiple``: a few shapes) compile static, one graph per
        bucket (and per training or evaluation), never dynamic: on a GPU the dynamic backward graph of the Ding
        config had not compiled after 130 s. Dynamo's limit of recompilations per function is raised to hold them."""
        multiple = self.data_facts.length_multiple if self.data_facts is not None else None
        if self.variable_shapes and multiple is not None:
            buckets = -(-self.data_facts.max_length // multiple) if self.data_facts.max_length else 16
            limit = 2 * buckets + 2  # training and evaluation graphs of each bucket, and a last short batch
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
            return torch.compile(function, dynamic=False)
        if self.variable_shapes:
            return torch.compile(function, dynamic=True, options=DYNAMIC_COMPILE_OPTIONS)
        return torch.compile(function)

    def compiled(self, method: Callable) -> Callable:
        """``method`` (of this task: the model's forward pass and the loss after it) compiled when ``compile``, as
        ``forward`` compiles the model; else ``method`` itself. Compiling the loss with the model lets inductor fuse
        the logits' cast to fp32 and the cross-entropy over the vocabulary, which the model's graph alone leaves to
        eager code: on the CPU translation config the model alone compiled ran at 0.9× eager, model and loss at 1.2×
        (docs/scaling.md). ``method`` calls ``self.model``, not ``self``: one compiled graph, not one inside another."""
        if not self.compile:
            return method
        if method.__name__ not in self._compiled:
            self._compiled[method.__name__] = self._compile(method)
        return self._compiled[method.__name__]
