"""A Batch as plain tensors and JSON text: what checkpoints and transfer messages hold.

Plain tensors load with ``torch.load(weights_only=True)`` (resuming never unpickles
arbitrary objects); each system's ``info`` travels as JSON (:mod:`.info_codec`).
"""

from __future__ import annotations

from typing import Any

from ..core.info_codec import info_from_json, info_to_json
from ..core.state import Batch


def batch_state(batch: Batch) -> dict[str, Any]:
    """A Batch as plain tensors on the host (checkpoints, weights_only-safe)."""
    return {
        "atom": {k: v.detach().cpu() for k, v in batch.atom.items()},
        "system": {k: v.detach().cpu() for k, v in batch.system.items()},
        "info": {str(sid): info_to_json(v) for sid, v in batch.info.items() if v},
    }


def batch_from_state(state: dict[str, Any]) -> Batch:
    info = {int(sid): info_from_json(text) for sid, text in state.get("info", {}).items()}
    return Batch(dict(state["atom"]), dict(state["system"]), info)
