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


#: ``ALCHEMI_LIT_TEST_BLAS=shape-sensitive`` runs every test with matrix products that
#: round by their shape (:func:`alchemi_lit.testing.shape_sensitive_blas`): a test that
#: passes only with this machine's BLAS kernels fails here, as it would on a processor
#: whose kernels block differently (issue #41; the slow tier runs the fast one so)
TEST_BLAS = "ALCHEMI_LIT_TEST_BLAS"


@pytest.fixture(autouse=True)
def _blas_under_test():
    import os

    if os.environ.get(TEST_BLAS, "native") == "native":
        yield
        return
    if os.environ[TEST_BLAS] != "shape-sensitive":
        raise pytest.UsageError(f"{TEST_BLAS} must be 'native' or 'shape-sensitive'")
    from alchemi_lit.testing import shape_sensitive_blas

    with shape_sensitive_blas():
        yield
