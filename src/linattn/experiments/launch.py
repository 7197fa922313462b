"""Start N local processes the way torchrun does (loopback rendezvous), with a hard deadline.

Used by the tests and by ``linattn cp-bytes``. Unlike torchrun, which stops the other ranks as
soon as one fails, this launcher leaves every rank alone until ``deadline`` seconds, so that a test
can check that each rank stops with an error *by itself* (``PeerFailureError`` after the process
group's timeout). A rank still running at the deadline is killed and reported with returncode None.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


@dataclass
class RankResult:
    """What one rank did: exit status (None: killed at the deadline), output, seconds it ran."""

    rank: int
    returncode: int | None
    output: str
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_local(
    args: list[str],
    nproc: int,
    deadline: float = 120.0,
    env: dict[str, str] | None = None,
    world_size: int | None = None,
) -> list[RankResult]:
    """Run ``python *args`` as ranks 0..nproc-1 of one job on 127.0.0.1; wait at most ``deadline``.

    ``world_size`` (default ``nproc``) larger than ``nproc`` leaves ranks missing: the job's
    rendezvous then waits for peers that never arrive.

    Each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    MASTER_ADDR=127.0.0.1, MASTER_PORT) and OMP_NUM_THREADS=1 unless already set in ``env``.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an int >= 1, got {nproc!r}")
    port = free_port()
    base = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    procs, logs = [], []
    start = time.monotonic()
    for rank in range(nproc):
        rank_env = base | {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size or nproc),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        log = tempfile.TemporaryFile(mode="w+")
        procs.append(
            subprocess.Popen(
                [sys.executable, *args], env=rank_env, stdout=log, stderr=subprocess.STDOUT
            )
        )
        logs.append(log)
    ended: dict[int, float] = {}
    try:
        while len(ended) < nproc and time.monotonic() - start < deadline:
            for rank, proc in enumerate(procs):
                if rank not in ended and proc.poll() is not None:
                    ended[rank] = time.monotonic() - start
            time.sleep(0.05)
    except BaseException:  # Ctrl-C: no rank may outlive the launcher
        for proc, log in zip(procs, logs, strict=True):
            proc.kill()  # our own children
            proc.wait()
            log.close()
        raise
    results: list[RankResult] = []
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        if rank not in ended:
            proc.kill()  # our own child, still running at the deadline
            proc.wait()
        log.seek(0)
        code = proc.returncode if rank in ended else None
        seconds = ended.get(rank, time.monotonic() - start)
        results.append(RankResult(rank, code, log.read(), seconds))
        log.close()
    return results
