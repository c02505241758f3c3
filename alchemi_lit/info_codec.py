"""Per-system ``info`` as JSON text, for places that must not pickle: results stores
(zarr string arrays) and checkpoints (``torch.load(weights_only=True)``).

``info`` holds what a user attached to an input structure (``ase.Atoms.info``: ids,
labels, arrays) and what the run learned (error texts).  numpy arrays and tensors keep
their dtype and shape through a tagged object; numpy scalars become Python numbers;
anything else JSON cannot hold is stored as its ``repr`` with a warning naming the key.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

_ARRAY_TAG = "__ndarray__"


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
    from loguru import logger

    logger.warning(
        f"info entry {key!r} ({type(obj).__name__}) is not JSON data; stored as its repr"
    )
    return repr(obj)


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _ARRAY_TAG in obj:
            return np.asarray(obj[_ARRAY_TAG], dtype=obj["dtype"]).reshape(obj["shape"])
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
