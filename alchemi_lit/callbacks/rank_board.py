"""Progress of every replica on rank 0's bar: each rank's counts in a small file.

Why files: replicas never step in lockstep (each runs its own share of the data and
ends when it is done), so a collective every few steps would make each rank wait for
the slowest.  A file per rank, written at most once a second (written whole to a
temporary name, then renamed: a reader never sees half of one) and read by rank 0 at
most once a second, costs no rank any waiting.  The folder is rank 0's, named to
every rank at the start (the strategy broadcasts it); a rank on another node that
cannot write there is simply not counted, and the bar says how many ranks report.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: seconds between two writes of a rank's file, and between two reads of them all
INTERVAL_S = 1.0


@dataclass(frozen=True)
class RankCounts:
    """What a rank has done and may still do: atom-steps done and still possible,
    systems finished and in its share (None: not known), and whether its total is an
    estimate (systems not yet seen counted at the mean size)."""

    done: int
    left: int
    finished: int
    total_systems: int | None
    estimated: bool = False


class RankBoard:
    """Rank ``rank``'s view of the folder where every rank of ``ranks`` posts its counts."""

    def __init__(self, folder: str | os.PathLike[str], rank: int, ranks: int) -> None:
        self.folder, self.rank, self.ranks = Path(folder), int(rank), int(ranks)
        self._written = -INTERVAL_S
        self._read = -INTERVAL_S
        self._others: dict[int, RankCounts] = {}

    def post(self, counts: RankCounts, force: bool = False) -> None:
        """Write this rank's counts (at most once per :data:`INTERVAL_S` unless ``force``:
        the last counts of a run)."""
        now = time.monotonic()
        if not force and now - self._written < INTERVAL_S:
            return
        self._written = now
        path = self.folder / f"rank{self.rank}.json"
        temporary = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):  # not reachable from here: not counted
            temporary.write_text(json.dumps(asdict(counts)))
            os.replace(temporary, path)

    def others(self) -> dict[int, RankCounts]:
        """The latest counts every other rank posted (read again at most once per
        :data:`INTERVAL_S`); ranks that posted nothing yet are absent."""
        now = time.monotonic()
        if now - self._read >= INTERVAL_S:
            self._read = now
            for r in range(self.ranks):
                if r == self.rank:
                    continue
                with contextlib.suppress(OSError, ValueError, TypeError):
                    text = (self.folder / f"rank{r}.json").read_text()
                    self._others[r] = RankCounts(**json.loads(text))
        return dict(self._others)
