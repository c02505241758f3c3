"""Settings every test of the repository shares (``tests/`` and the plugins' suites).

``tests/conftest.py`` holds the structure builders; this file holds only what must
apply to the plugins' tests as well.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One intra-op thread: the tests' tensors are small, where more threads only add
    overhead, and test processes (xdist workers, pipeline ranks) share few cores --
    oversubscribed threads slow them by an order of magnitude on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
