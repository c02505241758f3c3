"""alchemi_lit plugin: TorchSim models (``torch_sim.models``) as alchemi_lit models.

Importing this module registers the model class ``TorchSimModel`` with alchemi_lit's
registry; alchemi_lit imports it through the ``alchemi_lit.plugins`` entry point.
``torch_sim`` itself is imported only when a state is built, so listing plugins stays
fast.
"""

from __future__ import annotations

from alchemi_lit.core.registry import register

from .model import TorchSimModel, build_model, from_sim_state, to_sim_state

register("model")(TorchSimModel)

__version__ = "0.1.0"
__all__ = ["TorchSimModel", "build_model", "from_sim_state", "to_sim_state"]
