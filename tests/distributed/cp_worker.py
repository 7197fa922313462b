"""One rank of the context-parallel checks; run by tests/distributed/test_context_parallel.py.

``python cp_worker.py OUT_DIR SLICE_LENGTHS`` (with torchrun's environment variables): for every
case of ``CASES`` the rank takes its slice of a shared random sequence, runs the context-parallel
op, back-propagates its part of the loss, and saves outputs, states and gradients to
``OUT_DIR/rank{r}.pt``. The test computes the same loss in one process and compares.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

# (name, function, rule, gate, normalize)
CASES = [
    ("linear", "linear_attention", "additive", None, False),
    ("linear_normalize", "linear_attention", "additive", None, True),
    ("scalar_decay", "linear_attention", "additive", "scalar", False),
    ("gla", "linear_attention", "additive", "channel", False),
    ("delta", "delta_rule", "delta", None, False),
    ("gated_deltanet", "delta_rule", "delta", "scalar", False),
    ("kda", "delta_rule", "delta", "channel", False),
    ("iplr", "generalized_delta_rule", "dplr", None, False),
    ("dplr_head", "generalized_delta_rule", "dplr", "scalar", False),
    ("dplr", "generalized_delta_rule", "dplr", "channel", False),
    # A rule written outside the package (examples/implicit_delta_rule.py), through the generic
    # ``rule_attention``: context parallelism needs nothing of a rule but its registration.
    ("implicit_delta", "rule_attention", "implicit_delta", "channel", False),
]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "implicit_delta_rule.py"


def register_example():
    """Register the example's rule (idempotent); returns its module."""
    spec = importlib.util.spec_from_file_location("example_implicit_delta_rule", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.register()
    return module


DTYPES = (torch.float64, torch.float32)
B, H, K, V = 2, 2, 4, 3
CHUNK = 4


def make_case(name: str, T: int, dtype: torch.dtype, seed: int = 0) -> dict:
    """Inputs of one case over the whole sequence (float64 drawn, then cast), plus loss weights."""
    _, _, rule, gate, normalize = next(c for c in CASES if c[0] == name)
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    k = k / k.norm(dim=-1, keepdim=True)
    if normalize:  # positive features, so the normaliser stays away from zero
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    x = {"q": q, "k": k, "v": v, "beta": None, "g": None}
    if rule == "delta":
        x["beta"] = 2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    if rule == "implicit_delta":  # any strength >= 0
        x["beta"] = 3 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    if rule == "dplr":  # near the delta rule's a = -beta k, b = k, not on it
        beta = torch.rand(B, T, H, 1, generator=gen, dtype=torch.float64)
        x["a"] = -beta * k + 0.05 * randn(B, T, H, K)
        x["b"] = k + 0.05 * randn(B, T, H, K)
    if gate == "scalar":
        x["g"] = torch.nn.functional.logsigmoid(randn(B, T, H) + 2.0)
    elif gate == "channel":
        x["g"] = torch.nn.functional.logsigmoid(randn(B, T, H, K) + 2.0)
    Vs = V + int(normalize)
    x["S0"] = randn(B, H, K, Vs) if not normalize else randn(B, H, K, Vs).abs()
    weights = {"o": randn(B, T, H, V), "S": randn(B, H, K, Vs)}
    cast = {n: (None if t is None else t.to(dtype)) for n, t in x.items()}
    return {"inputs": cast, "weights": {n: t.to(dtype) for n, t in weights.items()}}


def call(name: str, fn, x: dict, initial_state, **kwargs):
    """Run ``fn`` (an op or its context-parallel version) on the case's inputs."""
    _, fn_name, rule, _, normalize = next(c for c in CASES if c[0] == name)
    if fn_name == "rule_attention":
        return fn(
            rule, x["q"], x["k"], x["v"], x["g"], beta=x["beta"], chunk_size=CHUNK,
            initial_state=initial_state, output_final_state=True, **kwargs,
        )  # fmt: skip
    if rule == "dplr":
        return fn(
            x["q"],
            x["k"],
            x["v"],
            x["a"],
            x["b"],
            x["g"],
            chunk_size=CHUNK,
            initial_state=initial_state,
            output_final_state=True,
            **kwargs,
        )
    if rule == "delta":
        return fn(
            x["q"],
            x["k"],
            x["v"],
            x["beta"],
            x["g"],
            chunk_size=CHUNK,
            initial_state=initial_state,
            output_final_state=True,
            **kwargs,
        )
    return fn(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        normalize=normalize,
        chunk_size=CHUNK,
        initial_state=initial_state,
        output_final_state=True,
        **kwargs,
    )


def leaves(x: dict) -> dict:
    """Detached copies of the inputs that require grad (None stays None)."""
    return {n: (None if t is None else t.detach().clone().requires_grad_()) for n, t in x.items()}


BYTES_LENGTHS = (16, 1024)
# Inference (no autograd) in the other local forms, and the delta rule's qk normalisation:
# (name, keyword arguments), float64.
EXTRAS = [
    ("kda", {"mode": "recurrent"}),
    ("linear_normalize", {"mode": "parallel"}),
    ("gated_deltanet", {"mode": "parallel"}),
    ("delta", {"use_qk_l2norm": True}),
    ("dplr", {"mode": "recurrent"}),
]


def extras(start: int, stop: int, T: int) -> dict:
    """Outputs and state after this rank's slice for each of ``EXTRAS``, under no_grad."""
    import linattn.distributed as ld

    out = {}
    for i, (name, kwargs) in enumerate(EXTRAS):
        fn = getattr(ld, next(c[1] for c in CASES if c[0] == name))
        full = make_case(name, T, torch.float64)["inputs"]
        part = {n: (t if n == "S0" or t is None else t[:, start:stop]) for n, t in full.items()}
        with torch.no_grad():
            out[i] = call(name, fn, part, part["S0"], **kwargs)
    return out


def count_bytes(rank: int) -> dict:
    """Bytes this rank contributes, by collective, for each case at two slice lengths (float32)."""
    import linattn.distributed as ld

    counts = {}
    for name, fn_name, *_ in CASES:
        for T in BYTES_LENGTHS:
            case = make_case(name, T, torch.float32, seed=rank)
            # S_0 is replicated: the same on every rank (the call refuses different values)
            case["inputs"]["S0"] = make_case(name, T, torch.float32)["inputs"]["S0"]
            x = leaves(case["inputs"])
            with ld.count_bytes() as counter:
                o, _ = call(name, getattr(ld, fn_name), x, x["S0"])
                (o * case["weights"]["o"]).sum().backward()
            counts[(name, T)] = dict(counter.by_op)
    return counts


def main(out_dir: str, lengths: list[int]) -> None:
    import linattn.distributed as ld

    register_example()
    ld.init_process_group("gloo", timeout=60)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    assert world == len(lengths), (world, lengths)
    start, stop = sum(lengths[:rank]), sum(lengths[: rank + 1])
    results = {}
    for name, fn_name, *_ in CASES:
        fn = getattr(ld, fn_name)
        for dtype in DTYPES:
            case = make_case(name, sum(lengths), dtype)
            full = case["inputs"]
            part = {n: (t if n == "S0" or t is None else t[:, start:stop]) for n, t in full.items()}
            x = leaves(part)
            o, S = call(name, fn, x, x["S0"])
            loss = (o * case["weights"]["o"][:, start:stop]).sum()
            if rank == world - 1:
                loss = loss + (S * case["weights"]["S"]).sum()
            loss.backward()
            grads = {n: (None if t is None else t.grad) for n, t in x.items()}
            results[(name, str(dtype))] = {"o": o.detach(), "S": S.detach(), "grads": grads}
    results["bytes"] = count_bytes(rank)
    results["extras"] = extras(start, stop, sum(lengths))
    torch.save(results, f"{out_dir}/rank{rank}.pt")


if __name__ == "__main__":
    try:
        main(sys.argv[1], [int(n) for n in sys.argv[2].split(",")])
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
