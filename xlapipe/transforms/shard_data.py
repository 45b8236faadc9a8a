"""shard_data: SPMD data parallelism over a device mesh, on torch_xla's own runtime.

One process drives every device of its host as one virtual device; each batch
is split along its first dimension over the mesh's batch axis as the device
loader uploads it (``MpDeviceLoader(..., input_sharding=...)``), and the
model's parameters are replicated, or sharded along a mesh axis (FSDP-like),
when the setup is realised. XLA's SPMD partitioner inserts the collectives.

The transform records the plan as a hook (:class:`ShardData`): when the
setup is realised it turns SPMD on with ``torch_xla.runtime.use_spmd()``
before the model is moved, then lays the moved parameters out on the mesh:
that switch is process-wide and **cannot be undone** in the process (it sets
``XLA_USE_SPMD=1`` and moves the runtime to a virtual device); every later
session in the same process runs in SPMD mode too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from attrs import field, frozen
from torch import nn
from torch_xla.distributed.parallel_loader import MpDeviceLoader

from xlapipe import claims
from xlapipe._convert import ints, strs
from xlapipe.claims import Claim
from xlapipe.device_loader import DeviceLoader
from xlapipe.hooks import Hook, SetupView
from xlapipe.training_setup import TrainingSetup
from xlapipe.transform import Transform, check_flag, practice, register

MODEL_PLACEMENTS = ("replicate", "shard")


@frozen
class SpmdPlan:
    """The mesh and how batches and parameters are laid out on it (plain data)."""

    mesh_shape: tuple[int, ...] = field(converter=ints)
    axis_names: tuple[str, ...] = field(converter=strs)
    batch_axis: str
    model: str = "replicate"
    shard_axis: str | None = None
    minibatch: bool = False

    @property
    def model_axis(self) -> str:
        """The axis parameters are sharded along (``model="shard"``)."""
        return self.shard_axis or self.batch_axis

    def resolved_shape(self, devices: int) -> tuple[int, ...]:
        """``mesh_shape`` with its ``-1`` filled in for ``devices`` devices."""
        known = math.prod(d for d in self.mesh_shape if d != -1)
        if -1 in self.mesh_shape:
            if devices % known:
                raise ValueError(
                    f"shard_data: mesh_shape {self.mesh_shape} cannot cover {devices} devices "
                    f"({devices} is not a multiple of {known}); choose sizes whose product divides {devices}"
                )
            return tuple(devices // known if d == -1 else d for d in self.mesh_shape)
        if known != devices:
            raise ValueError(
                f"shard_data: mesh_shape {self.mesh_shape} needs {known} devices, and this "
                f"runtime has {devices}. Use mesh_shape=(-1,) to take every device, or give "
                f"the runtime {known} devices (on CPU: CPU_NUM_DEVICES={known} in a fresh process)."
            )
        return self.mesh_shape

    def activate(self) -> None:
        """Check the mesh fits the runtime, then turn SPMD on (process-wide, irreversible)."""
        import torch_xla.runtime as xr

        self.resolved_shape(xr.global_runtime_device_count())  # refuse before switching
        if not xr.is_spmd() and xr.world_size() > 1:
            raise RuntimeError(
                "shard_data: this process is one of several replicas (xlapipe.launch, "
                "torch_xla.launch or xmp.spawn). SPMD runs one process per host that drives "
                "every local device: run the script directly (on a pod, once per host)."
            )
        if not xr.is_spmd():
            xr.use_spmd()

    def mesh(self) -> Any:
        """The ``torch_xla.distributed.spmd.Mesh`` over every device (needs SPMD on)."""
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        devices = xr.global_runtime_device_count()
        return xs.Mesh(np.arange(devices), self.resolved_shape(devices), self.axis_names)

    def place(self, model: nn.Module) -> nn.Module:
        """Annotate ``model``'s parameters (already on the XLA device) with their sharding.

        ``replicate``: every parameter on every device. ``shard``: the first
        dimension of each parameter split along :attr:`model_axis` when it
        divides evenly, the parameter replicated otherwise.
        """
        import torch_xla.distributed.spmd as xs

        mesh = self.mesh()
        size = mesh.shape()[self.model_axis]
        for p in model.parameters():
            if p.dim() == 0:
                continue
            first = self.model_axis if self.model == "shard" and p.shape[0] % size == 0 else None
            xs.mark_sharding(p, mesh, (first,) + (None,) * (p.dim() - 1))
        return model

    def batch_sharding(self) -> BatchSharding:
        return BatchSharding(self)


@frozen
class ShardData(Hook):
    """The hook: SPMD on before placement, parameters laid out after it; one-host checkpoints only."""

    plan: SpmdPlan

    def before_placement(self, setup: SetupView) -> None:
        self.plan.activate()  # use_spmd() before any tensor is on the device; process-wide

    def after_placement(self, model: nn.Module) -> None:
        self.plan.place(model)  # replicate or shard the parameters over the mesh

    def before_save(self) -> None:
        import torch_xla.runtime as xr

        if xr.process_count() > 1:
            raise NotImplementedError(
                "xlapipe.checkpoint gathers every tensor on one host; a multi-host SPMD run "
                "holds shards no single host can read. Use torch.distributed.checkpoint with "
                "torch_xla.experimental.distributed_checkpoint.SPMDSavePlanner / SPMDLoadPlanner."
            )

    def describe(self) -> dict:
        return {"hook": "shard_data", "mesh_shape": list(self.plan.mesh_shape)}


class BatchSharding:
    """The device loader's ``input_sharding``: dim 0 of every tensor along the batch axis.

    Unlike one ``ShardingSpec`` (which fits tensors of one rank only), this
    shards inputs and labels of any rank alike. The mesh is built lazily, on
    the loader's upload thread, once SPMD is on.
    """

    def __init__(self, plan: SpmdPlan):
        self.plan = plan
        self._specs: dict[int, Any] = {}

    @property
    def minibatch(self) -> bool:
        return self.plan.minibatch

    def can_apply(self, t: torch.Tensor) -> bool:
        return t.dim() > 0

    def spec(self, rank: int) -> Any:
        """The ``ShardingSpec`` for tensors of ``rank`` dimensions (None: upload replicated)."""
        if rank not in self._specs:
            import torch_xla.distributed.spmd as xs

            mesh = self.plan.mesh()
            first: Any = self.plan.batch_axis
            others = [a for a in self.plan.axis_names if a != first]
            if rank == 1 and others:
                # torch_xla 2.9 cannot upload a 1-D tensor partially replicated
                # ("IndexError: too many indices"): name the size-1 axes too when
                # that is the same layout, else upload it replicated.
                sizes = mesh.shape()
                first = tuple(self.plan.axis_names) if all(sizes[a] == 1 for a in others) else None
            self._specs[rank] = (
                None
                if first is None
                else xs.ShardingSpec(mesh, (first,) + (None,) * (rank - 1), minibatch=self.plan.minibatch)
            )
        return self._specs[rank]

    def xla_spec(self, t: torch.Tensor) -> Any:
        spec = self.spec(t.dim()) if self.can_apply(t) else None
        return None if spec is None else spec.xla_spec(t)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchSharding) and other.plan == self.plan

    def __hash__(self) -> int:
        return hash(self.plan)

    def __repr__(self) -> str:
        return f"BatchSharding(batch_axis={self.plan.batch_axis!r})"


def _shard(setup: TrainingSetup, **params: Any) -> TrainingSetup:
    plan = SpmdPlan(**params)
    loaders = {}
    for name, loader in setup.loaders.items():
        if isinstance(loader, MpDeviceLoader):
            options = dict(loader._parallel_loader_kwargs)
            if options.get("input_sharding") is None:  # an explicit user choice is kept
                options["input_sharding"] = plan.batch_sharding()
            loader = DeviceLoader(loader._loader, loader._device, **options)
        loaders[name] = loader
    return setup.evolve(loaders=loaders)


def _check(
    mesh_shape: Any, axis_names: Any, batch_axis: Any, model: Any, shard_axis: Any, minibatch: Any
) -> None:
    if (
        not isinstance(mesh_shape, tuple)
        or not mesh_shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1) for d in mesh_shape)
    ):
        raise ValueError(
            f"shard_data: mesh_shape must be a non-empty tuple of positive ints (one may be -1 "
            f"for 'the remaining devices'), e.g. (-1,) or (2, 2); got {mesh_shape!r}"
        )
    if mesh_shape.count(-1) > 1:
        raise ValueError(f"shard_data: at most one -1 in mesh_shape, got {mesh_shape!r}")
    if not isinstance(axis_names, tuple) or not all(isinstance(a, str) and a for a in axis_names):
        raise ValueError(
            f"shard_data: axis_names must be a tuple of names, e.g. ('data',); got {axis_names!r}"
        )
    if len(axis_names) != len(mesh_shape) or len(set(axis_names)) != len(axis_names):
        raise ValueError(
            f"shard_data: axis_names {axis_names!r} must name each of the {len(mesh_shape)} "
            f"mesh dimensions of {mesh_shape!r} once"
        )
    if batch_axis not in axis_names:
        raise ValueError(f"shard_data: batch_axis {batch_axis!r} is not one of the axis_names {axis_names!r}")
    if model not in MODEL_PLACEMENTS:
        raise ValueError(f"shard_data: model must be 'replicate' or 'shard', got {model!r}")
    if shard_axis is not None and (model != "shard" or shard_axis not in axis_names):
        raise ValueError(
            f"shard_data: shard_axis={shard_axis!r} needs model='shard' and one of the "
            f"axis_names {axis_names!r}"
        )
    check_flag("shard_data", "minibatch", minibatch)


@register
def shard_data(
    mesh_shape: tuple[int, ...] = (-1,),
    axis_names: tuple[str, ...] = ("data",),
    batch_axis: str = "data",
    model: str = "replicate",
    shard_axis: str | None = None,
    minibatch: bool = False,
) -> Transform:
    """SPMD data parallelism: batches split along ``batch_axis`` of a device mesh.

    ``mesh_shape``/``axis_names``: the mesh over every device (``-1``: the rest).
    ``model``: ``"replicate"`` the parameters, or ``"shard"`` their first
    dimension along ``shard_axis`` (default: the batch axis, FSDP-like).
    ``minibatch``: each host loads only its own part of the global batch
    (multi-host pods; give each host its own data shard).
    Turning SPMD on when the setup is realised cannot be undone in the process.
    """
    mesh_shape = tuple(mesh_shape) if isinstance(mesh_shape, list) else mesh_shape
    axis_names = tuple(axis_names) if isinstance(axis_names, list) else axis_names
    _check(mesh_shape, axis_names, batch_axis, model, shard_axis, minibatch)
    plan = SpmdPlan(mesh_shape, axis_names, batch_axis, model, shard_axis, minibatch)
    return practice(
        "shard_data",
        plan,
        _shard,
        needs=("with_device", "wrap_loader_mp"),
        excludes=("wrap_model_mp",),
        hooks=(ShardData(plan),),
    )


claims.declare(
    Claim(
        "shard_data",
        shard_data,
        summary="SPMD: batches sharded over the devices' mesh",
        own_process=True,
    )
)
