"""Failures end every rank with an error, never a hang (gloo over loopback, 2 ranks).

Mismatched slices and bad input on one rank raise the same ``ValueError`` on every rank at once.
A rank that raises (and exits, or stays alive without calling the collective), or a rank that
never joins, makes the others raise ``PeerFailureError`` within the process group's timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from linattn.experiments.launch import run_local

from . import fail_worker

WORKER = str(Path(fail_worker.__file__))
TIMEOUT = 4.0  # the process group's timeout, seconds
# A bound on one rank's whole life: interpreter start and torch import on a busy machine, plus the
# timeout. Generous, because the point is "ends by itself" as opposed to "killed at the deadline".
DEADLINE = 90.0


@pytest.fixture
def launch(worker_env):
    """``launch(scenario, nproc=2, world_size=None)``: run ``fail_worker`` on local ranks."""

    def run(scenario: str, nproc: int = 2, world_size: int | None = None):
        return run_local(
            [WORKER, scenario, str(TIMEOUT)],
            nproc,
            deadline=DEADLINE,
            env=worker_env,
            world_size=world_size,
        )

    return run


@pytest.mark.slow  # the context-parallel tests run the same path
def test_no_failure_runs_through(launch):
    for r in launch("ok"):
        assert r.returncode == 0 and "DONE" in r.output, r.output[-2000:]


@pytest.mark.parametrize(
    "scenario, message",
    [
        ("mismatch", "must agree across ranks"),
        ("state_values", "These differ: initial_state values (a checksum"),
        ("l2norm", "These differ: options (a checksum of scale and normalize / use_qk_l2norm)"),
        pytest.param("scale", "These differ: options", marks=pytest.mark.slow),
        pytest.param("bad_input", "rank 1: ValueError: beta", marks=pytest.mark.slow),
    ],
)
def test_invalid_slices_raise_the_same_error_on_every_rank(launch, scenario, message):
    for r in launch(scenario):
        assert r.returncode == 1, f"rank {r.rank}: {r.returncode}\n{r.output[-2000:]}"
        assert "ValueError" in r.output and message in r.output, r.output[-2000:]
        assert "DONE" not in r.output


def test_rank_that_raises_ends_every_rank_with_an_error(launch):
    results = launch("raise")
    for r in results:
        assert r.returncode is not None and r.returncode != 0, f"rank {r.rank} hung or passed"
        assert "DONE" not in r.output
    assert "this rank failed before the collective" in results[1].output
    assert "PeerFailureError" in results[0].output, results[0].output[-2000:]


@pytest.mark.slow
def test_peer_that_never_arrives_times_out(launch):
    survivor, silent = launch("absent")
    assert survivor.returncode not in (None, 0), survivor.output[-2000:]
    assert "PeerFailureError" in survivor.output, survivor.output[-2000:]
    # The silent rank sleeps 4 timeouts after the point where it should have joined: the survivor
    # gave up after about one timeout, well before the silent rank ended.
    assert survivor.seconds < silent.seconds - TIMEOUT, (survivor.seconds, silent.seconds)


@pytest.mark.slow
def test_missing_rank_at_rendezvous_times_out(launch):
    (result,) = launch("ok", nproc=1, world_size=2)
    assert result.returncode not in (None, 0), result.output[-2000:]
    assert "PeerFailureError" in result.output and "rendezvous" in result.output
    assert "DONE" not in result.output
