"""linattn beyond one process: context parallelism on torch.distributed (library code only).

- ``linear_attention``, ``delta_rule``, ``generalized_delta_rule`` and ``rule_attention`` (any
  registered rule, a user's too): context-parallel versions of the ops; each rank of a
  process group holds a contiguous slice of one long sequence and the ranks exchange only the
  slices' affine maps S -> M S + N (spec section 8), whose size does not depend on the slice length.
- ``init_process_group``: torchrun's environment plus a timeout after which a rank waiting for a
  failed or missing peer raises ``PeerFailureError`` instead of hanging.
- ``count_bytes``: the bytes this rank contributes to collectives.

The scripts that use it live with the experiments: ``linattn.experiments.cp_bytes`` (the
``linattn cp-bytes`` command), ``linattn.experiments.mqar.data_parallel`` (data-parallel MQAR
training with ``DistributedDataParallel``) and ``linattn.experiments.launch`` (local ranks).
"""

from linattn.distributed.collectives import (
    ByteCount,
    PeerFailureError,
    count_bytes,
    init_process_group,
)
from linattn.distributed.context_parallel import (
    delta_rule,
    generalized_delta_rule,
    linear_attention,
    rule_attention,
)

__all__ = [
    "ByteCount",
    "PeerFailureError",
    "count_bytes",
    "delta_rule",
    "generalized_delta_rule",
    "init_process_group",
    "linear_attention",
    "rule_attention",
]
