"""alchemi_lit plugin: SevenNet (``sevenn``) models, batched over all systems in flight.

Importing this module registers the model class ``SevenNet`` and the preset
``sevennet-0`` (SevenNet-0, 11 Jul 2024, whose weights ship inside the ``sevenn`` wheel)
with alchemi_lit's registry; alchemi_lit imports it through the ``alchemi_lit.plugins``
entry point.  ``sevenn`` itself (and e3nn) is imported only when a model is built, so
listing plugins stays fast.
"""

from __future__ import annotations

from alchemi_lit.core.registry import register, register_preset

from .model import PRETRAINED, SevenNet, checkpoint_path, load_checkpoint

register("model")(SevenNet)
register_preset("model", "sevennet-0", SevenNet, checkpoint="sevennet-0")

__version__ = "0.1.0"
__all__ = ["PRETRAINED", "SevenNet", "checkpoint_path", "load_checkpoint"]
