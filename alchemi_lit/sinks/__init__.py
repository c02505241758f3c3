"""Sinks: where finished systems go.  HostMemory, ZarrSink and the priority chain.

The interface and HostMemory are in :mod:`.base`, ZarrSink in :mod:`.zarr`, the
chain in :mod:`.chain`.

Sinks receive *host* batches of graduated systems.  A run's sinks form a priority
chain: each write goes to the first sink with free capacity (a partial fit is split);
a sink that fails (disk full, permission denied) is reported and skipped, and
whatever no sink could take stays in an overflow buffer in memory -- computed
results are never dropped.

ZarrSink writes a results store (layout: :mod:`alchemi_lit.io.results_store`, which
also reads it back: :func:`read_results`).  ``read()`` of any sink gives
:class:`~alchemi_lit.io.results.Results`.  :func:`merge_stores` joins stores (the
shards of a job array) into one, each system once (:mod:`.merge`).
"""

from ..io.results_store import (
    ATOM_COLUMNS,
    SCHEMA,
    SYSTEM_COLUMNS,
    read_results,
    read_store_batch,
    stored_system_ids,
)
from .base import HostMemory, Sink, SinkFlushError, id_list
from .chain import SinkChain
from .merge import merge_stores
from .zarr import ZarrSink, record_run_stats

__all__ = [  # (the store's layout and readers live in results_store; importable from here)
    "ATOM_COLUMNS", "SCHEMA", "SYSTEM_COLUMNS", "HostMemory", "Sink", "SinkChain",
    "SinkFlushError", "ZarrSink", "id_list", "merge_stores", "read_results", "read_store_batch",
    "record_run_stats", "stored_system_ids",
]  # fmt: skip
