"""One torch thread for tests of tiny tensors: on a shared machine it is faster than several."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Run each test with one intra-op thread, then restore the previous count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
