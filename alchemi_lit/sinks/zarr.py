"""ZarrSink: finished systems appended to a zarr v3 results store.

The layout, and reading a store back, are in :mod:`alchemi_lit.io.results_store`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from loguru import logger

from ..core.errors import ConfigError
from ..core.info_codec import info_to_json
from ..core.state import MODEL_ERROR_KEY, Batch
from ..io.results import Results
from ..io.results_store import (
    ATOM_COLUMNS,
    SCHEMA,
    SYSTEM_COLUMNS,
    open_store,
    read_results,
    read_store_batch,
    stored_system_ids,
)
from ..io.store_constraints import columns_to_write
from ..io.store_reader import CHAIN_COLUMNS, MC_COLUMNS, REPLICA_COLUMNS
from .base import Sink, SinkFlushError, id_list


class ZarrSink(Sink):
    """Append finished systems to a zarr v3 store (layout in the module docstring).

    ``mode``: ``"w-"`` (default) refuses an existing store, ``"a"`` appends to it,
    ``"w"`` replaces it -- a store is never overwritten unless asked for.  The mode
    applies to a store this sink did not create: the later runs a sink is used for
    (a Simulator run again) are appended to the store it created, each as a run of its
    own, as TrajectoryWriter does.  A run that appends must use system_ids the store
    does not hold yet (checked before the run: :meth:`refuse_id_clashes`); :meth:`read`
    gives every stored system, or one run's.

    Writes are buffered: systems reach the store ``flush_every`` systems at a time, or
    when the oldest buffered one has waited ``flush_seconds``, before every checkpoint
    and at close.  A zarr append has a fixed cost per array whatever its size, so
    writing each bookkeeping's few graduates at once dominated a long streamed run
    (figures in BENCHMARKS.md, "Soak").  If a flush fails, every buffered system goes on
    to the next sink (nothing is lost); ``flush_every=1`` writes through.

    Each array is stored in chunks of at least 1024 rows (the first write's size if
    larger), so appending costs memory of one flush whatever the store holds.
    ``shards``: chunks per file (zarr v3 sharding) for arrays this sink creates -- a
    store of millions of systems then has a few files per array instead of one per chunk
    (cluster file systems count inodes); each flush rewrites the shard file it lands in,
    so the default (None, one file per chunk) suits live runs and sharding suits stores
    written in large pieces (:func:`~alchemi_lit.sinks.merge_stores` shards its output).
    """

    def __init__(
        self,
        store: str | Path,
        mode: Literal["w-", "a", "w"] = "w-",
        flush_every: int = 2048,
        flush_seconds: float = 30.0,
        shards: int | None = None,
    ) -> None:
        if mode not in ("w-", "a", "w"):
            raise ConfigError(f"ZarrSink mode must be 'w-', 'a' or 'w', got {mode!r}")
        if int(flush_every) < 1 or not flush_seconds >= 0:
            raise ConfigError(
                f"ZarrSink needs flush_every >= 1 and flush_seconds >= 0, got {flush_every!r}, "
                f"{flush_seconds!r}"
            )
        if shards is not None and (isinstance(shards, bool) or int(shards) < 1):
            raise ConfigError(
                f"ZarrSink shards is the number of chunks per file: an integer >= 1 or None, "
                f"got {shards!r}"
            )
        self.path = Path(store)
        self.mode = mode
        self.shards = None if shards is None else int(shards)
        self.flush_every, self.flush_seconds = int(flush_every), float(flush_seconds)
        self._group = None
        self._created = False  # this sink made the store: its later runs append
        self._continuing = False  # the next open continues the store's last run
        self._run_info: dict[str, Any] = {}
        self._pending: list[Batch] = []
        self._pending_n = 0
        self._pending_since = 0.0

    # ---------------------------------------------------------------- open
    def open(self, run_info: dict[str, Any]) -> None:
        self.refuse_unwritable()
        try:
            self._open(run_info)
        except OSError as exc:  # (a folder made read-only or immutable since the check)
            raise ConfigError(
                f"ZarrSink: cannot write the results store {str(self.path)!r} "
                f"({type(exc).__name__}: {exc.strerror or exc}); choose a store path in a "
                f"writable folder"
            ) from exc

    def _open(self, run_info: dict[str, Any]) -> None:
        import zarr

        self._run_info = dict(run_info)
        if self._group is not None:  # resumed: already open at the checkpoint's state
            return
        exists = self.path.exists()
        if exists and self._continuing:  # a restart: the interrupted run goes on
            self._group = zarr.open_group(str(self.path), mode="a")
            self._continuing = False
            return
        self.refuse_existing()
        if exists and self._appends():
            group = zarr.open_group(str(self.path), mode="a")
            if group.attrs.get("schema") != SCHEMA:
                raise ConfigError(
                    f"{str(self.path)!r} is not an alchemi_lit results store (schema "
                    f"{group.attrs.get('schema')!r}); choose another path"
                )
            self._run_info["first_row"] = int(group.attrs.get("n_systems", 0))
            runs = list(group.attrs.get("runs", []))
            runs.append(self._run_info)
            group.attrs["runs"] = runs
        else:
            group = zarr.open_group(str(self.path), mode="w")
            self._created = True
            self._run_info["first_row"] = 0
            group.attrs.update(schema=SCHEMA, n_systems=0, n_atoms=0, runs=[self._run_info])
        self._group = group

    def state_dict(self) -> dict[str, Any]:
        self.flush()  # a checkpoint records only what is in the store
        if self._group is None:
            return {"n_systems": 0, "n_atoms": 0}
        return {
            "n_systems": int(self._group.attrs["n_systems"]),
            "n_atoms": int(self._group.attrs["n_atoms"]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: reopen the store and roll its commit marker back to the checkpoint."""
        import zarr

        if not self.path.exists():
            raise ConfigError(
                f"cannot resume: results store {str(self.path)!r} written before the "
                f"checkpoint is missing"
            )
        group = zarr.open_group(str(self.path), mode="a")
        group.attrs.update(n_systems=int(state["n_systems"]), n_atoms=int(state["n_atoms"]))
        self._group = group
        self._pending, self._pending_n = [], 0

    def _ensure(self) -> Any:
        if self._group is None:
            self.open(self._run_info)
        return self._group

    # ---------------------------------------------------------------- write
    def write(self, batch: Batch) -> None:
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(batch.to(device="cpu"))
        self._pending_n += batch.num_systems
        waited = time.monotonic() - self._pending_since
        if self._pending_n >= self.flush_every or waited >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        """Write the buffered systems to the store; on failure raise
        :class:`SinkFlushError` carrying all of them."""
        if not self._pending:
            return
        host = Batch.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._pending_n = [], 0
        try:
            self._append(host)
        except Exception as exc:
            raise SinkFlushError(f"{type(exc).__name__}: {exc}", host) from exc

    def _append(self, host: Batch) -> None:
        group = self._ensure()
        n_sys0 = int(group.attrs["n_systems"])
        n_atom0 = int(group.attrs["n_atoms"])
        atoms = {k: host.atom[k].numpy() for k in ATOM_COLUMNS}
        # (MC statistics, replica-exchange fields: where the run has them)
        columns = (*SYSTEM_COLUMNS, *MC_COLUMNS, *REPLICA_COLUMNS, *CHAIN_COLUMNS)
        systems = {k: host.system[k].numpy() for k in columns if k in host.system}
        systems["atom_offset"] = n_atom0 + np.concatenate([[0], np.cumsum(systems["n_atoms"])[:-1]])
        for name, data in atoms.items():
            self._put(group, f"atoms/{name}", data, n_atom0)
        for name, data in systems.items():
            self._put(group, f"systems/{name}", data, n_sys0)
        # constraints: only once the store holds a constrained system (zero: none)
        for key, data in columns_to_write(host.atom, host.system, group).items():
            self._put(group, key, data, n_atom0 if key[0] == "a" else n_sys0, zero_fill=True)
        infos = [info_to_json(host.info.get(sid)) for sid in systems["system_id"].tolist()]
        self._put(group, "systems/info", np.array(infos, dtype=object), n_sys0)
        errors = {
            str(sid): host.info[sid][MODEL_ERROR_KEY]
            for sid in systems["system_id"].tolist()
            if MODEL_ERROR_KEY in host.info.get(sid, {})
        }
        if errors:  # why quarantined systems failed, keyed by system_id
            group.attrs["errors"] = {**group.attrs.get("errors", {}), **errors}
        # commit marker last: readers never see half-written systems
        group.attrs.update(n_systems=n_sys0 + host.num_systems, n_atoms=n_atom0 + host.num_atoms)

    def _put(
        self, group: Any, name: str, data: np.ndarray, start: int, zero_fill: bool = False
    ) -> None:
        if data.dtype == np.float32 or data.dtype == np.float64:
            data = data.astype(np.float64, copy=False)
        end = start + len(data)
        if name in group:
            arr = group[name]
            if arr.shape[1:] != data.shape[1:]:
                raise ConfigError(
                    f"cannot append to {name}: stored shape {arr.shape[1:]} differs from "
                    f"{data.shape[1:]} (was the store written by another plan?); use a new store"
                )
            if arr.shape[0] != end:
                arr.resize((end, *arr.shape[1:]))
        else:
            chunk = (max(1024, len(data)), *data.shape[1:])
            dtype = str if data.dtype == object else data.dtype  # object: JSON strings
            # rows of earlier runs that lacked this column read as NaN, not as 0 eV
            fill = {"fill_value": np.nan} if data.dtype == np.float64 else {}
            if zero_fill:  # (earlier rows of a constraint column: unconstrained)
                fill = {"fill_value": data.dtype.type(0)}
            if self.shards is not None:  # a shard holds whole chunks
                fill["shards"] = (chunk[0] * self.shards, *chunk[1:])
            arr = group.create_array(
                name, shape=(end, *data.shape[1:]), dtype=dtype, chunks=chunk, **fill
            )
        if len(data):
            arr[start:end] = data

    # ---------------------------------------------------------------- read
    def __len__(self) -> int:
        if not self.path.exists():
            return self._pending_n
        import zarr

        stored = int(zarr.open_group(str(self.path), mode="r").attrs.get("n_systems", 0))
        return stored + self._pending_n

    def _appends(self) -> bool:
        """Whether a run opening an existing store adds to it (see the class doc)."""
        return self.mode == "a" or self._created

    def close(self) -> None:
        """Flush, and end this run's hold on the store: a later run with this sink
        opens it again as a run of its own instead of writing on as this one."""
        try:
            self.flush()
        finally:
            self._group = None

    def read_batch(self, run: int | None = None) -> Batch | None:
        """The stored systems as a Batch; ``run``: only those the ``run``-th run that
        wrote this store added (0 = the first; negative counts from the last)."""
        self.flush()
        return read_store_batch(self.path, run=run)

    def read(self, run: int | None = None) -> Results:
        """The stored systems as :class:`~alchemi_lit.io.results.Results` (``run``: see
        :meth:`read_batch`); the same as :func:`read_results` of the store."""
        self.flush()
        return read_results(self.path, run=run)

    def latest_run(self) -> int | None:
        """Index of the newest entry in the store's ``runs`` (the run that wrote it
        last), or None without a store."""
        if not self.path.exists():
            return None
        runs = open_store(self.path).attrs.get("runs", [])
        return len(runs) - 1 if runs else None

    @property
    def continuing(self) -> bool:
        """Whether the next open continues the store's last run (:meth:`continue_run`)."""
        return self._continuing

    def continue_run(self) -> None:
        """The next run writing this store continues the store's last run (a restart of
        an interrupted run: its finished systems stay, the others are appended)."""
        self._continuing = self._created = True

    def recorded_fingerprint(self) -> dict[str, Any] | None:
        """The fingerprint of the run that wrote this store last (None if not recorded;
        see :mod:`alchemi_lit.engine.fingerprint`)."""
        if not self.path.exists():
            return None
        runs = open_store(self.path).attrs.get("runs", [])
        return runs[-1].get("fingerprint") if runs else None

    def created_by_run(self) -> None:
        """Note that a run with this sink made its store (also when a pipeline rank
        wrote it through a copy of this sink): later runs with it append to it."""
        if self.path.exists():
            self._created = True

    def refuse_existing(self) -> None:
        """Mode ``"w-"``: refuse a store that exists and that this sink did not create
        (checked before a run starts, and again when the store is opened)."""
        if self.mode == "w-" and not self._created and self.path.exists():
            raise ConfigError(
                f"results store {str(self.path)!r} already exists; use ZarrSink(..., mode='a') to "
                f"append to it, mode='w' to replace it, or choose another path"
            )

    def refuse_unwritable(self) -> None:
        """A one-line :class:`ConfigError` where no store can be written at the path (a
        file in the way, no permission), checked before a run starts and at open."""
        why = unwritable(self.path)
        if why is not None:
            raise ConfigError(
                f"ZarrSink: cannot write the results store {str(self.path)!r}: {why}; "
                f"choose a store path in a writable folder"
            )

    def refuse_id_clashes(self, system_ids: Sequence[int]) -> None:
        """Before a run appends to an existing store: a ``system_id`` it already holds
        would make its results ambiguous (which run's system 3?), so such a run is
        refused before anything is computed, naming the ids and the ways out."""
        clash = self.id_clashes(system_ids)
        if len(clash):
            raise ConfigError(
                f"results store {str(self.path)!r} already holds system_id(s) "
                f"{id_list(clash)} ({len(clash)} of this run's systems); give this run other "
                f"ids (system_ids= of SizeAwareSampler or Batch.from_atoms), write another "
                f"store, or replace this one with ZarrSink(..., mode='w')"
            )

    def id_clashes(self, system_ids: Sequence[int]) -> np.ndarray:
        """The given ids this store already holds, when a run would append to it."""
        if not self._appends() or not self.path.exists():
            return np.zeros(0, dtype=np.int64)
        return np.intersect1d(stored_system_ids(self.path), np.asarray(system_ids, dtype=np.int64))

    def record_run(self, stats: dict[str, Any]) -> None:
        """Add a finished run's statistics (wall time, systems, steps ...) to its entry in
        the store's ``runs`` attribute.  Per-rank copies of a pipeline record into the
        store they are merged into."""
        record_run_stats(getattr(self, "final_path", self.path), stats)


def unwritable(path: str | Path) -> str | None:
    """Why no folder (a store, an output directory) can be written at ``path``, or None:
    a file there or among its parents, or a folder without write permission (what
    ``os.access`` says, so a read-only or immutable one); creates nothing."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        return f"{str(path)!r} exists and is a file, not a directory"
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent != path and not parent.is_dir():
        return f"{str(parent)!r} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"no write permission in {str(parent)!r}"
    return None


def record_run_stats(path: str | Path, stats: dict[str, Any]) -> None:
    """Set ``stats`` on the last entry of the ``runs`` attribute of the store at ``path``
    (the run that just wrote it).  A failure is logged: the results themselves are safe."""
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r+")
        runs = list(group.attrs.get("runs", []))
        if runs:
            runs[-1] = {**runs[-1], "stats": dict(stats)}
            group.attrs["runs"] = runs
    except Exception as exc:
        logger.warning(f"could not record the run statistics in {path}: {exc}")
