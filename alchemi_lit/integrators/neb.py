"""The nudged elastic band as a filter optimizers take: ``FIRE(band=NEB(...))``.

ASE's ``NEB`` is an object an optimizer runs on; ours is a *view* of the batch, like a
:class:`~.cell.CellFilter`: the images of a band are systems sharing
``info["path_id"]`` (in ``system_id`` order), and the optimizer sees their positions and
NEB forces (:mod:`.band_forces`).  The *band* is what ASE optimises as one object, so
everything an optimizer sums over a system -- FIRE's powers and step length, BFGS's
Hessian -- is summed over the band's interior images (:meth:`NEB.reduce`,
:meth:`NEB.dense_groups`), and a band converges when the largest NEB force on any of
its images is below ``fmax`` (ASE's test), all its images leaving together.

Endpoints are evaluated once: when a band enters the stage its endpoints' positions
and energies are copied onto its interior images (fields ``neb_x0``/``neb_x1``,
``neb_e0``/``neb_e1``) and the endpoints leave the stage at once, out of every later
forward.  Bands are laid out densely once per batch layout (a host read, kept while
the band fields are the same tensors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from ..core.errors import ConfigError, StructureError
from ..core.state import EXIT_QUARANTINED, Batch, system_name
from ..core.tensor_ops import identity_key, same_key
from ..data.bands import PATH_KEY, check_band
from .band_forces import METHODS, band_forces
from .base import FieldSpec
from .extended import DenseGroup, max_row_norm_sq

#: per-system band fields: path id, image index, images in the band (0 outside a band)
BAND_FIELDS = ("neb_path", "neb_image", "neb_count")
#: ``info["neb_quarantined"]`` of the images of a band one member of which failed
QUARANTINED_BAND = "an image of its band failed"


class Group(NamedTuple):
    """Running bands of ``n`` images of ``a`` atoms, with their indices (kept per layout,
    so a step reads nothing on the host)."""

    rows: torch.Tensor  # [G, n - 2] interior rows, in image order
    n: int
    a: int
    atoms: torch.Tensor  # atom indices of the interior rows, in that order
    first: torch.Tensor  # atom indices of each band's first interior image
    last: torch.Tensor  # ... and of its last
    k: torch.Tensor  # [G, n - 1] spring constants
    periodic: bool  # some band has a periodic direction


class Layout(NamedTuple):
    groups: list[Group]
    complete: torch.Tensor  # [B] interior images of complete bands


@dataclass
class NEB:
    """Nudged elastic band filter (ASE's ``NEB``) for ``FIRE``/``BFGS``'s ``band=``.

    Args:
        k: spring constant in eV/Å^2, or a mapping ``{path_id: k}`` (others get 0.1).
        climb: climbing image (the highest interior image climbs the band).
        method: tangent: ``"improvedtangent"`` (Henkelman-Jónsson), ``"aseneb"`` or
            ``"spline"`` (ASE's methods).
        climb_after: with ``climb``, the band climbs after this many steps.
        climb_fmax: with ``climb``, the band climbs once its NEB forces are below this
            (eV/Å); with ``climb_after`` too, whichever comes first.
    """

    k: float | Mapping[int, float] = 0.1
    climb: bool = False
    method: str = "improvedtangent"
    climb_after: int | None = None
    climb_fmax: float | None = None
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    width = 0  # no cell rows
    kind = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"NEB: method must be one of {METHODS}, got {self.method!r}")
        ks = self.k.values() if isinstance(self.k, Mapping) else [self.k]
        if not all(isinstance(v, (int, float)) and v >= 0 for v in ks):
            raise ConfigError(f"NEB: k must be >= 0 eV/Å^2 or {{path_id: k}}, got {self.k!r}")
        if (self.climb_after is not None or self.climb_fmax is not None) and not self.climb:
            raise ConfigError("NEB: climb_after/climb_fmax delay climbing; add climb=True")
        if self.climb_after is not None and int(self.climb_after) < 0:
            raise ConfigError(f"NEB: climb_after must be >= 0 steps, got {self.climb_after}")
        if self.climb_fmax is not None and not float(self.climb_fmax) > 0:
            raise ConfigError(f"NEB: climb_fmax must be > 0 eV/Å, got {self.climb_fmax}")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_memo": {}}

    # ------------------------------------------------------------ the batch's view
    def field_specs(self) -> dict[str, FieldSpec]:
        return {}  # (the band fields outlive a stage: declared by :meth:`declare`)

    def declare(self, batch: Batch) -> None:
        """The band fields -- membership read from ``info`` for systems new to the run,
        endpoint data, state -- which outlive a stage: declared here, not reset by the
        optimizer (a band entering its second band stage keeps its endpoints)."""
        for name in BAND_FIELDS:
            batch.ensure_field(name, "system", (), torch.int64, -1)
        for name in ("neb_e0", "neb_e1"):
            batch.ensure_field(name, "system", (), None, float("nan"))
        for name in ("neb_climbing", "neb_arrived", "neb_running"):
            batch.ensure_field(name, "system", (), torch.bool, False)
        for name in ("neb_x0", "neb_x1"):
            batch.ensure_field(name, "atom", (3,), None, float("nan"))
        new = self.bands_of(batch, batch.neb_count <= 0, "NEB", strict=False)
        if new:
            fields = [getattr(batch, n).clone() for n in BAND_FIELDS]
            for p, rows in new.items():
                index = torch.as_tensor(rows, device=batch.device)
                fields[0][index], fields[2][index] = p, len(rows)
                fields[1][index] = torch.arange(len(rows), device=batch.device)
            for name, value in zip(BAND_FIELDS, fields):
                setattr(batch, name, value)

    def carries_cell(self, batch: Batch) -> torch.Tensor:
        return torch.zeros_like(batch.pbc[:, 0])

    def bands_of(
        self, batch: Batch, mask: torch.Tensor, owner: str, strict: bool = True
    ) -> dict[int, list[int]]:
        """Rows of each band among the systems of ``mask`` new to the run (a resumed
        band keeps its fields), in ``system_id`` order; a system without a band (unless
        not ``strict``: left out), or a band not all there, is refused."""
        if batch.has_field("neb_count"):
            mask = mask & (batch.neb_count <= 0)
        rows = mask.nonzero().flatten().tolist()
        ids = batch.system_id.tolist()
        found: dict[int, list[int]] = {}
        for r in rows:
            p = batch.info.get(ids[r], {}).get(PATH_KEY)
            if p is None and not strict:
                continue
            if p is None:
                raise ConfigError(
                    f"{owner} with band=NEB(): {system_name(r, ids[r])} has no info['path_id']; "
                    f"a band stage relaxes bands: build them with alchemi_lit.workflows.make_band"
                )
            found.setdefault(int(p), []).append(r)
        for p, members in found.items():
            members.sort(key=lambda r: ids[r])
            want = batch.info[ids[members[0]]].get("n_images", len(members))
            if len(members) != want:
                raise ConfigError(
                    f"{owner}: band path_id {p} entered with {len(members)} of its {want} images; "
                    f"a band must be in one batch: use a SizeAwareSampler (it keeps bands whole)"
                )
        return found

    def check(self, batch: Batch, owner: str, mask: torch.Tensor) -> None:
        host = batch.to(device="cpu")
        for p, rows in self.bands_of(batch, mask, owner).items():
            try:
                check_band(host.select(rows).to_atoms(results=False), p)
            except StructureError as exc:
                raise ConfigError(f"{owner}: {exc}") from None

    def arrive(self, batch: Batch, mask: torch.Tensor) -> torch.Tensor:
        """Systems of ``mask`` entered the stage: an endpoint's positions and energy go
        onto its band's interior images (it leaves at once, out of every later forward).
        Returns ``mask`` and the waiting images of bands that start now (every interior
        image arrived, both endpoints' data there), for a fresh optimizer state."""
        batch.neb_arrived = batch.neb_arrived | mask
        batch.neb_running = batch.neb_running & ~mask
        ends = mask & (batch.neb_count > 0)
        ends &= (batch.neb_image == 0) | (batch.neb_image == batch.neb_count - 1)
        if bool(ends.any()):
            self._copy_endpoints(batch, ends.nonzero().flatten().tolist())
        return mask | self._ready(batch)

    def _copy_endpoints(self, batch: Batch, rows: list[int]) -> None:
        path, image, paths = batch.neb_path.tolist(), batch.neb_image.tolist(), batch.neb_path
        inner = (batch.neb_image > 0) & (batch.neb_image < batch.neb_count - 1)
        e0, e1, x0, x1 = (getattr(batch, f"neb_{n}").clone() for n in ("e0", "e1", "x0", "x1"))
        for r in rows:
            to = (inner & (paths == path[r])).nonzero().flatten()
            e, x = (e0, x0) if image[r] == 0 else (e1, x1)
            e[to] = batch.energy[r]
            x[batch.atom_index(to)] = batch.positions[batch.atom_index([r])].repeat(len(to), 1)
        batch.neb_e0, batch.neb_e1, batch.neb_x0, batch.neb_x1 = e0, e1, x0, x1

    def _ready(self, batch: Batch) -> torch.Tensor:
        """``[B]`` interior images of bands that may start: all arrived, endpoints known."""
        inner = (batch.neb_image > 0) & (batch.neb_image < batch.neb_count - 1)
        waiting = inner & batch.neb_arrived & ~batch.neb_running
        if not bool(waiting.any()):
            return waiting
        known = waiting & batch.neb_e0.isfinite() & batch.neb_e1.isfinite()
        ready = waiting.clone()
        for p in set(batch.neb_path[waiting].tolist()):
            members = inner & (batch.neb_path == p)
            count = int(batch.neb_count[members][0]) - 2
            ok = int(members.sum()) == count and bool((known | ~members).all())
            ready &= ~members | ok
        return ready

    def init(self, batch: Batch, mask: torch.Tensor) -> None:
        """Start the bands that are ready among ``mask`` (:meth:`arrive` widened it)."""
        start = mask & self._ready(batch)
        batch.neb_running = batch.neb_running | start
        batch.step = batch.step.masked_fill(start, 0)  # (waiting was no step of the band)
        climbing = self.climb and self.climb_after in (None, 0) and self.climb_fmax is None
        batch.neb_climbing = torch.where(mask, climbing, batch.neb_climbing)
        self.advance(batch, start, steps_done=0)

    def layout(self, batch: Batch) -> Layout:
        """The interior images of each complete band, grouped by (images, atoms)."""
        names = (*BAND_FIELDS, "neb_running")
        key = identity_key([getattr(batch, n) for n in names] + [batch.n_atoms])
        hit = self._memo.get("layout")
        if hit is not None and same_key(hit[0], key):
            return hit[1]
        path, image, count = (getattr(batch, n).cpu().numpy() for n in BAND_FIELDS)
        n_atoms = batch.n_atoms.cpu().numpy()
        running = batch.neb_running.cpu().numpy()
        inner = np.flatnonzero((image > 0) & (image < count - 1) & running)
        found: dict[tuple[int, int], dict[int, dict[int, int]]] = {}
        for r in inner:
            found.setdefault((int(count[r]), int(n_atoms[r])), {}).setdefault(int(path[r]), {})
            found[(int(count[r]), int(n_atoms[r]))][int(path[r])][int(image[r])] = int(r)
        groups, complete = [], torch.zeros_like(batch.pbc[:, 0])
        for (n, a), bands in found.items():
            whole = [[b[i] for i in range(1, n - 1)] for b in bands.values() if len(b) == n - 2]
            if whole:
                rows = torch.as_tensor(whole, device=batch.device)
                complete[rows.flatten()] = True
                periodic = bool(batch.pbc[rows[:, 0]].any())
                groups.append(Group(rows, n, a, batch.atom_index(rows.flatten()),
                                    batch.atom_index(rows[:, 0]), batch.atom_index(rows[:, -1]),
                                    self.k_of(batch, rows, n), periodic))  # fmt: skip
        out = Layout(groups, complete)
        self._memo["layout"] = (key, out)
        return out

    def k_of(self, batch: Batch, rows: torch.Tensor, n: int) -> torch.Tensor:
        """Spring constants ``[G, n - 1]`` of the bands whose interior rows are ``rows``."""
        if not isinstance(self.k, Mapping):
            shape = (len(rows), n - 1)
            return torch.full(shape, float(self.k), dtype=batch.dtype, device=batch.device)
        paths = batch.neb_path[rows[:, 0]].tolist()
        k = [float(self.k.get(p, 0.1)) for p in paths]
        return torch.tensor(k, dtype=batch.dtype, device=batch.device)[:, None].expand(-1, n - 1)

    def coordinates(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.positions, batch.positions.new_zeros((batch.num_systems, 0))

    def forces(
        self, batch: Batch, climbing: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """NEB forces on interior images of complete bands ``[N, 3]`` (model forces
        elsewhere), with the climbing image where ``neb_climbing`` (or ``climbing``)."""
        climbing = batch.neb_climbing if climbing is None else climbing
        names = ("positions", "forces", "energy", "neb_x0", "neb_x1", "neb_e0", "neb_e1")
        key = identity_key([getattr(batch, n) for n in names] + [climbing])
        hit = self._memo.get("forces")
        if hit is not None and same_key(hit[0], key):
            return hit[1]
        out = batch.forces
        for grp in self.layout(batch).groups:
            g, n, a, rows = len(grp.rows), grp.n, grp.a, grp.rows
            x = batch.positions[grp.atoms].reshape(g, n - 2, a, 3)
            x0 = batch.neb_x0[grp.first].reshape(g, 1, a, 3)
            x1 = batch.neb_x1[grp.last].reshape(g, 1, a, 3)
            x = torch.cat([x0, x, x1], 1)
            one = rows[:, :1]
            e = torch.cat([batch.neb_e0[one], batch.energy[rows], batch.neb_e1[one]], 1)
            f = batch.forces[grp.atoms].reshape(g, n - 2, a, 3)
            first = rows[:, 0]
            pbc = batch.pbc[first] if grp.periodic else None  # (None: no periodic direction)
            nudged = band_forces(x, e, f, grp.k, batch.cell[first], pbc, self.method,
                                 climbing[first])  # fmt: skip
            out = out.index_copy(0, grp.atoms, nudged.reshape(-1, 3))
        result = (out, out.new_zeros((batch.num_systems, 0)))
        self._memo["forces"] = (key, result)
        return result

    def set_coordinates(
        self, batch: Batch, x_atoms: torch.Tensor, x_cell: torch.Tensor, moving: torch.Tensor
    ) -> None:
        """Positions of the free atoms of the interior images of ``moving`` ``[B]``."""
        moving = moving & self.layout(batch).complete
        atoms = (batch.atom_mask(moving) & ~batch.fixed)[:, None]
        batch.positions = torch.where(atoms, x_atoms, batch.positions)

    # ------------------------------------------------------------ band-wide sums
    def reduce(self, sums: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Per-system sums ``[B]`` made per-band (every interior image gets its band's)."""
        out = sums
        for rows, *_ in self.layout(batch).groups:
            total = sums[rows].sum(1, keepdim=True).expand_as(rows)
            out = out.index_copy(0, rows.flatten(), total.flatten())
        return out

    def band_max_sq(self, batch: Batch, forces: torch.Tensor | None = None) -> torch.Tensor:
        """Largest squared NEB-force row of each interior image's band ``[B]``."""
        f = self.forces(batch)[0] if forces is None else forces
        return self._band_max(batch, max_row_norm_sq(batch, f, f.new_zeros((len(batch), 0))))

    def _band_max(self, batch: Batch, per_image: torch.Tensor) -> torch.Tensor:
        out = per_image
        for rows, *_ in self.layout(batch).groups:
            top = per_image[rows].amax(1, keepdim=True).expand_as(rows)
            out = out.index_copy(0, rows.flatten(), top.flatten())
        return out

    def advance(self, batch: Batch, mask: torch.Tensor, steps_done: int | None = None) -> None:
        """Images of ``mask`` waiting for their endpoints take no step: none of the budget,
        none of ``total_steps`` (so a band's steps, and a later stage's random streams, do
        not depend on how long it waited -- on one device or across ranks); switch on
        the climbing image of bands of ``mask`` whose delay is over."""
        if steps_done is None:
            waiting = mask & ~batch.neb_running & (batch.neb_image > 0)
            batch.step = torch.where(waiting, -1, batch.step)  # (0 after this step's +1)
            batch.total_steps = torch.where(waiting, batch.total_steps - 1, batch.total_steps)
        if not self.climb or (self.climb_after is None and self.climb_fmax is None):
            return
        done = batch.step + 1 if steps_done is None else torch.full_like(batch.step, steps_done)
        on = torch.zeros_like(mask)
        if self.climb_after is not None:
            on = on | (done >= int(self.climb_after))
        if self.climb_fmax is not None:
            quiet = torch.zeros_like(batch.neb_climbing)
            on = on | (self.band_max_sq(batch, self.forces(batch, quiet)[0]) < self.climb_fmax**2)
        batch.neb_climbing = batch.neb_climbing | (mask & on & self.layout(batch).complete)

    def converged(self, batch: Batch, fmax: float) -> torch.Tensor:
        """``[B]``: bands whose NEB forces are all below ``fmax``; endpoints always."""
        ends = (batch.neb_image == 0) | (batch.neb_image == batch.neb_count - 1)
        ends &= batch.neb_count > 0
        return ends | (self.layout(batch).complete & (self.band_max_sq(batch) < fmax**2))

    def quarantine_bands(self, batch: Batch, left: torch.Tensor, exit_code: int) -> None:
        """Images of bands an image of which just left for a failure (``left`` ``[B]``)
        leave with it, quarantined: a band without one of its images is no band."""
        broken = set(batch.neb_path[left & (batch.neb_count > 0)].tolist())
        if not broken:
            return
        going = torch.isin(batch.neb_path, torch.tensor(sorted(broken), device=batch.device))
        going &= (batch.status != exit_code) & ~left
        for sid in batch.system_id[going].tolist():
            batch.info.setdefault(sid, {})["neb_quarantined"] = QUARANTINED_BAND
        batch.exit_code = torch.where(going, EXIT_QUARANTINED, batch.exit_code)
        batch.status = torch.where(going, exit_code, batch.status)

    # ------------------------------------------------------------ BFGS's dense vectors
    def dense_groups(self, batch: Batch, mask: torch.Tensor) -> list[DenseGroup]:
        """Each band of ``mask`` as one dense vector: its interior images' atoms in order."""
        out = []
        for rows, n, a, *_ in self.layout(batch).groups:
            keep = mask[rows[:, 0]].nonzero().flatten()
            if len(keep):
                out.append(BandGroup(batch, rows[keep], a * (n - 2)))
        return out

    def local_index(self, batch: Batch) -> torch.Tensor:
        """Each atom's place in its band's vector ``[N]`` (its own system's elsewhere)."""
        offset = (batch.neb_image - 1).clamp_min(0) * batch.n_atoms
        return batch.segments.local_index + offset.index_select(0, batch.system_idx)

    def vector_atoms(self, batch: Batch, mask: torch.Tensor) -> torch.Tensor:
        """Atoms in each system's optimisation vector ``[B]``: its band's interior."""
        out = batch.n_atoms.clone()
        if batch.has_field("neb_count"):  # bands under way
            out = torch.where(batch.neb_count > 2, out * (batch.neb_count - 2), out)
        for rows in self.bands_of(batch, mask, "NEB").values():
            out[rows] = batch.n_atoms[rows[0]] * max(len(rows) - 2, 1)
        return out


class BandGroup(DenseGroup):
    """Bands of one shape as ``[G, 3 a (n - 2)]`` vectors (BFGS's dense group)."""

    def __init__(self, batch: Batch, rows: torch.Tensor, atoms: int) -> None:
        self.sys = rows[:, 0]  # one row per band: its first interior image
        self.idx = batch.atom_index(rows.flatten())
        self.n, self.c, self.dim = atoms, 0, 3 * atoms


def as_band(value: NEB | Mapping[str, Any] | None) -> NEB | None:
    """``band=`` of an optimizer: None, a mapping of :class:`NEB` arguments, or an NEB."""
    if value is None or isinstance(value, NEB):
        return value
    if isinstance(value, Mapping):
        return NEB(**value)
    raise ConfigError(f"band must be an NEB(...) or None, got {type(value).__name__}")
