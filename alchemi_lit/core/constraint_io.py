"""Reading constraints from ``ase.Atoms`` into batch fields and back, and declaring the
fields: the conversions of :mod:`.constraints`' interface, with every registered kind
(importing this module registers the built-ins of :mod:`.constraint_kinds`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from . import constraint_kinds as _builtin  # noqa: F401  (registers the built-in kinds)
from . import symmetry
from .constraints import (
    DOF_FIELD,
    FLAGS_FIELD,
    Constraint,
    Host,
    constraint_kinds,
    field_specs,
)
from .errors import StructureError


def declare_fields(batch: Any) -> None:
    """Create every constraint field on a ``batch`` holding a constrained system (zero:
    unconstrained), idempotent.  A batch with none gets no field: the 22 numbers per atom
    would cost every unconstrained run memory and copies; a constrained system joining
    it later brings its fields, and concatenation fills the others with zeros."""
    if not batch.has_field(FLAGS_FIELD):
        return
    dtypes = {"float": batch.dtype, "int64": torch.int64, "bool": torch.bool}
    for name, spec in field_specs().items():
        batch.ensure_field(name, spec.kind, spec.shape, dtypes[spec.dtype], 0)


def kind_of(constraint: Any) -> Constraint | None:
    """The registered kind for an ASE constraint object (by class name), or None."""
    name = type(constraint).__name__
    return next((k for k in constraint_kinds() if name in k.ase_names), None)


#: ASE constraints refused by name, with the reason (other unknown ones: generic message)
REFUSED = {
    "FixSubsetCom": "moves every atom to keep a subset's centre of mass (ASE's own "
    "adjust_positions); use FixCom for the whole structure",
}


def encode_structure(atoms: Any, index: int, name: str, fixed: np.ndarray) -> Host | None:
    """All constraints of one ``ase.Atoms`` except ``FixAtoms`` (and FixCartesian of
    x, y, z: ``fixed``) as arrays, or None when it has no other constraint; ``name``:
    how errors name the structure (:func:`~.errors.system_name`)."""
    host = None
    for c in atoms.constraints:
        kind_name = type(c).__name__
        if kind_name == "FixAtoms":
            continue
        kind = kind_of(c)
        if kind is None:
            supported = sorted({n for k in constraint_kinds() for n in k.ase_names})
            why = REFUSED.get(kind_name, "not supported")
            raise StructureError(
                f"{name}: constraint {kind_name} is {why}; supported: "
                f"{', '.join(supported)}. Remove it (atoms.set_constraint()) or express it "
                f"with one of those.",
                index,
            )
        if host is None:
            host = Host(atoms, index, name, fixed)
        kind.encode(c, host)
    if host is not None:
        _refuse_overlaps(host)
    return host


def _refuse_overlaps(host: Host) -> None:
    """FixCom with another constraint that moves atoms: ASE's result depends on the
    list's order (its FixCom shifts every atom, fixed ones included, and a later
    projection undoes part of the shift), so no order-free meaning exists.  FixSymmetry
    is the exception: it commutes with FixCom given equal masses within each orbit
    (checked with its operations, :mod:`.symmetry_invariance`)."""
    com = next((k for k in constraint_kinds() if "FixCom" in k.ase_names), None)
    if com is None or not host.flags & com.bit:
        return
    others = [
        "/".join(k.ase_names)
        for k in constraint_kinds()
        if k.holonomic
        and k is not com
        and not k.native
        and host.flags & k.bit
        and "FixSymmetry" not in k.ase_names
    ]
    if host.fixed.any():
        others.append("FixAtoms")
    if others:
        raise host.refuse(
            f"FixCom together with {', '.join(others)}: the result would depend on the "
            f"order ASE applies them in; keep FixCom alone or drop it (fixed atoms already "
            f"pin the centre of mass's drift)"
        )


def stack_fields(
    hosts: Iterable[Host | None], counts: list[int], dtype: torch.dtype, device: Any
) -> dict[str, dict[str, torch.Tensor]]:
    """The encoded structures as batch fields ``{"atom": {...}, "system": {...}}`` (only
    fields some structure uses; the step loop declares the rest)."""
    hosts = list(hosts)
    if not any(h is not None for h in hosts):
        return {"atom": {}, "system": {}}
    specs = field_specs()
    used = {name for h in hosts if h is not None for name in h.arrays}
    out: dict[str, dict[str, torch.Tensor]] = {"atom": {}, "system": {}}
    torch_dtype = {"float": dtype, "int64": torch.int64, "bool": torch.bool}
    for name in sorted(used):
        spec = specs[name]
        np_dtype = {"float": np.float64, "int64": np.int64, "bool": bool}[spec.dtype]
        parts = []
        for h, n in zip(hosts, counts):
            rows = n if spec.kind == "atom" else 1
            have = h.arrays.get(name) if h is not None else None
            parts.append(have if have is not None else np.zeros((rows, *spec.shape), np_dtype))
        out[spec.kind][name] = torch.as_tensor(
            np.concatenate(parts), dtype=torch_dtype[spec.dtype], device=device
        )
    flags = [h.flags if h is not None else 0 for h in hosts]
    dof = [h.dof if h is not None else 0.0 for h in hosts]
    out["system"][FLAGS_FIELD] = torch.as_tensor(flags, dtype=torch.int64, device=device)
    out["system"][DOF_FIELD] = torch.as_tensor(dof, dtype=dtype, device=device)
    return out


def decode_system(
    atom: Mapping[str, np.ndarray],
    system: Mapping[str, np.ndarray],
    lo: int,
    hi: int,
    b: int,
    atoms: Any,
) -> list[Any]:
    """Every ASE constraint object of system row ``b`` (atoms ``lo:hi``) of a batch's
    host arrays, for its result ``atoms``: ``FixAtoms`` (the ``fixed`` column), each
    flagged kind's ``decode`` and ``FixSymmetry`` from its operations.  The one way
    back, whether the arrays came from a batch in memory or from a results store."""
    from ase.constraints import FixAtoms

    fixed = atom["fixed"][lo:hi]
    out: list[Any] = [FixAtoms(mask=fixed)] if fixed.any() else []
    flags = int(system[FLAGS_FIELD][b]) if FLAGS_FIELD in system else 0
    for kind in constraint_kinds() if flags else ():
        if flags & kind.bit:
            arrays = {k: atom[k][lo:hi] for k, s in kind.fields.items() if s.kind == "atom"}
            scalars = {k: system[k][b] for k, s in kind.fields.items() if s.kind == "system"}
            out.extend(kind.decode(arrays, scalars))
    if symmetry.COUNT in system and system[symmetry.COUNT][b] > 0:
        out.append(symmetry.restore(atom, system, lo, hi, b, atoms))
    return out


def stored_fields() -> dict[str, str]:
    """Every constraint field (name -> ``"atom"`` or ``"system"``): the interface's,
    shared and per kind, and FixSymmetry's operations -- what a results store keeps of
    a batch holding a constrained system, so :func:`decode_system` works on its rows."""
    out = {name: spec.kind for name, spec in field_specs().items()}
    out.update({name: kind for name, (kind, _) in symmetry.FIELDS.items()})
    return out


def holds_constraints(system: Mapping[str, Any]) -> bool:
    """Whether per-system arrays (numpy or torch) hold a system with a constraint other
    than FixAtoms (a nonzero ``constraint_flags``; FixSymmetry sets its bit too)."""
    flags = system.get(FLAGS_FIELD)
    return flags is not None and bool((flags != 0).any())


def declare_for(batch: Any, names: Iterable[str]) -> None:
    """Declare on ``batch`` the fields a run needs on every batch when its structures
    carry constraints of these ASE class ``names`` (a sampler's scan): a pipeline's
    wire schema is one for all ranks and messages, and a field missing from it would
    be dropped in transit (the constraint lost on the next rank)."""
    kinds = set(names) - {"FixAtoms"}
    if not kinds:
        return
    batch.ensure_field(FLAGS_FIELD, "system", (), torch.int64, 0)
    declare_fields(batch)
    if "FixSymmetry" in kinds:  # (the dtypes atoms_codec gives symmetry.pack's arrays)
        dtypes = {symmetry.COUNT: torch.int64, symmetry.SOURCE: torch.int32,
                  symmetry.ADJUST: torch.bool}  # fmt: skip
        for name, (kind, shape) in symmetry.FIELDS.items():
            batch.ensure_field(name, kind, shape, dtypes.get(name, batch.dtype), 0)


__all__ = [
    "REFUSED", "constraint_kinds", "declare_fields", "declare_for", "decode_system",
    "encode_structure", "holds_constraints", "kind_of", "stack_fields", "stored_fields",
]  # fmt: skip
