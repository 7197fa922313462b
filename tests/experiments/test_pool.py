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


# A sweep stopped by Ctrl-C (a KeyboardInterrupt out of ``record``) while jobs are still pending:
# two workers busy, the call queue full, five jobs waiting.
INTERRUPTED = textwrap.dedent(
    """
    import time
    from functools import partial
    from linattn.experiments import _pool

    def job(i, progress=True):
        if i > 0:
            time.sleep(60)
        return {"i": i}

    def record(row):
        raise KeyboardInterrupt

    if __name__ == "__main__":
        try:
            _pool.run_jobs([partial(job, i) for i in range(8)], record, workers=2)
        except KeyboardInterrupt:
            print("interrupted")
    """
)


def test_ctrl_c_with_jobs_pending_prints_nothing_more(tmp_path):
    """The pending jobs are cancelled and the workers stopped without a traceback from the pool's
    thread (a future cancelled by the main thread, then failed by the pool's once the workers
    were gone: InvalidStateError, in 2 runs of 3 before the fix), and without waiting for the
    running jobs. Four runs: the race is the pool thread's."""
    script = tmp_path / "sweep.py"
    script.write_text(INTERRUPTED)
    for _ in range(4):
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, "interrupted\n", "")
        assert time.monotonic() - start < 50  # the running jobs (60 s) were not waited for
