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
// [B, H, D, D] and [B, H, D], the saved states [B, H, n, D, D] and [B, H, n, D]. Work: one task
// per (sequence, head), spread over the threads.
#include <ATen/Parallel.h>
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

namespace linattn_native {
namespace {

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
  void load(const TttRows& q, const TttRows& k, const TttRows& v, const TttRows& et, int64_t s, int64_t h,
            int64_t t0, int64_t m) {
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

  // Steps 1-4 but Z: X (and R when ``reads``) from the state, the gradient G, A and Y = A G.
  void gradient(const float* W, const float* hv, bool reads) {
    const int64_t rows = reads ? 2 * b : b;
    const float* in = reads ? Q() : K();
    float* out = reads ? XR.data() : XR.data() + b * D;
    gemm(false, false, rows, D, D, 1.0f, in, D, W, D, 0.0f, out, D);
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
    gemm(false, true, b, b, D, 1.0f, Q(), D, K(), D, 0.0f, A.data(), b);
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < b; ++j) A[i * b + j] = j <= i ? A[i * b + j] + 1.0f : 0.0f;
    gemm(false, false, b, D, b, 1.0f, A.data(), b, G.data(), D, 0.0f, Y.data(), D);
  }

  // Step 6: the state leaving the mini-batch, in place.
  void step(float* W, float* hv) {
    const float e = eta[b - 1];
    gemm(true, false, D, D, b, -e, K(), D, G.data(), D, 1.0f, W, D);
    for (int64_t r = 0; r < b; ++r) {
      const float* Gr = G.data() + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) hv[d] -= e * Gr[d];
    }
  }
};

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
    double scale_d, double eps_d, int64_t size, bool keep) {
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
  at::Tensor W = W0.clone(), hv = h0.clone();
  at::Tensor Ws = keep ? fresh({B, H, n, D, D}, opts) : at::empty({0}, opts);
  at::Tensor hs = keep ? at::empty({B, H, n, D}, opts) : at::empty({0}, opts);
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
        if (keep) {
          std::copy(Wt, Wt + D * D, Wsp + (task * n + j) * D * D);
          std::copy(ht, ht + D, hsp + (task * n + j) * D);
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
             double scale_d, double eps_d, int64_t size) {
  const Checks check{"linattn_native.ttt_backward"};
  const TttSizes s(check, q, k, v, eta, w, bias, size, eps_d);
  const int64_t B = s.B, T = s.T, H = s.H, D = s.D, n = s.n, b = s.size;
  TORCH_CHECK(w.is_contiguous() && bias.is_contiguous(), check.op,
              ": w and b must be contiguous");
  check_state(check, "Ws", Ws, {B, H, n, D, D}, "[B, H, n, D, D]");
  check_state(check, "hs", hs, {B, H, n, D}, "[B, H, n, D]");
  check_rows(check, "z", z, B, T, H, D);
  check_rows(check, "d_o", d_o, B, T, H, D);
  at::Tensor dW = dW_opt.has_value() ? dW_opt->clone() : at::zeros({B, H, D, D}, q.options());
  at::Tensor dh = dh_opt.has_value() ? dh_opt->clone() : at::zeros({B, H, D}, q.options());
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
      for (int64_t j = n - 1; j >= 0; --j) {
        const int64_t t0 = j * b, m = std::min(b, T - t0);
        const float* Wt = Wsp + (task * n + j) * D * D;
        const float* ht = hsp + (task * n + j) * D;
        mb.load(qr, kr, vr, er, sq, hd, t0, m);
        mb.gradient(Wt, ht, false);
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
        gemm(false, true, b, b, D, 1.0f, dY.data(), D, mb.G.data(), D, 0.0f, dA.data(), b);
        for (int64_t i = 0; i < b; ++i)
          for (int64_t jj = i + 1; jj < b; ++jj) dA[i * b + jj] = 0.0f;  // dP = tril(dA)
        gemm(true, false, b, D, b, 1.0f, mb.A.data(), b, dY.data(), D, 0.0f, dG.data(), D);
        // step 9, from the gradient of the state leaving the mini-batch
        gemm(false, false, b, D, D, 1.0f, mb.K(), D, dWt, D, 0.0f, KdW.data(), D);
        gemm(false, true, b, D, D, -e, mb.G.data(), D, dWt, D, 0.0f, dKu.data(), D);
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
        gemm(false, true, 2 * b, D, D, 1.0f, DZX.data(), D, Wt, D, 0.0f, dQK.data(), D);
        float *dQ = dQK.data(), *dK = dQK.data() + b * D;
        gemm(false, false, b, D, b, 1.0f, dA.data(), b, mb.K(), D, 1.0f, dQ, D);
        gemm(true, false, b, D, b, 1.0f, dA.data(), b, mb.Q(), D, 1.0f, dK, D);
        gemm(true, false, D, D, 2 * b, 1.0f, mb.Q(), D, DZX.data(), D, 1.0f, dWt, D);
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
      std::copy(dwa.begin(), dwa.end(), dwp + task * D);
      std::copy(dba.begin(), dba.end(), dbp + task * D);
    }
  });
  return {dq, dk, dv, deta, dwb.sum(0), dbb.sum(0), dW, dh};
}

}  // namespace linattn_native
