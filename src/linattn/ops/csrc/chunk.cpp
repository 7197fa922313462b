// The chunk form fused chunk by chunk on the CPU (spec sections 5.1 and 8; DESIGN.md's table).
//
// The same algebra as ``chunk_function`` (its module docstring gives the equations), computed chunk
// by chunk with every block of a chunk in the cache: for each chunk of c <= C tokens of a head with
// incoming state S [K, V] and cumulative log-gates G_i = g_1 + ... + g_i,
//
//   1. gates:      Qd = scale q * exp(G),  Ke = k * exp(G_c - G),  D = exp(G_c)
//   2. masked:     A_qk[i, j] = scale sum_k q_ik k_jk exp(G_ik - G_jk)  (j <= i)
//   3. delta rule: L[i, j] = beta_i sum_k k_ik k_jk exp(G_ik - G_jk)  (j < i),
//                  (I + L) [W, U0] = diag(beta) [k * exp(G), v]   (the UT transform)
//                  U = U0 - W S                                  (linear attention: U = v)
//   4. outputs:    o = Qd S + A_qk U
//   5. state:      S <- D * S + Ke^T U
//
// Only step 5 carries anything from one chunk to the next. The heads of a thread are taken chunk
// by chunk in the inner loop, so that the rows read and written (the [B, T, H, D] layout keeps the
// H heads of a token side by side) stream through memory in order. Every product is one call of
// the BLAS that PyTorch links (MKL or OpenBLAS), on matrices of 64 x 64 or so that stay in the L1
// and L2 caches; the elementwise work (gates, masks) is in plain loops the compiler vectorises.
//
// ``chunk_forward`` runs these steps for every mechanism and saves the state entering each chunk;
// ``chunk_backward`` differentiates them for every mechanism, chunk by chunk from the last, each
// chunk recomputed from its saved state (memory linear in T).
//
// Inputs are float32, q, k [B, H, T, K], v [B, H, T, V], beta [B, H, T], g [B, H, T, 1 | K], each
// with unit stride in its last dimension (any strides elsewhere: the [B, T, H, D] tensors of the
// public ops are read in place). Every log-gate is <= 0 and every input finite (the public ops
// check), but a log-gate may be -inf (a reset): each is floored at kGateFloor, and the cumulative
// log-gates are summed exactly as pairs of floats (``Gates``), so that every decay
// exp(G_i - G_j) has float32's accuracy whatever the gates (resets, steep gates).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <tuple>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void strsm_(const char* side, const char* uplo, const char* transa, const char* diag, const int* m,
            const int* n, const float* alpha, const float* a, const int* lda, float* b,
            const int* ldb);
}

namespace {

// The BLAS takes 32-bit integers: a size or leading dimension beyond that range is refused (the
// entry points copy an input whose stride is too large, ``blas_rows``; sizes are checked there).
int blas_int(int64_t x) {
  TORCH_CHECK(x >= 0 && x <= INT32_MAX, "linattn_native: ", x,
              " exceeds the BLAS's 32-bit range");
  return static_cast<int>(x);
}

// The leading dimension of a row-major [rows, cols] operand as the BLAS requires it: >= max(1,
// cols). A single row's stride is never read, and may be anything (a 1-token slice of an
// expanded tensor has time stride 0, which the BLAS refuses): it is replaced by max(1, cols).
int blas_ld(int64_t rows, int64_t cols, int64_t ld) {
  const int64_t least = std::max<int64_t>(1, cols);
  if (rows <= 1) return blas_int(least);
  TORCH_CHECK(ld >= least, "linattn_native: a leading dimension ", ld, " < ", least);
  return blas_int(ld);
}

// Row-major C[m, n] = alpha op(A) op(B) + beta C, with op(A) [m, k] and op(B) [k, n]; A is stored
// [m, k] (or [k, m] when ta), B [k, n] (or [n, k] when tb). The BLAS is column-major, and a
// row-major matrix is its transpose read column-major: C^T = op(B)^T op(A)^T.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const char opa = ta ? 'T' : 'N', opb = tb ? 'T' : 'N';
  const int la = ta ? blas_ld(k, m, lda) : blas_ld(m, k, lda);
  const int lb = tb ? blas_ld(n, k, ldb) : blas_ld(k, n, ldb);
  const int lc = blas_ld(m, n, ldc);
  const int mi = blas_int(m), ni = blas_int(n), ki = blas_int(k);
  sgemm_(&opb, &opa, &ni, &mi, &ki, &alpha, B, &lb, A, &la, &beta, C, &lc);
}

// The triangular solve of ``unit_lower_solve`` (trans 'N') or its transpose (trans 'T').
void unit_upper_trsm(char trans, int64_t c, int64_t n, const float* L, int64_t ldl, float* X,
                     int64_t ldx) {
  if (c == 0 || n == 0) return;
  const char side = 'R', uplo = 'U', diag = 'U';
  const float one = 1.0f;
  const int ll = blas_ld(c, c, ldl), lx = blas_ld(c, n, ldx);
  const int ci = blas_int(c), ni = blas_int(n);
  strsm_(&side, &uplo, &trans, &diag, &ni, &ci, &one, L, &ll, X, &lx);
}

// Solve (I + L) X = X in place for unit-lower-triangular I + L [c, c] (row-major, stride ldl)
// and X [c, n] (row-major, stride ldx). Column-major this is X^T (I + L)^T = X^T, where the
// row-major L read column-major is the upper-triangular (I + L)^T.
void unit_lower_solve(int64_t c, int64_t n, const float* L, int64_t ldl, float* X, int64_t ldx) {
  unit_upper_trsm('N', c, n, L, ldl, X, ldx);
}

// Solve (I + L)^T X = X in place (the same storage as ``unit_lower_solve``): column-major,
// X^T (I + L) = X^T, the stored (I + L)^T transposed once more.
void unit_lower_solve_transposed(int64_t c, int64_t n, const float* L, int64_t ldl, float* X,
                                 int64_t ldx) {
  unit_upper_trsm('T', c, n, L, ldl, X, ldx);
}

// exp(x) for x <= 88, to about 2 ulp; results below the normal range are 0 (flushed, as the
// PyTorch path flushes decays below the smallest normal number). Branch-free, so loops over it
// vectorise: x = n ln 2 + r with |r| <= ln 2 / 2, exp(r) by its degree-7 Taylor polynomial.
__attribute__((always_inline)) inline float exp_flush(float x) {
  x = std::min(std::max(x, -104.0f), 88.0f);
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 2^23)
  float r = std::fma(n, -0.693145752f, x);  // ln 2 in two parts: the product is exact
  r = std::fma(n, -1.42860677e-06f, r);
  float p = 1.98412698e-04f;  // 1/7!
  p = std::fma(p, r, 1.38888889e-03f);
  p = std::fma(p, r, 8.33333333e-03f);
  p = std::fma(p, r, 4.16666667e-02f);
  p = std::fma(p, r, 1.66666667e-01f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t e = std::max(static_cast<int32_t>(n) + 127, 0);  // biased exponent of 2^n
  return p * __builtin_bit_cast(float, e << 23);  // e = 0: 2^n below the normal range, 0
}

// A log-gate spread that the factored product exp(G_i - G_r) exp(G_r - G_j) can carry in float32:
// each factor stays below FLT_MAX^(1/4), so products of inputs of modest size cannot overflow
// (``_blockmath.factor_budget``).
const float kFactorBudget = std::log(FLT_MAX) / 4.0f;

// The floor of a log-gate, log(FLT_MIN * FLT_EPSILON) - 1 (``_blockmath.gate_floor``): exp of
// anything below it is exactly 0 in float32, so flooring changes no decay, and it maps a reset
// (g = -inf) to a finite number. A literal, so that the loops that compare with it vectorise.
constexpr float kGateFloor = -104.278931f;

// The cumulative log-gates of a chunk as pairs of floats, G = hi + lo: hi the float32 running sum,
// lo its rounding errors, summed (each [c, kg], row-major; ``cumulative_gates``). A float32 G
// would keep 5 digits of a gate of -0.05 after a reset of -104, and a difference G_i - G_j of two large sums would lose the rest; from the pairs,
// (hi_i - hi_j) + (lo_i - lo_j) is the exact difference to float32 rounding however large G is
// (hi_i - hi_j is exact where the two are within a factor 2, else rounded once), at the cost of
// two float operations more per exponent (a double difference costs more: measured, 30% more per
// exponential, against 0-10% for the pair; in GLA's forward pass 3% in all).
struct Gates {
  float* hi;
  float* lo;
};

// One row of ``cumulative_gates``: (hi, lo) = (hi_prev, lo_prev) + max(g, floor), the rounding of
// hi_prev + g kept in lo (Knuth's TwoSum, exact in float32 arithmetic: cheaper here than a double
// sum, which measured 20% of GLA's forward pass). Not inlined, and the floor a parameter: GCC
// vectorises the loop only so (with kGateFloor folded in, it does not).
__attribute__((noinline)) void cumulative_row(const float* __restrict g, int64_t kg,
                                              const float* __restrict hi_prev,
                                              const float* __restrict lo_prev,
                                              float* __restrict hi, float* __restrict lo,
                                              float floor) {
#pragma omp simd
  for (int64_t ch = 0; ch < kg; ++ch) {
    const float x = g[ch] < floor ? floor : g[ch], a = hi_prev[ch];
    const float s = a + x, x_part = s - a;
    const float rounding = (a - (s - x_part)) + (x - x_part);
    hi[ch] = s;
    lo[ch] = lo_prev[ch] + rounding;
  }
}

// G_i = sum_{l <= i} max(g_l, kGateFloor) for c rows of kg gates (row stride sg) as ``G``'s pairs;
// ``zeros``: kg zeros (the sum before the first row).
void cumulative_gates(const float* gc, int64_t sg, int c, int64_t kg, const float* zeros,
                      const Gates& G) {
  for (int i = 0; i < c; ++i) {
    const int64_t at = static_cast<int64_t>(i) * kg;
    const float* hi_prev = i == 0 ? zeros : G.hi + at - kg;
    const float* lo_prev = i == 0 ? zeros : G.lo + at - kg;
    cumulative_row(gc + i * sg, kg, hi_prev, lo_prev, G.hi + at, G.lo + at, kGateFloor);
  }
}

// out = sum where g > floor, else 0 (a floored gate's gradient), for one row of kg gates; not
// inlined, for the reason given at ``cumulative_row``.
__attribute__((noinline)) void floored_gradient_row(const float* __restrict sum,
                                                    const float* __restrict g, int64_t kg,
                                                    float* __restrict out, float floor) {
#pragma omp simd
  for (int64_t ch = 0; ch < kg; ++ch) out[ch] = g[ch] > floor ? sum[ch] : 0.0f;
}

// exp(G_i - G_j) from the pairs of G_i and G_j (``Gates``).
__attribute__((always_inline)) inline float decay(float hi_i, float lo_i, float hi_j, float lo_j) {
  return exp_flush((hi_i - hi_j) + (lo_i - lo_j));
}

// One thread's scratch memory, sized for one chunk of one head (64-bit sizes: C x C overflows an
// int from C = 46,341 on).
struct Scratch {
  std::vector<float> zeros;  // ``cumulative_gates``
  std::vector<float> G, Qd, Ke, A, L, X, Xf, Yf, Ex, Ey, dXf, dYf;  // G: hi, then lo (``Gates``)
  Scratch(int64_t C, int64_t K, int64_t V)
      : zeros(K, 0.0f), G(2 * C * K), Qd(C * K), Ke(C * K), A(C * C), L(C * C), X(C * (K + V)),
        Xf(C * K), Yf(C * K), Ex(C * K), Ey(C * K), dXf(C * K), dYf(C * K) {}
};

// Rows [i0, i0 + n) x [j0, j0 + m) of the decayed product sum_k x_ik y_jk exp(G_ik - G_jk) with one
// reference row r for the whole block: x * exp(G - G_r) times (y * exp(G_r - G))^T.
void factored_block(const float* X, int64_t ldx, const float* Y, int64_t ldy, const Gates& G,
                    int64_t K, int i0, int n, int j0, int m, int r, float alpha, float* A,
                    int64_t lda, Scratch& w) {
  const float *Gr = G.hi + static_cast<int64_t>(r) * K, *Lr = G.lo + static_cast<int64_t>(r) * K;
  if (i0 == j0 && n == m) {  // a diagonal block: the rows' exponents are d and -d, formed once
    for (int i = 0; i < n; ++i) {
      const float *x = X + (i0 + i) * ldx, *y = Y + (i0 + i) * ldy;
      const float* Gi = G.hi + static_cast<int64_t>(i0 + i) * K;
      const float* Li = G.lo + static_cast<int64_t>(i0 + i) * K;
      float *fx = w.Xf.data() + static_cast<int64_t>(i) * K, *fy = w.Yf.data() + i * K;
#pragma omp simd
      for (int c = 0; c < K; ++c) {
        const float d = (Gi[c] - Gr[c]) + (Li[c] - Lr[c]);
        fx[c] = x[c] * exp_flush(d);
        fy[c] = y[c] * exp_flush(-d);
      }
    }
    gemm(false, true, n, m, K, alpha, w.Xf.data(), K, w.Yf.data(), K, 0.0f, A + i0 * lda + j0,
         lda);
    return;
  }
  for (int i = 0; i < n; ++i) {
    const float* x = X + (i0 + i) * ldx;
    const float* Gi = G.hi + static_cast<int64_t>(i0 + i) * K;
    const float* Li = G.lo + static_cast<int64_t>(i0 + i) * K;
    float* out = w.Xf.data() + static_cast<int64_t>(i) * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) out[c] = x[c] * decay(Gi[c], Li[c], Gr[c], Lr[c]);
  }
  for (int j = 0; j < m; ++j) {
    const float* y = Y + (j0 + j) * ldy;
    const float* Gj = G.hi + static_cast<int64_t>(j0 + j) * K;
    const float* Lj = G.lo + static_cast<int64_t>(j0 + j) * K;
    float* out = w.Yf.data() + static_cast<int64_t>(j) * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) out[c] = y[c] * decay(Gr[c], Lr[c], Gj[c], Lj[c]);
  }
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
  for (int i = 0; i < n; ++i) {
    const float* x = X + (i0 + i) * ldx;
    const float* Gi = G.hi + static_cast<int64_t>(i0 + i) * K;
    const float* Li = G.lo + static_cast<int64_t>(i0 + i) * K;
    float *e = w.Ex.data() + static_cast<int64_t>(i) * K, *f = w.Xf.data() + i * K;
    if (i0 == j0 && n == m) {  // a diagonal block: the rows' exponents are d and -d, formed once
      const float* y = Y + (i0 + i) * ldy;
      float *ey = w.Ey.data() + static_cast<int64_t>(i) * K, *fy = w.Yf.data() + i * K;
#pragma omp simd
      for (int c = 0; c < K; ++c) {
        const float d = (Gi[c] - Gr[c]) + (Li[c] - Lr[c]);
        e[c] = exp_flush(d);
        f[c] = x[c] * e[c];
        ey[c] = exp_flush(-d);
        fy[c] = y[c] * ey[c];
      }
      continue;
    }
#pragma omp simd
    for (int c = 0; c < K; ++c) {
      e[c] = decay(Gi[c], Li[c], Gr[c], Lr[c]);
      f[c] = x[c] * e[c];
    }
  }
  for (int j = 0; !(i0 == j0 && n == m) && j < m; ++j) {
    const float* y = Y + (j0 + j) * ldy;
    const float* Gj = G.hi + static_cast<int64_t>(j0 + j) * K;
    const float* Lj = G.lo + static_cast<int64_t>(j0 + j) * K;
    float *e = w.Ey.data() + static_cast<int64_t>(j) * K, *f = w.Yf.data() + j * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) {
      e[c] = decay(Gr[c], Lr[c], Gj[c], Lj[c]);
      f[c] = y[c] * e[c];
    }
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
  for (int j = 0; !diagonal && j < m; ++j) {
    const float* y = Y + (j0 + j) * ldy;
    const float* Gj = G.hi + static_cast<int64_t>(j0 + j) * K;
    const float* Lj = G.lo + static_cast<int64_t>(j0 + j) * K;
    float* out = w.Yf.data() + static_cast<int64_t>(j) * K;
#pragma omp simd
    for (int c = 0; c < K; ++c) out[c] = y[c] * decay(Gr[c], Lr[c], Gj[c], Lj[c]);
  }
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

// Flush subnormal numbers to zero on this thread while alive (x86): decays deep below the normal
// range would otherwise run the arithmetic on them tens of times slower.
struct FlushSubnormals {
#if defined(__SSE__)
  unsigned int saved = _mm_getcsr();
  FlushSubnormals() { _mm_setcsr(saved | 0x8040); }  // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved); }
#endif
};

#if defined(__linux__) && defined(MADV_HUGEPAGE)
// A cache of the large blocks of memory the kernels' outputs live in (as PyTorch's CUDA caching
// allocator keeps GPU memory). Memory that goes back to the system comes back zeroed by the kernel
// at its first touch: measured on this project's machine, 5 of linear attention's 44 ms forward at
// T = 16,384 went to zeroing its fresh 32 MiB output. A block freed by its tensor is kept here, up
// to LINATTN_CACHE_MIB in all (default 1024; 0 keeps nothing), and serves the next output of the
// same size (training repeats its sizes every step). A request that finds no block of its size
// first returns every kept block to the system, so that the cache never adds to a peak of
// memory; ``cache_release`` empties it. Blocks are mapped on 2 MiB boundaries and backed by 2 MiB
// pages where the kernel allows it (transparent huge pages in "madvise" mode): the first touch of
// a fresh 32 MiB tensor then costs 4 ms instead of 15 ms.
class BlockCache {
 public:
  static constexpr size_t kHuge = size_t{1} << 21;
  static constexpr size_t kMinBytes = size_t{4} << 20;  // smaller tensors: PyTorch's allocator

  struct Block {
    void* base;     // the mapping
    size_t mapped;  // its length
    void* data;     // its first 2 MiB boundary
    size_t bytes;   // the usable length from data: a multiple of 2 MiB
  };

  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;  // never destroyed: tensors may outlive exit
    return *cache;
  }

  // A block of at least ``nbytes`` (rounded up to 2 MiB), or nullptr if the mapping fails.
  Block* take(size_t nbytes) {
    const size_t bytes = (nbytes + kHuge - 1) / kHuge * kHuge;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = 0; i < kept_.size(); ++i) {
        if (kept_[i]->bytes == bytes) {
          Block* block = kept_[i];
          kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(i));
          kept_bytes_ -= bytes;
          return block;
        }
      }
    }
    release();  // no block of this size: the others go back before new memory is mapped
    const size_t mapped = bytes + kHuge;
    void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    const uintptr_t first = (reinterpret_cast<uintptr_t>(base) + kHuge - 1) & ~(kHuge - 1);
    void* data = reinterpret_cast<void*>(first);
    madvise(data, bytes, MADV_HUGEPAGE);
    return new Block{base, mapped, data, bytes};
  }

  // Keep a block freed by its tensor (within the limit), or return it to the system.
  void give(Block* block) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (kept_bytes_ + block->bytes <= limit()) {
        kept_.push_back(block);
        kept_bytes_ += block->bytes;
        return;
      }
    }
    unmap(block);
  }

  // Return every kept block to the system; the bytes returned.
  int64_t release() {
    std::vector<Block*> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(kept_);
      kept_bytes_ = 0;
    }
    int64_t bytes = 0;
    for (Block* block : blocks) {
      bytes += static_cast<int64_t>(block->bytes);
      unmap(block);
    }
    return bytes;
  }

  int64_t kept_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(kept_bytes_);
  }

 private:
  static size_t limit() {
    const char* text = std::getenv("LINATTN_CACHE_MIB");
    const long long mib = text != nullptr ? std::atoll(text) : 1024;
    return mib > 0 ? static_cast<size_t>(mib) << 20 : 0;
  }

  static void unmap(Block* block) {
    munmap(block->base, block->mapped);
    delete block;
  }

  std::mutex mutex_;
  std::vector<Block*> kept_;
  size_t kept_bytes_ = 0;
};

void give_back(void* block) {
  BlockCache::instance().give(static_cast<BlockCache::Block*>(block));
}

// An uninitialised tensor; from 4 MiB up, in a block of ``BlockCache``. Its storage stays
// resizable (a resize moves it to PyTorch's allocator and gives the block back).
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const size_t nbytes =
      static_cast<size_t>(c10::multiply_integers(sizes)) * options.dtype().itemsize();
  BlockCache::Block* block =
      nbytes >= BlockCache::kMinBytes ? BlockCache::instance().take(nbytes) : nullptr;
  if (block == nullptr) return at::empty(sizes, options);
  c10::DataPtr data(block->data, block, &give_back, c10::Device(c10::kCPU));
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes),
                       std::move(data), c10::GetCPUAllocator(), /*resizable=*/true);
  return at::empty({0}, options).set_(storage, 0, sizes);
}

int64_t cache_release() { return BlockCache::instance().release(); }
int64_t cache_bytes() { return BlockCache::instance().kept_bytes(); }
#else
at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options);
}
int64_t cache_release() { return 0; }
int64_t cache_bytes() { return 0; }
#endif

// The largest chunk (C = min(chunk_size, T)) the kernels take: each thread keeps a few C x C
// blocks (256 MiB each at this size), and a larger C is never faster. ``_engine.MAX_CHUNK``.
constexpr int64_t kMaxChunk = 8192;

// An entry point's checks, before any work, each naming the argument: dtype, device and shape, so
// that no call, from Python or through torch.ops, reads or writes out of bounds.
struct Checks {
  const char* op;

  void float32_cpu(const char* name, const at::Tensor& x) const {
    TORCH_CHECK(x.defined(), op, ": ", name, " is undefined");
    TORCH_CHECK(x.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ",
                x.scalar_type());
    TORCH_CHECK(x.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", x.device());
  }

  void shape(const char* name, const at::Tensor& x, at::IntArrayRef sizes,
             const char* dims) const {
    float32_cpu(name, x);
    TORCH_CHECK(x.sizes() == sizes, op, ": ", name, " must be of shape ", dims, " = ", sizes,
                ", got ", x.sizes());
  }

  // g: [B, H, T, 1] (one log-gate per token) or [B, H, T, K] (one per channel); its width.
  int64_t gate(const at::Tensor& g, int64_t B, int64_t H, int64_t T, int64_t K) const {
    float32_cpu("g", g);
    TORCH_CHECK(g.dim() == 4 && (g.size(3) == 1 || g.size(3) == K), op,
                ": g must be of shape [B, H, T, 1 | K] = [", B, ", ", H, ", ", T, ", 1 | ", K,
                "], got ", g.sizes());
    shape("g", g, {B, H, T, g.size(3)}, "[B, H, T, 1 | K]");
    return g.size(3);
  }
};

// The sizes of a chunk-form call: q [B, H, T, K], v [B, H, T, V], N chunks of C tokens, with
// C = min(C, T) (the same chunks: one chunk holds the whole sequence either way). 64-bit
// throughout; the BLAS's 32-bit sizes and leading dimensions are checked here, before any work.
struct Sizes {
  int64_t B, H, T, K, V, P, N, C;
  Sizes(const Checks& check, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
        int64_t C64) {
    check.float32_cpu("q", q);
    TORCH_CHECK(q.dim() == 4, check.op, ": q must be of shape [B, H, T, K], got ", q.sizes());
    B = q.size(0), H = q.size(1), T = q.size(2), K = q.size(3);
    check.shape("k", k, q.sizes(), "[B, H, T, K]");
    check.float32_cpu("v", v);
    TORCH_CHECK(v.dim() == 4, check.op, ": v must be of shape [B, H, T, V], got ", v.sizes());
    V = v.size(3);
    check.shape("v", v, {B, H, T, V}, "[B, H, T, V]");
    TORCH_CHECK(C64 >= 1, check.op, ": C (the chunk size) must be >= 1, got ", C64);
    C = std::min(C64, std::max<int64_t>(T, 1));
    TORCH_CHECK(C <= kMaxChunk, check.op, ": C = min(chunk size, T) = ", C, " exceeds ",
                kMaxChunk, " (a thread keeps C x C blocks: use a smaller chunk size)");
    TORCH_CHECK(K + V <= INT32_MAX && H * std::max(K, V) <= INT32_MAX, check.op, ": K = ", K,
                ", V = ", V, ", H = ", H, " exceed the BLAS's 32-bit sizes");
    P = B * H;
    N = (T + C - 1) / C;
  }
};

// x [B, H, T, D] as the BLAS reads its rows: in place when each row is contiguous (unit stride
// along D, or D <= 1) and the rows a valid leading dimension apart (T <= 1, or a time stride from
// D up to the BLAS's 32-bit range); otherwise a contiguous copy (an expanded time dimension,
// overlapping rows, a transposed last dimension, a huge stride).
at::Tensor blas_rows(const at::Tensor& x) {
  const int64_t T = x.size(2), D = x.size(3);
  const bool unit = D <= 1 || x.stride(3) == 1;
  const bool rows = T <= 1 || (x.stride(2) >= D && x.stride(2) <= INT32_MAX);
  return unit && rows ? x : at::empty(x.sizes(), x.options()).copy_(x);
}

// x [..., D] with unit stride along D (as the elementwise loops read it), else a contiguous copy.
at::Tensor unit_rows(const at::Tensor& x) {
  return x.size(-1) <= 1 || x.stride(-1) == 1 ? x : x.contiguous();
}

// A fresh [B, T, H, D] tensor seen as [B, H, T, D]: the public layout, written head by head.
at::Tensor fresh_public(const Sizes& n, int64_t D, const at::TensorOptions& options) {
  return fresh({n.B, n.T, n.H, D}, options).transpose(1, 2);
}

// The first row of chunk t0 of head (b, h) in a [B, H, T, ...] tensor with any strides.
template <typename T>
T* chunk_rows(const at::Tensor& x, T* base, int64_t b, int64_t h, int64_t t0) {
  return base + b * x.stride(0) + h * x.stride(1) + t0 * x.stride(2);
}

}  // namespace

// o [B, H, T, V] (a view of a [B, T, H, V] tensor), the final state [B, H, K, V], and (keep) the
// state entering every chunk [N, B H, K, V] for the backward pass (else an empty tensor).
std::tuple<at::Tensor, at::Tensor, at::Tensor> chunk_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& beta_opt, const c10::optional<at::Tensor>& g_opt,
    const at::Tensor& S0, double scale_d, int64_t C64, bool keep) {
  const Checks check{"linattn_native.chunk_forward"};
  const Sizes sz(check, q_in, k_in, v_in, C64);
  const int64_t B = sz.B, H = sz.H, T = sz.T, K = sz.K, V = sz.V, P = sz.P, N = sz.N, C = sz.C;
  const bool delta = beta_opt.has_value();
  const bool gated = g_opt.has_value();
  if (delta) check.shape("beta", *beta_opt, {B, H, T}, "[B, H, T]");
  const int64_t kg = gated ? check.gate(*g_opt, B, H, T, K) : 0;
  check.shape("S0", S0, {B, H, K, V}, "[B, H, K, V]");
  const at::Tensor q = blas_rows(q_in), k = blas_rows(k_in), v = blas_rows(v_in);
  const at::Tensor beta = delta ? *beta_opt : at::Tensor();
  const at::Tensor g = gated ? unit_rows(*g_opt) : at::Tensor();
  const float scale = static_cast<float>(scale_d);

  at::Tensor o = fresh_public(sz, V, q.options());
  // The running states, contiguous (a clone keeps the strides of a transposed S0 otherwise).
  at::Tensor S = S0.reshape({P, K, V}).clone(at::MemoryFormat::Contiguous);
  at::Tensor states = keep ? fresh({N, P, K, V}, q.options()) : at::empty({0}, q.options());

  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float* bp = delta ? beta.data_ptr<float>() : nullptr;
  const float* gp = gated ? g.data_ptr<float>() : nullptr;
  float *op = o.data_ptr<float>(), *Sp = S.data_ptr<float>();
  float* statep = keep ? states.data_ptr<float>() : nullptr;

  at::parallel_for(0, P, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    Scratch w(C, K, V);
    const int Ki = static_cast<int>(K), Vi = static_cast<int>(V);
    const int64_t ldx = K + V;  // X = [W | U] after the solve
    for (int64_t n = 0; n < N; ++n) {
      const int64_t t0 = n * C;
      const int c = static_cast<int>(std::min<int64_t>(C, T - t0));
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t b = p / H, h = p % H;
        const float* Q = chunk_rows(q, qp, b, h, t0);
        const float* Kc = chunk_rows(k, kp, b, h, t0);
        const float* Vc = chunk_rows(v, vp, b, h, t0);
        float* O = chunk_rows(o, op, b, h, t0);
        const int64_t ldq = q.stride(2), ldk = k.stride(2), ldv = v.stride(2), ldo = o.stride(2);
        float* Sh = Sp + p * K * V;
        if (keep) std::memcpy(statep + (n * P + p) * K * V, Sh, sizeof(float) * K * V);

        // 1. Gates: the cumulative log-gates G, Qd = scale q exp(G), Ke = k exp(G_c - G).
        const float* Qread = Q;  // the rows that read the incoming state, times q_alpha
        int64_t ldqr = ldq;
        float q_alpha = scale;
        const float* Kend = Kc;  // the rows that write the state
        int64_t ldke = ldk;
        const Gates G{w.G.data(), w.G.data() + static_cast<int64_t>(C) * K};
        if (gated) {
          cumulative_gates(chunk_rows(g, gp, b, h, t0), g.stride(2), c, kg, w.zeros.data(), G);
          const float* Gc = G.hi + static_cast<int64_t>(c - 1) * kg;
          const float* Lc = G.lo + static_cast<int64_t>(c - 1) * kg;
          for (int i = 0; i < c; ++i) {
            const float* Gi = G.hi + static_cast<int64_t>(i) * kg;
            const float* Li = G.lo + static_cast<int64_t>(i) * kg;
            const float* qi = Q + i * ldq;
            const float* ki = Kc + i * ldk;
            float* qd = w.Qd.data() + static_cast<int64_t>(i) * K;
            float* ke = w.Ke.data() + static_cast<int64_t>(i) * K;
            if (kg == 1) {
              const float a = scale * exp_flush(Gi[0] + Li[0]), e = decay(Gc[0], Lc[0], Gi[0], Li[0]);
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) {
                qd[ch] = a * qi[ch];
                ke[ch] = e * ki[ch];
              }
            } else {
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) {
                qd[ch] = scale * qi[ch] * exp_flush(Gi[ch] + Li[ch]);
                ke[ch] = ki[ch] * decay(Gc[ch], Lc[ch], Gi[ch], Li[ch]);
              }
            }
          }
          Qread = w.Qd.data(), ldqr = K, q_alpha = 1.0f;
          Kend = w.Ke.data(), ldke = K;
        }

        // 2. The masked, decayed scores inside the chunk.
        //    The delta rule's A_kk (L) with it, sharing its decays.
        float *A = w.A.data(), *L = w.L.data();
        if (delta) {
          decayed_product_pair(Q, ldq, Kc, ldk, Kc, ldk, G, kg, c, Ki, scale, A, L, C, w);
        } else {
          decayed_products(Q, ldq, Kc, ldk, G, kg, c, Ki, false, scale, A, C, w);
        }

        // 3. Pseudo-values: U = v (additive rule), or the UT transform and U = U0 - W S.
        const float* U = Vc;
        int64_t ldu = ldv;
        if (delta) {
          const float* bc = chunk_rows(beta, bp, b, h, t0);
          const int64_t sb = beta.stride(2);
          float* X = w.X.data();
          for (int i = 0; i < c; ++i) {
            const float bi = bc[i * sb];
            float* Li = L + static_cast<int64_t>(i) * C;
#pragma omp simd
            for (int j = 0; j < i; ++j) Li[j] *= bi;
            const float* ki = Kc + i * ldk;
            const float* vi = Vc + i * ldv;
            float* xi = X + i * ldx;
            // k exp(G) = Qd / (scale q) * k: recomputed from G (exact for no gate)
            if (kg == 0) {
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) xi[ch] = bi * ki[ch];
            } else if (kg == 1) {
              const float a = bi * exp_flush(G.hi[i] + G.lo[i]);
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) xi[ch] = a * ki[ch];
            } else {
              const float *Gi = G.hi + static_cast<int64_t>(i) * K, *Li = G.lo + i * K;
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) xi[ch] = bi * ki[ch] * exp_flush(Gi[ch] + Li[ch]);
            }
#pragma omp simd
            for (int ch = 0; ch < Vi; ++ch) xi[K + ch] = bi * vi[ch];
          }
          unit_lower_solve(c, K + V, L, C, X, ldx);  // X = [W | U0]
          gemm(false, false, c, Vi, Ki, -1.0f, X, ldx, Sh, V, 1.0f, X + K, ldx);  // U = U0 - W S
          U = X + K, ldu = ldx;
        }

        // 4. Outputs: the read of the incoming state plus the masked product inside the chunk.
        gemm(false, false, c, Vi, Ki, q_alpha, Qread, ldqr, Sh, V, 0.0f, O, ldo);
        gemm(false, false, c, Vi, c, 1.0f, A, C, U, ldu, 1.0f, O, ldo);

        // 5. The state leaving the chunk: S <- D * S + Ke^T U.
        if (gated) {
          const float* Gc = G.hi + static_cast<int64_t>(c - 1) * kg;
          const float* Lc = G.lo + static_cast<int64_t>(c - 1) * kg;
          for (int ch = 0; ch < Ki; ++ch) {
            const float d = exp_flush(Gc[kg == 1 ? 0 : ch] + Lc[kg == 1 ? 0 : ch]);
            float* row = Sh + ch * V;
#pragma omp simd
            for (int j = 0; j < Vi; ++j) row[j] *= d;
          }
        }
        gemm(true, false, Ki, Vi, c, 1.0f, Kend, ldke, U, ldu, 1.0f, Sh, V);
      }
    }
  });
  return {o, S.view({B, H, K, V}), states};
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

// The backward pass of the chunk form, every mechanism of DESIGN.md's table, chunk by chunk from
// the last, from the states the forward pass saved: without decay (kg = 0: linear attention and,
// with beta, the delta rule: every gate below is 1 and dg is not formed), one log-gate per token
// (kg = 1: scalar decay, Mamba-2 style, and with beta Gated DeltaNet) or one per channel (kg = K:
// GLA and, with beta, KDA). Recomputed per chunk,
// with G [c, kg] the cumulative log-gates: Qd = scale q exp(G), Ke = k exp(G_c - G),
// Kd = k exp(G), D = Diag(exp G_c) on the state's rows; A_qk = scale decayed(Q K^T) (j <= i);
// delta rule: A_kk = decayed(K K^T) (j < i), (I + diag(beta) A_kk) [W | U0] = diag(beta) [Kd | V],
// U = U0 - W S (else U = V). Then, with dS' the gradient of the state leaving the chunk:
//
//   dU = A_qk^T dO + Ke dS'       dA = mask(dO U^T)       dQd = dO S^T       dKe = U dS'^T
//   dQ = scale exp(G) dQd + dQ_A            dK = exp(G_c - G) dKe + dK_A
//   dS = D dS' + Qd^T dO - W^T dU
//   delta rule: dR_v = T^{-T} dU, dR_k = -dR_v S^T, dT = -(dR_k W^T + dR_v U0^T) (j < i),
//               dV = beta dR_v, dK += beta exp(G) dR_k + dK_L with dL = diag(beta) dT,
//               dbeta = rows of (dT * A_kk) + dR_k . Kd + dR_v . V
//
// where dQ_A, dK_A (dK_L) are the gradients of A_qk's (A_kk's) two factors: for kg = 1, with
// Gamma[i, j] = exp(G_i - G_j), (dA * Gamma) K and (dA * Gamma)^T Q times scale; for kg = K, block
// by block as ``channel_diagonal`` forms the product. The gates: dG = dQd * Qd (+ beta dR_k * Kd)
// row by row; each product's share off its diagonal (X * dX - Y * dY for its factors X, Y; for
// kg = 1 the row sums of dM * M less its column sums, ``product_gate_gradient``); and
// D <dS', S> (row by row of S) for G_c. With kg = 1 each term is summed over the channels. dg is
// the reversed cumulative sum of dG inside the chunk (G_i = g_1 + ... + g_i) plus Ke's share,
// sum_{i < t} dKe_i * Ke_i. Terms without decay (the products' diagonals, Ke_c) never enter dg:
// their shares cancel exactly, and their rounding would swamp the small dg of steep gates.
//
// Returns dq, dk [B, H, T, K], dv [B, H, T, V], dbeta [B, H, T] (an empty tensor for the additive
// rule), dg [B, H, T, kg] (an empty tensor without decay; views of [B, T, H, ...] tensors) and dS0.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> chunk_backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& beta_opt, const c10::optional<at::Tensor>& g_opt,
    const at::Tensor& states_in, const at::Tensor& d_o_in, const at::Tensor& dS_final,
    double scale_d, int64_t C64) {
  const Checks check{"linattn_native.chunk_backward"};
  const Sizes sz(check, q_in, k_in, v_in, C64);
  const int64_t B = sz.B, H = sz.H, T = sz.T, K = sz.K, V = sz.V, P = sz.P, N = sz.N, C = sz.C;
  const bool delta = beta_opt.has_value();
  const bool gated = g_opt.has_value();
  if (delta) check.shape("beta", *beta_opt, {B, H, T}, "[B, H, T]");
  const int64_t kg = gated ? check.gate(*g_opt, B, H, T, K) : 0;
  check.shape("states", states_in, {N, P, K, V}, "[ceil(T / C), B H, K, V]");
  check.shape("d_o", d_o_in, {B, H, T, V}, "[B, H, T, V]");
  check.shape("dS_final", dS_final, {B, H, K, V}, "[B, H, K, V]");
  const at::Tensor q = blas_rows(q_in), k = blas_rows(k_in), v = blas_rows(v_in);
  const at::Tensor d_o = blas_rows(d_o_in), states = states_in.contiguous();
  const at::Tensor beta = delta ? *beta_opt : at::Tensor();
  const at::Tensor g = gated ? unit_rows(*g_opt) : at::Tensor();
  const int64_t kr = std::max<int64_t>(kg, 1);  // gates per row held below (no decay: G = 0)
  const bool channel = kg > 1;
  const float scale = static_cast<float>(scale_d);
  at::Tensor dq = fresh_public(sz, K, q.options()), dk = fresh_public(sz, K, q.options());
  at::Tensor dv = fresh_public(sz, V, q.options());
  at::Tensor dg = gated ? fresh_public(sz, kg, q.options()) : at::empty({0}, q.options());
  at::Tensor dbeta = delta ? at::empty({B, T, H}, q.options()).transpose(1, 2)
                           : at::empty({0}, q.options());
  at::Tensor dS = dS_final.reshape({P, K, V}).clone(at::MemoryFormat::Contiguous);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = gated ? g.data_ptr<float>() : nullptr, *sp = states.data_ptr<float>();
  const float* bp = delta ? beta.data_ptr<float>() : nullptr;
  const float* dop = d_o.data_ptr<float>();
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  float *dbp = delta ? dbeta.data_ptr<float>() : nullptr;
  float* dgp = gated ? dg.data_ptr<float>() : nullptr;
  float* dSp = dS.data_ptr<float>();

  at::parallel_for(0, P, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    Scratch w(C, K, V);
    const int Ki = static_cast<int>(K), Vi = static_cast<int>(V);
    const int64_t ldx = K + V, CC = static_cast<int64_t>(C) * C, CK = C * K, CG = C * kr;
    std::vector<float> Gam(kg == 1 ? CC : 0), Aqk(CC), Akk(CC), L(CC), dA(CC), X(C * ldx),
        U(C * V), dU(C * V), dRk(CK), Qd(CK), Ke(CK), Kd(CK), dQd(CK), dKe(CK), dXm(CK), dYm(CK),
        eG(CG), eEnd(CG), dG(CG), dGe(CG), dG_diag(C), Dv(kr), dG_end(kr);
    const Gates G{w.G.data(), w.G.data() + static_cast<int64_t>(C) * K};  // [c, kr] each
    for (int64_t n = N - 1; n >= 0; --n) {
      const int64_t t0 = n * C;
      const int c = static_cast<int>(std::min<int64_t>(C, T - t0));
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t b = p / H, h = p % H;
        auto at_row = [&](const at::Tensor& x, auto* base) {
          return chunk_rows(x, base, b, h, t0);
        };
        const float *Q = at_row(q, qp), *Kc = at_row(k, kp), *Vc = at_row(v, vp);
        const float* dO = at_row(d_o, dop);
        float *dQ = at_row(dq, dqp), *dK = at_row(dk, dkp), *dV = at_row(dv, dvp);
        const int64_t ldq = q.stride(2), ldk = k.stride(2), ldv = v.stride(2);
        const int64_t lddo = d_o.stride(2), lddq = dq.stride(2), lddk = dk.stride(2),
                      lddv = dv.stride(2);
        const float* S = sp + (n * P + p) * K * V;  // the state entering the chunk
        float* dSh = dSp + p * K * V;               // dS': the state leaving it

        // 1. Gates: G, exp(G), exp(G_c - G), D; Qd, Ke, Kd; Gamma for one gate per token.
        //    Without decay these rows are the inputs themselves (the scale folded into products).
        if (gated) {
          cumulative_gates(at_row(g, gp), g.stride(2), c, kg, w.zeros.data(), G);
          const float *Gc = G.hi + (c - 1) * kg, *Lc = G.lo + (c - 1) * kg;
          for (int ch = 0; ch < kg; ++ch) Dv[ch] = exp_flush(Gc[ch] + Lc[ch]);
          for (int i = 0; i < c; ++i) {
            const float *Gi = G.hi + i * kg, *Li = G.lo + i * kg;
            const float *qi = Q + i * ldq, *ki = Kc + i * ldk;
            float *eg = eG.data() + i * kg, *ee = eEnd.data() + i * kg;
#pragma omp simd
            for (int ch = 0; ch < kg; ++ch) {
              eg[ch] = exp_flush(Gi[ch] + Li[ch]);
              ee[ch] = decay(Gc[ch], Lc[ch], Gi[ch], Li[ch]);
            }
            float *qd = Qd.data() + i * K, *ke = Ke.data() + i * K, *kd = Kd.data() + i * K;
            if (!channel) {
              const float a = scale * eg[0], e = ee[0], d = eg[0];
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) {
                qd[ch] = a * qi[ch];
                ke[ch] = e * ki[ch];
                kd[ch] = d * ki[ch];
              }
              float* row = Gam.data() + static_cast<int64_t>(i) * C;
              const float G_i = Gi[0], L_i = Li[0];
#pragma omp simd
              for (int j = 0; j < c; ++j) row[j] = decay(G_i, L_i, G.hi[j], G.lo[j]);
              for (int j = i + 1; j < c; ++j) row[j] = 0.0f;
            } else {
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) {
                qd[ch] = scale * qi[ch] * eg[ch];
                ke[ch] = ki[ch] * ee[ch];
                kd[ch] = ki[ch] * eg[ch];
              }
            }
          }
        }
        const float* Qr = gated ? Qd.data() : Q;  // Qd = qr_alpha Qr
        const float qr_alpha = gated ? 1.0f : scale;
        const float* Ker = gated ? Ke.data() : Kc;
        const float* Kdr = gated ? Kd.data() : Kc;
        const int64_t ldqr = gated ? K : ldq, ldke = gated ? K : ldk, ldkd = gated ? K : ldk;

        // 2. The decayed products A_qk (j <= i) and A_kk (j < i), as the forward pass forms them.
        if (delta) {
          decayed_product_pair(Q, ldq, Kc, ldk, Kc, ldk, G, kg, c, Ki, scale, Aqk.data(),
                               Akk.data(), C, w);
        } else {
          decayed_products(Q, ldq, Kc, ldk, G, kg, c, Ki, false, scale, Aqk.data(), C, w);
        }

        // 3. Pseudo-values: U = V, or the UT transform and U = U0 - W S.
        const float* Uc = Vc;
        int64_t ldu = ldv;
        const float* bc = delta ? at_row(beta, bp) : nullptr;
        const int64_t sb = delta ? beta.stride(2) : 0;
        if (delta) {
          for (int i = 0; i < c; ++i) {
            const float bi = bc[i * sb];
            const float* Ai = Akk.data() + static_cast<int64_t>(i) * C;
            float* Li = L.data() + static_cast<int64_t>(i) * C;
            for (int j = 0; j < i; ++j) Li[j] = bi * Ai[j];
            const float *kd = Kdr + i * ldkd, *vi = Vc + i * ldv;
            float* xi = X.data() + i * ldx;
            for (int ch = 0; ch < Ki; ++ch) xi[ch] = bi * kd[ch];
            for (int ch = 0; ch < Vi; ++ch) xi[K + ch] = bi * vi[ch];
          }
          unit_lower_solve(c, K + V, L.data(), C, X.data(), ldx);  // [W | U0]
          for (int i = 0; i < c; ++i) {
            std::memcpy(U.data() + i * V, X.data() + i * ldx + K, sizeof(float) * V);
          }
          gemm(false, false, c, Vi, Ki, -1.0f, X.data(), ldx, S, V, 1.0f, U.data(), V);
          Uc = U.data(), ldu = V;
        }

        // 4. dU = A_qk^T dO + Ke dS';  dA = mask(dO U^T);  dQd = dO S^T;  dKe = U dS'^T. For the
        //    additive rule dU is dV; without decay dQd and dKe go straight into dQ (scaled), dK.
        float* dUp = delta ? dU.data() : dV;
        const int64_t lddu = delta ? V : lddv;
        gemm(true, false, c, Vi, c, 1.0f, Aqk.data(), C, dO, lddo, 0.0f, dUp, lddu);
        gemm(false, false, c, Vi, Ki, 1.0f, Ker, ldke, dSh, V, 1.0f, dUp, lddu);
        gemm(false, true, c, c, Vi, 1.0f, dO, lddo, Uc, ldu, 0.0f, dA.data(), C);
        if (gated) {
          gemm(false, true, c, Ki, Vi, 1.0f, dO, lddo, S, V, 0.0f, dQd.data(), K);
          gemm(false, true, c, Ki, Vi, 1.0f, Uc, ldu, dSh, V, 0.0f, dKe.data(), K);
        } else {
          gemm(false, true, c, Ki, Vi, scale, dO, lddo, S, V, 0.0f, dQ, lddq);
          gemm(false, true, c, Ki, Vi, 1.0f, Uc, ldu, dSh, V, 0.0f, dK, lddk);
        }
        for (int i = 0; i < c; ++i) {
          float* dAi = dA.data() + static_cast<int64_t>(i) * C;
          for (int j = i + 1; j < c; ++j) dAi[j] = 0.0f;
        }

        // 5. dG from Qd; G_c's share from D; Ke's share apart, in dGe: Ke_i = k_i exp(G_c - G_i)
        //    depends on the gates after i only, and is added to dg as a prefix sum (step 9), not
        //    as G_c's share less G_i's, whose rounding would be that of the undecayed Ke_c.
        if (gated) {
          std::fill(dG_end.begin(), dG_end.end(), 0.0f);
          for (int ch = 0; ch < Ki; ++ch) {
            const float *Sr = S + ch * V, *dSr = dSh + ch * V;
            float sS = 0.0f;
#pragma omp simd reduction(+ : sS)
            for (int j = 0; j < Vi; ++j) sS += dSr[j] * Sr[j];
            dG_end[channel ? ch : 0] += Dv[channel ? ch : 0] * sS;
          }
          for (int i = 0; i < c; ++i) {
            const float *a = dQd.data() + i * K, *x = Qd.data() + i * K;
            const float *e = dKe.data() + i * K, *y = Ke.data() + i * K;
            float *dGi = dG.data() + i * kg, *dGei = dGe.data() + i * kg;
            if (!channel) {
              float sq = 0.0f, sk = 0.0f;
#pragma omp simd reduction(+ : sq, sk)
              for (int ch = 0; ch < Ki; ++ch) {
                sq += a[ch] * x[ch];
                sk += e[ch] * y[ch];
              }
              dGi[0] = sq;
              dGei[0] = sk;
            } else {
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) {
                dGi[ch] = a[ch] * x[ch];
                dGei[ch] = e[ch] * y[ch];
              }
            }
          }
        }

        // 6. A_qk's factors: dQ = scale exp(G) dQd + dQ_A, dK = exp(G_c - G) dKe + dK_A, and
        //    the gates' share.
        if (!channel) {
          for (int i = 0; gated && i < c; ++i) {
            const float a = scale * eG[i], e = eEnd[i];
            const float *x = dQd.data() + i * K, *y = dKe.data() + i * K;
            float *dq_i = dQ + i * lddq, *dk_i = dK + i * lddk;
#pragma omp simd
            for (int ch = 0; ch < Ki; ++ch) {
              dq_i[ch] = a * x[ch];
              dk_i[ch] = e * y[ch];
            }
          }
          if (gated) {
            product_gate_gradient(dA.data(), Aqk.data(), C, c, dG.data());
            for (int64_t e = 0; e < static_cast<int64_t>(c) * C; ++e) dA[e] *= Gam[e];
          }
          gemm(false, false, c, Ki, c, scale, dA.data(), C, Kc, ldk, 1.0f, dQ, lddq);
          gemm(true, false, c, Ki, c, scale, dA.data(), C, Q, ldq, 1.0f, dK, lddk);
        } else {
          // The diagonal of dA (no decay) is taken out of the blocked backward and added to dQ
          // and dK alone: its shares of q dX and k dY cancel, and their rounding would reach dg.
          for (int i = 0; i < c; ++i) {
            float* dAii = dA.data() + static_cast<int64_t>(i) * (C + 1);
            dG_diag[i] = scale * *dAii;
            *dAii = 0.0f;
          }
          std::fill(dXm.begin(), dXm.begin() + c * K, 0.0f);
          std::fill(dYm.begin(), dYm.begin() + c * K, 0.0f);
          channel_diagonal_backward(Q, ldq, Kc, ldk, G, Ki, 0, c, scale, dA.data(), C,
                                    dXm.data(), dYm.data(), w);
          for (int i = 0; i < c; ++i) {
            const float *qi = Q + i * ldq, *ki = Kc + i * ldk;
            const float *dx = dXm.data() + i * K, *dy = dYm.data() + i * K;
            const float *a = dQd.data() + i * K, *e = dKe.data() + i * K;
            const float *eg = eG.data() + i * K, *ee = eEnd.data() + i * K;
            float *dq_i = dQ + i * lddq, *dk_i = dK + i * lddk, *dGi = dG.data() + i * K;
            const float d = dG_diag[i];
#pragma omp simd
            for (int ch = 0; ch < Ki; ++ch) {
              dq_i[ch] = scale * eg[ch] * a[ch] + dx[ch] + d * ki[ch];
              dk_i[ch] = ee[ch] * e[ch] + dy[ch] + d * qi[ch];
              dGi[ch] += qi[ch] * dx[ch] - ki[ch] * dy[ch];
            }
          }
        }

        // 7. dS = D dS' + Qd^T dO - W^T dU (dS' is no longer needed after this).
        for (int ch = 0; gated && ch < Ki; ++ch) {
          float* row = dSh + ch * V;
          const float d = Dv[channel ? ch : 0];
#pragma omp simd
          for (int j = 0; j < Vi; ++j) row[j] *= d;
        }
        gemm(true, false, Ki, Vi, c, qr_alpha, Qr, ldqr, dO, lddo, 1.0f, dSh, V);
        if (delta) {
          const float* W = X.data();
          const float* U0 = X.data() + K;
          gemm(true, false, Ki, Vi, c, -1.0f, W, ldx, dU.data(), V, 1.0f, dSh, V);
          // 8. The UT transform: dR_v = T^{-T} dU (in dU), dR_k = -dR_v S^T, dT (in dA).
          unit_lower_solve_transposed(c, Vi, L.data(), C, dU.data(), V);
          const float* dRv = dU.data();
          gemm(false, true, c, Ki, Vi, -1.0f, dRv, V, S, V, 0.0f, dRk.data(), K);
          gemm(false, true, c, c, Ki, -1.0f, dRk.data(), K, W, ldx, 0.0f, dA.data(), C);
          gemm(false, true, c, c, Vi, -1.0f, dRv, V, U0, ldx, 1.0f, dA.data(), C);
          float* dB = at_row(dbeta, dbp);
          const int64_t sdb = dbeta.stride(2);
          for (int i = 0; i < c; ++i) {
            const float bi = bc[i * sb];
            float* dTi = dA.data() + static_cast<int64_t>(i) * C;
            const float* Ai = Akk.data() + static_cast<int64_t>(i) * C;
            const float *kd = Kdr + i * ldkd, *vi = Vc + i * ldv, *eg = eG.data() + i * kr;
            const float *rk = dRk.data() + i * K, *rv = dRv + i * V;
            float *dk_i = dK + i * lddk, *dv_i = dV + i * lddv, *dGi = dG.data() + i * kr;
            float db = 0.0f, sk = 0.0f;
#pragma omp simd reduction(+ : db)
            for (int j = 0; j < i; ++j) db += dTi[j] * Ai[j];
            if (!channel) {
              const float a = gated ? bi * eg[0] : bi;
#pragma omp simd reduction(+ : sk)
              for (int ch = 0; ch < Ki; ++ch) {
                sk += rk[ch] * kd[ch];
                dk_i[ch] += a * rk[ch];
              }
              if (gated) dGi[0] += bi * sk;
            } else {
#pragma omp simd reduction(+ : sk)
              for (int ch = 0; ch < Ki; ++ch) {
                const float r = rk[ch] * kd[ch];
                sk += r;
                dGi[ch] += bi * r;
                dk_i[ch] += bi * eg[ch] * rk[ch];
              }
            }
#pragma omp simd reduction(+ : db)
            for (int ch = 0; ch < Vi; ++ch) {
              db += rv[ch] * vi[ch];
              dv_i[ch] = bi * rv[ch];
            }
            dB[i * sdb] = db + sk;
#pragma omp simd
            for (int j = 0; j < i; ++j) dTi[j] *= bi;  // dL = diag(beta) dT
            for (int j = i; j < c; ++j) dTi[j] = 0.0f;
          }
          // A_kk's two factors (both k): dK += dK_L, and the gates' share.
          if (!channel) {
            if (gated) {
              product_gate_gradient(dA.data(), Akk.data(), C, c, dG.data());
              for (int64_t e = 0; e < static_cast<int64_t>(c) * C; ++e) dA[e] *= Gam[e];
            }
            gemm(false, false, c, Ki, c, 1.0f, dA.data(), C, Kc, ldk, 1.0f, dK, lddk);
            gemm(true, false, c, Ki, c, 1.0f, dA.data(), C, Kc, ldk, 1.0f, dK, lddk);
          } else {
            std::fill(dXm.begin(), dXm.begin() + c * K, 0.0f);
            std::fill(dYm.begin(), dYm.begin() + c * K, 0.0f);
            channel_diagonal_backward(Kc, ldk, Kc, ldk, G, Ki, 0, c, 1.0f, dA.data(), C,
                                      dXm.data(), dYm.data(), w);
            for (int i = 0; i < c; ++i) {
              const float* ki = Kc + i * ldk;
              const float *dx = dXm.data() + i * K, *dy = dYm.data() + i * K;
              float *dk_i = dK + i * lddk, *dGi = dG.data() + i * K;
#pragma omp simd
              for (int ch = 0; ch < Ki; ++ch) {
                dk_i[ch] += dx[ch] + dy[ch];
                dGi[ch] += ki[ch] * (dx[ch] - dy[ch]);
              }
            }
          }
        }

        // 9. dg: the reversed cumulative sum of dG inside the chunk, G_c's share at its end.
        if (gated) {
          //    Ke's share (dGe) is the prefix sum sum_{i < t} dGe_i: Ke_i depends on g_t for t > i.
          //    A floored gate (g <= kGateFloor: its decay is exactly 0) has the floor's gradient, 0.
          float* dGt = at_row(dg, dgp);
          const float* gc = at_row(g, gp);
          const int64_t lddg = dg.stride(2), sg = g.stride(2);
          float* last = dG.data() + (c - 1) * kg;
          for (int ch = 0; ch < kg; ++ch) last[ch] += dG_end[ch];
          for (int i = c - 2; i >= 0; --i) {  // dG_i <- sum_{l >= i} dG_l
            float* dGi = dG.data() + i * kg;
#pragma omp simd
            for (int ch = 0; ch < kg; ++ch) dGi[ch] += dGi[ch + kg];
          }
          for (int i = 1; i < c; ++i) {  // dGe_i <- sum_{l <= i} dGe_l
            float* dGei = dGe.data() + i * kg;
#pragma omp simd
            for (int ch = 0; ch < kg; ++ch) dGei[ch] = dGei[ch] + dGei[ch - kg];
          }
          for (int i = c - 1; i >= 0; --i) {
            float* dGi = dG.data() + i * kg;
            if (i > 0) {
              const float* before = dGe.data() + (i - 1) * kg;  // sum_{l < i}
#pragma omp simd
              for (int ch = 0; ch < kg; ++ch) dGi[ch] += before[ch];
            }
            floored_gradient_row(dGi, gc + i * sg, kg, dGt + i * lddg, kGateFloor);
          }
        }
      }
    }
  });
  return {dq, dk, dv, dbeta, dg, dS.view({B, H, K, V})};
}

// One generation step of any mechanism (``linattn.ops.recurrent_step``), the state updated in
// place, every input checked first in the same call: the step is tens of microseconds of
// arithmetic, less than the PyTorch calls that would check and compute it one by one.
//
//   S <- Diag(exp g) S;  u = v (additive) or beta (v - S^T k) (delta);  S <- S + k u^T;
//   o = S^T (scale q)
//
// state [B, H, K, V] contiguous; q, k [B, H, K]; v [B, H, V]; beta [B, H] or None; g [B, H, 1|K]
// or None; all float32 (shapes checked first; the inputs other than the state are copied when not
// contiguous). Returns o [B, H, V]; or, when an input is out of its range (a NaN or Inf anywhere
// but a g of -inf, beta outside [0, 2], g > 0), an empty tensor, with the state unchanged: the caller then names
// the input.
at::Tensor recurrent_step(at::Tensor& state, const at::Tensor& q_in, const at::Tensor& k_in,
                          const at::Tensor& v_in, const c10::optional<at::Tensor>& beta_opt,
                          const c10::optional<at::Tensor>& g_opt, double scale_d) {
  const Checks check{"linattn_native.recurrent_step"};
  check.float32_cpu("state", state);
  TORCH_CHECK(state.dim() == 4 && state.is_contiguous(), check.op,
              ": state must be a contiguous [B, H, K, V] tensor (updated in place), got shape ",
              state.sizes(), " and strides ", state.strides());
  const int64_t B = state.size(0), H = state.size(1), K = state.size(2), V = state.size(3);
  const int64_t P = B * H;
  check.shape("q", q_in, {B, H, K}, "[B, H, K]");
  check.shape("k", k_in, {B, H, K}, "[B, H, K]");
  check.shape("v", v_in, {B, H, V}, "[B, H, V]");
  const bool delta = beta_opt.has_value(), gated = g_opt.has_value();
  if (delta) check.shape("beta", *beta_opt, {B, H}, "[B, H]");
  if (gated) {
    check.float32_cpu("g", *g_opt);
    const int64_t width = g_opt->dim() == 3 ? g_opt->size(2) : -1;
    TORCH_CHECK(width == 1 || width == K, check.op, ": g must be of shape [B, H, 1 | K] = [", B,
                ", ", H, ", 1 | ", K, "], got ", g_opt->sizes());
    check.shape("g", *g_opt, {B, H, width}, "[B, H, 1 | K]");
  }
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor beta = delta ? beta_opt->contiguous() : at::Tensor();
  const at::Tensor g = gated ? g_opt->contiguous() : at::Tensor();
  const int64_t kg = gated ? g.size(-1) : 0;
  const float* bp = delta ? beta.data_ptr<float>() : nullptr;
  const float* gp = gated ? g.data_ptr<float>() : nullptr;
  float* Sp = state.data_ptr<float>();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  // 1. Checks, before anything is written.
  bool ok = true;
  auto all_finite = [&](const float* x, int64_t n) {
    float acc = 0.0f;  // x * 0 is 0 for finite x and NaN for NaN or Inf
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += x[i] * 0.0f;
    return acc == 0.0f;
  };
  ok = all_finite(Sp, P * K * V) && all_finite(qp, P * K) && all_finite(kp, P * K) &&
       all_finite(vp, P * V);
  for (int64_t i = 0; ok && delta && i < P; ++i) ok = bp[i] >= 0.0f && bp[i] <= 2.0f;
  for (int64_t i = 0; ok && gated && i < P * kg; ++i) ok = gp[i] <= 0.0f;  // -inf: a reset
  if (!ok) return at::empty({0}, state.options());
  // 2. The step, head by head.
  at::Tensor o = at::empty({B, H, V}, state.options());
  float* op = o.data_ptr<float>();
  const float scale = static_cast<float>(scale_d);
  at::parallel_for(0, P, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> u(V);
    for (int64_t p = lo; p < hi; ++p) {
      float* S = Sp + p * K * V;
      const float *qh = qp + p * K, *kh = kp + p * K, *vh = vp + p * V;
      float* oh = op + p * V;
      // Decay and the read S^T k in one pass over S.
      std::fill(u.begin(), u.end(), 0.0f);
      for (int64_t i = 0; i < K; ++i) {
        float* row = S + i * V;
        if (gated) {
          const float a = std::exp(gp[p * kg + (kg == 1 ? 0 : i)]);
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) row[j] *= a;
        }
        if (delta) {
          const float ki = kh[i];
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) u[j] += ki * row[j];
        }
      }
      if (delta) {
        const float b = bp[p];
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) u[j] = b * (vh[j] - u[j]);
      } else {
        std::copy(vh, vh + V, u.begin());
      }
      // The write k u^T and the read S^T (scale q) in one more pass.
      std::fill(oh, oh + V, 0.0f);
      for (int64_t i = 0; i < K; ++i) {
        float* row = S + i * V;
        const float ki = kh[i], qi = scale * qh[i];
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) {
          row[j] += ki * u[j];
          oh[j] += qi * row[j];
        }
      }
    }
  });
  return o;
}

// ``fresh`` for Python: an uninitialised CPU tensor of ``sizes``, on huge pages where possible.
at::Tensor empty_huge(at::IntArrayRef sizes, at::ScalarType dtype) {
  uint64_t bytes = c10::elementSize(dtype);
  for (const int64_t n : sizes) {
    TORCH_CHECK(n >= 0, "linattn_native.empty_huge: sizes must be >= 0, got ", sizes);
    TORCH_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(n), &bytes) &&
                    bytes <= static_cast<uint64_t>(INT64_MAX),
                "linattn_native.empty_huge: sizes ", sizes, " overflow 64 bits");
  }
  return fresh(sizes, at::TensorOptions().dtype(dtype));
}

TORCH_LIBRARY(linattn_native, m) {
  m.def(
      "chunk_forward(Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g, Tensor S0, float scale,"
      " int C, bool keep) -> (Tensor, Tensor, Tensor)");
  m.def("empty_huge(int[] sizes, ScalarType dtype) -> Tensor", &empty_huge);
  m.def(
      "chunk_backward(Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g, Tensor states,"
      " Tensor d_o, Tensor dS_final, float scale, int C)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("cache_release() -> int", &cache_release);
  m.def("cache_bytes() -> int", &cache_bytes);
  m.def(
      "recurrent_step(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g,"
      " float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("chunk_forward", &chunk_forward);
  m.impl("chunk_backward", &chunk_backward);
  m.impl("recurrent_step", &recurrent_step);
}
