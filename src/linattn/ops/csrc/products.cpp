// The decayed products of products.h: factored blocks for per-channel gates, their gradients.

#include "products.h"

#include <algorithm>
#include <vector>

#include "blas.h"

namespace linattn_native {
namespace {

// A block of a per-channel product: rows [i0, i0 + n) x columns [j0, j0 + m), factored about the
// reference row r (every exponent of its factors <= 0 off the diagonal).
struct Block {
  int i0, n, j0, m, r;
  bool diagonal() const { return i0 == j0 && n == m; }
};

// The largest spread max_ch (G_i0 - G_{i0 + n - 1}) of the gates over rows [i0, i0 + n): the
// largest exponent of a decay inside them (G is non-increasing down the rows).
float gate_spread(const Gates& G, int64_t K, int i0, int n) {
  const float* first = G.hi + static_cast<int64_t>(i0) * K;
  const float* last = G.hi + static_cast<int64_t>(i0 + n - 1) * K;
  float spread = 0.0f;
  for (int c = 0; c < K; ++c) spread = std::max(spread, first[c] - last[c]);
  return spread;
}

// The one halving recursion of the per-channel products (``_blockmath.direct_block_size``): the
// diagonal block [i0, i0 + n) is one factored block when the gates' spread over it fits the
// budget; otherwise its lower-left quarter is one, factored exactly about the last row of its
// upper half, and its two diagonal halves recurse. ``block(b)`` computes (or differentiates) b.
template <typename F>
void factored_blocks(const Gates& G, int64_t K, int i0, int n, const F& block) {
  if (gate_spread(G, K, i0, n) <= kFactorBudget || n == 1) {
    block(Block{i0, n, i0, n, i0 + n / 2});
    return;
  }
  const int h = n / 2;
  block(Block{i0 + h, n - h, i0, h, i0 + h - 1});
  factored_blocks(G, K, i0, h, block);
  factored_blocks(G, K, i0 + h, n - h, block);
}

// The blocks of a per-channel product of c rows: with the end decays (``end``: exp(G_c - G), the
// chunk's eEnd) and a spread within the budget, the whole chunk is one block about its last row,
// whose decays are the end decays and their reciprocals (``factor_row``: no exponential formed
// again); else the halving recursion. ``block(b, end)`` computes (or differentiates) b, with the
// end decays for the first kind (nullptr for the second).
template <typename F>
void product_blocks(const Gates& G, int64_t K, int c, const float* end, const F& block) {
  if (end_factored(G, K, c, end)) {
    block(Block{0, c, 0, c, c - 1}, end);
  } else {
    factored_blocks(G, K, 0, c, [&](const Block& b) { block(b, nullptr); });
  }
}

// Row i of a diagonal block's factors: up = exp(G_i - G_r) into fx = x up (and f2 = x2 up),
// down = exp(G_r - G_i) into fy = y down (and ex, ey: the decays, kDecays). From the end decays
// (``end``: r the chunk's last row, so that down = end and x up = x / down, within the budget)
// or, end nullptr, from the gates' pairs (d = G_i - G_r).
template <bool kPair, bool kDecays>
void factor_row(const float* x, const float* x_2, const float* yi, const float* Gi,
                const float* Li, const float* Gr, const float* Lr, const float* end, int K,
                float* fx, float* f2, float* fy, float* ex, float* ey) {
  if (end) {  // fx = x / down: one rounding, as x up has (ex is not formed: dX divides alike)
#pragma omp simd
    for (int c = 0; c < K; ++c) {
      const float down = end[c];
      if constexpr (kDecays) ey[c] = down;
      fx[c] = x[c] / down;
      if constexpr (kPair) f2[c] = x_2[c] / down;
      fy[c] = yi[c] * down;
    }
    return;
  }
#pragma omp simd
  for (int c = 0; c < K; ++c) {
    const float d = (Gi[c] - Gr[c]) + (Li[c] - Lr[c]), up = exp_flush(d);
    const float down = exp_flush(-d);
    if constexpr (kDecays) {
      ex[c] = up;
      ey[c] = down;
    }
    fx[c] = x[c] * up;
    if constexpr (kPair) f2[c] = x_2[c] * up;
    fy[c] = yi[c] * down;
  }
}

// Block b's factored rows: Xf = x exp(G_i - G_r) (rows i0..) and Yf = y exp(G_r - G_j) (rows
// j0..); kPair: X2f = x2 exp(G_i - G_r) too (in w.dXf); kDecays: the decays into Ex and Ey (for
// the gradient). A diagonal block's exponents are d = G_i - G_r and -d, each formed once
// (``factor_row``; with ``end``, none: b is then the whole chunk about its last row).
template <bool kPair, bool kDecays>
void factor_block(Rows x1, Rows x2, Rows y, const Gates& G, int64_t K, const Block& b,
                  Scratch& w, const float* end = nullptr) {
  const int64_t ref = static_cast<int64_t>(b.r) * K;
  const float *Gr = G.hi + ref, *Lr = G.lo + ref;
  const bool diagonal = b.diagonal();
  for (int i = 0; i < b.n; ++i) {
    const int64_t row = b.i0 + i, at = static_cast<int64_t>(i) * K;
    const float *x = x1.p + row * x1.ld, *x_2 = kPair ? x2.p + row * x2.ld : nullptr;
    const float *Gi = G.hi + row * K, *Li = G.lo + row * K;
    float *fx = w.Xf.data() + at, *f2 = w.dXf.data() + at, *ex = w.Ex.data() + at;
    if (diagonal) {  // the rows of y too, with the exponents' negatives
      factor_row<kPair, kDecays>(x, x_2, y.p + row * y.ld, Gi, Li, Gr, Lr,
                                 end ? end + row * K : nullptr, static_cast<int>(K), fx, f2,
                                 w.Yf.data() + at, ex, w.Ey.data() + at);
    } else {
#pragma omp simd
      for (int c = 0; c < K; ++c) {
        const float up = decay(Gi[c], Li[c], Gr[c], Lr[c]);
        if constexpr (kDecays) ex[c] = up;
        fx[c] = x[c] * up;
        if constexpr (kPair) f2[c] = x_2[c] * up;
      }
    }
  }
  for (int j = 0; !diagonal && j < b.m; ++j) {
    const int64_t row = b.j0 + j, at = static_cast<int64_t>(j) * K;
    const float *Gj = G.hi + row * K, *Lj = G.lo + row * K, *yj = y.p + row * y.ld;
    float *fy = w.Yf.data() + at, *ey = w.Ey.data() + at;
#pragma omp simd
    for (int c = 0; c < K; ++c) {
      const float e = decay(Gr[c], Lr[c], Gj[c], Lj[c]);
      if constexpr (kDecays) ey[c] = e;
      fy[c] = yj[c] * e;
    }
  }
}

// Block b of A1 = alpha1 Xf Yf^T (and, kPair, of A2 = X2f Yf^T).
template <bool kPair>
void product_block(Rows x1, Rows x2, Rows y, const Gates& G, int64_t K, const Block& b,
                   float alpha1, float* A1, float* A2, int64_t lda, Scratch& w,
                   const float* end) {
  factor_block<kPair, false>(x1, x2, y, G, K, b, w, end);
  const int64_t at = b.i0 * lda + b.j0;
  gemm(false, true, b.n, b.m, K, alpha1, w.Xf.data(), K, w.Yf.data(), K, 0.0f, A1 + at, lda);
  if constexpr (kPair) {
    gemm(false, true, b.n, b.m, K, 1.0f, w.dXf.data(), K, w.Yf.data(), K, 0.0f, A2 + at, lda);
  }
}

// The gradient of block b's product, with the same factors: for dA the gradient of its rows,
// dX_i += (alpha dA Yf)_i * exp(G_i - G_r) and dY_j += (alpha dA^T Xf)_j * exp(G_r - G_j) (with
// ``end``, b the whole chunk about its last row: dX_i += (alpha dA Yf)_i / end_i).
void product_block_backward(Rows x, Rows y, const Gates& G, int64_t K, const Block& b,
                            float alpha, const float* dA, int64_t lda, float* dX, float* dY,
                            Scratch& w, const float* end) {
  factor_block<false, true>(x, x, y, G, K, b, w, end);
  const float* dAb = dA + b.i0 * lda + b.j0;
  gemm(false, false, b.n, K, b.m, alpha, dAb, lda, w.Yf.data(), K, 0.0f, w.dXf.data(), K);
  gemm(true, false, b.m, K, b.n, alpha, dAb, lda, w.Xf.data(), K, 0.0f, w.dYf.data(), K);
  for (int i = 0; i < b.n; ++i) {
    const float *d = w.dXf.data() + i * K, *e = w.Ex.data() + i * K;
    float* out = dX + static_cast<int64_t>(b.i0 + i) * K;
    if (end) {  // exp(G_i - G_r) = 1 / end_i (``factor_row``)
      const float* down = end + static_cast<int64_t>(b.i0 + i) * K;
#pragma omp simd
      for (int c = 0; c < K; ++c) out[c] += d[c] / down[c];
    } else {
#pragma omp simd
      for (int c = 0; c < K; ++c) out[c] += d[c] * e[c];
    }
  }
  for (int j = 0; j < b.m; ++j) {
    const float *d = w.dYf.data() + j * K, *e = w.Ey.data() + j * K;
    float* out = dY + static_cast<int64_t>(b.j0 + j) * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) out[c] += d[c] * e[c];
  }
}

// Block b's factored rows of a second right factor, Y2f = y2 exp(G_r - G_j) (rows j0..), into
// w.dYf: the same numbers as ``factor_block``'s Yf of y2 (with ``end``, y2 end_j, as there).
void second_y_factor(Rows y2, const Gates& G, int64_t K, const Block& b, Scratch& w,
                     const float* end) {
  const int64_t ref = static_cast<int64_t>(b.r) * K;
  const float *Gr = G.hi + ref, *Lr = G.lo + ref;
  for (int j = 0; j < b.m; ++j) {
    const int64_t row = b.j0 + j;
    const float *Gj = G.hi + row * K, *Lj = G.lo + row * K, *yj = y2.p + row * y2.ld;
    float* fy = w.dYf.data() + static_cast<int64_t>(j) * K;
    if (end) {
      const float* down = end + row * K;
#pragma omp simd
      for (int c = 0; c < K; ++c) fy[c] = yj[c] * down[c];
    } else {
#pragma omp simd
      for (int c = 0; c < K; ++c) fy[c] = yj[c] * decay(Gr[c], Lr[c], Gj[c], Lj[c]);
    }
  }
}

// Block b of ``decayed_products_2x2``: the factors of x1, x2, y1 (``factor_block``) and y2 once,
// then A1 = alpha1 [X1f Yf^T | X1f Y2f^T] and, on its rows below n2, A2 = alpha2 [X2f Yf^T |
// X2f Y2f^T] (each second half c columns on).
void quad_block(Rows x1, Rows x2, int n2, Rows y1, Rows y2, const Gates& G, int64_t K,
                const Block& b, int c, float alpha1, float alpha2, float* A1, float* A2,
                int64_t lda, Scratch& w, const float* end) {
  factor_block<true, false>(x1, x2, y1, G, K, b, w, end);
  second_y_factor(y2, G, K, b, w, end);
  const float *X1f = w.Xf.data(), *X2f = w.dXf.data(), *Yf = w.Yf.data(), *Y2f = w.dYf.data();
  const int64_t at = b.i0 * lda + b.j0;
  gemm(false, true, b.n, b.m, K, alpha1, X1f, K, Yf, K, 0.0f, A1 + at, lda);
  gemm(false, true, b.n, b.m, K, alpha1, X1f, K, Y2f, K, 0.0f, A1 + at + c, lda);
  const int rows2 = std::min(b.n, n2 - b.i0);
  if (rows2 <= 0) return;
  gemm(false, true, rows2, b.m, K, alpha2, X2f, K, Yf, K, 0.0f, A2 + at, lda);
  gemm(false, true, rows2, b.m, K, alpha2, X2f, K, Y2f, K, 0.0f, A2 + at + c, lda);
}

// One gate per token: A1 (and A2) times the decays exp(G_i - G_j), whole rows, so that every row
// is the same few vectors (a triangle's ragged row ends cost a scalar exponential each): above
// the diagonal the exponents are positive and exp_flush caps them at 88, and the masks overwrite
// those entries.
void decay_rows(const Gates& G, int c, float* A1, float* A2, int64_t lda) {
  for (int i = 0; i < c; ++i) {
    float *row1 = A1 + i * lda, *row2 = A2 ? A2 + i * lda : nullptr;
    const float Gi = G.hi[i], Li = G.lo[i];
    if (row2) {
#pragma omp simd
      for (int j = 0; j < c; ++j) {
        const float d = decay(Gi, Li, G.hi[j], G.lo[j]);
        row1[j] *= d;
        row2[j] *= d;
      }
    } else {
#pragma omp simd
      for (int j = 0; j < c; ++j) row1[j] *= decay(Gi, Li, G.hi[j], G.lo[j]);
    }
  }
}

// ``decay_rows`` from the end decays (``end_factored``): exp(G_i - G_j) = end_j / end_i, below
// the diagonal only (the diagonal's decay is 1: left as it is; the masks clear the rest). No
// exponential: a division per entry.
void end_decay_rows(const float* end, int c, float* A1, float* A2, int64_t lda) {
  for (int i = 1; i < c; ++i) {
    float *row1 = A1 + i * lda, *row2 = A2 ? A2 + i * lda : nullptr;
    const float down = end[i];
    if (row2) {
#pragma omp simd
      for (int j = 0; j < i; ++j) {
        const float d = end[j] / down;
        row1[j] *= d;
        row2[j] *= d;
      }
    } else {
#pragma omp simd
      for (int j = 0; j < i; ++j) row1[j] *= end[j] / down;
    }
  }
}

}  // namespace

bool end_factored(const Gates& G, int64_t kg, int c, const float* end) {
  return end && gate_spread(G, kg, 0, c) <= kFactorBudget;
}

void decayed_products(Rows x1, Rows x2, Rows y, const Gates& G, int64_t kg, int c, int64_t K,
                      float alpha1, float* A1, float* A2, int64_t lda, Scratch& w,
                      const float* end) {
  if (kg <= 1) {
    // the masks below clear what the rows above the split leave unwritten (``lower_products``)
    lower_products(c, c, 1, K, alpha1, x1.p, x1.ld, y.p, y.ld, A1, lda);
    if (A2) lower_products(c, c, 1, K, 1.0f, x2.p, x2.ld, y.p, y.ld, A2, lda);
    if (kg == 1 && end_factored(G, 1, c, end)) {
      end_decay_rows(end, c, A1, A2, lda);
    } else if (kg == 1) {
      decay_rows(G, c, A1, A2, lda);
    }
  } else if (A2) {
    product_blocks(G, K, c, end, [&](const Block& b, const float* e) {
      product_block<true>(x1, x2, y, G, K, b, alpha1, A1, A2, lda, w, e);
    });
  } else {
    product_blocks(G, K, c, end, [&](const Block& b, const float* e) {
      product_block<false>(x1, x1, y, G, K, b, alpha1, A1, nullptr, lda, w, e);
    });
  }
  for (int i = 0; i < c; ++i) {  // the causal masks: j <= i, and j < i for A2
    float* row1 = A1 + i * lda;
    for (int j = i + 1; j < c; ++j) row1[j] = 0.0f;
    if (A2) {
      float* row2 = A2 + i * lda;
      for (int j = i; j < c; ++j) row2[j] = 0.0f;
    }
  }
}

void decayed_products_2x2(Rows x1, Rows x2, int n2, Rows y1, Rows y2, const Gates& G, int c,
                          int64_t K, float alpha1, float alpha2, float* A1, float* A2,
                          int64_t lda, Scratch& w, const float* end) {
  product_blocks(G, K, c, end, [&](const Block& b, const float* e) {
    quad_block(x1, x2, n2, y1, y2, G, K, b, c, alpha1, alpha2, A1, A2, lda, w, e);
  });
  for (int i = 0; i < c; ++i) {  // the causal masks, j <= i in each half
    for (float* row : {A1 + i * lda, i < n2 ? A2 + i * lda : nullptr}) {
      if (!row) continue;
      std::fill(row + i + 1, row + c, 0.0f);
      std::fill(row + c + i + 1, row + 2 * c, 0.0f);
    }
  }
}

void channel_product_backward(Rows x, Rows y, const Gates& G, int64_t K, int c, float alpha,
                              const float* dA, int64_t lda, float* dX, float* dY, Scratch& w,
                              const float* end) {
  product_blocks(G, K, c, end, [&](const Block& b, const float* e) {
    product_block_backward(x, y, G, K, b, alpha, dA, lda, dX, dY, w, e);
  });
}

namespace {

// The rows of ``direct_gate_share``'s blocks: the pairs of a block's rows with the rows before and
// after it are products (gemm), those inside it a loop.
constexpr int kShareRows = 16;

// The gates' share of the pairs of a diagonal block b of n rows whose gates' spread fits the
// budget, from its factors about one row (``factor_block``; with ``end``, the whole chunk about
// its last row): share[m] += sum_{i >= m, j < m} alpha dA_ij Xf_i Yf_j, every term a pair across
// m. For m in a run [s, e) of kShareRows rows: the pairs with j < s are sum_{i >= m} Xf_i Q_i,
// Q = alpha dA[:, :s] Yf[:s] (its rows i >= e summed once for the run, W); those with i >= e and
// s <= j < m are sum_{s <= j < m} Yf_j U_j, U = alpha dA[e:, s:e]^T Xf[e:]; those inside the run
// a loop (P_i = alpha sum_{s <= j < m} dA_ij Yf_j grown a column at a time).
void direct_gate_share(Rows x, Rows y, const Gates& G, int64_t K, const Block& b, float alpha,
                       const float* dA, int64_t lda, float* share, Scratch& w, const float* end) {
  factor_block<false, false>(x, x, y, G, K, b, w, end);
  const int n = b.n, Ki = static_cast<int>(K);
  const float *Xf = w.Xf.data(), *Yf = w.Yf.data();
  const float* dA0 = dA + b.i0 * lda + b.i0;  // the block's pair (i, j) at dA0[i lda + j]
  float *Q = w.dXf.data(), *U = w.dYf.data(), *P = w.Ey.data(), *Cs = w.Ex.data();  // [n, K]
  thread_local std::vector<float> sums;
  sums.resize(static_cast<size_t>(2 * K));
  float *W = sums.data(), *Bm = W + K;
  for (int s = 0; s < n; s += kShareRows) {
    const int e = std::min(s + kShareRows, n), nb = e - s;
    std::fill(W, W + K, 0.0f);
    std::fill(Cs, Cs + nb * K, 0.0f);
    if (s > 0) {  // Q_i for the rows i >= s (row i at Q + (i - s) K)
      gemm(false, false, n - s, K, s, alpha, dA0 + s * lda, lda, Yf, K, 0.0f, Q, K);
      for (int i = e; i < n; ++i) {
        const float *xf = Xf + i * K, *q = Q + (i - s) * K;
#pragma omp simd
        for (int c = 0; c < Ki; ++c) W[c] += xf[c] * q[c];
      }
      std::fill(Bm, Bm + K, 0.0f);  // Cs[m - s] = sum_{m <= i < e} Xf_i Q_i
      for (int i = e - 1; i >= s; --i) {
        const float *xf = Xf + i * K, *q = Q + (i - s) * K;
        float* cs = Cs + (i - s) * K;
#pragma omp simd
        for (int c = 0; c < Ki; ++c) {
          Bm[c] += xf[c] * q[c];
          cs[c] = Bm[c];
        }
      }
    }
    if (e < n) {
      gemm(true, false, nb, K, n - e, alpha, dA0 + e * lda + s, lda, Xf + e * K, K, 0.0f, U, K);
    } else {
      std::fill(U, U + nb * K, 0.0f);
    }
    std::fill(P, P + nb * K, 0.0f);
    std::fill(Bm, Bm + K, 0.0f);
    for (int m = s; m < e; ++m) {
      if (m > s) {  // column m - 1 of the run enters
        const float *yf = Yf + (m - 1) * K, *u = U + (m - 1 - s) * K;
#pragma omp simd
        for (int c = 0; c < Ki; ++c) Bm[c] += yf[c] * u[c];
        for (int i = m; i < e; ++i) {
          const float a = alpha * dA0[i * lda + m - 1];
          float* Pi = P + (i - s) * K;
#pragma omp simd
          for (int c = 0; c < Ki; ++c) Pi[c] += a * yf[c];
        }
      }
      if (m == 0) continue;  // no pair across the first row
      float* out = share + static_cast<int64_t>(b.i0 + m) * K;
      const float* cs = Cs + (m - s) * K;
#pragma omp simd
      for (int c = 0; c < Ki; ++c) out[c] += W[c] + cs[c] + Bm[c];
      for (int i = m; i < e; ++i) {
        const float *xf = Xf + i * K, *Pi = P + (i - s) * K;
#pragma omp simd
        for (int c = 0; c < Ki; ++c) out[c] += xf[c] * Pi[c];
      }
    }
  }
}

// The gates' share of the pairs of rows [i0, i0 + n) (``channel_gate_share``): within the budget
// one direct block; else the lower-left quarter about r, the last row of the upper half
// (exponents <= 0 both sides), then each half.
void quarter_gate_share(Rows x, Rows y, const Gates& G, int64_t K, int i0, int n, float alpha,
                        const float* dA, int64_t lda, float* share, Scratch& w) {
  if (n <= 1) return;
  if (gate_spread(G, K, i0, n) <= kFactorBudget) {
    const Block d{i0, n, i0, n, i0 + n / 2};
    direct_gate_share(x, y, G, K, d, alpha, dA, lda, share, w, nullptr);
    return;
  }
  const int h = n / 2, Ki = static_cast<int>(K);
  const Block b{i0 + h, n - h, i0, h, i0 + h - 1};
  factor_block<false, false>(x, x, y, G, K, b, w);
  const float* dAb = dA + b.i0 * lda + b.j0;
  gemm(false, false, b.n, K, b.m, alpha, dAb, lda, w.Yf.data(), K, 0.0f, w.dXf.data(), K);
  gemm(true, false, b.m, K, b.n, alpha, dAb, lda, w.Xf.data(), K, 0.0f, w.dYf.data(), K);
  // Lower rows m: the pairs i >= m, alpha_i = Xf_i dXf_i (the last row first).
  float* sum = w.Ex.data();  // [K], a running sum
  std::fill(sum, sum + K, 0.0f);
  for (int i = b.n - 1; i >= 0; --i) {
    const float *f = w.Xf.data() + i * K, *d = w.dXf.data() + i * K;
    float* out = share + static_cast<int64_t>(b.i0 + i) * K;
#pragma omp simd
    for (int c = 0; c < Ki; ++c) {
      sum[c] += f[c] * d[c];
      out[c] += sum[c];
    }
  }
  // Upper rows m: the pairs j < m, beta_j = Yf_j dYf_j (the first row gets none).
  std::fill(sum, sum + K, 0.0f);
  for (int j = 0; j < b.m; ++j) {
    const float *f = w.Yf.data() + j * K, *d = w.dYf.data() + j * K;
    float* out = share + static_cast<int64_t>(b.j0 + j) * K;
#pragma omp simd
    for (int c = 0; c < Ki; ++c) {
      out[c] += sum[c];
      sum[c] += f[c] * d[c];
    }
  }
  quarter_gate_share(x, y, G, K, i0, h, alpha, dA, lda, share, w);
  quarter_gate_share(x, y, G, K, i0 + h, n - h, alpha, dA, lda, share, w);
}

}  // namespace

void channel_gate_share(Rows x, Rows y, const Gates& G, int64_t K, int c, float alpha,
                        const float* dA, int64_t lda, float* share, Scratch& w,
                        const float* end) {
  if (end_factored(G, K, c, end)) {  // the whole chunk about its last row, from the end decays
    direct_gate_share(x, y, G, K, Block{0, c, 0, c, c - 1}, alpha, dA, lda, share, w, end);
    return;
  }
  quarter_gate_share(x, y, G, K, 0, c, alpha, dA, lda, share, w);
}

void token_decay_row(const Gates& G, int i, int c, const float* quotients, float* row) {
  if (quotients) {  // end_j / end_i, the diagonal 1 exactly (``end_decay_rows``)
    const float down = quotients[i];
#pragma omp simd
    for (int j = 0; j < i; ++j) row[j] = quotients[j] / down;
    row[i] = 1.0f;
    return;
  }
  const float G_i = G.hi[i], L_i = G.lo[i];
#pragma omp simd
  for (int j = 0; j < c; ++j) row[j] = decay(G_i, L_i, G.hi[j], G.lo[j]);
}

void token_decays(const Gates& G, int c, int64_t ldg, float* Gam, const float* end) {
  const float* quotients = end_factored(G, 1, c, end) ? end : nullptr;
  for (int i = 0; i < c; ++i) {
    float* row = Gam + static_cast<int64_t>(i) * ldg;
    token_decay_row(G, i, c, quotients, row);
    for (int j = i + 1; j < c; ++j) row[j] = 0.0f;
  }
}

// The gates' share of a decayed product's gradient: for M = X * Gamma (Gamma[i, j] =
// exp(G_i - G_j), causal: j <= i, or j < i when strict) and its gradient dM, the pair (i, j)
// holds g_m for j < m <= i, so dg_m gets sum_{i >= m > j} dM_ij M_ij, added to pairs[m]. dM and
// M are [c, ld] row-major, zero above the mask. Each pair is summed into the gates across it
// alone: as row i's share of G_i less column j's share of G_j, summed over m >= i (dg is the
// reversed cumulative sum of dG), a pair on both sides of m would cancel in float32, and an
// undecayed one (a run of zero gates: DeltaProduct's writes of one token) would swamp the dg of
// a steep gate, of the order of exp(g). The diagonal crosses no gate.
void product_gate_gradient(const float* dM, const float* M, int64_t ld, int c, float* pairs) {
  thread_local std::vector<float> below;  // below[j] = sum_{i >= m} dM_ij M_ij, m going down
  below.assign(static_cast<size_t>(std::max(c, 0)), 0.0f);
  float* col = below.data();
  for (int m = c - 1; m >= 1; --m) {
    const float *dMm = dM + m * ld, *Mm = M + m * ld;
    float across = 0.0f;
#pragma omp simd reduction(+ : across)
    for (int j = 0; j < m; ++j) {
      col[j] += dMm[j] * Mm[j];
      across += col[j];
    }
    pairs[m] += across;
  }
}

void times_decays(int c, float* dM, int64_t ldm, const float* Gam, int64_t ldg) {
  for (int i = 0; i < c; ++i) {
    float* row = dM + i * ldm;
    const float* decays = Gam + i * ldg;
#pragma omp simd
    for (int j = 0; j < c; ++j) row[j] *= decays[j];
  }
}

}  // namespace linattn_native
