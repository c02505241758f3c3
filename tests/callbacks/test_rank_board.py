"""The files replicas post their progress in (``callbacks.rank_board``): a reader sees
each rank's latest whole counts, never half a file, and a rank that cannot write is
left out without an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alchemi_lit.callbacks import rank_board
from alchemi_lit.callbacks.rank_board import RankBoard, RankCounts


@pytest.fixture(autouse=True)
def no_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_board, "INTERVAL_S", 0.0)


def test_rank_0_reads_what_the_others_posted(tmp_path: Path) -> None:
    boards = [RankBoard(tmp_path, r, 3) for r in range(3)]
    assert boards[0].others() == {}
    boards[1].post(RankCounts(10, 90, 1, 4))
    boards[2].post(RankCounts(5, 5, 2, None, estimated=True))
    assert boards[0].others() == {1: RankCounts(10, 90, 1, 4), 2: RankCounts(5, 5, 2, None, True)}
    boards[1].post(RankCounts(100, 0, 4, 4))
    assert boards[0].others()[1] == RankCounts(100, 0, 4, 4)  # the latest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank1.json", "rank2.json"]


def test_a_half_written_file_is_skipped_and_an_unwritable_folder_is_no_error(tmp_path: Path):
    reader = RankBoard(tmp_path, 0, 2)
    (tmp_path / "rank1.json").write_text('{"done": 3, "le')  # a writer that died mid-write
    assert reader.others() == {}
    RankBoard(tmp_path / "absent" / "folder", 1, 2).post(RankCounts(1, 1, 0, 1))  # no error


def test_posts_are_rate_limited_unless_forced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(rank_board, "INTERVAL_S", 3600.0)
    writer, reader = RankBoard(tmp_path, 1, 2), RankBoard(tmp_path, 0, 2)
    writer.post(RankCounts(1, 9, 0, 2))
    writer.post(RankCounts(2, 8, 0, 2))  # within the interval: not written
    assert json.loads((tmp_path / "rank1.json").read_text())["done"] == 1
    writer.post(RankCounts(10, 0, 2, 2), force=True)  # the last counts of a run
    assert reader.others()[1] == RankCounts(10, 0, 2, 2)
