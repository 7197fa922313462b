"""The compute-dtype rule: float64 stays float64; every other dtype computes in float32.

States, cumulative gates and feature maps accumulate in the compute dtype of their input; outputs
come back in the input dtype. The ops, layers, feature maps, context parallelism and the
compatibility wrappers all take the dtype from ``compute_dtype``, so the rule is written once
(docs/design.md, "Layout and dtypes").
"""

from __future__ import annotations

import torch

# Computed in float32; the fused CPU chunk kernels read and write them in place, chunk by chunk.
LOW_DTYPES = (torch.bfloat16, torch.float16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, bfloat16 and float16 are computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
