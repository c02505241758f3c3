"""Process launch through Lightning Fabric (imported lazily: it costs seconds).

``python script.py``: Fabric starts the other ranks (re-running the command line, or
forking with ``start_method="fork"``).  Under ``torchrun`` or SLURM's ``srun``, on one
node or several, every rank is started by the launcher and Fabric starts nothing
(:mod:`.launchers` reads which ranks this process is).  Inside an already initialised
process group we run directly.  Fabric only launches processes and creates the process
group; devices are ours: rank r uses ``cuda:(local_rank % n_gpus)`` or the CPU, and
the backend is NCCL only when every rank has its own GPU -- otherwise gloo, with CUDA
buffers staged through pinned host memory (NCCL refuses two ranks on one GPU).

Failures of forked/spawned ranks: a rank that raises records its exception in the
hand-off folder and exits *cleanly*, so the launcher does not kill the other ranks
while they run their own shutdown (an aborted pipeline stops every rank within the
timeout and flushes what it holds; a rank that exits closes its connections, so no
peer waits on it).  The launching process then re-raises the error of the rank that
failed first -- e.g. :class:`~alchemi_lit.strategies.pipeline.PipelineError` naming it
-- instead of the launcher's generic ``ProcessRaisedException``.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import subprocess
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist

from .launchers import external_launch

StartMethod = Literal["popen", "fork", "spawn"]


def _under_launcher() -> bool:
    """Whether torchrun or srun started this process (:mod:`.launchers`)."""
    return external_launch() is not None


def is_first_process() -> bool:
    """True in the one process that prepares a run's files: the only one, or rank 0
    where a launcher (torchrun, SLURM) starts every rank with the user's script."""
    ext = external_launch()
    return ext is None or ext.rank == 0


def process_rank() -> int:
    """This process's global rank: the process group's when one is up, else what the
    launcher that started it set (torchrun's ``RANK``, SLURM's ``SLURM_PROCID``, Fabric's
    ``LOCAL_RANK`` for the ranks it starts on one node); 0 for a plain single process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    ext = external_launch()
    if ext is not None:
        return ext.rank
    value = os.environ.get("LOCAL_RANK", "").strip()
    return int(value) if value.isdigit() else 0


def choose_backend(accelerator: str, world_size: int, local_world: int) -> tuple[str, str]:
    """(fabric accelerator, process-group backend)."""
    wants_cuda = accelerator in ("cuda", "gpu") or (
        accelerator == "auto" and torch.cuda.is_available()
    )
    if wants_cuda and torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        return "cuda", "nccl"
    return "cpu", "gloo"


def rank_device(accelerator: str, local_rank: int) -> torch.device:
    wants_cuda = accelerator in ("cuda", "gpu") or (
        accelerator == "auto" and torch.cuda.is_available()
    )
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

    ext = external_launch()
    plugins = []
    if ext is not None:  # torchrun or srun started every rank (one node or several)
        ext.refuse_world(world_size)
        local_world, num_nodes = ext.local_world_size, ext.num_nodes
        plugins.append(ext.cluster_environment())
    else:
        local_world, num_nodes = world_size, 1
    fabric_acc, backend = choose_backend(accelerator, world_size, local_world)
    strategy = DDPStrategy(
        process_group_backend=backend,
        timeout=timedelta(seconds=timeout_s),
        start_method=start_method,
    )
    fabric = Fabric(
        accelerator=fabric_acc,
        devices=local_world,
        num_nodes=num_nodes,
        strategy=strategy,
        plugins=plugins or None,
    )

    spawned = start_method in ("fork", "spawn") and ext is None
    handoff = tempfile.mkdtemp(prefix="alchemi_lit_") if spawned else None

    def entry(fabric_: Any) -> Any:
        if start_method == "fork":
            torch.set_num_threads(1)  # forked ranks hang with more threads (REFERENCE.md)
        if handoff is None:
            return fn(fabric_.global_rank, fabric_.local_rank)
        try:
            value = fn(fabric_.global_rank, fabric_.local_rank)
        except Exception as exc:  # recorded for the launching process (module docstring)
            _record_failure(handoff, fabric_.global_rank, exc)
            return None
        if fabric_.global_rank != 0:
            return None
        # Lightning returns rank 0's value through a pipe that the parent reads only after
        # every child exited: a large value would block forever.  Hand it over as a file.
        path = os.path.join(handoff, "result.pt")
        torch.save(_to_tensors(value), path)
        return path

    try:
        try:
            out = fabric.launch(entry)
            _reap_at_exit(getattr(fabric.strategy.launcher, "procs", None))
        except Exception as exc:  # a rank died without recording (signal, os._exit ...)
            failure = _first_failure(handoff) if handoff is not None else None
            if failure is not None:
                raise failure from exc
            raise
        failure = _first_failure(handoff) if handoff is not None else None
        if failure is not None:
            raise failure
        if handoff is not None and out:
            return _from_tensors(torch.load(out, weights_only=True))
        return out
    finally:
        if handoff is not None:
            shutil.rmtree(handoff, ignore_errors=True)


#: rank processes this process started by re-running the command line (see below)
_started_ranks: list[subprocess.Popen] = []


def _reap_at_exit(children: list[subprocess.Popen] | None) -> None:
    """Make the launching process outlive the rank processes it started by re-running
    the command line: without it ``python script.py`` could return while another rank
    is still shutting down (Fabric does not wait for them, and waiting inside the run
    could deadlock a script that runs again: those ranks run the whole script too)."""
    new = [child for child in children or () if child not in _started_ranks]
    if new and not _started_ranks:
        atexit.register(_wait_for_started_ranks)
    _started_ranks.extend(new)


def _wait_for_started_ranks(timeout_s: float = 60.0) -> None:
    for child in _started_ranks:
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            from loguru import logger

            logger.warning(
                f"rank process {child.pid} still runs {timeout_s:.0f} s after this one "
                f"finished; not waiting longer"
            )


def _record_failure(folder: str, rank: int, exc: BaseException) -> None:
    """Write a rank's exception (pickled if possible) and traceback to ``folder``."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # exceptions with custom __init__ may not round-trip
    except Exception:
        blob = None
    record = {
        "rank": rank,
        "exception": blob,
        "type": type(exc).__name__,
        "text": str(exc),
        "traceback": text,
    }
    tmp = os.path.join(folder, f".failure_rank{rank}")
    with open(tmp, "wb") as f:
        pickle.dump(record, f)
    os.replace(tmp, os.path.join(folder, f"failure_rank{rank}.pkl"))


def _first_failure(folder: str) -> BaseException | None:
    """The exception to raise in the launching process, or None if no rank failed.

    Preference: the rank that failed on its own (an error naming its own rank), then
    any error other than a forwarded pipeline abort, then the lowest rank's error.
    """
    records = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("failure_rank") and name.endswith(".pkl"):
            with open(os.path.join(folder, name), "rb") as f:
                records.append(pickle.load(f))
    if not records:
        return None
    records.sort(key=lambda r: r["rank"])
    excs = []
    for r in records:
        exc = pickle.loads(r["exception"]) if r["exception"] is not None else None
        if exc is None:
            exc = RuntimeError(f"rank {r['rank']} failed: {r['type']}: {r['text']}")
        if hasattr(exc, "add_note"):
            exc.add_note(f"(raised on rank {r['rank']}; its traceback:)\n{r['traceback']}")
        excs.append((r["rank"], exc))
    for rank, exc in excs:
        if getattr(exc, "rank", None) == rank:
            return exc
    for _, exc in excs:
        if getattr(exc, "rank", None) is None:
            return exc
    return excs[0][1]


def _to_tensors(value: Any) -> Any:
    """numpy arrays and scalars -> tensors, recursively (for a weights_only-safe file;
    ``ase.Atoms.info`` holds numpy scalars, e.g. ``ase.build``'s ``adsorbate_info``)."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(value))}
    if isinstance(value, np.generic):
        if value.dtype.kind in "biufc":
            return {"__npscalar__": torch.from_numpy(np.asarray(value))}
        return value.item()  # (a numpy string: the str it holds)
    if isinstance(value, dict):
        return {k: _to_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_tensors(v) for v in value]
    return value


def _from_tensors(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__ndarray__"}:
            return value["__ndarray__"].numpy()
        if set(value) == {"__npscalar__"}:
            return value["__npscalar__"].numpy()[()]
        return {k: _from_tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_tensors(v) for v in value]
    return value
