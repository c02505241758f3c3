"""Batched materials-property workflows: every job of every material in one run.

Each workflow is a small module (``eos``, ``elastic``, ``phonons``); the shared job
runner (:mod:`.jobs`) and per-material table (:mod:`.base`) sit beside them.
"""

from .elastic import ElasticResults, elastic
from .eos import EOSResults, eos
from .phonons import PhononResults, phonons

__all__ = ["EOSResults", "ElasticResults", "PhononResults", "elastic", "eos", "phonons"]
