"""core.workers: per-material CPU work (phonopy's) in worker processes, in order, with
each call's failure in its place and the others finished."""

from __future__ import annotations

import os

import pytest
import worker_calls

from alchemi_lit.core import workers as workers_module
from alchemi_lit.core.errors import ConfigError, StructureError
from alchemi_lit.core.workers import WORKER_PAYS_S, WorkerError, map_in_workers, resolve_workers


def test_results_come_back_in_order_from_several_processes():
    """In order, from processes other than this one that import neither alchemi_lit nor
    torch (a worker starts in numpy's import time), whatever the called code prints."""
    got = map_in_workers(worker_calls, "report", [(x,) for x in range(6)], workers=2)
    assert [square for square, _, _ in got] == [x * x for x in range(6)]
    pids = {pid for _, pid, _ in got}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    assert not any(heavy for _, _, heavy in got)


def test_costs_hand_out_the_dearest_calls_first():
    """With an estimate per call, one worker takes the calls dearest first (a big call
    left for last would keep one worker busy while the others idle); the results stay
    in the order of the arguments."""
    costs = [1.0, 5.0, 2.0, 9.0, 3.0, 4.0]
    got = map_in_workers(worker_calls, "started", [(k,) for k in range(6)], 2, costs)
    one = map_in_workers(worker_calls, "report", [(k,) for k in range(6)], 2, costs)
    assert [square for square, _, _ in one] == [k * k for k in range(6)]
    firsts = []
    for pid in {p for p, _ in got}:  # each worker takes its calls dearest first
        mine = sorted((t, k) for k, (p, t) in enumerate(got) if p == pid)
        assert [costs[k] for _, k in mine] == sorted((costs[k] for _, k in mine), reverse=True)
        firsts.append(mine[0][1])
    assert 3 in firsts and set(firsts) <= {3, 1}  # 9 (and 5, if both workers ran any)


def test_one_worker_runs_here_through_the_same_function():
    got = map_in_workers(worker_calls, "report", [(3,), (4,)], workers=1)
    assert [(square, pid) for square, pid, _ in got] == [(9, os.getpid()), (16, os.getpid())]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_raising_call_gives_its_exception_and_the_others_finish(workers):
    got = map_in_workers(worker_calls, "refuse", [(5,), (6,)], workers=workers)
    assert [type(g) for g in got] == [ValueError, ValueError]
    assert str(got[1]) == "refused 6"
    if workers == 2 and hasattr(got[0], "__notes__"):
        assert "refuse" in got[0].__notes__[0]  # the worker's traceback travels


def test_a_dying_worker_fails_its_call_only():
    """A worker that dies is replaced; the calls after it still run."""
    got = map_in_workers(worker_calls, "die_on_zero", [(1,), (0,), (2,), (0,), (3,)], workers=2)
    assert [got[0], got[2], got[4]] == [1, 2, 3]
    assert all(isinstance(g, WorkerError) and "died (exit code 3)" in str(g) for g in got[1::2])


def test_an_unpicklable_result_is_an_error_not_a_hang():
    got = map_in_workers(worker_calls, "unpicklable", [(1,), (2,)], workers=2)
    assert all(isinstance(g, WorkerError) and "cannot be pickled" in str(g) for g in got)


def test_structure_errors_keep_their_system_index_across_processes():
    import pickle

    err = pickle.loads(pickle.dumps(StructureError("bad site", 4)))
    assert type(err) is StructureError and err.system_index == 4 and str(err) == "bad site"


def test_workers_setting(monkeypatch):
    assert resolve_workers(3, 2, "phonons") == 2  # never more processes than materials
    assert 1 <= resolve_workers("auto", 50, "phonons") <= (os.cpu_count() or 1)
    # work that would not pay for starting a worker stays here
    assert resolve_workers("auto", 50, "phonons", work_s=1.0) == 1
    assert resolve_workers("auto", 50, "phonons", work_s=1e4) == resolve_workers("auto", 50, "p")
    # one worker per WORKER_PAYS_S seconds of work, on a machine of 16 cores
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 16)
    assert resolve_workers("auto", 50, "phonons", work_s=3.5 * WORKER_PAYS_S) == 3
    assert resolve_workers("auto", 5, "phonons", work_s=1e4) == 5  # one per task at most
    for bad in (0, -1, 1.5, "many", True):
        with pytest.raises(ConfigError, match="workers must be 'auto' or an int >= 1"):
            resolve_workers(bad, 4, "phonons")
