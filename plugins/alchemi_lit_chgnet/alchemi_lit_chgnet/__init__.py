"""alchemi_lit plugin: CHGNet (``chgnet``) models, batched over all systems in flight.

Importing this module registers the model class ``CHGNet`` and the presets
``chgnet-mptrj`` (CHGNet 0.3.0, trained on MPtrj) and ``chgnet-r2scan``, whose weights
ship inside the ``chgnet`` wheel, with alchemi_lit's registry; alchemi_lit imports it
through the ``alchemi_lit.plugins`` entry point.  ``chgnet`` itself (and pymatgen) is
imported only when a model is built, so listing plugins stays fast.
"""

from __future__ import annotations

from alchemi_lit.core.registry import register, register_preset

from .model import PRETRAINED, CHGNet, checkpoint_path, load_network

register("model")(CHGNet)
register_preset("model", "chgnet-mptrj", CHGNet, model="0.3.0")
register_preset("model", "chgnet-r2scan", CHGNet, model="r2scan")

__version__ = "0.1.0"
__all__ = ["PRETRAINED", "CHGNet", "checkpoint_path", "load_network"]
