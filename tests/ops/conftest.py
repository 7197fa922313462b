"""One intra-op thread for the op tests: their tensors are tiny, and on a shared 2-core machine
OpenMP threads that wait on each other made the suite five times slower."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def pytorch_loop(monkeypatch):
    """Run float32 chunk forms through the PyTorch group loop, not the fused C++ forward."""
    monkeypatch.setenv("LINATTN_NATIVE", "0")
