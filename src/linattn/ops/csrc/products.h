// The masked, decayed products inside a chunk (spec section 8: A_qk and the delta rule's L;
// section 10 for the per-channel decay), and their gradients.
//
//   A[i, j] = alpha sum_k x_ik y_jk exp(G_ik - G_jk)   for j <= i (j < i when strict)
//
// No gate: one product and the causal mask. One gate per token: the product times the matrix of
// decays exp(G_i - G_j). One gate per channel: the decay differs per channel and cannot leave the
// sum; it is factored, exp(G_i - G_r) exp(G_r - G_j) about a reference row r, on blocks halved
// until the gates' spread fits float32 (``kFactorBudget``, gates.h).
#pragma once

#include <cstdint>
#include <vector>

#include "gates.h"

namespace linattn_native {

// One thread's scratch memory, sized for one chunk of one head (64-bit sizes: C x C overflows an
// int from C = 46,341 on).
struct Scratch {
  std::vector<float> zeros;  // ``cumulative_gates``
  std::vector<float> G, Qd, Ke, A, L, X, Xf, Yf, Ex, Ey, dXf, dYf;  // G: hi, then lo (``Gates``)
  Scratch(int64_t C, int64_t K, int64_t V)
      : zeros(K, 0.0f), G(2 * C * K), Qd(C * K), Ke(C * K), A(C * C), L(C * C), X(C * (K + V)),
        Xf(C * K), Yf(C * K), Ex(C * K), Ey(C * K), dXf(C * K), dYf(C * K) {}
};

// A[i, j] = alpha sum_k x_ik y_jk exp(G_ik - G_jk) for j <= i (j < i when strict), zero above,
// for c rows; kg = 0 (no gate), 1 (one log-gate per token) or K (one per channel); G [c, kg].
void decayed_products(const float* X, int64_t ldx, const float* Y, int64_t ldy, const Gates& G,
                      int64_t kg, int c, int64_t K, bool strict, float alpha, float* A,
                      int64_t lda, Scratch& w);

// The delta rule's two decayed products at once: A1 = alpha1 decayed(X1 Y^T) (j <= i) and
// A2 = decayed(X2 Y^T) (j < i), every decay formed once (A_qk and A_kk).
void decayed_product_pair(const float* X1, int64_t ld1, const float* X2, int64_t ld2,
                          const float* Y, int64_t ldy, const Gates& G, int kg, int c, int K,
                          float alpha1, float* A1, float* A2, int64_t lda, Scratch& w);

// The gradient of a per-channel decayed product's diagonal block [i0, i0 + n) (kg = K), for dA
// masked as the product was: adds to dX and dY ([c, K]).
void channel_diagonal_backward(const float* X, int64_t ldx, const float* Y, int64_t ldy,
                               const Gates& G, int64_t K, int i0, int n, float alpha,
                               const float* dA, int64_t lda, float* dX, float* dY, Scratch& w);

// The gates' share of a one-gate-per-token decayed product's gradient (adds to dG [c]).
void product_gate_gradient(const float* dM, const float* M, int64_t ld, int c, float* dG);

}  // namespace linattn_native
