"""Training runs in worker processes: the launch, Ctrl-C and cleanup shared by the sweeps
(``linattn mqar``, ``linattn state-tracking``).

A job is a picklable callable (a ``functools.partial`` of an importable function) that takes
``progress`` and returns a result row. With one worker the jobs run here, in order, with progress
bars; with more they run in spawned processes, ``threads`` torch threads each, no bars, and each
row is recorded as it finishes. Ctrl-C stops the main process with one line (the workers ignore
SIGINT) and terminates the workers; finished rows are recorded, the rest resume next time.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing.process import BaseProcess

import torch

Job = Callable[..., dict]


def run_jobs(
    jobs: Sequence[Job],
    record: Callable[[dict], None],
    *,
    workers: int,
    threads: int = 1,
    progress: bool = True,
) -> None:
    """Run every job, ``record``-ing each returned row; ``workers`` processes at most."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            record(job(progress=progress))
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
        with sigint_ignored():  # inherited by the workers: Ctrl-C is this process's to handle
            futures = [pool.submit(_in_worker, threads, job) for job in jobs]
        try:
            for future in as_completed(futures):
                record(future.result())
        except BaseException:
            # Finished rows are saved; the rest resume next time. The pool's own thread cancels
            # the pending jobs (a future cancelled here, in this thread, could still be failed
            # there once the workers are stopped: CPython 3.11's ``terminate_broken`` then raised
            # InvalidStateError and printed its traceback after our one-line message).
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            stop_workers(processes)  # else leaving the ``with`` would wait for the running jobs
            raise


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while the pool starts its workers, who inherit that (Python keeps an ignored
    SIGINT at startup): a Ctrl-C then stops the sweep in this process with one message, instead
    of a traceback from every worker. Outside the main thread signals cannot be set: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_workers(processes: Sequence[BaseProcess]) -> None:
    """Terminate a pool's worker processes (our own children; their jobs resume from their
    checkpoints next time). The pool's ``_processes`` is private: without it (an empty list) the
    pool ends as it would."""
    for process in processes:
        process.terminate()


def _in_worker(threads: int, job: Job) -> dict:
    """``job`` in a worker process, with ``threads`` torch threads and no progress bar.

    tqdm's default lock is a multiprocessing lock, a named semaphore; a worker stopped on Ctrl-C
    (``stop_workers``) would leave it behind, and the resource tracker would report it as leaked
    after our one-line message. A worker draws no bar: a thread lock serves.
    """
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(threads)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    return job(progress=False)


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    """End this worker once its parent is gone (killed: SIGTERM, SIGKILL), rather than train on
    as an orphan that nobody records: the parent's Ctrl-C path stops its workers itself, a kill
    does not. Its job resumes from its last checkpoint next time."""
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)
