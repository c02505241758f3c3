"""Building nudged elastic bands: the images of a path as ``ase.Atoms`` a run takes.

A band is a list of images, endpoints included, tagged with ``info["path_id"]`` (and
``info["n_images"]``, so that a band arriving incomplete is caught); any number of bands
go into one dataset one after another (:func:`label_bands`) and a
``FIRE(band=NEB(...))`` or ``BFGS(band=NEB(...))`` stage relaxes them all at once.
Interpolation is ASE's own (``ase.mep.NEB.interpolate``: linear, or IDPP as ASE
implements it), so a band starts where an ASE user's would.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from ..core.errors import ConfigError
from ..data.bands import PATH_KEY, check_band


def make_band(
    initial: Any,
    final: Any,
    n_images: int,
    interpolation: Literal["idpp", "linear"] = "idpp",
    path_id: int = 0,
    mic: bool = False,
    apply_constraint: bool | None = None,
) -> list[Any]:
    """The ``n_images`` images (endpoints included) of a band from ``initial`` to
    ``final``, interpolated by ASE (``"idpp"`` or ``"linear"``; ``mic``: displacements
    by the minimum-image convention; ``apply_constraint``: as ASE's ``interpolate``),
    each tagged with ``path_id``.  The endpoints are copies (without calculators)."""
    from ase.mep import NEB as AseNEB

    if interpolation not in ("idpp", "linear"):
        raise ConfigError(
            f"make_band: interpolation must be 'idpp' or 'linear', got {interpolation!r}"
        )
    if int(n_images) < 3:
        raise ConfigError(
            f"make_band: n_images={n_images} counts the endpoints too; a band needs at "
            f"least 3 (the endpoints and one image between them)"
        )
    images = [initial.copy() for _ in range(int(n_images) - 1)] + [final.copy()]
    for img in images:
        img.calc = None
    check_band(images, path_id)  # the endpoints must be the same atoms in the same cell
    with warnings.catch_warnings():  # (IDPP's inner optimisation warns about its method)
        warnings.simplefilter("ignore", UserWarning)
        neb = AseNEB(images, method="improvedtangent")
        neb.interpolate(method=interpolation, mic=mic, apply_constraint=apply_constraint)
    return label_bands([images], start=path_id)


def label_bands(bands: Sequence[Sequence[Any]], start: int = 0) -> list[Any]:
    """Bands (each a list of images, endpoints included) as one dataset: copies of the
    images one after another, band ``j`` tagged ``path_id = start + j``."""
    out = []
    for j, band in enumerate(bands):
        check_band(list(band), start + j)
        for img in band:
            copy = img.copy()
            copy.info.update({PATH_KEY: start + j, "n_images": len(band)})
            out.append(copy)
    return out


def read_bands(paths: Sequence[str | Path], start: int = 0) -> list[Any]:
    """One band per file (every frame of a trajectory or extxyz file: the images in
    order), tagged ``path_id = start, start + 1, ...`` in the order given."""
    from ase.io import read

    return label_bands([read(str(p), index=":") for p in paths], start)
