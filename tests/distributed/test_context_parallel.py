"""Context-parallel ops on 2 and 4 gloo processes over loopback equal the single-process op.

Every case of ``cp_worker.CASES`` (linear attention with and without decay and normaliser, the
delta rule, Gated DeltaNet, KDA, the generalized delta rule with each gate, and a rule written
outside the package through ``rule_attention``), in float64 and
float32, with slices of unequal length: outputs,
the state after every slice, and the gradients of every input (and of the replicated initial
state, summed over ranks) against one process running the whole sequence.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from linattn import ops
from linattn.experiments.launch import run_local
from linattn.ops import rules

from . import cp_worker
from .cp_worker import CASES, DTYPES, call, leaves, make_case

WORKER = Path(cp_worker.__file__)


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def rel_max(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).abs().max() / ref.abs().max())


def close(x: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> tuple[bool, float]:
    """float64: max error relative to the largest entry <= 1e-10; float32: relative RMS < 1e-5."""
    if dtype == torch.float64:
        err = rel_max(x, ref)
        return err <= 1e-10, err
    err = rel_rms(x, ref)
    return err < 1e-5, err


def reference(name: str, dtype: torch.dtype, T: int):
    """One process, the whole sequence, the same loss as the sum of the ranks' losses."""
    case = make_case(name, T, dtype)
    x = leaves(case["inputs"])
    fn = getattr(ops, next(c[1] for c in CASES if c[0] == name))
    o, S = call(name, fn, x, x["S0"])
    loss = (o * case["weights"]["o"]).sum() + (S * case["weights"]["S"]).sum()
    loss.backward()
    return case, o.detach(), S.detach(), {n: (None if t is None else t.grad) for n, t in x.items()}


def prefix_state(name: str, case: dict, stop: int) -> torch.Tensor:
    """The single-process state after the first ``stop`` tokens."""
    part = {n: (t if n == "S0" or t is None else t[:, :stop]) for n, t in case["inputs"].items()}
    fn = getattr(ops, next(c[1] for c in CASES if c[0] == name))
    return call(name, fn, part, part["S0"])[1]


def run_and_compare(lengths: list[int], tmp_path: Path, env: dict[str, str]) -> None:
    results = run_local(
        [str(WORKER), str(tmp_path), ",".join(map(str, lengths))],
        len(lengths),
        deadline=240,
        env=env,
    )
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} failed ({r.returncode}):\n{r.output[-3000:]}"
    ranks = [torch.load(tmp_path / f"rank{p}.pt", weights_only=False) for p in range(len(lengths))]
    T = sum(lengths)
    stops = [sum(lengths[: p + 1]) for p in range(len(lengths))]
    failures = []
    for name, *_ in CASES:
        for dtype in DTYPES:
            key = (name, str(dtype))
            case, o, S, grads = reference(name, dtype, T)
            got = [rank[key] for rank in ranks]
            checks = [("o", torch.cat([g["o"] for g in got], dim=1), o)]
            checks += [
                (f"state after slice {p}", got[p]["S"], prefix_state(name, case, stops[p]))
                for p in range(len(lengths) - 1)
            ]
            checks.append(("final state", got[-1]["S"], S))
            for n, ref in grads.items():
                if ref is None:
                    continue
                if n == "S0":  # replicated: every rank holds the total over ranks
                    checks += [
                        (f"grad S0 on rank {p}", g["grads"]["S0"], ref) for p, g in enumerate(got)
                    ]
                else:
                    checks.append((f"grad {n}", torch.cat([g["grads"][n] for g in got], 1), ref))
            for what, x, ref in checks:
                ok, err = close(x, ref, dtype)
                if not ok:
                    failures.append(f"{name} {dtype} {what}: error {err:.3g}")
    failures += check_extras([rank["extras"] for rank in ranks], lengths)
    assert not failures, "\n".join(failures)
    check_bytes([rank["bytes"] for rank in ranks])


def check_extras(per_rank: list[dict], lengths: list[int]) -> list[str]:
    """Inference in the recurrent and parallel forms, and with qk normalisation (float64)."""
    failures = []
    T = sum(lengths)
    for i, (name, kwargs) in enumerate(cp_worker.EXTRAS):
        x = make_case(name, T, torch.float64)["inputs"]
        fn = getattr(ops, next(c[1] for c in CASES if c[0] == name))
        o, S = call(name, fn, x, x["S0"], **kwargs)
        got_o = torch.cat([rank[i][0] for rank in per_rank], dim=1)
        for what, got, ref in (("o", got_o, o), ("final state", per_rank[-1][i][1], S)):
            ok, err = close(got, ref, torch.float64)
            if not ok:
                failures.append(f"{name} {kwargs} {what}: error {err:.3g}")
    return failures


def expected_bytes(name: str, world: int) -> dict[str, int]:
    """What each rank should contribute (float32): the shape descriptor, its map, the gradients."""
    _, _, rule, gate, normalize = next(c for c in CASES if c[0] == name)
    Vs = cp_worker.V + int(normalize)
    N = cp_worker.B * cp_worker.H * cp_worker.K * Vs
    per_head = {"scalar": 1, "channel": cp_worker.K, None: 0}[gate]
    M = (
        cp_worker.B
        * cp_worker.H
        * (cp_worker.K * cp_worker.K if rules.named(rule).READS_STATE else per_head)
    )
    L = M + N
    return {"descriptor": 12 * 8, "maps": 4 * L, "map_grads": 4 * (world * L + N)}


def check_bytes(per_rank: list[dict]) -> None:
    """The same bytes on every rank, at both slice lengths, and exactly the maps' size."""
    for name, *_ in CASES:
        want = expected_bytes(name, len(per_rank))
        for p, counts in enumerate(per_rank):
            for T in cp_worker.BYTES_LENGTHS:
                assert counts[(name, T)] == want, (name, p, T, counts[(name, T)], want)


def test_two_ranks_unequal_slices(tmp_path, worker_env, implicit_delta):
    run_and_compare([9, 14], tmp_path, worker_env)


@pytest.mark.slow
def test_four_ranks_unequal_slices(tmp_path, worker_env, implicit_delta):
    run_and_compare([5, 1, 9, 8], tmp_path, worker_env)


def test_checksum_tells_values_apart_and_ignores_the_sign_of_zero():
    from linattn.distributed.context_parallel import checksum

    S = torch.randn(2, 2, 4, 3, generator=torch.Generator().manual_seed(0))
    assert (
        checksum(S)
        == checksum(S.clone())
        == checksum(S.transpose(0, 3).contiguous().transpose(0, 3))
    )
    other = S.clone()
    other.view(-1)[5] = torch.nextafter(other.view(-1)[5], torch.tensor(9.0))  # one ulp
    assert checksum(other) != checksum(S)
    assert checksum(S.double()) != checksum(S)  # the dtype counts
    assert checksum(torch.zeros(3)) == checksum(-torch.zeros(3))
    assert checksum(0.5, "use_qk_l2norm", True) != checksum(0.5, "use_qk_l2norm", False)
