"""Child process of `linattn bench`: peak extra memory of each job (see ``_timing``).

Reads a JSON list of jobs ``{mechanism, B, T, H, K, V, mode, chunk_size, backward}`` on stdin,
prints one JSON list of the peak extra bytes (one per job, in order) as its last line.
"""

from __future__ import annotations

import json
import sys

import torch

from linattn.experiments import _bench_cases as cases
from linattn.experiments._timing import peak_extra_bytes


def measure(job: dict) -> int:
    """Peak extra resident bytes of one forward (or forward + backward) call."""
    mech = cases.by_name(job["mechanism"])
    shape = (job["B"], job["T"], job["H"], job["K"], job["V"])
    inputs = cases.make_inputs(mech, *shape)
    if job["backward"]:
        for x in inputs.values():
            x.requires_grad_(True)
        d_o = torch.randn(job["B"], job["T"], job["H"], job["V"])

        def fn():
            cases.call(mech, inputs, job["mode"], job["chunk_size"]).backward(d_o)
            return [x.grad for x in inputs.values()]  # gradients stay alive until the peak is read

    else:

        def fn():
            with torch.no_grad():
                return cases.call(mech, inputs, job["mode"], job["chunk_size"])

    # One untimed call first: one-time allocations (thread pools, libraries) are not counted.
    fn()
    for x in inputs.values():
        x.grad = None
    return peak_extra_bytes(fn)


def main() -> None:
    torch.set_num_threads(1)  # memory does not depend on it; the child should not crowd the timer
    jobs = json.loads(sys.stdin.read())
    print(json.dumps([measure(job) for job in jobs]))


if __name__ == "__main__":
    main()
