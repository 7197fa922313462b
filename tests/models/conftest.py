"""The model tests run tiny tensors: one thread is faster than several on a shared machine."""

from tests.threads import one_thread  # noqa: F401  (an autouse fixture)
