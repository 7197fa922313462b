// The masked, decayed products inside a chunk (spec section 8: A_qk and the delta rule's A_kk;
// section 10 for the per-channel decay), and their gradients.
//
//   A[i, j] = alpha sum_k x_ik y_jk exp(G_ik - G_jk)   for j <= i (j < i for A_kk)
//
// No gate: one product and the causal mask. One gate per token: the product times the matrix of
// decays exp(G_i - G_j). One gate per channel: the decay differs per channel and cannot leave the
// sum; it is factored, exp(G_i - G_r) exp(G_r - G_j) about a reference row r, on blocks halved
// until the gates' spread fits float32 (``kFactorBudget``, gates.h; ``factored_blocks``, the one
// halving recursion, which the products and their gradients share). Where the whole chunk fits,
// r is its last row and both kinds of decay come from the chunk's end decays exp(G_c - G)
// (``chunk_gates``'s eEnd) as quotients, with no exponential formed again (``end`` below).
#pragma once

#include <cstdint>
#include <vector>

#include "gates.h"

namespace linattn_native {

// One thread's scratch memory, sized for one chunk of one head (64-bit sizes: C x C overflows an
// int from C = 46,341 on), and for a rule's 2 C stacked write rows (rules.h: Ke, A_q, L, X; Y
// and dY [2 C, K], the stacked right factors [k; a] of its products and their gradient).
struct Scratch {
  std::vector<float> zeros;  // ``cumulative_gates``
  std::vector<float> G, Qd, Ke, A, L, X, Xf, Yf, Ex, Ey, dXf, dYf, Y, dY;  // G: hi, lo (``Gates``)
  Scratch(int64_t C, int64_t K, int64_t V)
      : zeros(K, 0.0f), G(2 * C * K), Qd(C * K), Ke(2 * C * K), A(2 * C * C), L(2 * C * C),
        X(2 * C * (K + V)), Xf(C * K), Yf(C * K), Ex(C * K), Ey(C * K), dXf(C * K), dYf(C * K),
        Y(2 * C * K), dY(2 * C * K) {}
};

// The rows of an operand [c, K] of a product: row i at p + i ld.
struct Rows {
  const float* p;
  int64_t ld;
};

// A1 = alpha1 decayed(X1 Y^T) (j <= i), zero above, for c rows; and, when A2 is not nullptr, the
// delta rule's second product A2 = decayed(X2 Y^T) (j < i) with every decay formed once for both
// (A_qk and A_kk). kg = 0 (no gate), 1 (one log-gate per token) or K (one per channel); G [c, kg].
// ``end``: the chunk's end decays exp(G_c - G) [c, kg] (``chunk_gates``'s eEnd, G_c the gates of
// row c - 1), or nullptr. With them, where the gates' spread over the chunk fits the budget, every
// decay is a quotient exp(G_i - G_j) = end_j / end_i (the product factored about the chunk's last
// row) and no exponential is formed again; otherwise, and without them, the decays are formed
// from G (the halving recursion for kg = K).
void decayed_products(Rows x1, Rows x2, Rows y, const Gates& G, int64_t kg, int c, int64_t K,
                      float alpha1, float* A1, float* A2, int64_t lda, Scratch& w,
                      const float* end = nullptr);

// Four per-channel decayed products (kg = K) of c rows sharing their factors' decays (the dplr
// rule's A_q and, one row down, M_b): A1 = alpha1 [decayed(x1 y1^T) | decayed(x1 y2^T)] and
// A2 = alpha2 [decayed(x2 y1^T) | decayed(x2 y2^T)] on its first n2 rows (x2 read on all c),
// each c-column half masked j <= i, the second half c columns on (row stride lda). ``end`` as
// for ``decayed_products``: with it, the factors are quotients of the end decays where they fit.
void decayed_products_2x2(Rows x1, Rows x2, int n2, Rows y1, Rows y2, const Gates& G, int c,
                          int64_t K, float alpha1, float alpha2, float* A1, float* A2,
                          int64_t lda, Scratch& w, const float* end = nullptr);

// The gradient of a per-channel decayed product of c rows (kg = K), for dA masked as the product
// was (the same blocks, the same halving; ``end`` as for ``decayed_products``): adds to dX and
// dY ([c, K]).
void channel_product_backward(Rows x, Rows y, const Gates& G, int64_t K, int c, float alpha,
                              const float* dA, int64_t lda, float* dX, float* dY, Scratch& w,
                              const float* end = nullptr);

// The gates' share of a per-channel decayed product's gradient (kg = K), for dA masked as the
// product was: each pair (i, j) holds g_m for j < m <= i, and sum_{i >= m > j} of its share
// dA_ij x_i y_j exp(G_i - G_j) (per channel) is added to share[m] (a term of dg itself, [c, K]).
// The pairs are taken by the halving (every exponent <= 0) down to blocks whose gates fit the
// budget (with ``end``, as ``channel_product_backward``: the whole chunk about its last row),
// each taken directly, every pair to the gates across it alone. As x dX - y dY summed into dG,
// the pairs on both sides of a gate would cancel in float32, and an undecayed one (a run of zero
// gates: DeltaProduct's writes of one token) would swamp the dg of a steep gate, of the order of
// exp(g).
void channel_gate_share(Rows x, Rows y, const Gates& G, int64_t K, int c, float alpha,
                        const float* dA, int64_t lda, float* share, Scratch& w,
                        const float* end = nullptr);

// Whether the c rows of a chunk are one block factored about their last row: the end decays
// exp(G_c - G) [c, kg] are given (``end``, not nullptr) and the gates' spread over the c rows
// fits the budget, so that every decay inside the chunk is a quotient of two of them.
bool end_factored(const Gates& G, int64_t kg, int c, const float* end);

// Gamma[i, j] = exp(G_i - G_j) for j <= i, zero above, c rows of row stride ldg (one gate per
// token: the decays ``decayed_products`` multiplies A by; from ``end`` as there, when given).
void token_decays(const Gates& G, int c, int64_t ldg, float* Gam, const float* end = nullptr);

// Row i of ``token_decays``' Gamma, its entries j <= i (the others unspecified): the quotients
// end_j / end_i (1 on the diagonal) from ``quotients``, the end decays where ``end_factored``
// holds, else (nullptr) exp(G_i - G_j) from G's pairs.
void token_decay_row(const Gates& G, int i, int c, const float* quotients, float* row);

// The gates' share of a one-gate-per-token decayed product's gradient: sum_{i >= m > j} of
// dM_ij M_ij added to pairs[m] (a term of dg_m itself, not of dG; pairs [c]).
void product_gate_gradient(const float* dM, const float* M, int64_t ld, int c, float* pairs);

// dM *= Gamma on the first c columns of c rows (dM row stride ldm, Gamma ldg): the gradient of a
// one-gate-per-token product's undecayed factors.
void times_decays(int c, float* dM, int64_t ldm, const float* Gam, int64_t ldg);

}  // namespace linattn_native
