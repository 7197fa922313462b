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
# # Attention as matrix algebra: from softmax to the delta rule, with linattn
#
# The spec's story, section 2 to the roadmap, told with the library: each definition is
# computed by the float64 reference `linattn.reference` (one short NumPy function per
# definition), each claim is checked by a computation, the PyTorch ops `linattn.ops` do the same
# work next to the reference, and the story ends with a layer and a small hybrid model. The nine
# figures are drawn inline.
#
# This file is a jupytext script in percent format. Open it as a notebook with
# `jupytext --to notebook notebooks/attention_as_matrix_algebra.py`, or run it as a script with
# `python notebooks/attention_as_matrix_algebra.py`; the test suite runs it
# (tests/test_notebook.py), so it cannot drift from the code. Every check prints its largest
# error, and the first one that fails stops the run.

# %%
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from linattn import features, ops
from linattn import reference as ref
from linattn.experiments.costs import compute_costs, costs_markdown
from linattn.experiments.table1 import compute_table1, table1_markdown
from linattn.experiments.verify import claim, compare
from linattn.figures import FIGURES as ALL_FIGURES
from linattn.figures import numbers
from linattn.reference import claims
from linattn.reference.gated import recurrence
from linattn.reference.memory import kaczmarz_sweeps, unit

FIGURES = Path(tempfile.mkdtemp(prefix="linattn-notebook-figures-"))


def check(name, got, want, tolerance=1e-12):
    """Print the largest difference between two arrays; fail above the tolerance."""
    result = compare(name, np.asarray(got, dtype=float), np.asarray(want, dtype=float), tolerance)
    print(result.line())
    assert result.passed, name


def holds(name, statement, detail=""):
    """Print a claim that is a statement (a rank, an inequality); fail when it does not hold."""
    result = claim(name, bool(statement), detail)
    print((detail + "\n" if detail else "") + result.line())
    assert result.passed, name


def show(number):
    """Draw Figure ``number`` (the spec's nine, then Figure 10) and show it inline (in a script:
    print its caption)."""
    figure = ALL_FIGURES[number - 1]
    png = next(path for path in figure.draw(FIGURES) if path.suffix == ".png")
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Image(filename=str(png)))
    print(f"{figure.caption} [{png.name}]")


def tensor(*arrays):
    """NumPy (n, d) arrays as the ops' float64 tensors [B = 1, T = n, H = 1, d]."""
    return [torch.from_numpy(np.asarray(a, dtype=float))[None, :, None] for a in arrays]


def array(t):
    """An op's output [1, T, 1, d] back as an (n, d) array."""
    return t[0, :, 0].detach().numpy()


# %% [markdown]
# ## 2. Softmax attention is two matrix products and a softmax
#
# $\operatorname{Attn}(Q, K, V) = \operatorname{softmax}(QK^\top / \sqrt{d})\,V$: the scores
# $G = QK^\top/\sqrt{d}$ ($2n^2d$ operations), the row-stochastic weights $P$, the output
# $O = PV$ ($2n^2d$ more). Under the causal mask, $P$ is lower triangular and each row is still
# a probability vector. The PyTorch op `linattn.ops.softmax_attention` (PyTorch's fused kernel)
# computes the same output.

# %%
rng = np.random.default_rng(20261019)
Q, K, V = (rng.standard_normal((64, 8)) for _ in range(3))
O, P = ref.softmax_attention(Q, K, V, causal=True)
check("causal softmax: each row sums to one", P.sum(axis=1), 1)
check("causal softmax: no weight above the diagonal", np.triu(P, 1), 0)
check("the PyTorch op equals the reference", array(ops.softmax_attention(*tensor(Q, K, V))), O)
show(1)

# %% [markdown]
# **Why divide by $\sqrt{d}$.** With independent entries of mean 0 and variance 1,
# $q^\top k = \sum_m q_m k_m$ has variance $d$. Without the factor the scores spread out as $d$
# grows, the softmax puts almost all weight on one key, and there its Jacobian
# $\operatorname{diag}(p) - pp^\top$ is close to zero (its norm is at most
# $2(1 - \max_j p_j)$).

# %%
rng12 = np.random.default_rng(12)
for d in (16, 256):
    variance, se = claims.score_variance(rng12, d, 50_000)
    check(f"q.k has variance d = {d} (four standard errors)", variance / d, 1, 4 * se / d)
for d in (4, 64, 1024):
    Qs, Ks = rng12.standard_normal((64, d)), rng12.standard_normal((64, d))
    plain = claims.softmax_rows(Qs @ Ks.T)
    scaled = claims.softmax_rows(Qs @ Ks.T / np.sqrt(d))
    norms = [claims.softmax_jacobian_norm(p) for p in plain]
    print(
        f"d = {d:4d}: mean largest weight {ref.mean_peak_weight(plain):.2f} without the factor, "
        f"{ref.mean_peak_weight(scaled):.2f} with it; softmax Jacobian norm {np.mean(norms):.3f}"
    )
holds("a row on one key has a near-zero gradient", all(
    claims.softmax_jacobian_norm(p) <= 2 * (1 - p.max()) + 1e-15 for p in plain
))  # fmt: skip

# %% [markdown]
# **Generation and the KV cache.** Step $t$ reads every earlier key and value: $2td$ numbers per
# head, about $4td$ operations, more at every step.

# %%
costs = compute_costs()
memory = costs["memory_numbers"]
print(f"KV cache after t = 131,072 tokens, d = 128: {memory['softmax']:,} numbers per head")
print(f"P at n = 32,768 in 2-byte numbers: {ref.attention_matrix_bytes(32_768) / 2**30:g} GiB")

# %% [markdown]
# ## 3. Attention is a kernel smoother
#
# $o_i = \sum_j \kappa(q_i, k_j) v_j / \sum_j \kappa(q_i, k_j)$ with
# $\kappa(q, k) = e^{q^\top k/\sqrt{d}}$: the Nadaraya-Watson estimator at $q_i$ from the pairs
# $(k_j, v_j)$. The exponential kernel is an inner product of infinitely many features
# $q^{\otimes m}/\sqrt{m!}$; truncating the Taylor series after $M$ terms leaves an error that
# falls with $M$ but never reaches zero for finitely many features.

# %%
kernel = np.tril(np.exp(Q @ K.T / np.sqrt(8)))  # the causal kernel weights
check("softmax attention is the Nadaraya-Watson estimator", kernel @ V / kernel.sum(1)[:, None], O)
s = Q[0] @ K[1] / np.sqrt(8)
for M in (1, 2, 4, 8):
    taylor = sum(s**m / np.prod(np.arange(1, m + 1)) for m in range(M + 1))
    print(f"Taylor series to m = {M}: relative error {abs(taylor / np.exp(s) - 1):.1e}")

# %% [markdown]
# ## 4. Linear attention: change the kernel, then reorder the product
#
# A feature map $\phi$ into $[0, \infty)^r$ gives the kernel $\phi(q)^\top\phi(k)$, and
# associativity moves one pair of parentheses:
# $(\phi(Q)\phi(K)^\top)V = \phi(Q)(\phi(K)^\top V)$. The left order builds an $n \times n$
# matrix, the right order the $r \times d$ matrix $M = \phi(K)^\top V$ (Figure 2).

# %%
left, _ = ref.linear_attention_quadratic(Q, K, V)
check("(phi(Q) phi(K)^T) V equals phi(Q) (phi(K)^T V)", left, ref.linear_attention(Q, K, V))
show(2)

# %% [markdown]
# Positive random features (Choromanski et al., 2021) estimate $e^{q^\top k}$ without bias:
# $E_\omega[\phi(q)^\top\phi(k)] = e^{q^\top k}$, within four standard errors
# $\sqrt{(e^{\lVert q + k\rVert^2} - 1)/r}$ with $r = 10^6$ features.

# %%
q, k = 0.5 * rng.standard_normal(8), 0.5 * rng.standard_normal(8)
W = rng.standard_normal((1_000_000, 8))
estimate = ref.positive_random_features(q[None], W) @ ref.positive_random_features(k[None], W).T
se = ref.prf_relative_standard_error(q, k, len(W))
print(f"relative standard error of the estimate: {se:.4f}")
check("positive random features: estimate / exp(q.k)", estimate / np.exp(q @ k), 1, 4 * se)

# %% [markdown]
# The cost table of section 4, counted product by product ($2abc$ for an $a \times b$ by
# $b \times c$ product): $4n^2d$ and an $n \times n$ intermediate against $4nrd$ and an
# $r \times d$ one. Linear attention needs fewer operations exactly when $n > r$.

# %%
FQ, FK = ref.elu_plus_one(Q), ref.elu_plus_one(K)
print("softmax (operations, largest intermediate):", claims.softmax_order(Q, K, V))
print("linear  (operations, largest intermediate):", claims.linear_right_order(FQ, FK, V))
cheaper = [n for n in range(1, 1025) if 4 * n * 128 * 128 < ref.softmax_training_ops(n, 128)]
holds("r = d = 128: linear attention is cheaper from n = 129 on", cheaper[0] == 129)

# %% [markdown]
# ## 5. Under a causal mask, linear attention is a recurrent network
#
# $S_t = S_{t-1} + \phi(k_t)v_t^\top$, $z_t = z_{t-1} + \phi(k_t)$,
# $o_t = S_t^\top\phi(q_t) / z_t^\top\phi(q_t)$: a state of $rd + r$ numbers at every step.
# The op `linattn.ops.linear_attention` computes it in its three forms (the normaliser $z$ is
# one more column of the state).

# %%
masked, _ = ref.linear_attention_quadratic(Q, K, V, causal=True)
check("the recurrence equals the masked product", ref.causal_linear_attention(Q, K, V), masked)
q_t, k_t, v_t = tensor(Q, K, V)
for mode in ("parallel", "recurrent", "chunk"):
    o_t, _ = ops.linear_attention(
        features.elu_plus_one(q_t), features.elu_plus_one(k_t), v_t, normalize=True, scale=1.0,
        mode=mode, chunk_size=16,
    )  # fmt: skip
    check(f"the PyTorch op, {mode} form, equals the reference", array(o_t), masked)
print(
    f"after t = 131,072 tokens, d = r = 128: KV cache {memory['softmax']:,} numbers, "
    f"state {memory['linear']:,}, {costs['cache_to_linear_state']:,.0f} times fewer; "
    f"break-even after {costs['break_even_tokens']} tokens"
)
show(3)

# %% [markdown]
# ### 5.1 Training: the mask blocks the reordering
#
# $(A \odot L)V \ne \phi(Q)(\phi(K)^\top V)$: row $t$ of the masked product is
# $\phi(q_t)^\top S_t$, with its own state. Chunks of $C$ tokens join the two exact options:
# the masked product inside a chunk, the state across chunks.

# %%
unnormalized = np.tril(FQ @ FK.T) @ V
states = np.cumsum(FK[:, :, None] * V[:, None, :], axis=0)  # S_t, (n, r, d)
check("row t of (A o L) V is phi(q_t)^T S_t", np.einsum("tr,trd->td", FQ, states), unnormalized)
gap = np.abs(unnormalized - FQ @ (FK.T @ V)).max(axis=1)
holds("(A o L) V differs from phi(Q) (phi(K)^T V) before row n", np.all(gap[:-1] > 1e-3))
for C in (1, 7, 16, 64):
    check(
        f"chunks of C = {C} equal the masked product",
        ref.chunked_linear_attention(Q, K, V, C),
        masked,
    )

# %% [markdown]
# ## 6. What the fixed memory costs
#
# ### 6.1 Rank: at most $r$ for linear attention, up to $n$ for softmax attention
#
# With $d = 1$, six distinct queries and six distinct keys, the softmax matrix is nonsingular,
# but badly conditioned. The unmasked linear matrix of Figure 4 has rank $r = 4$, the softmax
# one full rank; by Eckart-Young the best rank-$r$ approximation misses by $\sigma_{r+1}$. The
# causal mask raises the linear matrix's rank back to $n$.

# %%
P1 = ref.softmax_d1_example()
print(
    f"d = 1, n = 6: determinant {np.linalg.det(P1):.2e}, condition number {np.linalg.cond(P1):.2e}"
)
P4, A4 = ref.attention_maps(np.random.default_rng(1))
for name, M in (("softmax", P4), ("linear", A4)):
    print(
        f"{name:>8}: rank {ref.matrix_rank(M):2d}, "
        f"mean of the largest weight in a row {ref.mean_peak_weight(M):.2f}"
    )
sigma = np.linalg.svd(P4, compute_uv=False)
errors = [claims.rank_r_error(P4, r) for r in range(1, 16)]
check("Eckart-Young: the best rank-r error is sigma_(r+1)", errors, sigma[1:])
rng1 = np.random.default_rng(1)
Q4, K4 = 1.5 * rng1.standard_normal((16, 4)), 1.5 * rng1.standard_normal((16, 4))
holds("the causal mask raises the linear rank to n = 16", ref.matrix_rank(
    claims.causal_linear_matrix(Q4, K4)
) == 16)  # fmt: skip
show(4)

# %% [markdown]
# ### 6.2 Sharpness: the keys bound how peaked a linear row can be
#
# $A_{ij}/A_{il} \le \max_m \phi(k_j)_m/\phi(k_l)_m$ whatever the query; a softmax row becomes
# one-hot as the query grows. A uniform row would give $1/16 = 0.0625$.

# %%
bound = claims.sharpness_bound(ref.elu_plus_one(K4))
for scale in (1.0, 10.0, 100.0):
    _, A = ref.linear_attention_quadratic(scale * Q4, K4, np.eye(16))
    _, Ps = ref.softmax_attention(scale * Q4, K4, np.eye(16))
    worst = (claims.weight_ratios(A) / bound[None]).max()
    print(
        f"queries x {scale:5g}: largest A_ij / A_il over its bound {worst:.3f}; mean largest "
        f"weight, linear {ref.mean_peak_weight(A):.2f}, softmax {ref.mean_peak_weight(Ps):.2f}"
    )
    holds(f"queries x {scale:g}: no linear row beats its keys' bound", worst <= 1 + 1e-12)

# %% [markdown]
# ### 6.3 Capacity: few stored values come back free of crosstalk
#
# $k_i^\top S_t = \lVert k_i\rVert^2 v_i^\top + \sum_{j \ne i}(k_i^\top k_j)v_j^\top$: free of
# crosstalk only for mutually orthogonal keys, at most $r$ of them. Strictly positive features
# leave no two keys orthogonal, so with elu + 1 already two pairs interfere.

# %%
f5 = ref.figure5_example()
check("Figure 5: two orthogonal keys read exactly", f5["keys"][:2] @ f5["S2"], f5["values"][:2])
check("Figure 5: the crosstalk after the third write", f5["crosstalk"], [[2, 0], [2, 0], [1, 1.5]])
gram = claims.feature_gram(ref.elu_plus_one(np.eye(8)))
holds("elu + 1 features of orthogonal keys are not orthogonal", gram.min() > 0,
      f"smallest phi(e_i)^T phi(e_j): {gram.min():g}")  # fmt: skip
show(5)

# %% [markdown]
# ## 7. The delta rule: write only the difference
#
# $u_t = \beta_t(v_t - S_{t-1}^\top k_t)$, $S_t = S_{t-1} + k_t u_t^\top$, that is
# $S_t = (I - \beta_t k_t k_t^\top)S_{t-1} + \beta_t k_t v_t^\top$. A new value under an old key
# replaces the old one (Figure 6). The op `linattn.ops.delta_rule` computes it in three forms.

# %%
f6 = ref.figure6_example()
check("Figure 6: additive S_3", f6["additive_S3"], [[3, 5], [-1, 2]])
check("Figure 6: delta-rule S_3", f6["delta_S3"], [[0, 4], [-1, 2]])
check("Figure 6: the pseudo-value u_3", f6["u3"], [-3, 3])
rng3 = np.random.default_rng(3)
Qd, Kd = unit(rng3.standard_normal((64, 8))), unit(rng3.standard_normal((64, 8)))
Vd = rng3.standard_normal((64, 8))
beta = 1 / (1 + np.exp(-rng3.standard_normal(64)))  # write strengths through a sigmoid
recurrent, _ = ref.delta_rule(Qd, Kd, Vd, beta)
q_t, k_t, v_t, b_t = tensor(Qd, Kd, Vd, beta)
for mode in ("parallel", "recurrent", "chunk"):
    o_t, _ = ops.delta_rule(q_t, k_t, v_t, b_t, scale=1.0, mode=mode, chunk_size=16)
    check(f"the PyTorch delta rule, {mode} form, equals the reference", array(o_t), recurrent)
show(6)

# %% [markdown]
# ### 7.1 One step of online regression
#
# The delta rule is one gradient step of size $\beta_t$ on
# $\mathcal{L}_t(S) = \tfrac12\lVert S^\top k_t - v_t\rVert^2$, whose gradient
# $k_t(S^\top k_t - v_t)^\top$ PyTorch's autograd finds too. The additive rule is a gradient step
# on the linear loss $-\langle S^\top k_t, v_t\rangle$, whose gradient $-k_t v_t^\top$ does not
# depend on $S$: it corrects nothing.

# %%
rng7 = np.random.default_rng(7)
S, b = rng7.standard_normal((8, 8)), 0.7
k, v = rng7.standard_normal(8), rng7.standard_normal(8)
k /= np.linalg.norm(k)
_, written = ref.delta_rule(k[None], k[None], v[None], [b], initial_state=S)
gradient = np.outer(k, S.T @ k - v)
S_t = torch.from_numpy(S).requires_grad_()
(0.5 * (S_t.T @ torch.from_numpy(k) - torch.from_numpy(v)).square().sum()).backward()
check("autograd's gradient equals k (S^T k - v)^T", S_t.grad.numpy(), gradient)
check("the delta rule is one gradient step of size beta", written, S - b * gradient)
check("read-correct-write equals the Householder form", written,
      (np.eye(8) - b * np.outer(k, k)) @ S + b * np.outer(k, v))  # fmt: skip
for M in (S, np.outer(k, v)):
    check("the linear loss has gradient -k v^T at any S",
          claims.linear_loss_gradient(M, k, v), -np.outer(k, v))  # fmt: skip

# %% [markdown]
# ### 7.2 The geometry: each write moves the state along the key only
#
# $A_t = I - \beta_t k_t k_t^\top$ has the eigenvalue $1 - \beta_t$ on $k_t$ and 1 on
# $k_t^\perp$: a projection at $\beta_t = 1$, a reflection at 2, spectral norm 1 in between.

# %%
for beta_t in (0.0, 0.5, 1.0, 2.0):
    low, high, norm = ref.householder_spectrum(k, beta_t)
    check(
        f"beta = {beta_t}: eigenvalues 1 - beta and 1, spectral norm 1",
        [low, high, norm],
        [1 - beta_t, 1, 1],
    )
show(7)

# %% [markdown]
# ### 7.3 What the delta rule fixes, and what it does not
#
# Table 1: the read error of $n$ random unit pairs in $\mathbb{R}^{32}$ for the additive rule,
# the delta rule and the least-squares memory, with the two theory columns. Seeing each pair
# once is the delta rule's limit: swept 200 times, 24 pairs are read back (Kaczmarz).

# %%
rows = compute_table1()
print(table1_markdown(rows))
holds("the delta rule beats the additive rule at every n",
      all(row["delta_all"] < row["additive"] for row in rows))  # fmt: skip
rng4 = np.random.default_rng(4)
K24, V24 = unit(rng4.standard_normal((24, 32))), unit(rng4.standard_normal((24, 32)))
check(
    "24 pairs swept 200 times: the reads converge", K24 @ kaczmarz_sweeps(K24, V24, 200), V24, 1e-4
)

# %% [markdown]
# ## 8. Training the delta rule in chunks
#
# Inside a chunk, one unit lower-triangular solve $(I + L)U = \operatorname{diag}(\beta)(V - KS)$
# gives the pseudo-values; the rest is chunked linear attention with $U$ in place of $V$. The
# product of the chunk's transitions is $I - K^\top T K$, the WY form. The PyTorch op's chunk
# form above is this algebra.

# %%
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
show(8)

# %% [markdown]
# ## 9. When each trade pays
#
# The cost model of one head, and section 9's qualitative rows computed: a new value under an
# old key (the softmax cache keeps both, the additive rule adds them, the delta rule keeps the
# new one), and what a read returns.

# %%
print(costs_markdown(costs))
keys, values = np.array([[1.0, 0], [0, 1], [1, 0]]), np.array([[3.0, 1], [-1, 2], [0, 4]])
_, S_delta = ref.delta_rule(keys, keys, values, np.ones(3))
check("softmax keeps both values of a key in its cache",
      claims.softmax_read(keys, values, 60 * keys[0]), (values[0] + values[2]) / 2)  # fmt: skip
check("the additive rule adds old and new", (keys.T @ values).T @ keys[0], values[0] + values[2])
check("the delta rule replaces the old value", S_delta.T @ keys[0], values[2])
K3, V3 = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))  # 3 arbitrary pairs in R^2
residual = K3 @ ref.least_squares_memory(K3, V3) - V3  # the best 2 x 2 memory's read errors
holds("no 2 x 2 memory holds 3 arbitrary pairs exactly", np.abs(residual).max() > 1e-3,
      f"least squares misses by up to {np.abs(residual).max():.2f}")  # fmt: skip

# %% [markdown]
# ## 10. Where this goes next
#
# Decay and gating change the update: Mamba-2 one forget rate per head, Gated DeltaNet the same
# rate on the delta rule, Kimi Delta Attention one rate per channel (Figure 9). The ops take the
# log-rate `g`; each is checked against the literal float64 recurrence. Figure 9's third column,
# the generalized delta rule (IPLR, Comba, DPLR / RWKV-7: `linattn.ops.generalized_delta_rule`),
# replaces the delta rule's correction along the key by any rank-one matrix `a_t b_t^T`.

# %%
g_scalar = F.logsigmoid(torch.from_numpy(rng3.standard_normal(64)) + 2)  # log alpha_t <= 0
g_channel = F.logsigmoid(torch.from_numpy(rng3.standard_normal((64, 8))) + 2)
for name, rule, g in (
    ("Mamba-2 (scalar decay)", "additive", g_scalar),
    ("Gated DeltaNet", "delta", g_scalar),
    ("Kimi Delta Attention", "delta", g_channel),
):
    want, _ = recurrence(Qd, Kd, Vd, beta if rule == "delta" else None, g.numpy(), rule=rule)
    g_t = g[None, :, None]
    if rule == "delta":
        got, _ = ops.delta_rule(q_t, k_t, v_t, b_t, g_t, scale=1.0, chunk_size=16)
    else:
        got, _ = ops.linear_attention(q_t, k_t, v_t, g_t, scale=1.0, chunk_size=16)
    check(f"{name}: the chunk op equals the recurrence", array(got), want)
show(9)

# %% [markdown]
# **A layer and a small hybrid model.** `GatedDeltaNet` is a layer around the op; a prefill
# then one step gives the output of one pass. A Kimi-Linear-style hybrid stacks three KDA blocks
# and one softmax block; its generation cache holds a fixed state per KDA block and a KV cache
# for the softmax block.

# %%
from linattn.layers import GatedDeltaNet  # noqa: E402
from linattn.models import CausalLM, LMConfig  # noqa: E402

torch.manual_seed(0)
layer = GatedDeltaNet(d_model=32, n_heads=2).double()
x = torch.randn(2, 10, 32, dtype=torch.float64)
y, _ = layer(x)
state = layer.new_state(batch_size=2, dtype=torch.float64)
_, state = layer(x[:, :9], state)
y_step, state = layer(x[:, 9:], state)
check("GatedDeltaNet: prefill then one step equals one pass", y_step.detach(), y[:, 9:].detach())

config = LMConfig(vocab_size=64, d_model=32, n_heads=2, mixers=("kda", "kda", "kda", "softmax"))
model = CausalLM(config).double().eval()
ids = torch.randint(0, 64, (1, 24))
with torch.no_grad():
    logits = model(ids)
    cache = model.new_cache(batch_size=1)
    model(ids[:, :23], cache=cache)
    last = model(ids[:, 23:], cache=cache)
check("hybrid model: prefill then one step equals one pass", last[:, -1], logits[:, -1], 1e-10)
out = model.generate(ids[:, :8], max_new_tokens=8, seed=0)
print(f"generated {out.shape[1] - 8} tokens; the cache per block: {cache.numbers_per_block()}")

# %% [markdown]
# ## 11. What a fixed memory can compute: state tracking
#
# The sections above measure what the memory can *store*. What it can *compute* while it reads
# is decided by the transitions' eigenvalues: a product of transitions with eigenvalues in
# $[0, 1]$ (every additive or decaying rule, the delta rule with $\beta \in [0, 1]$) cannot
# flip a sign, while $I - \beta k k^\top$ has the eigenvalue $1 - \beta \in [-1, 1]$, and at
# $\beta = 2$ it is a reflection (Grazzi et al., 2025). Parity: one fixed key, $\beta_t = 2x_t$,
# and the state's sign is $(-1)^{x_1 + \dots + x_t}$ at every $t$. A transposition of $n$ items
# is the reflection with key $(e_i - e_j)/\sqrt{2}$, so $n - 1$ writes per token (DeltaProduct,
# Siems et al., 2025: the delta rule on interleaved rows, the token read at its last row) keep
# the state equal to the permutation matrix of the running product. The constructions below
# run the PyTorch op on hand-set keys; `linattn state-tracking` trains the mechanisms instead.

# %%
from linattn.reference import state_tracking as st  # noqa: E402

rng11 = np.random.default_rng(32)
bits = rng11.integers(0, 2, 10_000)
k_fixed = unit(rng11.standard_normal((1, 4)))[0]
K_par = np.tile(k_fixed, (10_001, 1))  # token 0 writes S_0 = k v^T, then beta_t = 2 x_t, v_t = 0
V_par = np.zeros((10_001, 1))
V_par[0] = 1.0
beta_par = np.concatenate([[1.0], 2.0 * bits])
o_par, _ = ops.delta_rule(*tensor(K_par, K_par, V_par), torch.from_numpy(beta_par)[None, :, None],
                          scale=1.0, chunk_size=64)  # fmt: skip
check("parity over 10,000 tokens: the state's sign", array(o_par)[1:, 0], (-1.0) ** np.cumsum(bits))
alternating = np.arange(1, 10_001) % 2
best = max(
    st.threshold_accuracy(st.decaying_state(np.ones(10_000, int), (a, a), (b, b)), alternating)
    for a in (0.0, 0.5, 0.9, 0.99, 1.0)
    for b in (-1.0, 1.0)
)
holds("eigenvalues in [0, 1]: 1^n's parity is not separated", best <= 0.5001,
      f"best threshold accuracy of a decaying or additive state on 1^n: {best:.4f}")  # fmt: skip

for n in (3, 5):
    perms, reads = st.random_permutations(rng11, 500, n), rng11.integers(0, n, 500)
    K_perm, beta_perm = st.permutation_writes(perms)  # n - 1 reflections per token
    Q_perm = np.zeros_like(K_perm)
    Q_perm[np.arange(500) * (n - 1) + n - 2, reads] = 1.0  # one read per token, at its last row
    o_perm, S_perm = ops.delta_rule(
        *tensor(Q_perm, K_perm, np.zeros_like(K_perm)), torch.from_numpy(beta_perm)[None, :, None],
        scale=1.0, chunk_size=16, initial_state=torch.eye(n, dtype=torch.float64)[None, None],
        output_final_state=True,
    )  # fmt: skip
    P = [st.permutation_matrix(c) for c in st.running_compositions(perms)]
    check(f"S_{n}: {n - 1} reflections a token read the running product",
          array(o_perm)[n - 2 :: n - 1], [P[t][reads[t]] for t in range(500)])  # fmt: skip
    check(f"S_{n}: the final state is its permutation matrix", S_perm[0, 0], P[-1])

# %% [markdown]
# ## 12. Beyond a fixed memory
#
# The field has since filled the space between softmax attention's growing cache and the delta
# rule's fixed state, and bent the two ends toward each other. Log-linear attention (Guo, Yang et
# al., 2025) keeps one state per level of a Fenwick hierarchy, O(log t) of them; MesaNet (von
# Oswald et al., 2025) keeps the regularised least-squares memory of section 7.3, solved per token
# by conjugate gradients; the Forgetting Transformer (Lin et al., 2025) is softmax attention with
# the decay mechanisms' cumulative forget gates; PaTH (Yang et al., 2025) puts the delta rule's
# Householder transitions inside softmax as a position encoding; DeltaFormer (Zhong et al., 2025)
# is the delta rule with a softmax kernel. Each reduces to a mechanism above, and `linattn verify`
# checks each identity on the ops themselves (float64): one level of log-linear attention is its
# base mechanism and every level the masked hierarchical product; MesaNet's memory is the
# least-squares solution; FoX with zero forget gates is softmax attention; PaTH with beta = 0 is
# softmax attention without positions and with beta = 2 its transitions are reflections;
# DeltaFormer with a linear kernel is the delta rule. Figure 10 places them on Figure 3's axes.

# %%
from linattn.experiments import verify  # noqa: E402

for section in (
    verify.log_linear_checks,
    verify.mesa_checks,
    verify.forgetting_checks,
    verify.path_checks,
    verify.deltaformer_checks,
):
    for result in section():
        print(result.line())
        assert result.passed, result.name
show(10)

# %% [markdown]
# ## Appendix: the numbers files
#
# The spec's appendix writes the numbers two of its TikZ figures read, as TeX macros.

# %%
for path in numbers.write_numbers(FIGURES / "numbers"):
    print(f"{path.name}: {len(path.read_text().splitlines())} lines")
print(f"figures drawn into {FIGURES}")

# %%
print("every check of this notebook passed")
