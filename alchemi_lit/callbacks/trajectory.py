"""TrajectoryWriter: per-system trajectories of a batched run in one zarr v3 store.

Why this layout: with inflight batching the batch changes composition between two
writes (systems finish and leave, new ones come in), and systems have different
sizes.  A fixed ``[frames, atoms, 3]`` array can not hold that; one zarr group per
frame would create thousands of tiny arrays.  Instead every array is flat and only
ever *appended* to, with offsets to slice it back per system:

.. code-block:: text

    <path>/                       zarr v3 group; attrs: format, version, fields, runs
      frames/step        [F]      int64   loop step of each write
      frames/run         [F]      int64   run index (a store appended to holds several runs)
      frames/system_start [F]     int64   first row of the frame in systems/*
      frames/n_systems   [F]      int64   systems written in the frame
      systems/frame      [S]      int64   frame of each system row
      systems/system_id  [S]      int64   global id of the system (Batch.system_id)
      systems/step       [S]      int64   steps the system had taken (Batch.total_steps)
      systems/final      [S]      bool    row holds the state the system left the plan in
      systems/n_atoms    [S]      int64
      systems/atom_offset [S]     int64   first row of the system in atoms/*
      systems/cell       [S,3,3]  float
      systems/pbc        [S,3]    bool
      systems/<field>    [S,...]  requested per-system fields (energy, temperature, ...)
      atoms/atomic_numbers [A]    int16
      atoms/<field>      [A,...]  requested per-atom fields (positions, forces, ...)

The atoms of system row ``r`` are ``atoms/*[atom_offset[r] : atom_offset[r] + n_atoms[r]]``.
:func:`read_trajectory` returns the frames of one system as ``ase.Atoms``.

When: a frame is written every ``every`` loop steps, at ``BEFORE_STEP`` -- the state
after ``step`` steps, so step 0 is the initial structure, and positions, energy and
forces of a frame belong together.  It holds the systems inside a stage.  With
``write_final=True`` each system also gets one row for the state it finished the plan
in (a frame of its own, written at the bookkeeping that sees it finish).

Host cost: the step loop never waits on the host; the writer copies the rows it
writes every ``every`` steps, buffers them in host memory and appends them to the
store every ``flush_every`` frames (or when the buffer holds many atoms) and at run
end, also when the run fails.  frames/* is appended last, so every frame listed
there is complete.

Fields: any batch field (``positions``, ``velocities``, ``forces``, ``masses``,
``energy``, ``stress``, integrator fields such as ``fire_dt``) plus the derived
per-system ``temperature`` (K) and ``kinetic_energy`` (eV).  The default,
``positions, velocities, energy, temperature``, is what ``alchemi-lit report
--trajectory`` plots and what restarting MD from a frame needs; velocities double the
per-atom bytes of a frame (24 more per atom in float64, as much as positions), the
temperature adds one number per system.  ``fields=("positions", "energy")`` halves
the store where only structures matter (the report then says the temperature panel
has no data).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ..core.state import Batch
from ..engine.hooks import Callback, StepContext
from ..io.trajectory_store import FORMAT, VERSION, _as_path, _is_store
from ..io.trajectory_store import read_trajectory as read_trajectory  # (lived here before)
from ..io.trajectory_store import trajectory_system_ids as trajectory_system_ids

#: Written when ``fields`` is not given: what the report plots, and velocities.
DEFAULT_FIELDS = ("positions", "velocities", "energy", "temperature")
#: Always written; not valid in ``fields``.
_RESERVED = frozenset(
    {
        "system_id",
        "n_atoms",
        "cell",
        "pbc",
        "atomic_numbers",
        "step",
        "total_steps",
        "frame",
        "final",
        "atom_offset",
        "system_idx",
    }
)
#: Per-system values computed from the batch rather than stored in it.
_DERIVED = {"temperature": Batch.temperature, "kinetic_energy": Batch.kinetic_energy}
_CHUNK_ROWS = {"frames": 4096, "systems": 16384, "atoms": 65536}


class TrajectoryWriter(Callback):
    """Write per-system trajectories to a zarr v3 store (layout: module docstring).

    Args:
        path: directory of the zarr store.
        every: loop steps between two frames (>= 1).
        fields: batch fields to write per frame; must include ``"positions"``.  The
            default records what the report plots (temperature, energy) and velocities.
        mode: ``"w"`` creates the store and refuses an existing one unless
            ``overwrite=True``; ``"a"`` appends to an existing store (same fields) or
            creates it.
        overwrite: with ``mode="w"``, delete an existing store at ``path`` first.
        write_final: also write each system's final state when it finishes the plan.
        flush_every: frames buffered in host memory before they are appended to the store.

    Several runs with the same writer append to the same store (``frames/run``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        every: int = 100,
        fields: Sequence[str] = DEFAULT_FIELDS,
        mode: Literal["w", "a"] = "w",
        overwrite: bool = False,
        write_final: bool = True,
        flush_every: int = 10,
    ) -> None:
        name = type(self).__name__
        if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"{name}: every must be an int >= 1 (loop steps), got {every!r}")
        super().__init__(int(every))
        self.path = _as_path(path, name)
        if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
            raise TypeError(f"{name}: fields must be a sequence of field names, got {fields!r}")
        fields = tuple(fields)
        if "positions" not in fields:
            raise ValueError(f"{name}: fields must include 'positions', got {fields}")
        if len(set(fields)) != len(fields):
            raise ValueError(f"{name}: duplicate names in fields {fields}")
        reserved = sorted(set(fields) & _RESERVED)
        if reserved:
            raise ValueError(
                f"{name}: {reserved} are always written (system_id, step = total steps, "
                f"n_atoms, cell, pbc, atomic_numbers); remove them from fields"
            )
        if mode not in ("w", "a"):
            raise ValueError(f"{name}: mode must be 'w' (create) or 'a' (append), got {mode!r}")
        if isinstance(flush_every, bool) or int(flush_every) < 1:
            raise ValueError(f"{name}: flush_every must be >= 1, got {flush_every!r}")
        self.fields = fields
        self.mode = mode
        self.overwrite = bool(overwrite)
        self.write_final = bool(write_final)
        self.flush_every = int(flush_every)
        self.max_buffer_atoms = 1 << 22  # flush early when the buffer holds this many atom rows
        self._group: Any = None
        self._created = False  # this writer made the store: later runs append to it
        self._kinds: dict[str, str] = {}
        self._buffer: dict[str, list[np.ndarray]] = {}
        self._buffered_frames = 0
        self._buffered_atoms = 0
        self._counts = {"frames": 0, "systems": 0, "atoms": 0}
        self._run = 0
        self._check_target()

    # ---------------------------------------------------------------- store
    def _check_target(self) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise FileExistsError(
                f"TrajectoryWriter: {p} exists and is not a directory; a zarr store is a "
                f"directory, choose another path"
            )
        nonempty = p.is_dir() and any(p.iterdir())
        if self.mode == "w" and nonempty and self.overwrite and not _is_store(p):
            raise FileExistsError(
                f"TrajectoryWriter: {p} is a non-empty directory but not a zarr store; "
                f"overwrite=True only replaces a zarr store, choose another path"
            )
        if self.mode == "w" and nonempty and not self.overwrite:
            raise FileExistsError(
                f"TrajectoryWriter: {p} already exists; pass mode='a' to append to it, "
                f"overwrite=True to replace it, or choose another path"
            )
        if self.mode == "a" and nonempty:
            if not _is_store(p):
                raise ValueError(
                    f"TrajectoryWriter: {p} is a non-empty directory but not a zarr store; "
                    f"append (mode='a') only to a trajectory written by TrajectoryWriter"
                )
            self._check_format(p)

    def _check_format(self, p: Path) -> None:
        import zarr

        attrs = dict(zarr.open_group(p, mode="r").attrs)
        if attrs.get("format") != FORMAT:
            raise ValueError(
                f"TrajectoryWriter: {p} is a zarr store but not an alchemi_lit trajectory "
                f"(format {attrs.get('format')!r}); choose another path"
            )
        if list(attrs.get("fields", [])) != list(self.fields):
            raise ValueError(
                f"TrajectoryWriter: {p} holds fields {attrs.get('fields')}, this writer was "
                f"given {list(self.fields)}; appending needs the same fields"
            )

    def _open(self) -> None:
        import zarr

        p = self.path
        if self._created or (self.mode == "a" and _is_store(p)):
            self._check_format(p)
            group = zarr.open_group(p, mode="r+")
        else:
            if p.is_dir() and any(p.iterdir()):
                self._check_target()  # appeared since __init__: same rules
                shutil.rmtree(p)  # mode="w", overwrite=True and a zarr store
            group = zarr.open_group(p, mode="w")
            group.attrs.update(format=FORMAT, version=VERSION, fields=list(self.fields), runs=0)
            self._created = True
        self._run = int(group.attrs.get("runs", 0))
        group.attrs["runs"] = self._run + 1
        self._group = group
        for part in self._counts:
            # a run killed during a flush may leave one part's arrays of unequal length:
            # cut them to the shortest so appended rows stay aligned (frames/* is written
            # last, so every frame still points at complete rows)
            sub = group.get(part)
            arrays = [] if sub is None else [a for _, a in sub.arrays()]
            n = min((int(a.shape[0]) for a in arrays), default=0)
            for a in arrays:
                if a.shape[0] > n:
                    a.resize((n, *a.shape[1:]))
            self._counts[part] = n
        self._buffer = {}
        self._buffered_frames = self._buffered_atoms = 0

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Rows committed so far (flushes first): a resumed run rolls back to them."""
        self.flush()
        return {"counts": dict(self._counts), "run": int(getattr(self, "_run", 0))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_counts = {k: int(v) for k, v in state["counts"].items()}

    def _resume(self) -> None:
        import zarr

        group = zarr.open_group(self.path, mode="r+")
        for part, n in self._resume_counts.items():
            sub = group.get(part)
            for _, a in [] if sub is None else sub.arrays():
                if a.shape[0] > n:
                    a.resize((n, *a.shape[1:]))
            self._counts[part] = n
        self._group = group
        self._run = int(group.attrs.get("runs", 1)) - 1
        self._created = True
        self._buffer = {}
        self._buffered_frames = self._buffered_atoms = 0
        self._resume_counts = None

    def _resolve_fields(self, batch: Batch) -> None:
        kinds = {}
        for f in self.fields:
            if f in _DERIVED:
                kinds[f] = "system"
            elif batch.has_field(f):
                kinds[f] = batch.field_kind(f)
            else:
                known = sorted({*batch.atom, *batch.system, *_DERIVED} - _RESERVED)
                raise ValueError(f"TrajectoryWriter: unknown field {f!r}; available: {known}")
        self._kinds = kinds

    # ---------------------------------------------------------------- hooks
    def on_run_start(self, ctx: StepContext) -> None:
        self._resolve_fields(ctx.batch)
        if getattr(self, "_resume_counts", None):
            self._resume()  # continue the checkpointed store, dropping later frames
        else:
            self._open()

    def before_step(self, ctx: StepContext) -> None:
        b = ctx.batch
        if self._group is not None and b.num_systems:
            self._write(ctx, (b.status >= 0) & (b.status != ctx.state.get("exit_code", -1)), False)

    def on_converge(self, ctx: StepContext) -> None:
        b = ctx.batch
        if self._group is None or not self.write_final or ctx.exited is None:
            return
        if b.num_systems:
            self._write(ctx, ctx.exited & (b.status == ctx.state.get("exit_code", -1)), True)

    def on_run_end(self, ctx: StepContext) -> None:
        if self._group is not None:
            try:
                self.flush()
            finally:
                self._group = None

    # ---------------------------------------------------------------- writing
    def _write(self, ctx: StepContext, rows: torch.Tensor, final: bool) -> None:
        b = ctx.batch
        idx = rows.nonzero().flatten()  # host sync, only on writing steps
        k = int(idx.numel())
        if k == 0:
            return
        aidx = b.atom_index(idx)

        def host(t: torch.Tensor) -> np.ndarray:
            return t.detach().cpu().numpy()

        n_atoms = host(b.n_atoms[idx])
        offsets = self._counts["atoms"] + np.concatenate([[0], np.cumsum(n_atoms)[:-1]])
        systems = {
            "frame": np.full(k, self._counts["frames"], dtype=np.int64),
            "system_id": host(b.system_id[idx]),
            "step": host(b.total_steps[idx]),
            "final": np.full(k, final, dtype=bool),
            "n_atoms": n_atoms,
            "atom_offset": offsets.astype(np.int64),
            "cell": host(b.cell[idx]),
            "pbc": host(b.pbc[idx]),
        }
        atoms = {"atomic_numbers": host(b.atomic_numbers[aidx]).astype(np.int16)}
        for f, kind in self._kinds.items():
            if f in _DERIVED:
                systems[f] = host(_DERIVED[f](b)[idx])
            elif kind == "system":
                systems[f] = host(getattr(b, f)[idx])
            else:
                atoms[f] = host(getattr(b, f)[aidx])
        frames = {
            "step": np.array([ctx.step], dtype=np.int64),
            "run": np.array([self._run], dtype=np.int64),
            "system_start": np.array([self._counts["systems"]], dtype=np.int64),
            "n_systems": np.array([k], dtype=np.int64),
        }
        for part, data in (("atoms", atoms), ("systems", systems), ("frames", frames)):
            for key, value in data.items():
                self._buffer.setdefault(f"{part}/{key}", []).append(value)
        self._counts["frames"] += 1
        self._counts["systems"] += k
        self._counts["atoms"] += len(aidx)
        self._buffered_frames += 1
        self._buffered_atoms += len(aidx)
        full = self._buffered_atoms >= self.max_buffer_atoms
        if full or self._buffered_frames >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Append the buffered frames to the store (atoms, then systems, then frames)."""
        if self._group is None or not self._buffer:
            return
        for part in ("atoms", "systems", "frames"):
            for key in [k for k in self._buffer if k.startswith(part + "/")]:
                data = np.concatenate(self._buffer[key])
                arr = self._group.get(key)
                if arr is None:
                    arr = self._group.create_array(
                        key,
                        shape=(0, *data.shape[1:]),
                        dtype=data.dtype,
                        chunks=(_CHUNK_ROWS[part], *data.shape[1:]),
                    )
                elif arr.shape[1:] != data.shape[1:]:
                    raise ValueError(
                        f"TrajectoryWriter: {self.path}/{key} has rows of shape {arr.shape[1:]}, "
                        f"this run writes {data.shape[1:]}"
                    )
                arr.append(data.astype(arr.dtype, copy=False), axis=0)
        self._buffer = {}
        self._buffered_frames = self._buffered_atoms = 0
