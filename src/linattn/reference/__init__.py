"""The float64 reference: one short, literal NumPy/SciPy function per definition of the spec.

The oracle every fast form is tested against. Each function's docstring gives its formula, the
shapes and the spec section; each checks its inputs and raises ``ValueError``/``TypeError`` naming
the argument before any work.
"""

from linattn.reference.costs import (
    attention_matrix_bytes,
    break_even_tokens,
    crossover_tokens,
    delta_state_numbers,
    delta_step_ops,
    delta_training_ops,
    kv_cache_numbers,
    linear_fraction,
    linear_state_numbers,
    linear_step_ops,
    linear_training_ops,
    softmax_step_ops,
    softmax_training_ops,
)
from linattn.reference.delta import (
    chunked_delta_rule,
    delta_rule,
    householder_spectrum,
    pseudo_values,
    transition_product,
    ut_transform,
    wy_transition,
)
from linattn.reference.dplr import recurrence as dplr_recurrence
from linattn.reference.dplr import transition as dplr_transition
from linattn.reference.features import (
    elu_plus_one,
    positive_random_features,
    prf_relative_standard_error,
)
from linattn.reference.linear import (
    causal_linear_attention,
    chunked_linear_attention,
    linear_attention,
    linear_attention_quadratic,
)
from linattn.reference.maps import attention_maps, matrix_rank, mean_peak_weight
from linattn.reference.memory import (
    figure5_example,
    figure6_example,
    kaczmarz_sweeps,
    least_squares_memory,
    recall_errors,
    recall_theory,
)
from linattn.reference.softmax import softmax_attention, softmax_d1_example

__all__ = [
    # 2
    "softmax_attention",
    # 4
    "elu_plus_one",
    "positive_random_features",
    "prf_relative_standard_error",
    "linear_attention_quadratic",
    "linear_attention",
    # 5, 5.1
    "causal_linear_attention",
    "chunked_linear_attention",
    # 6.1, 6.2
    "attention_maps",
    "softmax_d1_example",
    "matrix_rank",
    "mean_peak_weight",
    # 6.3, 7
    "figure5_example",
    "figure6_example",
    # 7, 7.2, 8
    "delta_rule",
    "pseudo_values",
    "ut_transform",
    "chunked_delta_rule",
    "transition_product",
    "wy_transition",
    "householder_spectrum",
    # 10: the generalized delta rule
    "dplr_recurrence",
    "dplr_transition",
    # 7.3
    "least_squares_memory",
    "kaczmarz_sweeps",
    "recall_errors",
    "recall_theory",
    # 9
    "softmax_training_ops",
    "linear_training_ops",
    "delta_training_ops",
    "softmax_step_ops",
    "linear_step_ops",
    "delta_step_ops",
    "kv_cache_numbers",
    "linear_state_numbers",
    "delta_state_numbers",
    "break_even_tokens",
    "crossover_tokens",
    "linear_fraction",
    "attention_matrix_bytes",
]
