"""One intra-op thread for the op tests: their tensors are tiny, and on a shared 2-core machine
OpenMP threads that wait on each other made the suite five times slower."""

import torch

torch.set_num_threads(1)
