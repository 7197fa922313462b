# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Attention as matrix algebra, with linattn
#
# The spec's story, told with the library's own functions. This file is the source of truth: a
# jupytext script in percent format. Open it as a notebook with `jupytext --to notebook
# notebooks/attention_as_matrix_algebra.py`, or run it as a plain script with
# `python notebooks/attention_as_matrix_algebra.py`; the test suite runs it as a script
# (tests/test_notebook.py), so it never drifts from the code. It prints the spec's checks, each
# with its largest error, and stops at the first one that fails.
#
# Every function used here is the float64 reference, `linattn.reference`: one short NumPy
# function per definition of the spec.

# %%
import numpy as np

from linattn import reference as ref
from linattn.experiments.costs import compute_costs
from linattn.experiments.table1 import compute_table1, table1_markdown
from linattn.experiments.verify import compare


def check(name, got, want, tolerance=1e-12):
    """Print the largest difference between two arrays; fail above the tolerance."""
    result = compare(name, got, want, tolerance)
    print(result.line())
    assert result.passed, name


# %% [markdown]
# ## 1-2. Softmax attention is two matrix products around a row-wise softmax
#
# $O = \operatorname{softmax}(QK^\top/\sqrt{d})\,V$: the scores $G$ and the weights $P$ are
# $n \times n$, so one head costs $4n^2d$ operations. Under the causal mask, $P$ is lower
# triangular and each row is still a probability vector.

# %%
rng = np.random.default_rng(20261019)
Q, K, V = (rng.standard_normal((64, 8)) for _ in range(3))
_, P = ref.softmax_attention(Q, K, V, causal=True)
check("causal softmax: each row sums to one", P.sum(axis=1), 1)
check("causal softmax: no weight above the diagonal", np.triu(P, 1), 0)

# %% [markdown]
# ## 4. Linear attention: change the kernel, then reorder the product
#
# With a finite feature map $\phi$, $(\phi(Q)\phi(K)^\top)V = \phi(Q)(\phi(K)^\top V)$: the left
# order builds an $n \times n$ matrix, the right order an $r \times d$ one.

# %%
left, _ = ref.linear_attention_quadratic(Q, K, V)
check("(phi(Q) phi(K)^T) V equals phi(Q) (phi(K)^T V)", left, ref.linear_attention(Q, K, V))

# %% [markdown]
# ## 5. Under a causal mask, linear attention is a recurrent network
#
# $S_t = S_{t-1} + \phi(k_t)v_t^\top$, $z_t = z_{t-1} + \phi(k_t)$. In training, chunks of $C$
# tokens join the recurrence ($C = 1$) and the masked product ($C = n$).

# %%
masked, _ = ref.linear_attention_quadratic(Q, K, V, causal=True)
check("the recurrence equals the masked product", ref.causal_linear_attention(Q, K, V), masked)
for C in (1, 7, 16, 64):
    check(
        f"chunks of C = {C} equal the masked product",
        ref.chunked_linear_attention(Q, K, V, C),
        masked,
    )

costs = compute_costs()
memory = costs["memory_numbers"]
print(
    f"after t = 131,072 tokens, d = r = 128: KV cache {memory['softmax']:,} numbers, "
    f"state {memory['linear']:,}, {costs['cache_to_linear_state']:,.0f} times fewer; "
    f"break-even after {costs['break_even_tokens']} tokens"
)

# %% [markdown]
# ## 6. What the fixed memory costs
#
# The unmasked linear attention matrix has rank at most $r$; the softmax matrix of the same
# queries and keys has full rank, and sharper rows (Figure 4). A third key that overlaps the first
# two adds crosstalk to every read (Figure 5).

# %%
P4, A4 = ref.attention_maps(np.random.default_rng(1))
for name, M in (("softmax", P4), ("linear", A4)):
    print(
        f"{name:>8}: rank {ref.matrix_rank(M):2d}, "
        f"mean of the largest weight in a row {ref.mean_peak_weight(M):.2f}"
    )
assert ref.matrix_rank(P4) == 16 and ref.matrix_rank(A4) == 4

f5 = ref.figure5_example()
check("Figure 5: two orthogonal keys read exactly", f5["keys"][:2] @ f5["S2"], f5["values"][:2])
check("Figure 5: the crosstalk after the third write", f5["crosstalk"], [[2, 0], [2, 0], [1, 1.5]])

# %% [markdown]
# ## 7. The delta rule: write only the difference
#
# $u_t = \beta_t(v_t - S_{t-1}^\top k_t)$, $S_t = S_{t-1} + k_t u_t^\top$, that is
# $S_t = (I - \beta_t k_t k_t^\top)S_{t-1} + \beta_t k_t v_t^\top$. A new value under an old key
# replaces the old one (Figure 6). The transition has eigenvalues $1 - \beta_t$ and 1, and
# spectral norm 1 for $\beta_t \in [0, 2]$ (Figure 7).

# %%
f6 = ref.figure6_example()
check("Figure 6: additive S_3", f6["additive_S3"], [[3, 5], [-1, 2]])
check("Figure 6: delta-rule S_3", f6["delta_S3"], [[0, 4], [-1, 2]])
check("Figure 6: the pseudo-value u_3", f6["u3"], [-3, 3])

k = np.random.default_rng(7).standard_normal(8)
k /= np.linalg.norm(k)
for beta in (0.0, 0.5, 1.0, 2.0):
    low, high, norm = ref.householder_spectrum(k, beta)
    check(
        f"beta = {beta}: eigenvalues 1 - beta and 1, spectral norm 1",
        [low, high, norm],
        [1 - beta, 1, 1],
    )

# %% [markdown]
# ## 7.3 What the delta rule fixes, and what it does not
#
# Table 1: the read error of $n$ random unit pairs in $\mathbb{R}^{32}$, for the additive rule,
# the delta rule and the least-squares memory, with the two theory columns.

# %%
rows = compute_table1()
print(table1_markdown(rows))
for row in rows:
    assert row["delta_all"] < row["additive"]  # the delta rule is better at every size

# %% [markdown]
# ## 8. Training the delta rule in chunks
#
# Inside a chunk, one unit lower-triangular solve $(I + L)U = \operatorname{diag}(\beta)(V - KS)$
# gives the pseudo-values; the rest is chunked linear attention with $U$ in place of $V$
# (Figure 8). The product of the chunk's transitions is $I - K^\top T K$ (the WY form).

# %%
rng3 = np.random.default_rng(3)
Qd = rng3.standard_normal((64, 8))
Kd = rng3.standard_normal((64, 8))
Qd /= np.linalg.norm(Qd, axis=1, keepdims=True)
Kd /= np.linalg.norm(Kd, axis=1, keepdims=True)
Vd = rng3.standard_normal((64, 8))
beta = 1 / (1 + np.exp(-rng3.standard_normal(64)))
recurrent, _ = ref.delta_rule(Qd, Kd, Vd, beta)
for C in (1, 5, 16, 64):
    check(
        f"delta rule: chunks of C = {C} equal the recurrence",
        ref.chunked_delta_rule(Qd, Kd, Vd, beta, C)[0],
        recurrent,
    )
check(
    "WY form: the product of 6 transitions is I - K^T T K",
    ref.transition_product(Kd[:6], beta[:6]),
    ref.wy_transition(Kd[:6], beta[:6]),
)

# %% [markdown]
# ## Figures
#
# `linattn report --out report` draws the nine figures, with everything above, into one page.
# In a notebook, one figure can be drawn and shown directly:
#
# ```python
# from linattn.figures import SPEC_FIGURES
# png, svg = SPEC_FIGURES[3].draw("figures")  # Figure 4, the attention maps
# from IPython.display import Image; Image(png)
# ```

# %%
print("every check of this notebook passed")
