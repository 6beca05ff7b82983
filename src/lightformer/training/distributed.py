"""Fully sharded data parallel training (FSDP2) on every process, on GPUs or, over gloo, on CPUs.

``configs/trainer/fsdp.yaml`` selects ``FSDP2Strategy``; every task's ``configure_model`` then calls
``shard_model``, which makes each transformer layer one FSDP unit and the rest of the model (embeddings, heads)
another. A model names the stacks whose layers are its units once, beside its class (``layer_stacks``): sharding and
activation checkpointing both read them. FSDP2 (``torch.distributed.fsdp.fully_shard``) shards each parameter as a
DTensor, so what the optimizer, gradient clipping and checkpoints see is ordinary tensors' API: the code path of
single-device training.
"""

from __future__ import annotations

from datetime import timedelta

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from lightformer.nn import Decoder, Encoder


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as plain FSDP2: one data-parallel dimension over all processes.

    ``ModelParallelStrategy`` sizes an "auto" mesh as nodes × processes per node, for tensor parallelism inside a
    node; here every process shards and no tensor is split. Checkpoints are gathered into one ordinary file by
    default, which ``generate``, ``translate``, ``classify`` and ``export`` read anywhere.

    Args:
        save_distributed_checkpoint: write one shard per process into a checkpoint folder instead (for models too
            large to gather on one device); the file commands cannot read those.
        process_group_backend: "nccl" on GPUs, "gloo" on CPUs by default.
        timeout: of collective operations.
    """

    def __init__(
        self,
        save_distributed_checkpoint: bool = False,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
    ) -> None:
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


def layer_stacks(model: nn.Module) -> list[Encoder | Decoder]:
    """The layer stacks of ``model``: the submodules its class's ``layer_stacks`` names (e.g. ``("encoder",
    "decoder")``); none for a model that names none (it is then one unit)."""
    return [model.get_submodule(path) for path in getattr(type(model), "layer_stacks", ())]


def shard_model(model: nn.Module, mesh: DeviceMesh, precision: str) -> None:
    """Shard each layer of ``model``'s stacks (``layer_stacks``), then ``model`` itself, over ``mesh`` (FSDP2).

    Under "bf16-mixed" the sharded parameters are gathered in bfloat16 and gradients reduced in float32 (half the
    communication of float32, the numerics of mixed precision). "16-mixed" would need a sharded gradient scaler
    (every process must skip the same steps), which lightformer does not set up, so it is refused.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if isinstance(model, FSDPModule):  # configure_model runs again for test after fit
        return
    if precision.startswith("16"):
        raise ValueError(
            f"precision={precision!r} is not supported with FSDP2 in lightformer (fp16 needs a gradient scaler "
            "shared by the shards); use bf16-mixed (GPUs since Ampere), 32-true, or DDP for 16-mixed"
        )
    if precision == "bf16-mixed":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    for stack in layer_stacks(model):
        for layer in stack.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def set_gathered(model: nn.Module, gathered: bool) -> None:
    """Gather (``True``) every FSDP2 unit of ``model`` into whole parameters and keep them whole, or shard them
    again (``False``); nothing for a model that is not sharded.

    Evaluation runs gathered: a sharded forward pass is a collective that every process must call in step, but
    evaluation shards may differ by a batch, decoding runs as many steps as its batch needs, and samples and
    attention maps are drawn on one process. Gathered, each process evaluates on its own, as under DDP, holding
    the whole model for the length of the evaluation. Every process calls this (it is a collective).
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_forward(not gathered, recurse=False)
            if gathered:
                module.unshard()
            else:
                module.reshard()
