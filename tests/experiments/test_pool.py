"""The sweeps' worker pool (``linattn.experiments._pool``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# A sweep of two jobs that never end, in two workers; prints the workers' pids, then waits.
SWEEP = textwrap.dedent(
    """
    import os, sys, time
    from functools import partial
    from linattn.experiments import _pool

    def forever(directory, progress=True):
        open(os.path.join(directory, str(os.getpid())), "w").close()
        while True:
            time.sleep(0.1)

    if __name__ == "__main__":
        jobs = [partial(forever, sys.argv[1]) for _ in range(2)]
        _pool.run_jobs(jobs, lambda row: None, workers=2)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended, its parent not reaped it yet
        return stat.read().split(") ")[-1][0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_the_sweep_is_killed(tmp_path):
    # A killed sweep (SIGKILL: no cleanup of its own) leaves no worker training on as an orphan.
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("[0-9]*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = [int(p.name) for p in tmp_path.glob("[0-9]*")]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)
