"""Process launch through Lightning Fabric (imported lazily: it costs seconds).

``python script.py``: Fabric starts the other ranks (re-running the command line, or
forking with ``start_method="fork"``).  Under ``torchrun``/SLURM Fabric detects the
launcher and starts nothing.  Inside an already initialised process group we run
directly.  Fabric only launches processes and creates the process group; devices are
ours: rank r uses ``cuda:(local_rank % n_gpus)`` or the CPU, and the backend is NCCL
only when every rank has its own GPU -- otherwise gloo, with CUDA buffers staged
through pinned host memory (NCCL refuses two ranks on one GPU).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

StartMethod = Literal["popen", "fork", "spawn"]


def _under_launcher() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))


def choose_backend(accelerator: str, world_size: int, local_world: int) -> tuple[str, str]:
    """(fabric accelerator, process-group backend)."""
    wants_cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    if wants_cuda and torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        return "cuda", "nccl"
    return "cpu", "gloo"


def rank_device(accelerator: str, local_rank: int) -> torch.device:
    wants_cuda = accelerator in ("cuda", "gpu") or (accelerator == "auto" and torch.cuda.is_available())
    if wants_cuda:
        if not torch.cuda.is_available():
            raise ValueError("accelerator='cuda' but no CUDA device is available")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def launch(
    fn: Callable[[int, int], Any],
    world_size: int,
    accelerator: str,
    start_method: StartMethod,
    timeout_s: float,
) -> Any:
    """Run ``fn(rank, local_rank)`` on every rank; returns rank 0's value in this process
    (or this rank's value when every rank runs this code, as under torchrun)."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise ValueError(
                f"the plan needs {world_size} ranks but the process group has "
                f"{dist.get_world_size()}; start as many processes as the plan has ranks"
            )
        return fn(dist.get_rank(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import DDPStrategy

    if _under_launcher():
        launched = int(os.environ["WORLD_SIZE"])
        if launched != world_size:
            raise ValueError(
                f"the plan needs {world_size} ranks but {launched} were launched "
                f"(WORLD_SIZE={launched}); launch with --nproc_per_node matching the plan"
            )
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        num_nodes = max(1, world_size // local_world)
    else:
        local_world, num_nodes = world_size, 1
    fabric_acc, backend = choose_backend(accelerator, world_size, local_world)
    strategy = DDPStrategy(
        process_group_backend=backend,
        timeout=timedelta(seconds=timeout_s),
        start_method=start_method,
    )
    fabric = Fabric(accelerator=fabric_acc, devices=local_world, num_nodes=num_nodes, strategy=strategy)

    spawned = start_method in ("fork", "spawn") and not _under_launcher()
    handoff = tempfile.mkdtemp(prefix="alchemi_lit_") if spawned else None

    def entry(fabric_: Any) -> Any:
        if start_method == "fork":
            torch.set_num_threads(1)  # forked ranks hang with more threads (REFERENCE.md)
        value = fn(fabric_.global_rank, fabric_.local_rank)
        if handoff is None or fabric_.global_rank != 0:
            return value if handoff is None else None
        # Lightning returns rank 0's value through a pipe that the parent reads only after
        # every child exited: a large value would block forever.  Hand it over as a file.
        path = os.path.join(handoff, "result.pt")
        torch.save(_to_tensors(value), path)
        return path

    try:
        out = fabric.launch(entry)
        if handoff is not None and out:
            return _from_tensors(torch.load(out, weights_only=True))
        return out
    finally:
        if handoff is not None:
            shutil.rmtree(handoff, ignore_errors=True)


def _to_tensors(value: Any) -> Any:
    """numpy arrays -> tensors, recursively (for a weights_only-safe file)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(value))}
    if isinstance(value, dict):
        return {k: _to_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_tensors(v) for v in value]
    return value


def _from_tensors(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__ndarray__"}:
            return value["__ndarray__"].numpy()
        return {k: _from_tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_tensors(v) for v in value]
    return value
