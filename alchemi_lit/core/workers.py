"""Independent CPU work of many materials in worker processes.

Some per-material work is not the model's and cannot be batched: phonopy's symmetry
set-up of a supercell, its force constants and thermal sums.  With a cheap model (or a
GPU) it is most of a phonon campaign's time, spent one material after the other on one
core.  :func:`map_in_workers` spreads such calls over ``workers`` processes.

The workers are fresh interpreters running :mod:`.worker_main` as a script, talking
over pipes, not ``multiprocessing`` children: a spawned child re-imports the user's
script, which runs an unguarded script's top-level code again, and a forked child of a
process whose torch and BLAS thread pools already run can deadlock.  Each worker gets
one thread (``OMP_NUM_THREADS=1`` ...), so ``workers`` processes use ``workers`` cores.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .worker_main import receive, send

#: environment of every worker: one thread each, so the pool uses ``workers`` cores
_ONE_THREAD = {
    name: "1"
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "NUMEXPR_NUM_THREADS", "RAYON_NUM_THREADS")
}  # fmt: skip


class WorkerError(RuntimeError):
    """A worker died, or a call raised an exception that could not travel back."""


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def resolve_workers(
    workers: int | str | None, tasks: int, what: str, work_s: float | None = None
) -> int:
    """How many processes: an int >= 1 as given (at most one per task); ``"auto"``/None:
    one per usable core and task, but only as many as ``work_s`` (an estimate of the
    whole work's seconds on one core, when known) keeps busy for ``WORKER_PAYS_S`` each
    -- a worker takes about a second to start, so small work stays in this process."""
    if workers is None or workers == "auto":
        n = min(usable_cores(), tasks)
        if work_s is not None:
            n = min(n, int(work_s / WORKER_PAYS_S))
        return max(1, n)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        from .errors import ConfigError

        raise ConfigError(f"{what}: workers must be 'auto' or an int >= 1, got {workers!r}")
    return min(workers, max(tasks, 1))


#: seconds of work a worker must get to pay for its start (python, numpy and the
#: called library's imports; docs/design/46-materials-property-workflows.md)
WORKER_PAYS_S = 2.0


def map_in_workers(
    module: ModuleType,
    name: str,
    arguments: Sequence[tuple[Any, ...]],
    workers: int,
    costs: Sequence[float] | None = None,
) -> list[Any]:
    """``module.name(*args)`` for each ``args``; results in the order of ``arguments``.

    ``module`` must import nothing relative (workers load it from its file, without
    alchemi_lit).  A call that raises gives its exception in its place (the others
    still run; a worker's traceback is attached as a note), a dead worker a
    :class:`WorkerError`; the caller decides what a failure means.  ``workers <= 1``
    (or a single call) runs in this process, through the same function, so results do
    not depend on it.  ``costs`` (an estimate per call) hands out the dearest calls
    first, so that no worker is left with a big one while the others idle at the end.
    """
    if workers <= 1 or len(arguments) <= 1:
        return [_call_here(getattr(module, name), args) for args in arguments]
    request = (str(Path(module.__file__).resolve()), name)  # type: ignore[arg-type]
    todo: queue.Queue[int] = queue.Queue()
    order = range(len(arguments))
    for k in order if costs is None else sorted(order, key=lambda k: -costs[k]):
        todo.put(k)
    results: list[Any] = [None] * len(arguments)
    threads = [
        threading.Thread(target=_serve, args=(request, arguments, todo, results), daemon=True)
        for _ in range(min(workers, len(arguments)))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _call_here(function: Any, args: tuple[Any, ...]) -> Any:
    try:
        return function(*args)
    except Exception as exc:
        return exc


def _serve(request: tuple[str, str], arguments: Sequence[Any], todo: queue.Queue,
           results: list) -> None:  # fmt: skip
    """One worker process: take calls from ``todo`` until it is empty; a worker that
    dies fails its call and is replaced for the next one."""
    proc = None
    try:
        while True:
            try:
                k = todo.get_nowait()
            except queue.Empty:
                return
            if proc is None:
                proc = _start()
            try:
                send(proc.stdin, (*request, arguments[k]))
                ok, value = receive(proc.stdout)
                results[k] = value if ok else _raised(*value)
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                _stop(proc)
                results[k] = WorkerError(
                    f"the worker process died (exit code {proc.returncode}) during "
                    f"{request[1]}: {type(exc).__name__}: {exc}"
                )
                proc = None
            except Exception as exc:  # e.g. an argument that cannot be pickled
                results[k] = WorkerError(f"{type(exc).__name__}: {exc}")
    finally:
        if proc is not None:
            _stop(proc)


def _raised(exc: BaseException | None, remote_traceback: str) -> BaseException:
    """The worker's exception with its traceback as a note (a WorkerError carrying the
    traceback when the exception itself could not be pickled)."""
    if exc is None:
        return WorkerError(remote_traceback)
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(f"in a worker process:\n{remote_traceback}")
    return exc


def _start() -> subprocess.Popen:
    env = {**os.environ, **_ONE_THREAD}  # and this process's sys.path, for the libraries
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    script = str(Path(__file__).with_name("worker_main.py"))
    return subprocess.Popen(
        [sys.executable, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )


def _stop(proc: subprocess.Popen) -> None:
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)
    except Exception:
        proc.kill()
        proc.wait()
