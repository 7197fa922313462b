"""One rank of the failure checks; run by tests/distributed/test_failures.py.

``python fail_worker.py SCENARIO TIMEOUT``: every rank calls ``linattn.distributed.delta_rule`` on a
tiny slice, except that one rank misbehaves according to SCENARIO:

- ``mismatch``: the last rank's slice has another number of heads;
- ``state_values``: the last rank's initial state holds other values (same shape);
- ``l2norm``: the last rank passes use_qk_l2norm=True, the others False;
- ``scale``: the last rank passes scale=0.25, the others the default (0.5);
- ``bad_input``: the last rank's beta is out of range;
- ``raise``: the last rank raises before the collective and exits;
- ``absent``: the last rank raises before the collective and then stays alive without calling it;
- ``ok``: nobody misbehaves.

Each rank prints ``rank R: DONE`` or lets its exception end the process (exit status 1).
"""

from __future__ import annotations

import sys
import time

import torch


def main(scenario: str, timeout: float) -> None:
    import linattn.distributed as ld

    ld.init_process_group("gloo", timeout=timeout)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    last = rank == world - 1
    H = 3 if scenario == "mismatch" and last else 2
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 5, H, 4, generator=gen) for _ in range(3))
    beta = torch.rand(1, 5, H, generator=gen)
    if scenario == "bad_input" and last:
        beta = beta + 3.0
    if scenario in ("raise", "absent") and last:
        try:
            raise RuntimeError("this rank failed before the collective")
        finally:
            if scenario == "absent":
                time.sleep(4 * timeout)  # alive, but never arrives
    S0 = torch.ones(1, H, 4, 4) * (2.0 if scenario == "state_values" and last else 1.0)
    options = {
        "use_qk_l2norm": scenario == "l2norm" and last,
        "scale": 0.25 if scenario == "scale" and last else None,  # default: 1 / sqrt(4)
    }
    ld.delta_rule(q, k, v, beta, chunk_size=2, initial_state=S0, **options)
    print(f"rank {rank}: DONE", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1], float(sys.argv[2]))
    finally:
        # As any torch.distributed program should: tear the group down, also after an error, so
        # that the process ends with Python's exit status rather than an abort in gloo's threads.
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
