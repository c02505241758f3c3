"""What makes two runs the same run: the check every resume makes.

A resume continues systems mid-trajectory, so anything that changes a system's path
must be the same as in the run that wrote the checkpoint: every parameter of every
stage and criterion, the model's settings and weights, the precision, the seed and the
input structures themselves (species, coordinates, cells, ids).  A fingerprint holds
each of these in a readable, JSON-able form (numbers as they are, tensors and weights
as digests), so a refused resume names exactly what differs, and the single-device
loop, every pipeline rank and a results store all compare with the same function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.structure_hash import StructureHashes, digest_arrays

#: attributes set by the run itself rather than by the user's configuration (a class
#: adds its own in ``fingerprint_ignore``; counters named ``num_*`` are left out too)
_RUN_STATE = frozenset({"seed", "compiled_kernels", "training", "fingerprint_ignore"})
_MAX_DEPTH = 4


def canonical(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON-able data that compares equal exactly when it is the same
    setting: numbers and strings as they are, small arrays as lists, large ones and
    model weights as digests, objects as their class and public attributes."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # JSON has no nan/inf
    if isinstance(value, (torch.Tensor, np.ndarray)):
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        if array.size <= 16 and array.dtype.kind in "biuf":
            return {"array": array.astype(np.float64).tolist(), "dtype": str(array.dtype)}
        return {"digest": digest_arrays([array]), "shape": list(array.shape)}
    if isinstance(value, Mapping):
        return {str(k): canonical(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v, depth + 1) for v in value]
    if isinstance(value, torch.nn.Module):
        return {"class": _class_name(value), **settings(value, depth + 1)}
    if callable(value) and not hasattr(value, "__dict__"):
        return getattr(value, "__qualname__", repr(value))
    if hasattr(value, "__dict__") and depth < _MAX_DEPTH:
        return {"class": _class_name(value), **settings(value, depth + 1)}
    return _class_name(value)


def settings(obj: Any, depth: int = 0) -> dict[str, Any]:
    """An object's public attributes (its configuration), canonical; for a torch
    module, also a digest of its weights (parameters and buffers)."""
    ignore = _RUN_STATE | frozenset(getattr(obj, "fingerprint_ignore", ()))
    out = {
        k: canonical(v, depth)
        for k, v in sorted(vars(obj).items())
        if not k.startswith(("_", "num_")) and k not in ignore
    }
    if isinstance(obj, torch.nn.Module):
        state = obj.state_dict()
        if state:
            out["weights"] = digest_arrays(
                [
                    np.frombuffer(f"{k}{t.dtype}{tuple(t.shape)}".encode(), np.uint8)
                    for k, t in state.items()
                ]
                + [
                    t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy()
                    for t in state.values()
                ]
            )  # (bytes as uint8: any dtype, bfloat16 included)
    return out


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def input_digest(data: Any) -> str:
    """Digest of a run's input: the ids, species, coordinates, cells and periodicity of
    every structure (a Batch, ``ase.Atoms``, a list of them or a SizeAwareSampler),
    in float64 so that the same structures give the same digest however they came."""
    from ase import Atoms

    from ..core.state import Batch, default_system_ids
    from ..data.sampler import SizeAwareSampler

    if isinstance(data, Batch):
        order = torch.argsort(data.system_id.cpu(), stable=True)
        host = data.to(device="cpu").select(order)
        return structures_digest(
            host.system_id.numpy(), np.zeros(0), host.n_atoms.numpy(),
            host.atomic_numbers.numpy(), host.positions.numpy(), host.cell.numpy(),
            host.pbc.numpy(),
        )  # fmt: skip
    if isinstance(data, SizeAwareSampler):  # streamed: a dataset is never all in memory
        atoms, systems, edges = data.requested_budget()  # "auto" (-2), not what it measured
        budget = np.asarray([-2 if atoms == "auto" else atoms, systems or -1, edges or -1])
        order = np.argsort(data.system_ids, kind="stable")
        parts = data.content_hashes  # (the scan's, in dataset order: used when that is id order)
        if parts is None or np.any(np.diff(data.system_ids) <= 0):
            parts = StructureHashes()
            for k in order:
                parts.add(data.dataset[int(k)])
        return parts.digest(data.system_ids[order], budget, data.sizes[order])
    items = [data] if isinstance(data, Atoms) else data  # (never consume an iterator)
    if not isinstance(items, (list, tuple)) or not items:
        return "not structures"  # (refused when the run reads them, naming the fix)
    if not all(isinstance(a, Atoms) for a in items):
        return "not structures"  # (refused when the run reads them, naming the fix)
    ids, budget = np.asarray(default_system_ids(items)), np.zeros(0)
    order = np.argsort(np.asarray(ids), kind="stable")
    items = [items[k] for k in order]
    return structures_digest(
        np.asarray(ids)[order], budget, np.asarray([len(a) for a in items]),
        np.concatenate([a.numbers for a in items]), np.concatenate([a.positions for a in items]),
        np.stack([a.cell.array for a in items]), np.stack([a.pbc for a in items]),
    )  # fmt: skip


def structures_digest(
    ids: np.ndarray, budget: np.ndarray, counts: np.ndarray, numbers: np.ndarray,
    positions: np.ndarray, cells: np.ndarray, pbc: np.ndarray,
) -> str:  # fmt: skip
    """The digest of structures in ``system_id`` order (:class:`StructureHashes`), each
    part in one dtype (integers int64, coordinates float64) whatever container and
    precision held it."""
    parts = StructureHashes()
    parts.update(numbers, positions, cells, pbc)
    return parts.digest(ids, budget, counts)


def stage_settings(stages: Sequence[Any]) -> list[dict[str, Any]]:
    """Each stage's class and parameters (its criterion included), in plan order."""
    return [{"class": _class_name(s), **settings(s)} for s in stages]


def run_fingerprint(
    stages: Sequence[Any], model: Any, precision: str, seed: int, data_digest: str
) -> dict[str, Any]:
    """Everything a resume must find unchanged (see the module docstring)."""
    return {
        "stages": stage_settings(stages),
        "model": {"class": _class_name(model), **settings(model)},
        "precision": precision,
        "seed": int(seed),
        "input": data_digest,
    }


_LABELS = {
    "stages": "plan",
    "model": "model",
    "precision": "precision",
    "seed": "seed",
    "input": "input structures (ids, species, coordinates, cells)",
}


def differences(saved: Any, mine: Any, path: str = "") -> list[str]:
    """Where two fingerprints differ, as ``"what: written -> now"`` lines."""
    if isinstance(saved, dict) and isinstance(mine, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(mine), key=str):
            label = _label(path, key)
            if key not in saved or key not in mine:
                out.append(f"{label}: {'new in' if key not in saved else 'missing from'} this run")
            else:
                out += differences(saved[key], mine[key], label)
        return out
    if isinstance(saved, list) and isinstance(mine, list):
        if len(saved) != len(mine):
            if path == "plan":
                return [f"plan: stages {_names(saved)} -> {_names(mine)}"]
            return [f"{path}: {len(saved)} -> {len(mine)} entries"]
        return [
            line
            for k, (a, b) in enumerate(zip(saved, mine))
            for line in differences(a, b, _item_label(path, k, a))
        ]
    if saved != mine:
        if path.endswith("weights") or isinstance(saved, dict) or path.startswith("input"):
            return [f"{path} differ"]
        return [f"{path}: {_short(saved)} -> {_short(mine)}"]
    return []


def _item_label(path: str, k: int, item: Any) -> str:
    """``stage 1 (Langevin)`` for a plan's stages, ``path[k]`` for other lists."""
    if path == "plan" and isinstance(item, dict) and "class" in item:
        return f"plan stage {k} ({_names([item])})"
    return f"{path}[{k}]"


def _names(stages: list[Any]) -> str:
    """``FIRE, Langevin``: the short class names of fingerprinted stages."""
    return ", ".join(str(s.get("class", "?")).rsplit(".", 1)[-1] for s in stages)


def _label(path: str, key: str) -> str:
    if not path:
        return _LABELS.get(key, key)
    return f"{path}.{key}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refuse_mismatch(saved: Mapping[str, Any] | None, mine: Mapping[str, Any], source: str) -> None:
    """Raise a :class:`~alchemi_lit.core.errors.ConfigError` naming every difference between
    the fingerprint ``saved`` with ``source`` (a checkpoint, a store) and this run's."""
    if saved is None:
        return
    found = differences(dict(saved), dict(mine))
    if found:
        shown = "; ".join(found[:6]) + (f"; and {len(found) - 6} more" if len(found) > 6 else "")
        raise ConfigError(
            f"cannot resume from {source}: it was written by a different run (written -> "
            f"now: {shown}). "
            f"Resume with the same configuration and structures, or start a new run "
            f"(another checkpoint folder and results store)"
        )
