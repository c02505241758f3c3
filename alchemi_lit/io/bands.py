"""Results per nudged elastic band: barriers, energies along the path, the images.

A run's :class:`~alchemi_lit.io.results.Results` holds one ``ase.Atoms`` per image; this
regroups them by ``info["path_id"]`` (in ``system_id`` order, the band's order) into
:class:`Band` objects.  The fitted barrier is ASE's ``NEBTools`` fit
(``ase.utils.forcecurve.fit_images``: a cubic through the energies *and* the forces
projected on the path, so the barrier is not limited to the image grid).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError
from ..data.bands import PATH_KEY


def highest_image(energies: np.ndarray) -> int:
    """ASE's ``imax``: the interior image of highest energy (the last of a tie)."""
    inner = np.asarray(energies)[1:-1]
    return int(len(inner) - np.argmax(inner[::-1]))


def barriers(energies: np.ndarray) -> tuple[float, float]:
    """(forward, backward) barrier: the highest energy along the path, endpoints
    included, above the first and the last image -- ``NEBTools.get_barrier(fit=False)``'s
    definition, so a band that only climbs has forward barrier = reaction energy and
    backward barrier 0, never a negative one (the highest *interior* image would give
    that)."""
    e = np.asarray(energies, dtype=np.float64)
    top = float(e.max())
    return top - float(e[0]), top - float(e[-1])


def band_status(converged: Sequence[Any], reasons: Sequence[Any]) -> tuple[bool, str]:
    """(converged, exit reason) of a band from its interior images': converged when every
    one is; the reason is the first other than ``converged`` (``max_steps``,
    ``non_finite``, ``model_error`` ...), ``converged`` when there is none."""
    others = [r for r in reasons if r not in ("converged", None)]
    return all(bool(c) for c in converged), others[0] if others else "converged"


@dataclass
class Band:
    """One band's images (``ase.Atoms`` with energy and model forces) and its summary.

    ``energies`` are the images' potential energies (eV), endpoints included;
    barriers are relative to the endpoints' energies."""

    path_id: int
    images: list[Any] = field(repr=False)

    @cached_property
    def energies(self) -> np.ndarray:
        return np.array([img.get_potential_energy() for img in self.images])

    @property
    def highest_image(self) -> int:
        """Index of the image of highest energy (ASE's ``imax`` among the interior)."""
        return highest_image(self.energies)

    @property
    def forward_barrier(self) -> float:
        return barriers(self.energies)[0]

    @property
    def backward_barrier(self) -> float:
        return barriers(self.energies)[1]

    @property
    def reaction_energy(self) -> float:
        return float(self.energies[-1] - self.energies[0])

    @cached_property
    def fit(self) -> Any:
        """ASE's ``ForceFit`` of the band (``path``, ``energies``, ``fit_path``,
        ``fit_energies``; energies relative to the first image)."""
        from ase.utils.forcecurve import fit_images

        return fit_images(self.images)

    @property
    def fitted_barrier(self) -> float:
        """Forward barrier of the fit, as ``NEBTools(images).get_barrier(fit=True)[0]``."""
        return float(np.max(self.fit.fit_energies))

    def _info(self, key: str) -> list[Any]:
        return [img.info.get(key) for img in self.images[1:-1]]

    @property
    def converged(self) -> bool:
        return band_status(self._info("converged"), self._info("exit_reason"))[0]

    @property
    def steps(self) -> int:
        return max(int(s or 0) for s in self._info("steps"))

    @property
    def exit_reason(self) -> str:
        return band_status(self._info("converged"), self._info("exit_reason"))[1]

    def row(self) -> dict[str, Any]:
        return {
            "path_id": self.path_id, "formula": self.images[0].get_chemical_formula(),
            "n_images": len(self.images), "forward_barrier": self.forward_barrier,
            "backward_barrier": self.backward_barrier, "reaction_energy": self.reaction_energy,
            "fitted_barrier": self.fitted_barrier, "highest_image": self.highest_image,
            "highest_energy": float(self.energies[self.highest_image]),
            "energies": self.energies.tolist(), "converged": self.converged,
            "steps": self.steps, "exit_reason": self.exit_reason,
        }  # fmt: skip


class BandResults(Sequence[Band]):
    """A run's results as bands, in ``path_id`` order; ``results[path_id]`` is not
    indexing: use :meth:`band`.  Structures outside bands are left out."""

    def __init__(self, atoms: Sequence[Any]) -> None:
        found: dict[int, list[tuple[int, Any]]] = {}
        for k, a in enumerate(atoms):
            p = a.info.get(PATH_KEY)
            if p is not None:
                found.setdefault(int(p), []).append((int(a.info.get("system_id", k)), a))
        self.bands = [Band(p, [a for _, a in sorted(found[p], key=lambda t: t[0])])
                      for p in sorted(found)]  # fmt: skip

    def __len__(self) -> int:
        return len(self.bands)

    def __getitem__(self, index: Any) -> Any:
        return self.bands[index]

    def __iter__(self) -> Iterator[Band]:
        return iter(self.bands)

    def band(self, path_id: int) -> Band:
        for b in self.bands:
            if b.path_id == path_id:
                return b
        raise ConfigError(f"no band with path_id {path_id}; the results hold {self.path_ids}")

    @property
    def path_ids(self) -> list[int]:
        return [b.path_id for b in self.bands]

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``, one row per band (:meth:`Band.row`)."""
        import pandas as pd

        return pd.DataFrame([b.row() for b in self.bands])

    def write(self, folder: str | Path, prefix: str = "band") -> list[Path]:
        """One extxyz file per band, ``{folder}/{prefix}_{path_id}.extxyz`` (its images in
        order, energies and forces kept); returns the paths."""
        from ase.io import write

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for b in self.bands:
            paths.append(out / f"{prefix}_{b.path_id}.extxyz")
            write(paths[-1], b.images, format="extxyz")
        return paths

    def __repr__(self) -> str:
        return f"BandResults({len(self)} bands: path_id {self.path_ids[:10]})"


def band_results(results: Any) -> BandResults:
    """The bands of a run's ``Results`` (or of any sequence of ``ase.Atoms`` tagged
    with ``path_id``): ``band_results(sim.run(images)).to_pandas()``."""
    atoms = results.to_atoms() if hasattr(results, "to_atoms") else list(results)
    return BandResults(atoms)
