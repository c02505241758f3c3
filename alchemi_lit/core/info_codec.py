"""Per-system ``info`` as JSON text, for places that must not pickle: results stores
(zarr string arrays) and checkpoints (``torch.load(weights_only=True)``).

``info`` holds what a user attached to an input structure (``ase.Atoms.info``: ids,
labels, arrays) and what the run learned (error texts).  numpy arrays and tensors keep
their dtype and shape through a tagged object; numpy scalars become Python numbers.
ASE's own objects come back as themselves: a CIF's ``Spacegroup`` (every CIF input has
one) is stored as its number and setting, and objects ``ase.io.jsonio`` encodes
(``Cell``, ``Atoms``, ``BandPath`` ...) as that module's JSON text.  Anything else JSON
cannot hold is stored as its ``repr``, with one warning per key and type (not one per
structure).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

_ARRAY_TAG = "__ndarray__"
#: {"__ase__": "spacegroup", "number", "setting"} or {"__ase__": "jsonio", "text"}
_ASE_TAG = "__ase__"
_warned: set[tuple[str, str]] = set()  # (key, type) already warned about


def _encode(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return {str(k): _encode(v, f"{key}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, key) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # torch.Tensor
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc" and obj.dtype.kind != "c":
        return {_ARRAY_TAG: obj.tolist(), "dtype": str(obj.dtype), "shape": list(obj.shape)}
    ase_object = _encode_ase(obj)
    if ase_object is not None:
        return ase_object
    if (key, type(obj).__name__) not in _warned:
        from loguru import logger

        _warned.add((key, type(obj).__name__))
        logger.warning(
            f"info entry {key!r} ({type(obj).__name__}) is not JSON data; stored as its repr "
            f"(warned once)"
        )
    return repr(obj)


def _encode_ase(obj: Any) -> dict[str, Any] | None:
    """ASE objects as tagged JSON (None for anything else)."""
    if type(obj).__module__.split(".")[0] != "ase":
        return None
    from ase.spacegroup import Spacegroup

    if isinstance(obj, Spacegroup):
        return {_ASE_TAG: "spacegroup", "number": int(obj.no), "setting": int(obj.setting)}
    if getattr(obj, "ase_objtype", None) is None:
        return None
    from ase.io import jsonio

    return {_ASE_TAG: "jsonio", "text": jsonio.encode(obj)}


def _decode_ase(obj: dict[str, Any]) -> Any:
    if obj[_ASE_TAG] == "spacegroup":
        from ase.spacegroup import Spacegroup

        return Spacegroup(obj["number"], setting=obj["setting"])
    from ase.io import jsonio

    return jsonio.decode(obj["text"])


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _ARRAY_TAG in obj:
            return np.asarray(obj[_ARRAY_TAG], dtype=obj["dtype"]).reshape(obj["shape"])
        if _ASE_TAG in obj:
            return _decode_ase(obj)
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def info_to_json(info: dict[str, Any] | None) -> str:
    """JSON text of one system's info ("" when it has none)."""
    if not info:
        return ""
    return json.dumps(_encode(info, "info"), allow_nan=True)


def info_from_json(text: str) -> dict[str, Any]:
    """The info a :func:`info_to_json` text describes ({} for "")."""
    return _decode(json.loads(text)) if text else {}


__all__ = ["info_from_json", "info_to_json"]
