// The decayed products of products.h: factored blocks for per-channel gates, their gradients.

#include "products.h"

#include "blas.h"

namespace linattn_native {
namespace {

// Rows [i0, i0 + n) of X times their decays about the reference row r (Gr, Lr), into F [n, K]:
// x_i * exp(G_i - G_r) (toward r) or, kFromRef, x_i * exp(G_r - G_i); kKeep: the decays into E too.
template <bool kFromRef, bool kKeep>
void factor_rows(const float* X, int64_t ldx, const Gates& G, int64_t K, int i0, int n,
                 const float* Gr, const float* Lr, float* F, float* E) {
  for (int i = 0; i < n; ++i) {
    const float* x = X + (i0 + i) * ldx;
    const float* Gi = G.hi + static_cast<int64_t>(i0 + i) * K;
    const float* Li = G.lo + static_cast<int64_t>(i0 + i) * K;
    float* f = F + static_cast<int64_t>(i) * K;
    float* e = kKeep ? E + static_cast<int64_t>(i) * K : nullptr;
#pragma omp simd
    for (int c = 0; c < K; ++c) {
      const float d = kFromRef ? decay(Gr[c], Lr[c], Gi[c], Li[c])
                               : decay(Gi[c], Li[c], Gr[c], Lr[c]);
      if constexpr (kKeep) e[c] = d;
      f[c] = x[c] * d;
    }
  }
}

// A diagonal block's rows [i0, i0 + n) (the reference row r inside it): their exponents are
// d = G_i - G_r and -d, formed once: Xf = x * exp(d), Yf = y * exp(-d); kKeep: the decays into
// Ex and Ey too (for the backward pass).
template <bool kKeep>
void factor_diagonal_rows(const float* X, int64_t ldx, const float* Y, int64_t ldy,
                          const Gates& G, int64_t K, int i0, int n, const float* Gr,
                          const float* Lr, Scratch& w) {
  for (int i = 0; i < n; ++i) {
    const float *x = X + (i0 + i) * ldx, *y = Y + (i0 + i) * ldy;
    const float* Gi = G.hi + static_cast<int64_t>(i0 + i) * K;
    const float* Li = G.lo + static_cast<int64_t>(i0 + i) * K;
    float *fx = w.Xf.data() + static_cast<int64_t>(i) * K, *fy = w.Yf.data() + i * K;
    float* ex = kKeep ? w.Ex.data() + static_cast<int64_t>(i) * K : nullptr;
    float* ey = kKeep ? w.Ey.data() + static_cast<int64_t>(i) * K : nullptr;
#pragma omp simd
    for (int c = 0; c < K; ++c) {
      const float d = (Gi[c] - Gr[c]) + (Li[c] - Lr[c]);
      const float up = exp_flush(d), down = exp_flush(-d);
      if constexpr (kKeep) {
        ex[c] = up;
        ey[c] = down;
      }
      fx[c] = x[c] * up;
      fy[c] = y[c] * down;
    }
  }
}

// Rows [i0, i0 + n) x [j0, j0 + m) of the decayed product sum_k x_ik y_jk exp(G_ik - G_jk) with one
// reference row r for the whole block: x * exp(G - G_r) times (y * exp(G_r - G))^T.
void factored_block(const float* X, int64_t ldx, const float* Y, int64_t ldy, const Gates& G,
                    int64_t K, int i0, int n, int j0, int m, int r, float alpha, float* A,
                    int64_t lda, Scratch& w) {
  const float *Gr = G.hi + static_cast<int64_t>(r) * K, *Lr = G.lo + static_cast<int64_t>(r) * K;
  if (i0 == j0 && n == m) {  // a diagonal block
    factor_diagonal_rows<false>(X, ldx, Y, ldy, G, K, i0, n, Gr, Lr, w);
    gemm(false, true, n, m, K, alpha, w.Xf.data(), K, w.Yf.data(), K, 0.0f, A + i0 * lda + j0,
         lda);
    return;
  }
  factor_rows<false, false>(X, ldx, G, K, i0, n, Gr, Lr, w.Xf.data(), nullptr);
  factor_rows<true, false>(Y, ldy, G, K, j0, m, Gr, Lr, w.Yf.data(), nullptr);
  gemm(false, true, n, m, K, alpha, w.Xf.data(), K, w.Yf.data(), K, 0.0f, A + i0 * lda + j0, lda);
}

// The diagonal block [i0, i0 + n) of a per-channel decayed product. One factored product when the
// gates' spread over the block fits the budget; otherwise the block is halved: the lower-left
// quarter factors exactly about the last row of its upper half (every exponent <= 0 there), and the
// two diagonal halves recurse (``_blockmath.direct_block_size``).
void channel_diagonal(const float* X, int64_t ldx, const float* Y, int64_t ldy, const Gates& G,
                      int64_t K, int i0, int n, float alpha, float* A, int64_t lda,
                      Scratch& w) {
  const float* first = G.hi + static_cast<int64_t>(i0) * K;
  const float* last = G.hi + static_cast<int64_t>(i0 + n - 1) * K;
  float spread = 0.0f;
  for (int c = 0; c < K; ++c) spread = std::max(spread, first[c] - last[c]);
  if (spread <= kFactorBudget || n == 1) {
    factored_block(X, ldx, Y, ldy, G, K, i0, n, i0, n, i0 + n / 2, alpha, A, lda, w);
    return;
  }
  const int h = n / 2;
  factored_block(X, ldx, Y, ldy, G, K, i0 + h, n - h, i0, h, i0 + h - 1, alpha, A, lda, w);
  channel_diagonal(X, ldx, Y, ldy, G, K, i0, h, alpha, A, lda, w);
  channel_diagonal(X, ldx, Y, ldy, G, K, i0 + h, n - h, alpha, A, lda, w);
}

// The gradient of ``factored_block``'s product, with the same factors: for dA the gradient of its
// rows [i0, i0 + n) x [j0, j0 + m), dX_i += (alpha dA Yf)_i * exp(G_i - G_r) and
// dY_j += (alpha dA^T Xf)_j * exp(G_r - G_j), with Xf, Yf the factored rows. dX, dY: [c, K].
void factored_block_backward(const float* X, int64_t ldx, const float* Y, int64_t ldy,
                             const Gates& G, int64_t K, int i0, int n, int j0, int m, int r,
                             float alpha, const float* dA, int64_t lda, float* dX, float* dY,
                             Scratch& w) {
  const float *Gr = G.hi + static_cast<int64_t>(r) * K, *Lr = G.lo + static_cast<int64_t>(r) * K;
  if (i0 == j0 && n == m) {  // a diagonal block
    factor_diagonal_rows<true>(X, ldx, Y, ldy, G, K, i0, n, Gr, Lr, w);
  } else {
    factor_rows<false, true>(X, ldx, G, K, i0, n, Gr, Lr, w.Xf.data(), w.Ex.data());
    factor_rows<true, true>(Y, ldy, G, K, j0, m, Gr, Lr, w.Yf.data(), w.Ey.data());
  }
  const float* dAb = dA + i0 * lda + j0;
  gemm(false, false, n, K, m, alpha, dAb, lda, w.Yf.data(), K, 0.0f, w.dXf.data(), K);
  gemm(true, false, m, K, n, alpha, dAb, lda, w.Xf.data(), K, 0.0f, w.dYf.data(), K);
  for (int i = 0; i < n; ++i) {
    const float *d = w.dXf.data() + i * K, *e = w.Ex.data() + i * K;
    float* out = dX + static_cast<int64_t>(i0 + i) * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) out[c] += d[c] * e[c];
  }
  for (int j = 0; j < m; ++j) {
    const float *d = w.dYf.data() + j * K, *e = w.Ey.data() + j * K;
    float* out = dY + static_cast<int64_t>(j0 + j) * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) out[c] += d[c] * e[c];
  }
}

}  // namespace

// The gradient of ``channel_diagonal``'s product (the same blocks, the same halving), for dA
// masked as the product was: adds to dX and dY ([c, K]).
void channel_diagonal_backward(const float* X, int64_t ldx, const float* Y, int64_t ldy,
                               const Gates& G, int64_t K, int i0, int n, float alpha,
                               const float* dA, int64_t lda, float* dX, float* dY, Scratch& w) {
  const float* first = G.hi + static_cast<int64_t>(i0) * K;
  const float* last = G.hi + static_cast<int64_t>(i0 + n - 1) * K;
  float spread = 0.0f;
  for (int c = 0; c < K; ++c) spread = std::max(spread, first[c] - last[c]);
  if (spread <= kFactorBudget || n == 1) {
    factored_block_backward(X, ldx, Y, ldy, G, K, i0, n, i0, n, i0 + n / 2, alpha, dA, lda, dX,
                            dY, w);
    return;
  }
  const int h = n / 2;
  factored_block_backward(X, ldx, Y, ldy, G, K, i0 + h, n - h, i0, h, i0 + h - 1, alpha, dA, lda,
                          dX, dY, w);
  channel_diagonal_backward(X, ldx, Y, ldy, G, K, i0, h, alpha, dA, lda, dX, dY, w);
  channel_diagonal_backward(X, ldx, Y, ldy, G, K, i0 + h, n - h, alpha, dA, lda, dX, dY, w);
}

// A[i, j] = alpha sum_k x_ik y_jk exp(G_ik - G_jk) for j <= i (j < i when strict), zero above:
// the masked, decayed product of section 10 for c rows. kg = 0 (no gate), 1 (one log-gate per
// token) or K (one per channel); G [c, kg] holds the cumulative log-gates.
void decayed_products(const float* X, int64_t ldx, const float* Y, int64_t ldy, const Gates& G,
                      int64_t kg, int c, int64_t K, bool strict, float alpha, float* A,
                      int64_t lda, Scratch& w) {
  if (kg <= 1) {
    gemm(false, true, c, c, K, alpha, X, ldx, Y, ldy, 0.0f, A, lda);
    if (kg == 1) {
      // Whole rows, so that every row is the same few vectors (a triangle's ragged row ends cost
      // a scalar exponential each): above the diagonal the exponents are positive and exp_flush
      // caps them at 88, and the mask below overwrites those entries.
      for (int i = 0; i < c; ++i) {
        float* row = A + i * lda;
        const float Gi = G.hi[i], Li = G.lo[i];
#pragma omp simd
        for (int j = 0; j < c; ++j) row[j] *= decay(Gi, Li, G.hi[j], G.lo[j]);
      }
    }
  } else {
    channel_diagonal(X, ldx, Y, ldy, G, K, 0, c, alpha, A, lda, w);
  }
  for (int i = 0; i < c; ++i) {  // the causal mask
    float* row = A + i * lda;
    for (int j = strict ? i : i + 1; j < c; ++j) row[j] = 0.0f;
  }
}

namespace {

// ``factored_block`` for two left factors X1, X2 (row strides ld1, ld2) of one Y: A1 = alpha1 X1f
// Yf^T and A2 = X2f Yf^T, each exponential formed once for both (the delta rule's A_qk and A_kk).
void factored_pair(const float* X1, int64_t ld1, const float* X2, int64_t ld2, const float* Y,
                   int64_t ldy, const Gates& G, int K, int i0, int n, int j0, int m, int r,
                   float alpha1, float* A1, float* A2, int64_t lda, Scratch& w) {
  const float *Gr = G.hi + static_cast<int64_t>(r) * K, *Lr = G.lo + static_cast<int64_t>(r) * K;
  const bool diagonal = i0 == j0 && n == m;  // the rows' exponents are d and -d, formed once
  for (int i = 0; i < n; ++i) {
    const float *x1 = X1 + (i0 + i) * ld1, *x2 = X2 + (i0 + i) * ld2, *y = Y + (i0 + i) * ldy;
    const float* Gi = G.hi + static_cast<int64_t>(i0 + i) * K;
    const float* Li = G.lo + static_cast<int64_t>(i0 + i) * K;
    float *f1 = w.Xf.data() + static_cast<int64_t>(i) * K, *f2 = w.dXf.data() + i * K;
    float* fy = w.Yf.data() + static_cast<int64_t>(i) * K;
    if (diagonal) {
#pragma omp simd
      for (int c = 0; c < K; ++c) {
        const float d = (Gi[c] - Gr[c]) + (Li[c] - Lr[c]), e = exp_flush(d);
        f1[c] = x1[c] * e;
        f2[c] = x2[c] * e;
        fy[c] = y[c] * exp_flush(-d);
      }
    } else {
#pragma omp simd
      for (int c = 0; c < K; ++c) {
        const float e = decay(Gi[c], Li[c], Gr[c], Lr[c]);
        f1[c] = x1[c] * e;
        f2[c] = x2[c] * e;
      }
    }
  }
  if (!diagonal) factor_rows<true, false>(Y, ldy, G, K, j0, m, Gr, Lr, w.Yf.data(), nullptr);
  const int64_t at = i0 * lda + j0;
  gemm(false, true, n, m, K, alpha1, w.Xf.data(), K, w.Yf.data(), K, 0.0f, A1 + at, lda);
  gemm(false, true, n, m, K, 1.0f, w.dXf.data(), K, w.Yf.data(), K, 0.0f, A2 + at, lda);
}

// ``channel_diagonal`` for the pair of ``factored_pair`` (the same blocks, the same halving).
void channel_diagonal_pair(const float* X1, int64_t ld1, const float* X2, int64_t ld2,
                           const float* Y, int64_t ldy, const Gates& G, int K, int i0, int n,
                           float alpha1, float* A1, float* A2, int64_t lda, Scratch& w) {
  const float* first = G.hi + static_cast<int64_t>(i0) * K;
  const float* last = G.hi + static_cast<int64_t>(i0 + n - 1) * K;
  float spread = 0.0f;
  for (int c = 0; c < K; ++c) spread = std::max(spread, first[c] - last[c]);
  if (spread <= kFactorBudget || n == 1) {
    factored_pair(X1, ld1, X2, ld2, Y, ldy, G, K, i0, n, i0, n, i0 + n / 2, alpha1, A1, A2, lda,
                  w);
    return;
  }
  const int h = n / 2;
  factored_pair(X1, ld1, X2, ld2, Y, ldy, G, K, i0 + h, n - h, i0, h, i0 + h - 1, alpha1, A1, A2,
                lda, w);
  channel_diagonal_pair(X1, ld1, X2, ld2, Y, ldy, G, K, i0, h, alpha1, A1, A2, lda, w);
  channel_diagonal_pair(X1, ld1, X2, ld2, Y, ldy, G, K, i0 + h, n - h, alpha1, A1, A2, lda, w);
}

}  // namespace

// The delta rule's two decayed products at once: A1 = alpha1 decayed(X1 Y^T) (j <= i) and
// A2 = decayed(X2 Y^T) (j < i), as ``decayed_products`` forms each, every decay formed once.
void decayed_product_pair(const float* X1, int64_t ld1, const float* X2, int64_t ld2,
                          const float* Y, int64_t ldy, const Gates& G, int kg, int c, int K,
                          float alpha1, float* A1, float* A2, int64_t lda, Scratch& w) {
  if (kg <= 1) {
    gemm(false, true, c, c, K, alpha1, X1, ld1, Y, ldy, 0.0f, A1, lda);
    gemm(false, true, c, c, K, 1.0f, X2, ld2, Y, ldy, 0.0f, A2, lda);
    if (kg == 1) {  // whole rows, as in ``decayed_products``
      for (int i = 0; i < c; ++i) {
        float *row1 = A1 + i * lda, *row2 = A2 + i * lda;
        const float Gi = G.hi[i], Li = G.lo[i];
#pragma omp simd
        for (int j = 0; j < c; ++j) {
          const float d = decay(Gi, Li, G.hi[j], G.lo[j]);
          row1[j] *= d;
          row2[j] *= d;
        }
      }
    }
  } else {
    channel_diagonal_pair(X1, ld1, X2, ld2, Y, ldy, G, K, 0, c, alpha1, A1, A2, lda, w);
  }
  for (int i = 0; i < c; ++i) {  // the causal masks
    float *row1 = A1 + i * lda, *row2 = A2 + i * lda;
    for (int j = i + 1; j < c; ++j) row1[j] = 0.0f;
    for (int j = i; j < c; ++j) row2[j] = 0.0f;
  }
}

// The gates' share of a decayed product's gradient: for M = X * Gamma (Gamma[i, j] =
// exp(G_i - G_j), causal: j <= i, or j < i when strict) and its gradient dM, row i of dM * M adds
// to dG_i and column i subtracts from it. dM and M are [c, ld] row-major, zero above the mask.
// The diagonal (no decay) adds to its row and subtracts from its column the same number: it is
// skipped, so that its rounding (as large as the undecayed term) does not reach dg.
void product_gate_gradient(const float* dM, const float* M, int64_t ld, int c, float* dG) {
  for (int i = 0; i < c; ++i) {
    const float *dMi = dM + i * ld, *Mi = M + i * ld;
    float row = 0.0f;
#pragma omp simd reduction(+ : row)
    for (int j = 0; j < i; ++j) {
      const float m = dMi[j] * Mi[j];
      row += m;
      dG[j] -= m;
    }
    dG[i] += row;
  }
}

}  // namespace linattn_native
