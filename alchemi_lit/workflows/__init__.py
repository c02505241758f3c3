"""Workflows: whole studies built on the Simulator (nudged elastic bands, ...)."""

from .bands import Band, BandResults, band_results
from .neb import label_bands, make_band, read_bands

__all__ = ["Band", "BandResults", "band_results", "label_bands", "make_band", "read_bands"]
