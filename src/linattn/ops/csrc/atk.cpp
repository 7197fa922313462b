// Preconditioned DeltaNet's curvature state and preconditioned keys
// (``linattn.ops.precond_delta_rule.atk_preconditioner``; arXiv:2604.21100), forward and backward,
// in one pass over the keys' rows each:
//
//   A_t = exp(g_t) A_{t-1} + beta_t k_t^2          (per key channel; g_t, beta_t per head)
//   r_t = log(A_t + eps) - c,   s_t = r_t / (1 + |r_t|),   M_t = exp(-ln(x) s_t),   kp_t = M_t k_t
//
// The backward runs the scan from the last token with lambda_t = dL/dA_t:
//
//   dM/dA = M (-ln x) / ((1 + |r|)^2 (A + eps)),   dk = M dkp + 2 beta lambda k,
//   lambda_t = dkp_t k_t dM/dA_t + exp(g_{t+1}) lambda_{t+1}   (lambda_T from dA_T),
//   dbeta_t = sum lambda_t k_t^2,  dg_t = exp(g_t) sum lambda_t A_{t-1},  dA_0 = exp(g_1) lambda_1,
//   dc = sum M k dkp ln(x) / (1 + |r|)^2   (over the batch, the tokens and the channels).
//
// ``atk_write_forward`` writes the memory's write keys w = beta_w kp instead of kp (Preconditioned
// DeltaNet's write key, per value head: beta_w [B, T, HV], HV = G H), so that neither kp nor the
// product is a tensor of its own; its backward takes dw, forms dkp = sum_j beta_w,j dw_j row by
// row, and returns dbeta_w = dw . kp besides; k's gradient from its other uses (the memory's
// read key), if given, is added into dk in the same pass.
//
// Rows [B, T, H, K] (k, kp, the saved A_t), [B, T, H] (g, beta), [B, H, K] (A_0, A_T), c [H].
// The large outputs come from the block cache (``fresh``): a fresh tensor's pages would otherwise
// be faulted in and zeroed on every call.
// Work: the B H heads are the lanes of the scan, split over the threads; each thread takes its
// lanes token by token, so that the rows it reads stream in order. log and exp are written out
// (``log_positive``, ``exp_flush``) so that each channel loop vectorises.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "block_cache.h"
#include "checks.h"
#include "gates.h"
#include "kernels.h"

namespace linattn_native {
namespace {

// log(x) for a finite x >= FLT_MIN (a normal number: the caller's eps is at least FLT_MIN), to a
// few ulp, branch-free, so that loops over it vectorise (a clamp here would not: the comparison
// before the bit cast counts as control flow): x = 2^e m with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(z), z = (m - 1) / (m + 1), |z| <= 0.172, by its series to z^11.
__attribute__((always_inline)) inline float log_positive(float x) {
  const int32_t bits = __builtin_bit_cast(int32_t, x);
  // the exponent relative to sqrt(1/2) (0x3f3504f3): m = x / 2^e in [sqrt(1/2), sqrt(2))
  const int32_t e = (bits - 0x3f3504f3) >> 23;
  const float m = __builtin_bit_cast(float, bits - (e << 23));
  const float z = (m - 1.0f) / (m + 1.0f), z2 = z * z;
  float p = 1.0f / 11.0f;
  p = std::fma(p, z2, 1.0f / 9.0f);
  p = std::fma(p, z2, 1.0f / 7.0f);
  p = std::fma(p, z2, 1.0f / 5.0f);
  p = std::fma(p, z2, 1.0f / 3.0f);
  p = std::fma(p, z2, 1.0f);
  const float fe = static_cast<float>(e);
  // e ln 2 in two parts (the product with the first is exact for |e| < 2^8)
  return std::fma(fe, 0.693145752f, std::fma(fe, 1.42860677e-06f, 2.0f * z * p));
}

struct Scan {
  int64_t B, T, H, K;
  const float *k, *g, *beta, *A0, *c;
  float log_x, eps;
};

// The inputs' checks (naming the argument) and sizes.
Scan prepare(const Checks& check, const at::Tensor& k, const at::Tensor& g,
             const at::Tensor& beta, const at::Tensor& A0, const at::Tensor& center,
             double log_x, double eps) {
  check.float32_cpu("k", k);
  TORCH_CHECK(k.dim() == 4 && k.is_contiguous(), check.op,
              ": k must be a contiguous [B, T, H, K] tensor, got shape ", k.sizes());
  const int64_t B = k.size(0), T = k.size(1), H = k.size(2), K = k.size(3);
  for (const auto& [name, x] : {std::pair{"g", &g}, std::pair{"beta", &beta}}) {
    check.float32_cpu(name, *x);
    check.shape(name, *x, {B, T, H}, "[B, T, H]");
    TORCH_CHECK(x->is_contiguous(), check.op, ": ", name, " must be contiguous");
  }
  check.float32_cpu("A0", A0);
  check.shape("A0", A0, {B, H, K}, "[B, H, K]");
  TORCH_CHECK(A0.is_contiguous(), check.op, ": A0 must be contiguous");
  check.float32_cpu("center", center);
  check.shape("center", center, {H}, "[H]");
  TORCH_CHECK(center.is_contiguous(), check.op, ": center must be contiguous");
  TORCH_CHECK(std::isfinite(log_x) && std::isfinite(eps) && eps > 0, check.op,
              ": log_x must be finite and eps a finite number > 0");
  // meta tensors (the fake kernels' checks) have no data
  const auto data = [&](const at::Tensor& x) {
    return check.device == c10::kCPU ? x.data_ptr<float>() : nullptr;
  };
  return {B, T, H, K, data(k), data(g), data(beta), data(A0), data(center),
          static_cast<float>(log_x),
          std::max(static_cast<float>(eps), FLT_MIN)};  // A >= 0: A + eps is a normal number
}

// The lanes [lo, hi) of the B H heads, a thread's share (at least one whole head each).
template <typename F>
void for_lanes(const Scan& s, const F& body) {
  at::parallel_for(0, s.B * s.H, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    body(lo, hi);
  });
}

}  // namespace

namespace {

// The write strengths beta [B, T, HV] (HV = G H, value head h G + j on key head h) of the fused
// write keys w = beta kp (``atk_write_forward``), checked; G.
int64_t strength_groups(const Checks& check, const Scan& s, const at::Tensor& strength) {
  check.float32_cpu("strength", strength);
  TORCH_CHECK(strength.dim() == 3 && strength.size(0) == s.B && strength.size(1) == s.T &&
                  s.H > 0 && strength.size(2) % s.H == 0 && strength.size(2) > 0,
              check.op, ": strength must be a [B, T, HV] tensor with B, T = ", s.B, ", ", s.T,
              " and HV a multiple of H = ", s.H, ", got shape ", strength.sizes());
  TORCH_CHECK(strength.is_contiguous(), check.op, ": strength must be contiguous");
  return strength.size(2) / s.H;
}

// The scan forward: into out [B, T, H G, K] kp (wb null, G = 1) or the write keys wb kp, row
// (b, t, h G + j) = row (b, t, h) G + j; A_T into A_end, every A_t into keepp (if not null).
void scan_forward(const Scan& s, const float* wb, int64_t G, float* out, float* A_end,
                  float* keepp) {
  const int64_t H = s.H, K = s.K, T = s.T;
  for_lanes(s, [&](int64_t lo, int64_t hi) {
    std::vector<float> kp_row(wb != nullptr ? K : 0);
    std::copy(s.A0 + lo * K, s.A0 + hi * K, A_end + lo * K);  // A, lane by lane, in place
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t lane = lo; lane < hi; ++lane) {
        const int64_t b = lane / H, h = lane % H, row = (b * T + t) * H + h;
        const float decay = std::exp(s.g[row]), bt = s.beta[row], c = s.c[h];
        const float* kr = s.k + row * K;
        float *A = A_end + lane * K, *kp = wb != nullptr ? kp_row.data() : out + row * K;
#pragma omp simd
        for (int64_t ch = 0; ch < K; ++ch) {
          const float a = std::fma(decay, A[ch], bt * kr[ch] * kr[ch]);
          A[ch] = a;
          const float r = log_positive(a + s.eps) - c;
          kp[ch] = kr[ch] * exp_flush(-s.log_x * (r / (1.0f + std::fabs(r))));
        }
        if (keepp) std::copy(A, A + K, keepp + row * K);
        if (wb == nullptr) continue;
        for (int64_t j = 0; j < G; ++j) {
          const float bj = wb[row * G + j];
          float* w = out + (row * G + j) * K;
#pragma omp simd
          for (int64_t ch = 0; ch < K; ++ch) w[ch] = bj * kp[ch];
        }
      }
    }
  });
}

// The gradients of the scan (the file's header) from dkp (wb null, G = 1: dout = dkp [B, T, H,
// K]) or from the write keys' gradient dout [B, T, H G, K]: dkp = sum_j wb_j dout_j and the
// strengths' dwb_j = dout_j . kp (into dwbp); dr [B, T, H, K] (or null: zeros, with wb only),
// the gradient that k receives elsewhere, added into dk.
void scan_backward(const Scan& s, const float* wb, int64_t G, const float* Aall,
                   const float* dout, const float* dAe, float* dkp_out, float* dgp, float* dbp,
                   float* lam, double* dcp, float* dwbp, const float* dr) {
  const int64_t H = s.H, K = s.K, T = s.T;
  for_lanes(s, [&](int64_t lo, int64_t hi) {
    std::vector<float> dkp_row(wb != nullptr ? K : 0), kp_row(wb != nullptr ? K : 0);
    const std::vector<float> zeros(wb != nullptr && dr == nullptr ? K : 0, 0.0f);
    std::copy(dAe + lo * K, dAe + hi * K, lam + lo * K);  // lambda, lane by lane, in place
    for (int64_t t = T - 1; t >= 0; --t) {
      for (int64_t lane = lo; lane < hi; ++lane) {
        const int64_t b = lane / H, h = lane % H, row = (b * T + t) * H + h;
        const float decay = std::exp(s.g[row]), bt = s.beta[row], c = s.c[h];
        const float *kr = s.k + row * K, *A = Aall + row * K;
        const float* dkr = dout + row * K;
        if (wb != nullptr) {  // dkp = sum_j wb_j dout_j
          float* d = dkp_row.data();
          std::fill(d, d + K, 0.0f);
          for (int64_t j = 0; j < G; ++j) {
            const float bj = wb[row * G + j];
            const float* dj = dout + (row * G + j) * K;
#pragma omp simd
            for (int64_t ch = 0; ch < K; ++ch) d[ch] = std::fma(bj, dj[ch], d[ch]);
          }
          dkr = d;
        }
        float* kp = kp_row.data();
        const float* before = t > 0 ? Aall + (row - H) * K : s.A0 + lane * K;
        float *L = lam + lane * K, *dkk = dkp_out + row * K;
        float dc = 0.0f, db = 0.0f, dgate = 0.0f;
        if (wb != nullptr) {
          const float* dri = dr != nullptr ? dr + row * K : zeros.data();
#pragma omp simd reduction(+ : dc, db, dgate)
          for (int64_t ch = 0; ch < K; ++ch) {
            const float ae = A[ch] + s.eps, r = log_positive(ae) - c;
            const float q = 1.0f / (1.0f + std::fabs(r));
            const float M = exp_flush(-s.log_x * (r * q));
            kp[ch] = kr[ch] * M;
            const float w = dkr[ch] * kr[ch] * M * s.log_x * q * q;  // -dL/dr
            dc += w;
            const float l = L[ch] - w / ae;  // dL/dA_t
            db += l * (kr[ch] * kr[ch]);
            dgate += l * before[ch];
            dkk[ch] = (M * dkr[ch] + 2.0f * bt * kr[ch] * l) + dri[ch];
            L[ch] = decay * l;
          }
          for (int64_t j = 0; j < G; ++j) {
            const float* dj = dout + (row * G + j) * K;
            float sw = 0.0f;
#pragma omp simd reduction(+ : sw)
            for (int64_t ch = 0; ch < K; ++ch) sw += dj[ch] * kp[ch];
            dwbp[row * G + j] = sw;
          }
        } else {
#pragma omp simd reduction(+ : dc, db, dgate)
          for (int64_t ch = 0; ch < K; ++ch) {
            const float ae = A[ch] + s.eps, r = log_positive(ae) - c;
            const float q = 1.0f / (1.0f + std::fabs(r));
            const float M = exp_flush(-s.log_x * (r * q));
            const float w = dkr[ch] * kr[ch] * M * s.log_x * q * q;  // -dL/dr
            dc += w;
            const float l = L[ch] - w / ae;  // dL/dA_t
            db += l * (kr[ch] * kr[ch]);
            dgate += l * before[ch];
            dkk[ch] = M * dkr[ch] + 2.0f * bt * kr[ch] * l;
            L[ch] = decay * l;
          }
        }
        dcp[lane] += dc;
        dbp[row] = db;
        dgp[row] = decay * dgate;
      }
    }
  });
}

// The backward's checks of A_all, the incoming gradient dout ([B, T, HV, K] under ``name``) and
// dA_end.
void check_backward(const Checks& check, const Scan& s, int64_t HV, const at::Tensor& A_all,
                    const char* name, const at::Tensor& dout, const at::Tensor& dA_end) {
  check.float32_cpu("A_all", A_all);
  check.shape("A_all", A_all, {s.B, s.T, s.H, s.K}, "[B, T, H, K]");
  TORCH_CHECK(A_all.is_contiguous(), check.op, ": A_all must be contiguous");
  check.float32_cpu(name, dout);
  check.shape(name, dout, {s.B, s.T, HV, s.K}, "[B, T, HV, K]");
  TORCH_CHECK(dout.is_contiguous(), check.op, ": ", name, " must be contiguous");
  check.float32_cpu("dA_end", dA_end);
  check.shape("dA_end", dA_end, {s.B, s.H, s.K}, "[B, H, K]");
  TORCH_CHECK(dA_end.is_contiguous(), check.op, ": dA_end must be contiguous");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> atk_forward(const at::Tensor& k,
                                                           const at::Tensor& g,
                                                           const at::Tensor& beta,
                                                           const at::Tensor& A0,
                                                           const at::Tensor& center,
                                                           double log_x, double eps, bool keep) {
  const Checks check{"linattn_native.atk_forward"};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  at::Tensor kp = fresh(k.sizes(), k.options());
  at::Tensor A_end = at::empty(A0.sizes(), A0.options());
  at::Tensor A_all = keep ? fresh(k.sizes(), k.options()) : at::empty({0}, k.options());
  scan_forward(s, nullptr, 1, kp.data_ptr<float>(), A_end.data_ptr<float>(),
               keep ? A_all.data_ptr<float>() : nullptr);
  return {kp, A_end, A_all};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> atk_backward(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, const at::Tensor& A_all, const at::Tensor& dkp,
    const at::Tensor& dA_end, double log_x, double eps) {
  const Checks check{"linattn_native.atk_backward"};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  check_backward(check, s, s.H, A_all, "dkp", dkp, dA_end);
  at::Tensor dk = fresh(k.sizes(), k.options());
  at::Tensor dg = at::empty(g.sizes(), g.options()), dbeta = at::empty(beta.sizes(), g.options());
  at::Tensor dA0 = at::empty(A0.sizes(), A0.options());
  at::Tensor dc_lanes = at::zeros({s.B * s.H}, A0.options().dtype(at::kDouble));
  scan_backward(s, nullptr, 1, A_all.data_ptr<float>(), dkp.data_ptr<float>(),
                dA_end.data_ptr<float>(), dk.data_ptr<float>(), dg.data_ptr<float>(),
                dbeta.data_ptr<float>(), dA0.data_ptr<float>(), dc_lanes.data_ptr<double>(),
                nullptr, nullptr);
  at::Tensor dcenter = dc_lanes.view({s.B, s.H}).sum(0).to(at::kFloat);
  return {dk, dg, dbeta, dA0, dcenter};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> atk_write_forward(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, const at::Tensor& strength, double log_x, double eps, bool keep) {
  const Checks check{"linattn_native.atk_write_forward"};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  const int64_t G = strength_groups(check, s, strength);
  at::Tensor w = fresh({s.B, s.T, s.H * G, s.K}, k.options());
  at::Tensor A_end = at::empty(A0.sizes(), A0.options());
  at::Tensor A_all = keep ? fresh(k.sizes(), k.options()) : at::empty({0}, k.options());
  scan_forward(s, strength.data_ptr<float>(), G, w.data_ptr<float>(), A_end.data_ptr<float>(),
               keep ? A_all.data_ptr<float>() : nullptr);
  return {w, A_end, A_all};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
atk_write_backward(const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta,
                   const at::Tensor& A0, const at::Tensor& center, const at::Tensor& strength,
                   const at::Tensor& A_all, const at::Tensor& dw, const at::Tensor& dA_end,
                   const std::optional<at::Tensor>& dr, double log_x, double eps) {
  const Checks check{"linattn_native.atk_write_backward"};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  const int64_t G = strength_groups(check, s, strength);
  check_backward(check, s, s.H * G, A_all, "dw", dw, dA_end);
  if (dr) {
    check.float32_cpu("dr", *dr);
    check.shape("dr", *dr, {s.B, s.T, s.H, s.K}, "[B, T, H, K]");
    TORCH_CHECK(dr->is_contiguous(), check.op, ": dr must be contiguous");
  }
  at::Tensor dk = fresh(k.sizes(), k.options());
  at::Tensor dg = at::empty(g.sizes(), g.options()), dbeta = at::empty(beta.sizes(), g.options());
  at::Tensor dA0 = at::empty(A0.sizes(), A0.options());
  at::Tensor dstrength = at::empty(strength.sizes(), strength.options());
  at::Tensor dc_lanes = at::zeros({s.B * s.H}, A0.options().dtype(at::kDouble));
  scan_backward(s, strength.data_ptr<float>(), G, A_all.data_ptr<float>(), dw.data_ptr<float>(),
                dA_end.data_ptr<float>(), dk.data_ptr<float>(), dg.data_ptr<float>(),
                dbeta.data_ptr<float>(), dA0.data_ptr<float>(), dc_lanes.data_ptr<double>(),
                dstrength.data_ptr<float>(), dr ? dr->data_ptr<float>() : nullptr);
  at::Tensor dcenter = dc_lanes.view({s.B, s.H}).sum(0).to(at::kFloat);
  return {dk, dg, dbeta, dA0, dcenter, dstrength};
}

namespace {

// The fake (shape-only) kernels: the CPU kernels' checks on meta tensors and their outputs'
// shapes, every output contiguous (A_all empty unless ``keep``).
std::tuple<at::Tensor, at::Tensor, at::Tensor> atk_forward_meta(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, double log_x, double eps, bool keep) {
  const Checks check{"linattn_native.atk_forward", c10::kMeta};
  prepare(check, k, g, beta, A0, center, log_x, eps);
  return {at::empty(k.sizes(), k.options()), at::empty(A0.sizes(), A0.options()),
          keep ? at::empty(k.sizes(), k.options()) : at::empty({0}, k.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> atk_backward_meta(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, const at::Tensor& A_all, const at::Tensor& dkp,
    const at::Tensor& dA_end, double log_x, double eps) {
  const Checks check{"linattn_native.atk_backward", c10::kMeta};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  check_backward(check, s, s.H, A_all, "dkp", dkp, dA_end);
  return {at::empty(k.sizes(), k.options()), at::empty(g.sizes(), g.options()),
          at::empty(beta.sizes(), g.options()), at::empty(A0.sizes(), A0.options()),
          at::empty({s.H}, A0.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> atk_write_forward_meta(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, const at::Tensor& strength, double log_x, double eps, bool keep) {
  const Checks check{"linattn_native.atk_write_forward", c10::kMeta};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  const int64_t G = strength_groups(check, s, strength);
  return {at::empty({s.B, s.T, s.H * G, s.K}, k.options()), at::empty(A0.sizes(), A0.options()),
          keep ? at::empty(k.sizes(), k.options()) : at::empty({0}, k.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
atk_write_backward_meta(const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta,
                        const at::Tensor& A0, const at::Tensor& center,
                        const at::Tensor& strength, const at::Tensor& A_all,
                        const at::Tensor& dw, const at::Tensor& dA_end,
                        const std::optional<at::Tensor>& dr, double log_x, double eps) {
  const Checks check{"linattn_native.atk_write_backward", c10::kMeta};
  const Scan s = prepare(check, k, g, beta, A0, center, log_x, eps);
  const int64_t G = strength_groups(check, s, strength);
  check_backward(check, s, s.H * G, A_all, "dw", dw, dA_end);
  if (dr) {
    check.float32_cpu("dr", *dr);
    check.shape("dr", *dr, {s.B, s.T, s.H, s.K}, "[B, T, H, K]");
    TORCH_CHECK(dr->is_contiguous(), check.op, ": dr must be contiguous");
  }
  return {at::empty(k.sizes(), k.options()),      at::empty(g.sizes(), g.options()),
          at::empty(beta.sizes(), g.options()),   at::empty(A0.sizes(), A0.options()),
          at::empty({s.H}, A0.options()),         at::empty(strength.sizes(), strength.options())};
}

}  // namespace

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("atk_forward", &atk_forward_meta);
  m.impl("atk_backward", &atk_backward_meta);
  m.impl("atk_write_forward", &atk_write_forward_meta);
  m.impl("atk_write_backward", &atk_write_backward_meta);
}

}  // namespace linattn_native
