"""tests/compat: fla's Triton kernels on the CPU under triton's interpreter (tests/fla_interpreter).

Imported before any test module here imports fla; without triton the helper is skipped and
the tests that need fla skip on their own ``pytest.importorskip``.
"""

import contextlib

with contextlib.suppress(ImportError):
    from tests import fla_interpreter  # noqa: F401
