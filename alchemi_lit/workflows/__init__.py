"""Workflows: whole studies built on the Simulator, every job of every band or
material in one batched run.

Nudged elastic bands (:mod:`.neb`: bands built with ASE's interpolation; results per
band in :mod:`.bands`) and materials properties, each a small module (``eos``,
``elastic``, ``phonons``, ``qha``; ``vibrations`` for molecules and adsorbates) over
a shared job runner (:mod:`.jobs`) and per-material table
(:mod:`.base`); orderings of partially occupied structures (:mod:`.order`).
"""

from ..io.bands import Band, BandResults, band_results
from .elastic import ElasticResults, elastic
from .eos import EOSResults, eos
from .neb import label_bands, make_band, read_bands
from .order import order
from .order_results import OrderResults
from .phonons import PhononResults, phonons
from .qha import QHAResults, qha
from .vibrations import VibrationResults, vibrations

__all__ = [
    "Band", "BandResults", "EOSResults", "ElasticResults", "OrderResults", "PhononResults",
    "QHAResults", "VibrationResults", "band_results", "elastic", "eos", "label_bands",
    "make_band", "order", "phonons", "qha", "read_bands", "vibrations",
]  # fmt: skip
