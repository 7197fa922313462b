// TTT-Linear's dual form (``linattn.ops.ttt``; Sun et al. 2024, arXiv:2407.04620, section 2.7),
// forward and backward fused per (sequence, head): a loop over the mini-batches of b tokens, its
// small products on the BLAS, its row-wise work (two layer norms and the layer norm's gradient)
// in plain loops over the D channels.
//
// Forward, one mini-batch of rows Q = scale q, K, V [b, D], rates eta [b], e = eta_{b-1}, from the
// state (W [D, D], h [D]) entering it (a short last mini-batch padded with zero tokens k = v = q =
// 0 whose rate is the last real token's: fla's padding):
//
//   1. X = K W + h,  R = Q W + h                  (one product of [Q; K] with W)
//   2. X_hat = (X - mean X) / sigma,  sigma = sqrt(var X + eps)          (row by row)
//   3. g = w^2 X_hat + w (b - (V - K)),
//      G = (g - mean g - X_hat mean(g X_hat)) / sigma   (d l / d X, l = 1/2 |LN(X) - (V - K)|^2)
//   4. A = tril(Q K^T + 1),  Z = R - diag(eta) A G
//   5. o = Z + LN_{w,b}(Z)
//   6. W <- W - e K^T G,  h <- h - e 1^T G
//
// Backward, the mini-batches last to first, with (dW, dh) the gradient of the state leaving the
// mini-batch, the state entering it saved by the forward and X, G, A recomputed from it:
//
//   7. dZ = do + (dZh - mean dZh - Z_hat mean(dZh Z_hat)) / sigma_Z,  dZh = w do;
//      dw += do Z_hat, db += do                                          (step 5)
//   8. deta_t = -dZ_t . (A G)_t,  dY = -diag(eta) dZ,  dP = tril(dY G^T),  dG = A^T dY
//   9. de = -<dW, K^T G> - dh . 1^T G,  dG -= e (K dW + 1 dh),  dK = -e G dW^T   (step 6)
//  10. through step 3, with s1 = mean dG, s2 = mean(dG X_hat), a = mean g, c = mean(g X_hat):
//      dg = (dG - s1 - X_hat s2) / sigma,
//      dX_hat = w^2 dg - (c dG + g s2) / sigma,
//      dX = (dX_hat - mean dX_hat - X_hat mean(dX_hat X_hat)) / sigma - X_hat mean(dG G) / sigma
//      (the last term: G's explicit 1 / sigma), dK += w dg, dV = -w dg,
//      dw += dg (b - (V - K)) + 2 w dg X_hat, db += w dg
//  11. [dQ; dK] += [dZ; dX] W^T,  dQ += dP K,  dK += dP^T Q,
//      dW += [Q; K]^T [dZ; dX],  dh += 1^T (dZ + dX)                     (steps 1 and 4)
//
// Layouts: q, k, v, o, z and the gradients [B, T, H, D] (the public layout, any strides with unit
// stride along D: rows read in place), eta [B, T, H] (any strides), w, b [H, D], the states
// [B, H, D, D] and [B, H, D]. The forward saves the state entering every ``every``-th mini-batch,
// [B, H, n / every, D, D] and [B, H, n / every, D]; the backward takes them a segment of
// ``every`` mini-batches at a time, last to first, recomputes the states entering the segment's
// mini-batches (steps 1-3 and 6) into a block of its own, then runs steps 7-11 over them. Work:
// one task per (sequence, head), spread over the threads.
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "blas.h"
#include "block_cache.h"
#include "checks.h"
#include "gates.h"
#include "kernels.h"
#include "simd.h"

namespace linattn_native {
namespace {

// C[m, n] = alpha op(A) B + beta C (row-major; op(A) = A [m, k], or A^T with A stored [k, m]
// when ``ta``) for the loops' skinny products, m and k a mini-batch's few rows: in registers, R
// rows by NV vectors of C at a time, where a BLAS call would cost more than its arithmetic. n
// not a multiple of the vector width: the BLAS.
template <int R, int NV, bool TA>
inline void tile(int64_t k, float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) acc[r][x] = Vec{};
  for (int64_t p = 0; p < k; ++p) {
    Vec bv[NV];
    for (int x = 0; x < NV; ++x) bv[x] = load(B + p * ldb + x * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec av = splat(TA ? A[p * lda + r] : A[r * lda + p]);
      for (int x = 0; x < NV; ++x) acc[r][x] = fmadd(av, bv[x], acc[r][x]);
    }
  }
  const Vec va = splat(alpha), vb = splat(beta);
  for (int r = 0; r < R; ++r)
    for (int x = 0; x < NV; ++x) {
      float* c = C + r * ldc + x * kLanes;
      store(c, beta == 0.0f ? va * acc[r][x] : va * acc[r][x] + vb * load(c));
    }
}

template <bool TA>
void small_gemm_impl(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i0 = 0; i0 < m; i0 += 4) {
    const int R = static_cast<int>(std::min<int64_t>(4, m - i0));
    const float* Ai = TA ? A + i0 : A + i0 * lda;
    for (int64_t j0 = 0; j0 < n; j0 += 4 * kLanes) {
      const int NV = static_cast<int>(std::min<int64_t>(4, (n - j0) / kLanes));
      const float* Bj = B + j0;
      float* Cij = C + i0 * ldc + j0;
#define LINATTN_TILE(r, v)                                              \
  case (r) * 8 + (v):                                                   \
    tile<r, v, TA>(k, alpha, Ai, lda, Bj, ldb, beta, Cij, ldc);         \
    break;
      switch (R * 8 + NV) {
        LINATTN_TILE(1, 1) LINATTN_TILE(1, 2) LINATTN_TILE(1, 3) LINATTN_TILE(1, 4)
        LINATTN_TILE(2, 1) LINATTN_TILE(2, 2) LINATTN_TILE(2, 3) LINATTN_TILE(2, 4)
        LINATTN_TILE(3, 1) LINATTN_TILE(3, 2) LINATTN_TILE(3, 3) LINATTN_TILE(3, 4)
        LINATTN_TILE(4, 1) LINATTN_TILE(4, 2) LINATTN_TILE(4, 3) LINATTN_TILE(4, 4)
      }
#undef LINATTN_TILE
    }
  }
}

void small_gemm(bool ta, int64_t m, int64_t n, int64_t k, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (n % kLanes != 0 || k > 256) {
    gemm(ta, false, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  } else if (ta) {
    small_gemm_impl<true>(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  } else {
    small_gemm_impl<false>(m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

// The sum of x's lanes.
inline float lanes_sum(Vec x) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)x);
#else
  float sum = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) sum += x[lane];
  return sum;
#endif
}

// R rows of C = alpha A B^T + beta C (A [R, k], B [n, k], k a multiple of the vector width):
// each entry a dot product along k, four columns of C at a time.
template <int R>
void nt_rows(int64_t n, int64_t k, float alpha, const float* A, int64_t lda, const float* B,
             int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += 4) {
    const int64_t J = std::min<int64_t>(4, n - j0);
    Vec acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int x = 0; x < 4; ++x) acc[r][x] = Vec{};
    for (int64_t p = 0; p < k; p += kLanes) {
      Vec a[R];
      for (int r = 0; r < R; ++r) a[r] = load(A + r * lda + p);
      for (int64_t x = 0; x < J; ++x) {
        const Vec bv = load(B + (j0 + x) * ldb + p);
        for (int r = 0; r < R; ++r) acc[r][x] = fmadd(a[r], bv, acc[r][x]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int64_t x = 0; x < J; ++x) {
        float* c = C + r * ldc + j0 + x;
        const float dot = alpha * lanes_sum(acc[r][x]);
        *c = beta == 0.0f ? dot : dot + beta * *c;
      }
  }
}

// C[m, n] = alpha A B^T + beta C, A [m, k], B [n, k] row-major: ``nt_rows`` four rows at a time
// where k is a multiple of the vector width, else the BLAS.
void small_gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (k % kLanes != 0) {
    gemm(false, true, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  for (int64_t i0 = 0; i0 < m; i0 += 4) {
    const float* Ai = A + i0 * lda;
    float* Ci = C + i0 * ldc;
    switch (std::min<int64_t>(4, m - i0)) {
      case 1: nt_rows<1>(n, k, alpha, Ai, lda, B, ldb, beta, Ci, ldc); break;
      case 2: nt_rows<2>(n, k, alpha, Ai, lda, B, ldb, beta, Ci, ldc); break;
      case 3: nt_rows<3>(n, k, alpha, Ai, lda, B, ldb, beta, Ci, ldc); break;
      default: nt_rows<4>(n, k, alpha, Ai, lda, B, ldb, beta, Ci, ldc); break;
    }
  }
}

// A [B, T, H, D] tensor's rows (unit stride along D) or a [B, T, H] tensor's values.
struct TttRows {
  const float* p;
  int64_t sb, st, sh;
  explicit TttRows(const at::Tensor& x)
      : p(x.data_ptr<float>()), sb(x.stride(0)), st(x.stride(1)),
                              sh(x.stride(2)) {}
  const float* at(int64_t b, int64_t t, int64_t h) const { return p + b * sb + t * st + h * sh; }
};

void check_rows(const Checks& check, const char* name, const at::Tensor& x, int64_t B, int64_t T,
                int64_t H, int64_t D) {
  check.shape(name, x, {B, T, H, D}, "[B, T, H, D]");
  TORCH_CHECK(D <= 1 || x.stride(3) == 1, check.op, ": ", name,
              " must have unit stride along D, got strides ", x.strides());
}

// The sizes of a call, checked: q, k, v [B, T, H, D], eta [B, T, H], w, b [H, D].
struct TttSizes {
  int64_t B, T, H, D, n, size;
  TttSizes(const Checks& check, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const at::Tensor& eta, const at::Tensor& w, const at::Tensor& b, int64_t size_,
           double eps) {
    check.float32_cpu("q", q);
    TORCH_CHECK(q.dim() == 4, check.op, ": q must be of shape [B, T, H, D], got ", q.sizes());
    B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
    check_rows(check, "q", q, B, T, H, D);
    check_rows(check, "k", k, B, T, H, D);
    check_rows(check, "v", v, B, T, H, D);
    check.shape("eta", eta, {B, T, H}, "[B, T, H]");
    check.shape("w", w, {H, D}, "[H, D]");
    check.shape("b", b, {H, D}, "[H, D]");
    TORCH_CHECK(size_ >= 1, check.op, ": size (the mini-batch size) must be >= 1, got ", size_);
    TORCH_CHECK(size_ <= 4096, check.op, ": size (the mini-batch size) must be <= 4096, got ",
                size_);
    TORCH_CHECK(std::isfinite(eps) && eps >= 0, check.op, ": eps must be finite and >= 0, got ",
                eps);
    TORCH_CHECK(2 * size_ * D <= INT32_MAX && D <= 65536, check.op, ": D = ", D,
                " exceeds the BLAS's 32-bit sizes");
    size = size_;
    n = (T + size - 1) / size;
  }
};

// A task's blocks for one mini-batch of b rows of D channels, and the head's layer norm.
struct Batch {
  int64_t b, D;
  float scale, eps;
  const float *w, *bias;
  std::vector<float> w2, QK, target, eta, XR, rstd, Xh, g, c, G, A, Y;
  Batch(int64_t b_, int64_t D_, float scale_, float eps_, const float* w_, const float* bias_)
      : b(b_), D(D_), scale(scale_), eps(eps_), w(w_), bias(bias_), w2(D), QK(2 * b * D),
        target(b * D), eta(b), XR(2 * b * D), rstd(b), Xh(b * D), g(b * D), c(b),
        G(b * D), A(b * b), Y(b * D) {
    for (int64_t d = 0; d < D; ++d) w2[d] = w[d] * w[d];
  }

  float* Q() { return QK.data(); }
  float* K() { return QK.data() + b * D; }

  // The mini-batch's m <= b real rows from t0 (sequence s, head h), the rest fla's zero tokens
  // with the last real token's rate; target = b - (V - K).
  void load(const TttRows& q, const TttRows& k, const TttRows& v, const TttRows& et, int64_t s,
            int64_t h, int64_t t0, int64_t m) {
    float *Qp = Q(), *Kp = K();
    for (int64_t r = 0; r < b; ++r) {
      float *qr = Qp + r * D, *kr = Kp + r * D, *tr = target.data() + r * D;
      if (r < m) {
        const float *qi = q.at(s, t0 + r, h), *ki = k.at(s, t0 + r, h), *vi = v.at(s, t0 + r, h);
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) {
          qr[d] = scale * qi[d];
          kr[d] = ki[d];
          tr[d] = bias[d] - (vi[d] - ki[d]);
        }
        eta[r] = *et.at(s, t0 + r, h);
      } else {
        for (int64_t d = 0; d < D; ++d) {
          qr[d] = 0.0f;
          kr[d] = 0.0f;
          tr[d] = bias[d];
        }
        eta[r] = eta[m - 1];
      }
    }
  }

  // Steps 1-4 but Z: X (and R when ``reads``) from the state, the gradient G, and (``scores``)
  // A and Y = A G.
  void gradient(const float* W, const float* hv, bool reads, bool scores = true) {
    const int64_t rows = reads ? 2 * b : b;
    const float* in = reads ? Q() : K();
    float* out = reads ? XR.data() : XR.data() + b * D;
    small_gemm(false, rows, D, D, 1.0f, in, D, W, D, 0.0f, out, D);
    for (int64_t r = 0; r < rows; ++r) {
      float* x = out + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) x[d] += hv[d];
    }
    const float inv = 1.0f / static_cast<float>(D);
    for (int64_t r = 0; r < b; ++r) {
      const float* x = XR.data() + (b + r) * D;
      float *xh = Xh.data() + r * D, *gr = g.data() + r * D, *Gr = G.data() + r * D;
      const float* tr = target.data() + r * D;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t d = 0; d < D; ++d) sum += x[d];
      const float mean = sum * inv;
      float var = 0.0f;
#pragma omp simd reduction(+ : var)
      for (int64_t d = 0; d < D; ++d) var += (x[d] - mean) * (x[d] - mean);
      const float rs = 1.0f / std::sqrt(var * inv + eps);
      float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t d = 0; d < D; ++d) {
        xh[d] = (x[d] - mean) * rs;
        gr[d] = w2[d] * xh[d] + w[d] * tr[d];
        sg += gr[d];
        sgx += gr[d] * xh[d];
      }
      rstd[r] = rs, c[r] = sgx * inv;
      const float ar = sg * inv, cr = c[r];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) Gr[d] = (gr[d] - ar - xh[d] * cr) * rs;
    }
    if (scores) score();
  }

  // Step 4's A and Y = A G, from the rows and G.
  void score() {
    small_gemm_nt(b, b, D, 1.0f, Q(), D, K(), D, 0.0f, A.data(), b);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < b; ++j) A[i * b + j] = j <= i ? A[i * b + j] + 1.0f : 0.0f;
    small_gemm(false, b, D, b, 1.0f, A.data(), b, G.data(), D, 0.0f, Y.data(), D);
  }

  // Step 6: the state leaving the mini-batch, in place.
  void step(float* W, float* hv) {
    const float e = eta[b - 1];
    small_gemm(true, D, D, b, -e, K(), D, G.data(), D, 1.0f, W, D);
    for (int64_t r = 0; r < b; ++r) {
      const float* Gr = G.data() + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) hv[d] -= e * Gr[d];
    }
  }
};

// out[c, r] = x[r, c] for x [rows, cols] (row stride ldx), out [cols, rows] (row stride ldo).
void transpose(int64_t rows, int64_t cols, const float* x, int64_t ldx, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * ldo + r] = x[r * ldx + c];
}

// Ask for the rows [t0, t0 + m) of x (sequence s, head h) ahead of their use: a task walks one
// head's rows, H D floats apart, which the hardware's prefetchers follow poorly across so many
// streams.
inline void prefetch_rows(const TttRows& x, int64_t s, int64_t h, int64_t t0, int64_t m,
                          int64_t D) {
  for (int64_t r = 0; r < m; ++r) {
    const char* row = reinterpret_cast<const char*>(x.at(s, t0 + r, h));
    for (int64_t off = 0; off < D * 4; off += 64) __builtin_prefetch(row + off);
  }
}

// mean and 1 / sigma of a row of D (the biased variance).
inline void moments(const float* x, int64_t D, float eps, float& mean, float& rs) {
  const float inv = 1.0f / static_cast<float>(D);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < D; ++d) sum += x[d];
  mean = sum * inv;
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int64_t d = 0; d < D; ++d) var += (x[d] - mean) * (x[d] - mean);
  rs = 1.0f / std::sqrt(var * inv + eps);
}

void check_state(const Checks& check, const char* name, const at::Tensor& x,
                 at::IntArrayRef sizes, const char* dims) {
  check.shape(name, x, sizes, dims);
  TORCH_CHECK(x.is_contiguous(), check.op, ": ", name, " must be contiguous");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ttt_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& eta,
    const at::Tensor& w, const at::Tensor& bias, const at::Tensor& W0, const at::Tensor& h0,
    double scale_d, double eps_d, int64_t size, int64_t every, bool keep) {
  const Checks check{"linattn_native.ttt_forward"};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, n = s.n, b = s.size;
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  check_state(check, "W0", W0, {B, H, D, D}, "[B, H, D, D]");
  check_state(check, "h0", h0, {B, H, D}, "[B, H, D]");
  const float scale = checked_scale(check, scale_d), eps = static_cast<float>(eps_d);
  const auto opts = q.options();
  at::Tensor o = fresh({B, T, H, D}, opts);
  at::Tensor z = keep ? fresh({B, T, H, D}, opts) : at::empty({0}, opts);
  // copies of the data only (``detach``): a call with inputs that require grad records no
  // autograd graph on the outputs (the ops have no autograd of their own)
  at::Tensor W = W0.detach().clone(), hv = h0.detach().clone();
  TORCH_CHECK(every >= 1, check.op, ": every (mini-batches per saved state) must be >= 1, got ",
              every);
  const int64_t ns = (n + every - 1) / every;
  at::Tensor Ws = keep ? fresh({B, H, ns, D, D}, opts) : at::empty({0}, opts);
  at::Tensor hs = keep ? at::empty({B, H, ns, D}, opts) : at::empty({0}, opts);
  const TttRows qr(q), kr(k), vr(v), er(eta);
  float *op = o.data_ptr<float>(), *zp = keep ? z.data_ptr<float>() : nullptr;
  float *Wp = W.data_ptr<float>(), *hp = hv.data_ptr<float>();
  float *Wsp = keep ? Ws.data_ptr<float>() : nullptr, *hsp = keep ? hs.data_ptr<float>() : nullptr;
  const float *wp = w.data_ptr<float>(), *bp = bias.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    FlushSubnormals flush;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t sq = task / H, hd = task % H;
      const float *wh = wp + hd * D, *bh = bp + hd * D;
      Batch mb(b, D, scale, eps, wh, bh);
      std::vector<float> zrow(D);  // Z's row when z is not kept
      float *Wt = Wp + task * D * D, *ht = hp + task * D;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t0 = j * b, m = std::min(b, T - t0);
        if (keep && j % every == 0) {
          std::copy(Wt, Wt + D * D, Wsp + (task * ns + j / every) * D * D);
          std::copy(ht, ht + D, hsp + (task * ns + j / every) * D);
        }
        if (j + 1 < n) {
          const int64_t m1 = std::min(b, T - t0 - b);
          for (const TttRows* x : {&qr, &kr, &vr}) prefetch_rows(*x, sq, hd, t0 + b, m1, D);
        }
        mb.load(qr, kr, vr, er, sq, hd, t0, m);
        mb.gradient(Wt, ht, true);
        for (int64_t r = 0; r < m; ++r) {  // steps 4-5
          const float *R = mb.XR.data() + r * D, *Yr = mb.Y.data() + r * D;
          const int64_t at = ((sq * T + t0 + r) * H + hd) * D;
          float* Z = keep ? zp + at : zrow.data();
          const float er_ = mb.eta[r];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) Z[d] = R[d] - er_ * Yr[d];
          float mean, rs;
          moments(Z, D, eps, mean, rs);
          float* orow = op + at;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) orow[d] = Z[d] + wh[d] * (Z[d] - mean) * rs + bh[d];
        }
        mb.step(Wt, ht);
      }
    }
  });
  return {o, z, W, hv, Ws, hs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
ttt_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& eta,
             const at::Tensor& w, const at::Tensor& bias, const at::Tensor& Ws,
             const at::Tensor& hs, const at::Tensor& z, const at::Tensor& d_o,
             const std::optional<at::Tensor>& dW_opt, const std::optional<at::Tensor>& dh_opt,
             double scale_d, double eps_d, int64_t size, int64_t every) {
  const Checks check{"linattn_native.ttt_backward"};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, n = s.n, b = s.size;
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  TORCH_CHECK(every >= 1, check.op, ": every (mini-batches per saved state) must be >= 1, got ",
              every);
  const int64_t ns = (n + every - 1) / every;
  check_state(check, "Ws", Ws, {B, H, ns, D, D}, "[B, H, n / every, D, D]");
  check_state(check, "hs", hs, {B, H, ns, D}, "[B, H, n / every, D]");
  check_rows(check, "z", z, B, T, H, D);
  check_rows(check, "d_o", d_o, B, T, H, D);
  at::Tensor dW =
      dW_opt.has_value() ? dW_opt->detach().clone() : at::zeros({B, H, D, D}, q.options());
  at::Tensor dh =
      dh_opt.has_value() ? dh_opt->detach().clone() : at::zeros({B, H, D}, q.options());
  check_state(check, "dW", dW, {B, H, D, D}, "[B, H, D, D]");
  check_state(check, "dh", dh, {B, H, D}, "[B, H, D]");
  const float scale = checked_scale(check, scale_d), eps = static_cast<float>(eps_d);
  const auto opts = q.options();
  at::Tensor dq = fresh({B, T, H, D}, opts), dk = fresh({B, T, H, D}, opts);
  at::Tensor dv = fresh({B, T, H, D}, opts), deta = at::empty({B, T, H}, opts);
  at::Tensor dwb = at::empty({B, H, D}, opts), dbb = at::empty({B, H, D}, opts);
  const TttRows qr(q), kr(k), vr(v), er(eta), zr(z), dor(d_o);
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  float *dep = deta.data_ptr<float>(), *dWp = dW.data_ptr<float>(), *dhp = dh.data_ptr<float>();
  float *dwp = dwb.data_ptr<float>(), *dbp = dbb.data_ptr<float>();
  const float *Wsp = Ws.data_ptr<float>(), *hsp = hs.data_ptr<float>();
  const float *wp = w.data_ptr<float>(), *bp = bias.data_ptr<float>();
  const float inv = 1.0f / static_cast<float>(D);
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    FlushSubnormals flush;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t sq = task / H, hd = task % H;
      const float *wh = wp + hd * D, *bh = bp + hd * D;
      Batch mb(b, D, scale, eps, wh, bh);
      std::vector<float> DZX(2 * b * D), dY(b * D), dA(b * b), dG(b * D), KdW(b * D),
          dKu(b * D), dQK(2 * b * D), dg(b * D), dXh(D), dwa(D, 0.0f), dba(D, 0.0f), detar(b);
      float *dWt = dWp + task * D * D, *dht = dhp + task * D;
      float *dZ = DZX.data(), *dX = DZX.data() + b * D;
      // the segment's states W, their transposes (for [dZ; dX] W^T as a product of rows) and h
      std::vector<float> segW(every * D * D), segWT(every * D * D), segh(every * D);
      // and the recomputed layer norm's rows (X_hat, g, G, 1 / sigma, mean(g X_hat)) of all but
      // its last mini-batch, which the reverse pass reads again
      std::vector<float> segXh(every * b * D), segg(every * b * D), segG(every * b * D),
          segrs(every * b), segc(every * b);
      for (int64_t seg = ns - 1; seg >= 0; --seg) {
        // the states entering the segment's mini-batches, from its saved one
        const int64_t j0 = seg * every, j1 = std::min(n, j0 + every);
        const float* saved = Wsp + (task * ns + seg) * D * D;
        std::copy(saved, saved + D * D, segW.data());
        transpose(D, D, saved, D, segWT.data(), D);
        std::copy(hsp + (task * ns + seg) * D, hsp + (task * ns + seg + 1) * D, segh.data());
        for (int64_t j = j0; j + 1 < j1; ++j) {
          const int64_t i = j - j0;
          float *Wi = segW.data() + i * D * D, *hi_ = segh.data() + i * D;
          if (j + 2 < j1) {
            const int64_t m1 = std::min(b, T - (j + 1) * b);
            for (const TttRows* x : {&qr, &kr, &vr}) prefetch_rows(*x, sq, hd, (j + 1) * b, m1, D);
          }
          mb.load(qr, kr, vr, er, sq, hd, j * b, std::min(b, T - j * b));
          mb.gradient(Wi, hi_, false, false);
          std::copy(mb.Xh.begin(), mb.Xh.end(), segXh.begin() + i * b * D);
          std::copy(mb.g.begin(), mb.g.end(), segg.begin() + i * b * D);
          std::copy(mb.G.begin(), mb.G.end(), segG.begin() + i * b * D);
          std::copy(mb.rstd.begin(), mb.rstd.end(), segrs.begin() + i * b);
          std::copy(mb.c.begin(), mb.c.end(), segc.begin() + i * b);
          std::copy(Wi, Wi + D * D, Wi + D * D);
          std::copy(hi_, hi_ + D, hi_ + D);
          mb.step(Wi + D * D, hi_ + D);
          float* WTi = segWT.data() + i * D * D;  // W^T <- W^T - e G^T K
          std::copy(WTi, WTi + D * D, WTi + D * D);
          small_gemm(true, D, D, b, -mb.eta[b - 1], mb.G.data(), D, mb.K(), D, 1.0f, WTi + D * D,
                     D);
        }
        for (int64_t j = j1 - 1; j >= j0; --j) {
          const int64_t t0 = j * b, m = std::min(b, T - t0);
          const float* Wt = segW.data() + (j - j0) * D * D;
          const float* WTt = segWT.data() + (j - j0) * D * D;
          const float* ht = segh.data() + (j - j0) * D;
          if (j > 0) {
            for (const TttRows* x : {&qr, &kr, &vr, &zr, &dor})
              prefetch_rows(*x, sq, hd, t0 - b, b, D);
          }
          mb.load(qr, kr, vr, er, sq, hd, t0, m);
          if (j + 1 < j1) {  // recomputed above
            const int64_t i = j - j0;
            std::copy(segXh.begin() + i * b * D, segXh.begin() + (i + 1) * b * D, mb.Xh.begin());
            std::copy(segg.begin() + i * b * D, segg.begin() + (i + 1) * b * D, mb.g.begin());
            std::copy(segG.begin() + i * b * D, segG.begin() + (i + 1) * b * D, mb.G.begin());
            std::copy(segrs.begin() + i * b, segrs.begin() + (i + 1) * b, mb.rstd.begin());
            std::copy(segc.begin() + i * b, segc.begin() + (i + 1) * b, mb.c.begin());
            mb.score();
          } else {
            mb.gradient(Wt, ht, false);
          }
          const float e = mb.eta[b - 1];
          // step 7
          for (int64_t r = 0; r < b; ++r) {
            float* dZr = dZ + r * D;
            if (r >= m) {
              std::fill(dZr, dZr + D, 0.0f);
              detar[r] = 0.0f;
              continue;
            }
            const float *Zr = zr.at(sq, t0 + r, hd), *dor_ = dor.at(sq, t0 + r, hd);
            float mean, rs;
            moments(Zr, D, eps, mean, rs);
            float s1 = 0.0f, s2 = 0.0f;
  #pragma omp simd reduction(+ : s1, s2)
            for (int64_t d = 0; d < D; ++d) {
              const float zh = (Zr[d] - mean) * rs, dzh = wh[d] * dor_[d];
              s1 += dzh;
              s2 += dzh * zh;
              dwa[d] += dor_[d] * zh;
              dba[d] += dor_[d];
            }
            s1 *= inv, s2 *= inv;
            const float* Yr = mb.Y.data() + r * D;
            float de = 0.0f;
  #pragma omp simd reduction(+ : de)
            for (int64_t d = 0; d < D; ++d) {
              const float zh = (Zr[d] - mean) * rs, dzh = wh[d] * dor_[d];
              dZr[d] = dor_[d] + (dzh - s1 - zh * s2) * rs;
              de += dZr[d] * Yr[d];
            }
            detar[r] = -de;
          }
          // step 8
          for (int64_t r = 0; r < b; ++r) {
            const float et = mb.eta[r];
            const float* dZr = dZ + r * D;
            float* dYr = dY.data() + r * D;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d) dYr[d] = -et * dZr[d];
          }
          small_gemm_nt(b, b, D, 1.0f, dY.data(), D, mb.G.data(), D, 0.0f, dA.data(), b);
          for (int64_t i = 0; i < b; ++i)
            for (int64_t jj = i + 1; jj < b; ++jj) dA[i * b + jj] = 0.0f;  // dP = tril(dA)
          small_gemm(true, b, D, b, 1.0f, mb.A.data(), b, dY.data(), D, 0.0f, dG.data(), D);
          // step 9, from the gradient of the state leaving the mini-batch
          small_gemm(false, b, D, D, 1.0f, mb.K(), D, dWt, D, 0.0f, KdW.data(), D);
          small_gemm_nt(b, D, D, -e, mb.G.data(), D, dWt, D, 0.0f, dKu.data(), D);
          float de = 0.0f;
          for (int64_t r = 0; r < b; ++r) {
            const float *Gr = mb.G.data() + r * D, *KdWr = KdW.data() + r * D;
            float* dGr = dG.data() + r * D;
  #pragma omp simd reduction(+ : de)
            for (int64_t d = 0; d < D; ++d) {
              de += (KdWr[d] + dht[d]) * Gr[d];
              dGr[d] -= e * (KdWr[d] + dht[d]);
            }
          }
          detar[m - 1] -= de;
          // step 10
          for (int64_t r = 0; r < b; ++r) {
            const float *dGr = dG.data() + r * D, *Gr = mb.G.data() + r * D;
            const float *xh = mb.Xh.data() + r * D, *gr = mb.g.data() + r * D;
            const float* tr = mb.target.data() + r * D;
            float *dgr = dg.data() + r * D, *dXr = dX + r * D;
            const float rs = mb.rstd[r], cr = mb.c[r];
            float s1 = 0.0f, s2 = 0.0f, sGG = 0.0f;
  #pragma omp simd reduction(+ : s1, s2, sGG)
            for (int64_t d = 0; d < D; ++d) {
              s1 += dGr[d];
              s2 += dGr[d] * xh[d];
              sGG += dGr[d] * Gr[d];
            }
            s1 *= inv, s2 *= inv, sGG *= inv;
            float t1 = 0.0f, t2 = 0.0f;
  #pragma omp simd reduction(+ : t1, t2)
            for (int64_t d = 0; d < D; ++d) {
              dgr[d] = (dGr[d] - s1 - xh[d] * s2) * rs;
              dXh[d] = mb.w2[d] * dgr[d] - (cr * dGr[d] + gr[d] * s2) * rs;
              t1 += dXh[d];
              t2 += dXh[d] * xh[d];
              dwa[d] += dgr[d] * tr[d] + 2.0f * wh[d] * dgr[d] * xh[d];
              dba[d] += wh[d] * dgr[d];
            }
            t1 *= inv, t2 *= inv;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d)
              dXr[d] = (dXh[d] - t1 - xh[d] * t2) * rs - xh[d] * sGG * rs;
          }
          // step 11
          small_gemm(false, 2 * b, D, D, 1.0f, DZX.data(), D, WTt, D, 0.0f, dQK.data(), D);
          float *dQ = dQK.data(), *dK = dQK.data() + b * D;
          small_gemm(false, b, D, b, 1.0f, dA.data(), b, mb.K(), D, 1.0f, dQ, D);
          small_gemm(true, b, D, b, 1.0f, dA.data(), b, mb.Q(), D, 1.0f, dK, D);
          small_gemm(true, D, D, 2 * b, 1.0f, mb.Q(), D, DZX.data(), D, 1.0f, dWt, D);
          for (int64_t r = 0; r < b; ++r) {
            const float *dZr = dZ + r * D, *dXr = dX + r * D;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d) dht[d] += dZr[d] + dXr[d];
          }
          for (int64_t r = 0; r < m; ++r) {
            const int64_t at = ((sq * T + t0 + r) * H + hd) * D;
            const float *dQr = dQ + r * D, *dKr = dK + r * D, *dKur = dKu.data() + r * D;
            const float* dgr = dg.data() + r * D;
            float *dqo = dqp + at, *dko = dkp + at, *dvo = dvp + at;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d) {
              dqo[d] = scale * dQr[d];
              dko[d] = dKr[d] + dKur[d] + wh[d] * dgr[d];
              dvo[d] = -wh[d] * dgr[d];
            }
            dep[(sq * T + t0 + r) * H + hd] = detar[r];
          }
        }
      }
      std::copy(dwa.begin(), dwa.end(), dwp + task * D);
      std::copy(dba.begin(), dba.end(), dbp + task * D);
    }
  });
  return {dq, dk, dv, deta, dwb.sum(0), dbb.sum(0), dW, dh};
}


// ---------------------------------------------------------------------------------------------
// Titans' linear memory (``linattn.ops.titans``; Behrouz et al. 2024, arXiv:2501.00663, sections
// 3.1-3.2, as fla computes it), the same shape of loop over chunks of L tokens. The memory M and
// the momentum S [D, D] are kept side by side, MS = [M | S] [D, 2 D], so that one product reads
// both. One chunk, from (M0, S0), rows Q, K, V [L, D], rates theta, alpha, eta [L]:
//
//   1. [Q; K] [M0 | S0]: Q M0, Q S0, X = K M0
//   2. u = D g - (mean g + X_hat mean(g X_hat)) / sigma,  g = w^2 X_hat + w (b - (V - K))
//      (fla's surprise, row by row; X_hat, sigma: X's layer norm)
//   3. the coefficients of the chunk's scalar recurrence, for every source sigma (each write
//      U_j = -2 theta_j k_j^T u_j, j < L, then M0, then S0):
//      s_t = eta_t s_{t-1} + [sigma = j = t],  m_t = (1 - alpha_t) m_{t-1} + s_t,
//      (s, m)_{-1} = (0, 0) for a write, (0, 1) for M0, (1, 0) for S0; CS[t, sigma] = s_t,
//      CM[t, sigma] = m_t, so that M_t = sum_sigma CM[t, sigma] sigma, S_t alike
//   4. Wu = diag(-2 theta) u,  Z = diag(CM[:, M0]) Q M0 + diag(CM[:, S0]) Q S0 + P Wu,
//      P[t, j] = CM[t, j] (q_t . k_j) (j <= t)
//   5. o = Z + LN_{w,b}(Z)
//   6. M <- CM[L-1, M0] M0 + CM[L-1, S0] S0 + K^T diag(CM[L-1, :L]) Wu,
//      S <- CS[L-1, S0] S0 + K^T diag(CS[L-1, :L]) Wu
//
// Backward, the chunks last to first, (dM, dS) the gradient of the state leaving the chunk:
//
//   7. dZ from step 5 (as TTT's step 7)
//   8. dCM[t, M0] = dZ_t . (Q M0)_t, dCM[t, S0] = dZ_t . (Q S0)_t, dP = dZ Wu^T,
//      dCM[t, j] = dP[t, j] (q_t . k_j), d(q_t . k_j) = dP[t, j] CM[t, j]; at t = L - 1 also
//      <dM, M0>, <dM, S0>, <dS, S0> and, with K dM and K dS, (K dM)_j . Wu_j, (K dS)_j . Wu_j
//   9. dWu = P^T dZ + diag(CM[L-1, :L]) K dM + diag(CS[L-1, :L]) K dS,  du = diag(-2 theta) dWu,
//      dtheta_j = -2 dWu_j . u_j,  dK = [diag(CM[L-1]) Wu | diag(CS[L-1]) Wu] [dM | dS]^T
//  10. through step 2, with s1 = mean du, s2 = mean(du X_hat), a = mean g, c = mean(g X_hat):
//      dg = D du - (s1 + X_hat s2) / sigma,  dX_hat = w^2 dg - (c du + g s2) / sigma,
//      dX = (dX_hat - mean dX_hat - X_hat mean(dX_hat X_hat)) / sigma
//           + X_hat (a s1 + c s2) / sigma^2,
//      dK += w dg, dV = -w dg, dw += dg (b - (V - K)) + 2 w dg X_hat, db += w dg
//  11. the scalar recurrence's adjoint, t from L - 1 down, for every source:
//      lm_t = dCM[t] + (1 - alpha_{t+1}) lm_{t+1},  ls_t = dCS[t] + lm_t + eta_{t+1} ls_{t+1},
//      dalpha_t -= lm_t m_{t-1},  deta_t += ls_t s_{t-1}
//  12. dQ += [diag(CM[:, M0]) dZ | diag(CM[:, S0]) dZ] [M0 | S0]^T + d(QK^T) K,
//      dK += d(QK^T)^T Q + dX M0^T,
//      dM <- CM[L-1, M0] dM + Q^T diag(CM[:, M0]) dZ + K^T dX,
//      dS <- CM[L-1, S0] dM + CS[L-1, S0] dS + Q^T diag(CM[:, S0]) dZ
//
// Layouts and saved states as TTT's: q, k, v, o, z and their gradients [B, T, H, D], theta,
// alpha, eta [B, T, H], the states [B, H, D, D], the saved ones [B, H, n / every, D, D] (the
// backward recomputes the others segment by segment: steps 1-3 and 6).
namespace {

// A task's blocks for one chunk of at most L rows.
struct Chunk {
  int64_t L, D;
  float eps;
  const float *w, *bias;
  std::vector<float> w2, QK, target, theta, alpha, eta, XR, rstd, Xh, g, a, c, u, Wu, QKt, P,
      CM, CS, WuMS;
  Chunk(int64_t L_, int64_t D_, float eps_, const float* w_, const float* bias_)
      : L(L_), D(D_), eps(eps_), w(w_), bias(bias_), w2(D), QK(2 * L * D), target(L * D),
        theta(L), alpha(L), eta(L), XR(2 * L * 2 * D), rstd(L), Xh(L * D), g(L * D), a(L), c(L),
        u(L * D), Wu(L * D), QKt(L * L), P(L * L), CM(L * (L + 2)), CS(L * (L + 2)),
        WuMS(L * 2 * D) {
    for (int64_t d = 0; d < D; ++d) w2[d] = w[d] * w[d];
  }

  float* Q() { return QK.data(); }
  float* K() { return QK.data() + L * D; }  // with m rows: K at L * D all the same
  float cm(int64_t t, int64_t s) const { return CM[t * (L + 2) + s]; }
  float cs(int64_t t, int64_t s) const { return CS[t * (L + 2) + s]; }

  void load(const TttRows& q, const TttRows& k, const TttRows& v, const TttRows& th,
            const TttRows& al, const TttRows& et, int64_t sq, int64_t h, int64_t t0, int64_t m) {
    for (int64_t r = 0; r < m; ++r) {
      const float *qi = q.at(sq, t0 + r, h), *ki = k.at(sq, t0 + r, h), *vi = v.at(sq, t0 + r, h);
      float *qr = Q() + r * D, *kr = K() + r * D, *tr = target.data() + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        qr[d] = qi[d];
        kr[d] = ki[d];
        tr[d] = bias[d] - (vi[d] - ki[d]);
      }
      theta[r] = *th.at(sq, t0 + r, h);
      alpha[r] = *al.at(sq, t0 + r, h);
      eta[r] = *et.at(sq, t0 + r, h);
    }
  }

  // Steps 1-4 but Z, for m rows from MS [D, 2 D]: XR rows [2 m, 2 D], Q [M0 | S0] (``reads``)
  // then X = K M0 from row m, u, the coefficients, Wu, and (``reads``) QKt and P.
  void surprise(const float* MS, int64_t m, bool reads = true) {
    // K's rows moved to follow Q's m rows (``K(m)``)
    float* Kd = Q() + m * D;
    if (Kd != K()) std::copy(K(), K() + m * D, Kd);
    if (reads) small_gemm(false, m, 2 * D, D, 1.0f, Q(), D, MS, 2 * D, 0.0f, XR.data(), 2 * D);
    small_gemm(false, m, D, D, 1.0f, Kd, D, MS, 2 * D, 0.0f, XR.data() + m * 2 * D, 2 * D);
    const float inv = 1.0f / static_cast<float>(D), Df = static_cast<float>(D);
    for (int64_t r = 0; r < m; ++r) {
      const float* x = XR.data() + (m + r) * 2 * D;
      float *xh = Xh.data() + r * D, *gr = g.data() + r * D, *ur = u.data() + r * D;
      const float* tr = target.data() + r * D;
      float mean, rs;
      moments(x, D, eps, mean, rs);
      float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t d = 0; d < D; ++d) {
        xh[d] = (x[d] - mean) * rs;
        gr[d] = w2[d] * xh[d] + w[d] * tr[d];
        sg += gr[d];
        sgx += gr[d] * xh[d];
      }
      rstd[r] = rs, a[r] = sg * inv, c[r] = sgx * inv;
      const float ar = a[r], cr = c[r], wr = -2.0f * theta[r];
      float* wur = Wu.data() + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        ur[d] = Df * gr[d] - (ar + xh[d] * cr) * rs;
        wur[d] = wr * ur[d];
      }
    }
    // step 3: sources 0..m-1 the writes, L the memory, L + 1 the momentum
    const int64_t n = L + 2;
    for (int64_t t = 0; t < m; ++t) {
      const float e = eta[t], f = 1.0f - alpha[t];
      for (int64_t s = 0; s < n; ++s) {
        const bool own = s == t;
        const float sp = t ? CS[(t - 1) * n + s] : (s == L + 1 ? 1.0f : 0.0f);
        const float mp = t ? CM[(t - 1) * n + s] : (s == L ? 1.0f : 0.0f);
        const float sv = e * sp + (own ? 1.0f : 0.0f);
        CS[t * n + s] = sv;
        CM[t * n + s] = f * mp + sv;
      }
    }
    if (reads) score(m);
  }

  // The reads of ``surprise`` (``reads``) after the rest was formed or restored: Q [M0 | S0],
  // QKt and P.
  void read(const float* MS, int64_t m) {
    float* Kd = Q() + m * D;
    if (Kd != K()) std::copy(K(), K() + m * D, Kd);
    small_gemm(false, m, 2 * D, D, 1.0f, Q(), D, MS, 2 * D, 0.0f, XR.data(), 2 * D);
    score(m);
  }

  void score(int64_t m) {
    const int64_t n = L + 2;
    small_gemm_nt(m, m, D, 1.0f, Q(), D, Q() + m * D, D, 0.0f, QKt.data(), m);
    for (int64_t t = 0; t < m; ++t)
      for (int64_t j = 0; j < m; ++j)
        P[t * m + j] = j <= t ? CM[t * n + j] * QKt[t * m + j] : 0.0f;
  }

  // The per-chunk rows ``surprise`` forms besides the reads, saved to and restored from a
  // block of ``rows_size()`` floats.
  int64_t rows_size() const { return 4 * L * D + 3 * L + 2 * L * (L + 2); }
  void keep_rows(float* out) const {
    for (const std::vector<float>* x : {&Xh, &g, &u, &Wu, &rstd, &a, &c, &CM, &CS})
      out = std::copy(x->begin(), x->end(), out);
  }
  void restore_rows(const float* in) {
    for (std::vector<float>* x : {&Xh, &g, &u, &Wu, &rstd, &a, &c, &CM, &CS}) {
      std::copy(in, in + x->size(), x->begin());
      in += x->size();
    }
  }

  // Step 6 after ``surprise``: MS [D, 2 D] the state leaving the chunk, in place.
  void advance(float* MS, int64_t m) {
    const int64_t n = L + 2;
    const float bL = cm(m - 1, L), fL = cm(m - 1, L + 1), mL = cs(m - 1, L + 1);
    for (int64_t r = 0; r < m; ++r) {
      const float gM = CM[(m - 1) * n + r], gS = CS[(m - 1) * n + r];
      const float* wur = Wu.data() + r * D;
      float* out = WuMS.data() + r * 2 * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        out[d] = gM * wur[d];
        out[D + d] = gS * wur[d];
      }
    }
    for (int64_t r = 0; r < D; ++r) {
      float* row = MS + r * 2 * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        row[d] = bL * row[d] + fL * row[D + d];
        row[D + d] = mL * row[D + d];
      }
    }
    small_gemm(true, D, 2 * D, m, 1.0f, Q() + m * D, D, WuMS.data(), 2 * D, 1.0f, MS, 2 * D);
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> titans_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& theta,
    const at::Tensor& alpha, const at::Tensor& eta, const at::Tensor& w, const at::Tensor& bias,
    const at::Tensor& M0, const at::Tensor& S0, double eps_d, int64_t size, int64_t every,
    bool keep) {
  const Checks check{"linattn_native.titans_forward"};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, n = s.n, L = s.size;
  check.shape("theta", theta, {B, T, H}, "[B, T, H]");
  check.shape("alpha", alpha, {B, T, H}, "[B, T, H]");
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  check_state(check, "M0", M0, {B, H, D, D}, "[B, H, D, D]");
  check_state(check, "S0", S0, {B, H, D, D}, "[B, H, D, D]");
  const float eps = static_cast<float>(eps_d);
  const auto opts = q.options();
  at::Tensor o = fresh({B, T, H, D}, opts);
  at::Tensor z = keep ? fresh({B, T, H, D}, opts) : at::empty({0}, opts);
  at::Tensor M = at::empty({B, H, D, D}, opts), S = at::empty({B, H, D, D}, opts);
  TORCH_CHECK(every >= 1, check.op, ": every (chunks per saved state) must be >= 1, got ", every);
  const int64_t ns = (n + every - 1) / every;
  at::Tensor Ms = keep ? fresh({B, H, ns, D, D}, opts) : at::empty({0}, opts);
  at::Tensor Ss = keep ? fresh({B, H, ns, D, D}, opts) : at::empty({0}, opts);
  const TttRows qr(q), kr(k), vr(v), thr(theta), alr(alpha), er(eta);
  float *op = o.data_ptr<float>(), *zp = keep ? z.data_ptr<float>() : nullptr;
  float *Mp = M.data_ptr<float>(), *Sp = S.data_ptr<float>();
  float *Msp = keep ? Ms.data_ptr<float>() : nullptr, *Ssp = keep ? Ss.data_ptr<float>() : nullptr;
  const float *M0p = M0.data_ptr<float>(), *S0p = S0.data_ptr<float>();
  const float *wp = w.data_ptr<float>(), *bp = bias.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    FlushSubnormals flush;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t sq = task / H, hd = task % H;
      const float *wh = wp + hd * D, *bh = bp + hd * D;
      Chunk ch(L, D, eps, wh, bh);
      std::vector<float> MS(D * 2 * D);
      for (int64_t r = 0; r < D; ++r) {
        std::copy(M0p + (task * D + r) * D, M0p + (task * D + r + 1) * D, MS.data() + r * 2 * D);
        std::copy(S0p + (task * D + r) * D, S0p + (task * D + r + 1) * D,
                  MS.data() + r * 2 * D + D);
      }
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t0 = j * L, m = std::min(L, T - t0), nc = L + 2;
        if (keep && j % every == 0) {
          for (int64_t r = 0; r < D; ++r) {
            const float* row = MS.data() + r * 2 * D;
            std::copy(row, row + D, Msp + ((task * ns + j / every) * D + r) * D);
            std::copy(row + D, row + 2 * D, Ssp + ((task * ns + j / every) * D + r) * D);
          }
        }
        if (j + 1 < n) {
          const int64_t m1 = std::min(L, T - t0 - L);
          for (const TttRows* x : {&qr, &kr, &vr}) prefetch_rows(*x, sq, hd, t0 + L, m1, D);
        }
        ch.load(qr, kr, vr, thr, alr, er, sq, hd, t0, m);
        ch.surprise(MS.data(), m);
        const float* Kd = ch.Q() + m * D;
        // step 4: Z = diag(beta) Q M0 + diag(f) Q S0 + P Wu, into the rows of o
        for (int64_t r = 0; r < m; ++r) {
          const float* QMS = ch.XR.data() + r * 2 * D;
          const float beta = ch.cm(r, L), f = ch.cm(r, L + 1);
          const int64_t at = ((sq * T + t0 + r) * H + hd) * D;
          float* orow = op + at;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) orow[d] = beta * QMS[d] + f * QMS[D + d];
        }
        // P Wu added into o's rows (stride H D), then step 5 row by row
        small_gemm(false, m, D, m, 1.0f, ch.P.data(), m, ch.Wu.data(), D, 1.0f,
             op + ((sq * T + t0) * H + hd) * D, H * D);
        for (int64_t r = 0; r < m; ++r) {
          const int64_t at = ((sq * T + t0 + r) * H + hd) * D;
          float* orow = op + at;
          if (keep) std::copy(orow, orow + D, zp + at);
          float mean, rs;
          moments(orow, D, eps, mean, rs);
#pragma omp simd
          for (int64_t d = 0; d < D; ++d)
            orow[d] = orow[d] + wh[d] * (orow[d] - mean) * rs + bh[d];
        }
        ch.advance(MS.data(), m);
      }
      for (int64_t r = 0; r < D; ++r) {
        const float* row = MS.data() + r * 2 * D;
        std::copy(row, row + D, Mp + (task * D + r) * D);
        std::copy(row + D, row + 2 * D, Sp + (task * D + r) * D);
      }
    }
  });
  return {o, z, M, S, Ms, Ss};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor>
titans_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& theta, const at::Tensor& alpha, const at::Tensor& eta,
                const at::Tensor& w, const at::Tensor& bias, const at::Tensor& Ms,
                const at::Tensor& Ss, const at::Tensor& z, const at::Tensor& d_o,
                const std::optional<at::Tensor>& dM_opt, const std::optional<at::Tensor>& dS_opt,
                double eps_d, int64_t size, int64_t every) {
  const Checks check{"linattn_native.titans_backward"};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, n = s.n, L = s.size;
  check.shape("theta", theta, {B, T, H}, "[B, T, H]");
  check.shape("alpha", alpha, {B, T, H}, "[B, T, H]");
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  TORCH_CHECK(every >= 1, check.op, ": every (chunks per saved state) must be >= 1, got ", every);
  const int64_t ns = (n + every - 1) / every;
  check_state(check, "Ms", Ms, {B, H, ns, D, D}, "[B, H, n / every, D, D]");
  check_state(check, "Ss", Ss, {B, H, ns, D, D}, "[B, H, n / every, D, D]");
  check_rows(check, "z", z, B, T, H, D);
  check_rows(check, "d_o", d_o, B, T, H, D);
  if (dM_opt.has_value()) check_state(check, "dM", *dM_opt, {B, H, D, D}, "[B, H, D, D]");
  if (dS_opt.has_value()) check_state(check, "dS", *dS_opt, {B, H, D, D}, "[B, H, D, D]");
  const float eps = static_cast<float>(eps_d);
  const auto opts = q.options();
  at::Tensor dq = fresh({B, T, H, D}, opts), dk = fresh({B, T, H, D}, opts);
  at::Tensor dv = fresh({B, T, H, D}, opts);
  at::Tensor dtheta = at::empty({B, T, H}, opts), dalpha = at::empty({B, T, H}, opts);
  at::Tensor deta = at::empty({B, T, H}, opts);
  at::Tensor dwb = at::empty({B, H, D}, opts), dbb = at::empty({B, H, D}, opts);
  at::Tensor dM0 = at::empty({B, H, D, D}, opts), dS0 = at::empty({B, H, D, D}, opts);
  const TttRows qr(q), kr(k), vr(v), thr(theta), alr(alpha), er(eta), zr(z), dor(d_o);
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  float *dthp = dtheta.data_ptr<float>(), *dalp = dalpha.data_ptr<float>();
  float *dep = deta.data_ptr<float>(), *dwp = dwb.data_ptr<float>(), *dbp = dbb.data_ptr<float>();
  float *dM0p = dM0.data_ptr<float>(), *dS0p = dS0.data_ptr<float>();
  const float *dMp = dM_opt.has_value() ? dM_opt->data_ptr<float>() : nullptr;
  const float *dSp = dS_opt.has_value() ? dS_opt->data_ptr<float>() : nullptr;
  const float *Msp = Ms.data_ptr<float>(), *Ssp = Ss.data_ptr<float>();
  const float *wp = w.data_ptr<float>(), *bp = bias.data_ptr<float>();
  const float inv = 1.0f / static_cast<float>(D), Df = static_cast<float>(D);
  at::parallel_for(0, B * H, 1, [&](int64_t lo, int64_t hi) {
    SequentialBlas sequential;
    FlushSubnormals flush;
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t sq = task / H, hd = task % H, nc = L + 2;
      const float *wh = wp + hd * D, *bh = bp + hd * D;
      Chunk ch(L, D, eps, wh, bh);
      std::vector<float> MS(D * 2 * D), dMS(D * 2 * D, 0.0f), dZ(L * D), dZbf(L * 2 * D),
          dP(L * L), dQKt(L * L), dCM(L * nc), dCS(L * nc), KdMS(L * 2 * D), dWu(L * D),
          WuMS(L * 2 * D), dQ(L * D), dK(L * D), dX(L * D), dg(L * D), dXh(D), dwa(D, 0.0f),
          dba(D, 0.0f), dth(L), dal(L), det(L), lm(nc), ls(nc);
      for (int64_t r = 0; r < D; ++r) {
        if (dMp) std::copy(dMp + (task * D + r) * D, dMp + (task * D + r + 1) * D,
                           dMS.data() + r * 2 * D);
        if (dSp) std::copy(dSp + (task * D + r) * D, dSp + (task * D + r + 1) * D,
                           dMS.data() + r * 2 * D + D);
      }
      // the segment's memories [M | S] and their transposes [M^T; S^T] [2 D, D] (for the products
      // with M^T and S^T as products of rows)
      std::vector<float> seg(every * D * 2 * D), segT(every * 2 * D * D);
      std::vector<float> segRows;  // and the rows the recompute formed (``Chunk::keep_rows``)
      for (int64_t sg = ns - 1; sg >= 0; --sg) {
        // the memories entering the segment's chunks, from its saved ones
        const int64_t j0 = sg * every, j1 = std::min(n, j0 + every);
        for (int64_t r = 0; r < D; ++r) {
          std::copy(Msp + ((task * ns + sg) * D + r) * D, Msp + ((task * ns + sg) * D + r + 1) * D,
                    seg.data() + r * 2 * D);
          std::copy(Ssp + ((task * ns + sg) * D + r) * D, Ssp + ((task * ns + sg) * D + r + 1) * D,
                    seg.data() + r * 2 * D + D);
        }
        transpose(D, 2 * D, seg.data(), 2 * D, segT.data(), D);
        const int64_t rows = ch.rows_size();
        segRows.resize(every * rows);
        for (int64_t j = j0; j + 1 < j1; ++j) {
          float* MSi = seg.data() + (j - j0) * D * 2 * D;
          const int64_t m = std::min(L, T - j * L);
          if (j + 2 < j1) {
            const int64_t m1 = std::min(L, T - (j + 1) * L);
            for (const TttRows* x : {&qr, &kr, &vr}) prefetch_rows(*x, sq, hd, (j + 1) * L, m1, D);
          }
          ch.load(qr, kr, vr, thr, alr, er, sq, hd, j * L, m);
          ch.surprise(MSi, m, false);
          ch.keep_rows(segRows.data() + (j - j0) * rows);
          std::copy(MSi, MSi + D * 2 * D, MSi + D * 2 * D);
          ch.advance(MSi + D * 2 * D, m);
          // M^T <- bL M^T + fL S^T + (diag(gM) Wu)^T K, S^T <- mL S^T + (diag(gS) Wu)^T K
          const float* Ti = segT.data() + (j - j0) * 2 * D * D;
          float* Tn = segT.data() + (j - j0 + 1) * 2 * D * D;
          const float bL = ch.cm(m - 1, L), fL = ch.cm(m - 1, L + 1), mL = ch.cs(m - 1, L + 1);
#pragma omp simd
          for (int64_t x = 0; x < D * D; ++x) {
            Tn[x] = bL * Ti[x] + fL * Ti[D * D + x];
            Tn[D * D + x] = mL * Ti[D * D + x];
          }
          small_gemm(true, 2 * D, D, m, 1.0f, ch.WuMS.data(), 2 * D, ch.Q() + m * D, D, 1.0f, Tn,
                     D);
        }
        for (int64_t j = j1 - 1; j >= j0; --j) {
          const int64_t t0 = j * L, m = std::min(L, T - t0);
          const float* MSj = seg.data() + (j - j0) * D * 2 * D;
          const float* MST = segT.data() + (j - j0) * 2 * D * D;
          std::copy(MSj, MSj + D * 2 * D, MS.data());
          if (j > 0) {
            for (const TttRows* x : {&qr, &kr, &vr, &zr, &dor})
              prefetch_rows(*x, sq, hd, t0 - L, L, D);
          }
          ch.load(qr, kr, vr, thr, alr, er, sq, hd, t0, m);
          if (j + 1 < j1) {  // recomputed above: the reads only
            ch.restore_rows(segRows.data() + (j - j0) * rows);
            ch.read(MS.data(), m);
          } else {
            ch.surprise(MS.data(), m);
          }
          const float* Kd = ch.Q() + m * D;
          std::fill(dCM.begin(), dCM.end(), 0.0f);
          std::fill(dCS.begin(), dCS.end(), 0.0f);
          // step 7, and step 8's reads of Q M0 and Q S0
          for (int64_t r = 0; r < m; ++r) {
            const float *Zr = zr.at(sq, t0 + r, hd), *dor_ = dor.at(sq, t0 + r, hd);
            float mean, rs;
            moments(Zr, D, eps, mean, rs);
            float s1 = 0.0f, s2 = 0.0f;
  #pragma omp simd reduction(+ : s1, s2)
            for (int64_t d = 0; d < D; ++d) {
              const float zh = (Zr[d] - mean) * rs, dzh = wh[d] * dor_[d];
              s1 += dzh;
              s2 += dzh * zh;
              dwa[d] += dor_[d] * zh;
              dba[d] += dor_[d];
            }
            s1 *= inv, s2 *= inv;
            float* dZr = dZ.data() + r * D;
            const float* QMS = ch.XR.data() + r * 2 * D;
            const float beta = ch.cm(r, L), f = ch.cm(r, L + 1);
            float* dzbf = dZbf.data() + r * 2 * D;
            float pm = 0.0f, ps = 0.0f;
  #pragma omp simd reduction(+ : pm, ps)
            for (int64_t d = 0; d < D; ++d) {
              const float zh = (Zr[d] - mean) * rs, dzh = wh[d] * dor_[d];
              dZr[d] = dor_[d] + (dzh - s1 - zh * s2) * rs;
              pm += dZr[d] * QMS[d];
              ps += dZr[d] * QMS[D + d];
              dzbf[d] = beta * dZr[d];
              dzbf[D + d] = f * dZr[d];
            }
            dCM[r * nc + L] = pm;
            dCM[r * nc + L + 1] = ps;
          }
          // step 8: dP, the coefficients' and the scores' gradients
          small_gemm_nt(m, m, D, 1.0f, dZ.data(), D, ch.Wu.data(), D, 0.0f, dP.data(), m);
          for (int64_t t = 0; t < m; ++t)
            for (int64_t jj = 0; jj < m; ++jj) {
              const bool low = jj <= t;
              dCM[t * nc + jj] = low ? dP[t * m + jj] * ch.QKt[t * m + jj] : 0.0f;
              dQKt[t * m + jj] = low ? dP[t * m + jj] * ch.CM[t * nc + jj] : 0.0f;
            }
          float iMM = 0.0f, iMS = 0.0f, iSS = 0.0f;  // <dM, M0>, <dM, S0>, <dS, S0>
          for (int64_t r = 0; r < D; ++r) {
            const float *row = MS.data() + r * 2 * D, *drow = dMS.data() + r * 2 * D;
  #pragma omp simd reduction(+ : iMM, iMS, iSS)
            for (int64_t d = 0; d < D; ++d) {
              iMM += drow[d] * row[d];
              iMS += drow[d] * row[D + d];
              iSS += drow[D + d] * row[D + d];
            }
          }
          dCM[(m - 1) * nc + L] += iMM;
          dCM[(m - 1) * nc + L + 1] += iMS;
          dCS[(m - 1) * nc + L + 1] += iSS;
          small_gemm(false, m, 2 * D, D, 1.0f, Kd, D, dMS.data(), 2 * D, 0.0f, KdMS.data(),
               2 * D);
          // step 9
          small_gemm(true, m, D, m, 1.0f, ch.P.data(), m, dZ.data(), D, 0.0f, dWu.data(), D);
          for (int64_t r = 0; r < m; ++r) {
            const float gM = ch.CM[(m - 1) * nc + r], gS = ch.CS[(m - 1) * nc + r];
            const float *KdM = KdMS.data() + r * 2 * D, *KdS = KdM + D;
            const float *wur = ch.Wu.data() + r * D, *ur = ch.u.data() + r * D;
            float* dwur = dWu.data() + r * D;
            float* out = WuMS.data() + r * 2 * D;
            float pM = 0.0f, pS = 0.0f, pu = 0.0f;
  #pragma omp simd reduction(+ : pM, pS, pu)
            for (int64_t d = 0; d < D; ++d) {
              pM += KdM[d] * wur[d];
              pS += KdS[d] * wur[d];
              dwur[d] += gM * KdM[d] + gS * KdS[d];
              pu += dwur[d] * ur[d];
              out[d] = gM * wur[d];
              out[D + d] = gS * wur[d];
            }
            dCM[(m - 1) * nc + r] += pM;
            dCS[(m - 1) * nc + r] += pS;
            dth[r] = -2.0f * pu;
          }
          small_gemm_nt(m, D, 2 * D, 1.0f, WuMS.data(), 2 * D, dMS.data(), 2 * D, 0.0f,
               dK.data(), D);
          // step 10, with du = -2 theta dWu
          for (int64_t r = 0; r < m; ++r) {
            const float cth = -2.0f * ch.theta[r];
            const float *dwur = dWu.data() + r * D, *xh = ch.Xh.data() + r * D;
            const float *gr = ch.g.data() + r * D, *tr = ch.target.data() + r * D;
            float *dgr = dg.data() + r * D, *dXr = dX.data() + r * D;
            const float rs = ch.rstd[r], ar = ch.a[r], cr = ch.c[r];
            float s1 = 0.0f, s2 = 0.0f;
  #pragma omp simd reduction(+ : s1, s2)
            for (int64_t d = 0; d < D; ++d) {
              s1 += cth * dwur[d];
              s2 += cth * dwur[d] * xh[d];
            }
            s1 *= inv, s2 *= inv;
            float t1 = 0.0f, t2 = 0.0f;
  #pragma omp simd reduction(+ : t1, t2)
            for (int64_t d = 0; d < D; ++d) {
              const float du = cth * dwur[d];
              dgr[d] = Df * du - (s1 + xh[d] * s2) * rs;
              dXh[d] = ch.w2[d] * dgr[d] - (cr * du + gr[d] * s2) * rs;
              t1 += dXh[d];
              t2 += dXh[d] * xh[d];
              dwa[d] += dgr[d] * tr[d] + 2.0f * wh[d] * dgr[d] * xh[d];
              dba[d] += wh[d] * dgr[d];
            }
            t1 *= inv, t2 *= inv;
            const float extra = (ar * s1 + cr * s2) * rs * rs;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d)
              dXr[d] = (dXh[d] - t1 - xh[d] * t2) * rs + xh[d] * extra;
          }
          // step 11
          std::fill(lm.begin(), lm.end(), 0.0f);
          std::fill(ls.begin(), ls.end(), 0.0f);
          for (int64_t t = m - 1; t >= 0; --t) {
            const float an = t + 1 < m ? 1.0f - ch.alpha[t + 1] : 0.0f;
            const float en = t + 1 < m ? ch.eta[t + 1] : 0.0f;
            float da = 0.0f, dE = 0.0f;
            for (int64_t sidx = 0; sidx < nc; ++sidx) {
              if (sidx < m && sidx > t) continue;  // a write after t: zero coefficients
              const float lmv = dCM[t * nc + sidx] + an * lm[sidx];
              const float lsv = dCS[t * nc + sidx] + lmv + en * ls[sidx];
              lm[sidx] = lmv, ls[sidx] = lsv;
              const float sp = t ? ch.CS[(t - 1) * nc + sidx] : (sidx == L + 1 ? 1.0f : 0.0f);
              const float mp = t ? ch.CM[(t - 1) * nc + sidx] : (sidx == L ? 1.0f : 0.0f);
              da += lmv * mp;
              dE += lsv * sp;
            }
            dal[t] = -da;
            det[t] = dE;
          }
          // step 12
          small_gemm(false, m, D, 2 * D, 1.0f, dZbf.data(), 2 * D, MST, D, 0.0f, dQ.data(), D);
          small_gemm(false, m, D, m, 1.0f, dQKt.data(), m, Kd, D, 1.0f, dQ.data(), D);
          small_gemm(true, m, D, m, 1.0f, dQKt.data(), m, ch.Q(), D, 1.0f, dK.data(), D);
          small_gemm(false, m, D, D, 1.0f, dX.data(), D, MST, D, 1.0f, dK.data(), D);
          const float bL = ch.cm(m - 1, L), fL = ch.cm(m - 1, L + 1), mL = ch.cs(m - 1, L + 1);
          for (int64_t r = 0; r < D; ++r) {
            float* row = dMS.data() + r * 2 * D;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d) {
              const float dm = row[d];
              row[d] = bL * dm;
              row[D + d] = fL * dm + mL * row[D + d];
            }
          }
          small_gemm(true, D, 2 * D, m, 1.0f, ch.Q(), D, dZbf.data(), 2 * D, 1.0f, dMS.data(),
               2 * D);
          small_gemm(true, D, D, m, 1.0f, Kd, D, dX.data(), D, 1.0f, dMS.data(), 2 * D);
          for (int64_t r = 0; r < m; ++r) {
            const int64_t at = ((sq * T + t0 + r) * H + hd) * D, ts = (sq * T + t0 + r) * H + hd;
            const float *dQr = dQ.data() + r * D, *dKr = dK.data() + r * D;
            const float* dgr = dg.data() + r * D;
            float *dqo = dqp + at, *dko = dkp + at, *dvo = dvp + at;
  #pragma omp simd
            for (int64_t d = 0; d < D; ++d) {
              dqo[d] = dQr[d];
              dko[d] = dKr[d] + wh[d] * dgr[d];
              dvo[d] = -wh[d] * dgr[d];
            }
            dthp[ts] = dth[r];
            dalp[ts] = dal[r];
            dep[ts] = det[r];
          }
        }
      }
      for (int64_t r = 0; r < D; ++r) {
        const float* row = dMS.data() + r * 2 * D;
        std::copy(row, row + D, dM0p + (task * D + r) * D);
        std::copy(row + D, row + 2 * D, dS0p + (task * D + r) * D);
      }
      std::copy(dwa.begin(), dwa.end(), dwp + task * D);
      std::copy(dba.begin(), dba.end(), dbp + task * D);
    }
  });
  return {dq, dk, dv, dtheta, dalpha, deta, dwb.sum(0), dbb.sum(0), dM0, dS0};
}

namespace {

// The fake (shape-only) kernels: the CPU kernels' checks on meta tensors and their outputs'
// shapes. Every output is contiguous but the final states, which copy W0, h0 (``clone``) or the
// incoming dW, dh and so keep their strides; z and the saved states are empty unless ``keep``.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ttt_forward_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& eta,
    const at::Tensor& w, const at::Tensor& bias, const at::Tensor& W0, const at::Tensor& h0,
    double scale_d, double eps_d, int64_t size, int64_t every, bool keep) {
  const Checks check{"linattn_native.ttt_forward", c10::kMeta};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D;
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  check_state(check, "W0", W0, {B, H, D, D}, "[B, H, D, D]");
  check_state(check, "h0", h0, {B, H, D}, "[B, H, D]");
  checked_scale(check, scale_d);
  TORCH_CHECK(every >= 1, check.op, ": every (mini-batches per saved state) must be >= 1, got ",
              every);
  const int64_t ns = (s.n + every - 1) / every;
  const auto opts = q.options();
  const auto kept = [&](at::IntArrayRef sizes) {
    return keep ? at::empty(sizes, opts) : at::empty({0}, opts);
  };
  return {at::empty({B, T, H, D}, opts), kept({B, T, H, D}), at::empty_like(W0),
          at::empty_like(h0),            kept({B, H, ns, D, D}), kept({B, H, ns, D})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
ttt_backward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& eta, const at::Tensor& w, const at::Tensor& bias,
                  const at::Tensor& Ws, const at::Tensor& hs, const at::Tensor& z,
                  const at::Tensor& d_o, const std::optional<at::Tensor>& dW_opt,
                  const std::optional<at::Tensor>& dh_opt, double scale_d, double eps_d,
                  int64_t size, int64_t every) {
  const Checks check{"linattn_native.ttt_backward", c10::kMeta};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D;
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  TORCH_CHECK(every >= 1, check.op, ": every (mini-batches per saved state) must be >= 1, got ",
              every);
  const int64_t ns = (s.n + every - 1) / every;
  check_state(check, "Ws", Ws, {B, H, ns, D, D}, "[B, H, n / every, D, D]");
  check_state(check, "hs", hs, {B, H, ns, D}, "[B, H, n / every, D]");
  check_rows(check, "z", z, B, T, H, D);
  check_rows(check, "d_o", d_o, B, T, H, D);
  const auto opts = q.options();
  at::Tensor dW = dW_opt.has_value() ? at::empty_like(*dW_opt) : at::empty({B, H, D, D}, opts);
  at::Tensor dh = dh_opt.has_value() ? at::empty_like(*dh_opt) : at::empty({B, H, D}, opts);
  check_state(check, "dW", dW, {B, H, D, D}, "[B, H, D, D]");
  check_state(check, "dh", dh, {B, H, D}, "[B, H, D]");
  checked_scale(check, scale_d);
  const at::Tensor rows = at::empty({B, T, H, D}, opts);
  return {rows,
          at::empty_like(rows),
          at::empty_like(rows),
          at::empty({B, T, H}, opts),
          at::empty({H, D}, opts),
          at::empty({H, D}, opts),
          dW,
          dh};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
titans_forward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& theta, const at::Tensor& alpha, const at::Tensor& eta,
                    const at::Tensor& w, const at::Tensor& bias, const at::Tensor& M0,
                    const at::Tensor& S0, double eps_d, int64_t size, int64_t every, bool keep) {
  const Checks check{"linattn_native.titans_forward", c10::kMeta};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D;
  check.shape("theta", theta, {B, T, H}, "[B, T, H]");
  check.shape("alpha", alpha, {B, T, H}, "[B, T, H]");
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  check_state(check, "M0", M0, {B, H, D, D}, "[B, H, D, D]");
  check_state(check, "S0", S0, {B, H, D, D}, "[B, H, D, D]");
  TORCH_CHECK(every >= 1, check.op, ": every (chunks per saved state) must be >= 1, got ", every);
  const int64_t ns = (s.n + every - 1) / every;
  const auto opts = q.options();
  const auto kept = [&](at::IntArrayRef sizes) {
    return keep ? at::empty(sizes, opts) : at::empty({0}, opts);
  };
  return {at::empty({B, T, H, D}, opts), kept({B, T, H, D}),    at::empty({B, H, D, D}, opts),
          at::empty({B, H, D, D}, opts), kept({B, H, ns, D, D}), kept({B, H, ns, D, D})};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor>
titans_backward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& theta, const at::Tensor& alpha, const at::Tensor& eta,
                     const at::Tensor& w, const at::Tensor& bias, const at::Tensor& Ms,
                     const at::Tensor& Ss, const at::Tensor& z, const at::Tensor& d_o,
                     const std::optional<at::Tensor>& dM_opt,
                     const std::optional<at::Tensor>& dS_opt, double eps_d, int64_t size,
                     int64_t every) {
  const Checks check{"linattn_native.titans_backward", c10::kMeta};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D;
  check.shape("theta", theta, {B, T, H}, "[B, T, H]");
  check.shape("alpha", alpha, {B, T, H}, "[B, T, H]");
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  TORCH_CHECK(every >= 1, check.op, ": every (chunks per saved state) must be >= 1, got ", every);
  const int64_t ns = (s.n + every - 1) / every;
  check_state(check, "Ms", Ms, {B, H, ns, D, D}, "[B, H, n / every, D, D]");
  check_state(check, "Ss", Ss, {B, H, ns, D, D}, "[B, H, n / every, D, D]");
  check_rows(check, "z", z, B, T, H, D);
  check_rows(check, "d_o", d_o, B, T, H, D);
  if (dM_opt.has_value()) check_state(check, "dM", *dM_opt, {B, H, D, D}, "[B, H, D, D]");
  if (dS_opt.has_value()) check_state(check, "dS", *dS_opt, {B, H, D, D}, "[B, H, D, D]");
  const auto opts = q.options();
  const auto rows = [&] { return at::empty({B, T, H, D}, opts); };
  const auto gates = [&] { return at::empty({B, T, H}, opts); };
  const auto state = [&] { return at::empty({B, H, D, D}, opts); };
  return {rows(), rows(), rows(), gates(), gates(), gates(), at::empty({H, D}, opts),
          at::empty({H, D}, opts), state(), state()};
}

}  // namespace

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("ttt_forward", &ttt_forward_meta);
  m.impl("ttt_backward", &ttt_backward_meta);
  m.impl("titans_forward", &titans_forward_meta);
  m.impl("titans_backward", &titans_backward_meta);
}

}  // namespace linattn_native
