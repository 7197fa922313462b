"""Context parallelism's slice maps for the generalized delta rule: composed, the maps
of consecutive slices move any state as the op does, and a slice run from the state the maps
hand it gives the op's outputs there."""

from __future__ import annotations

import pytest
import torch

from linattn import ops
from linattn.distributed import maps
from linattn.ops.mechanism import Mechanism

from ..ops.test_generalized_delta_rule import GATES, close, dplr_inputs


@pytest.mark.parametrize("gate", GATES)
def test_slice_maps_compose_to_the_op(gate):
    x = dplr_inputs(B=2, T=60, gate=gate, state=True)
    x["g"] = None if gate is None else 0.1 * x["g"]  # the state stays of order 1 over 60 tokens
    mech = Mechanism.of(None, x["g"], "dplr")
    S, bounds = x["S0"], [0, 17, 40, 60]
    outputs = []
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        part = {n: (None if t is None or n == "S0" else t[:, s:e]) for n, t in x.items()}
        ab = torch.cat([part["a"], part["b"]], dim=-1)
        M, N = maps.slice_map(part["k"], part["v"], ab, part["g"], mech, chunk_size=8)
        o, _ = ops.generalized_delta_rule(
            part["q"], part["k"], part["v"], part["a"], part["b"], part["g"], initial_state=S
        )
        outputs.append(o)
        S = maps.apply(M, N, S)
    o_ref, S_ref = ops.generalized_delta_rule(
        x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], initial_state=x["S0"],
        output_final_state=True,
    )  # fmt: skip
    close(torch.cat(outputs, dim=1), o_ref)
    close(S, S_ref)
