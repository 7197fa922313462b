// LightNet's gate (``linattn.compat.lightnet``): the running log-sum-exp of the key logits and
// the keys and log-decays it gives, forward and backward, in one pass over rows of channels
// x [B, T, D] (unit stride over D):
//
//   z_t = log(exp(z_{t-1}) + exp(x_t))   (z_{-1} = z0 [B, D], or -inf: no prior mass)
//   g_t = z_{t-1} - z_t                  (0 while z_{t-1} = -inf)
//   k_t = exp(x_t - z_t)
//
// Each step from d = x_t - z_{t-1} and e = exp(-|d|) in (0, 1]: z_t = z_{t-1} + softplus(d),
// g_t = -softplus(d) = -(max(d, 0) + log1p(e)) <= 0 and k_t = sigmoid(d), so that no exponent is
// positive and no difference of two large numbers is taken. The backward, with R the gradient
// of z_t (dz_t / dz_{t-1} = exp(g_t), dz_t / dx_t = k_t), runs the tokens last to first:
//
//   R_t = -dk_t k_t - dg_t + dg_{t+1} (+ dz_T at the last token) + exp(g_{t+1}) R_{t+1}
//   dx_t = k_t (dk_t + R_t)
//
// (no -dg_0 where g_0 is the constant 0), and returns R_0 for the initial state's gradient.
// Work: tasks of up to kLseColumns channels of one sequence, parallel over the batch and the
// channels; every loop runs over a task's channels, contiguous, so that it vectorises. The steps
// of one channel are a chain (each z_t waits for z_{t-1}): a task's row is wide so that many
// chains are in flight at once, and split only to give every thread a task.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "block_cache.h"
#include "checks.h"
#include "gates.h"
#include "kernels.h"

namespace linattn_native {
namespace {

constexpr int64_t kLseColumns = 512;  // the most channels of one task

// log(1 + e) for e in [0, 1], as 2 atanh(s) with s = e / (2 + e) in [0, 1/3] (no rounding of
// 1 + e): its odd series to s^15, whose next term is below float32's rounding.
__attribute__((always_inline)) inline float log1p_unit(float e) {
  const float s = e / (2.0f + e), s2 = s * s;
  float p = 2.0f / 15.0f;
  p = std::fma(p, s2, 2.0f / 13.0f);
  p = std::fma(p, s2, 2.0f / 11.0f);
  p = std::fma(p, s2, 2.0f / 9.0f);
  p = std::fma(p, s2, 2.0f / 7.0f);
  p = std::fma(p, s2, 2.0f / 5.0f);
  p = std::fma(p, s2, 2.0f / 3.0f);
  p = std::fma(p, s2, 2.0f);
  return p * s;
}

// The tasks of a [B, T, D] call: task i is sequence i / n, channels from (i % n) w, with w at
// most kLseColumns and small enough (down to 64) that every thread has a task.
template <typename F>
void for_columns(int64_t B, int64_t D, const F& body) {
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t per_sequence = (threads + B - 1) / B;  // tasks a sequence needs
  int64_t w = std::min<int64_t>(kLseColumns, (D + per_sequence - 1) / per_sequence);
  w = std::max<int64_t>(std::min<int64_t>(64, D), (w + 15) / 16 * 16);
  w = std::min(w, kLseColumns);
  const int64_t n = (D + w - 1) / w;
  at::parallel_for(0, B * n, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / n, d0 = (i % n) * w;
      body(b, d0, std::min(D, d0 + w) - d0);
    }
  });
}

void check_rows(const Checks& check, const char* name, const at::Tensor& x) {
  check.float32_cpu(name, x);
  TORCH_CHECK(x.dim() == 3 && x.is_contiguous(), check.op, ": ", name,
              " must be a contiguous [B, T, D] tensor, got shape ", x.sizes(), " and strides ",
              x.strides());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> logsumexp_gate_forward(
    const at::Tensor& x, const std::optional<at::Tensor>& z0_opt) {
  const Checks check{"linattn_native.logsumexp_gate_forward"};
  check_rows(check, "x", x);
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  at::Tensor z0;
  if (z0_opt.has_value()) {
    check.shape("z0", *z0_opt, {B, D}, "[B, D]");
    z0 = z0_opt->contiguous();
  }
  at::Tensor k = fresh({B, T, D}, x.options()), g = fresh({B, T, D}, x.options());
  at::Tensor z_last = at::empty({B, D}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* zp0 = z0.defined() ? z0.data_ptr<float>() : nullptr;
  float *kp = k.data_ptr<float>(), *gp = g.data_ptr<float>(), *zl = z_last.data_ptr<float>();
  constexpr float kNoMass = -std::numeric_limits<float>::infinity();
  for_columns(B, D, [&](int64_t b, int64_t d0, int64_t w) {
    // z is carried as an unevaluated sum z + lo of two floats (each step's rounding of z_{t-1}
    // + softplus kept in lo by Knuth's TwoSum): a float z alone would round at every step, and
    // those roundings add up over the tokens (the decay from token i to t is off by their sum
    // over i..t, growing with t - i). The pair keeps every step in float32 lanes.
    float z[kLseColumns], lo[kLseColumns];
    for (int64_t c = 0; c < w; ++c) {
      z[c] = zp0 ? zp0[b * D + d0 + c] : kNoMass;
      lo[c] = 0.0f;
    }
    for (int64_t t = 0; t < T; ++t) {
      const int64_t at = (b * T + t) * D + d0;
      const float* xr = xp + at;
      float *kr = kp + at, *gr = gp + at;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        const float prev = z[c], d = (xr[c] - prev) - lo[c];
        const float e = exp_flush(-std::fabs(d));
        const float softplus = std::max(d, 0.0f) + log1p_unit(e);
        const float sigmoid = (d >= 0.0f ? 1.0f : e) / (1.0f + e);
        const float sum = prev + softplus, back = sum - prev;  // TwoSum: sum + error exactly
        const float error = (prev - (sum - back)) + (softplus - back);
        const bool start = prev == kNoMass;  // no prior mass: z_t = x_t, g_t = 0, k_t = 1
        z[c] = start ? xr[c] : sum;
        lo[c] = start ? 0.0f : lo[c] + error;
        gr[c] = start ? 0.0f : -softplus;
        kr[c] = start ? 1.0f : sigmoid;
      }
    }
    for (int64_t c = 0; c < w; ++c) zl[b * D + d0 + c] = z[c] + lo[c];
  });
  return {k, g, z_last};
}

std::tuple<at::Tensor, at::Tensor> logsumexp_gate_backward(
    const at::Tensor& k, const at::Tensor& g, const std::optional<at::Tensor>& dk_opt,
    const std::optional<at::Tensor>& dg_opt, const std::optional<at::Tensor>& dz_opt,
    const at::Tensor& first_constant) {
  const Checks check{"linattn_native.logsumexp_gate_backward"};
  check_rows(check, "k", k);
  const int64_t B = k.size(0), T = k.size(1), D = k.size(2);
  check.shape("g", g, {B, T, D}, "[B, T, D]");
  TORCH_CHECK(g.is_contiguous(), check.op, ": g must be contiguous");
  // an absent gradient is zeros (a rare call: k or g unused), so that the loops read rows
  const auto rows_or_zeros = [&](const std::optional<at::Tensor>& x, const char* name) {
    if (!x.has_value()) return at::zeros({B, T, D}, k.options());
    check.shape(name, *x, {B, T, D}, "[B, T, D]");
    return x->contiguous();
  };
  const at::Tensor dk = rows_or_zeros(dk_opt, "dk"), dg = rows_or_zeros(dg_opt, "dg");
  at::Tensor dz;
  if (dz_opt.has_value()) {
    check.shape("dz_last", *dz_opt, {B, D}, "[B, D]");
    dz = dz_opt->contiguous();
  }
  TORCH_CHECK(first_constant.scalar_type() == at::kBool && first_constant.dim() == 2 &&
                  first_constant.size(0) == B && first_constant.size(1) == D,
              check.op, ": first_constant must be a bool [B, D] tensor, got ",
              first_constant.scalar_type(), " ", first_constant.sizes());
  // 1 where g_0 is a gradient's path (prior mass), 0 where it is the constant 0
  const at::Tensor live = first_constant.logical_not().to(at::kFloat).contiguous();
  at::Tensor dx = fresh({B, T, D}, k.options());
  at::Tensor r0 = at::empty({B, D}, k.options());
  const float *kp = k.data_ptr<float>(), *gp = g.data_ptr<float>();
  const float *dkp = dk.data_ptr<float>(), *dgp = dg.data_ptr<float>();
  const float* dzp = dz.defined() ? dz.data_ptr<float>() : nullptr;
  const float* lp = live.data_ptr<float>();
  float *dxp = dx.data_ptr<float>(), *r0p = r0.data_ptr<float>();
  for_columns(B, D, [&](int64_t b, int64_t d0, int64_t w) {
    float r[kLseColumns];  // exp(g_{t+1}) R_{t+1} + dg_{t+1}: what z_t receives from later
    for (int64_t c = 0; c < w; ++c) r[c] = dzp ? dzp[b * D + d0 + c] : 0.0f;
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t at = (b * T + t) * D + d0;
      const float *kr = kp + at, *gr = gp + at, *dkr = dkp + at, *dgr = dgp + at;
      const float* lr = t == 0 ? lp + b * D + d0 : nullptr;
      float* dxr = dxp + at;
      if (lr == nullptr) {
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          const float total = r[c] - dkr[c] * kr[c] - dgr[c];  // R_t
          dxr[c] = kr[c] * (dkr[c] + total);
          // what z_{t-1} receives: exp(g_t) R_t through z_t, and dg_t through g_t
          r[c] = exp_flush(gr[c]) * total + dgr[c];
        }
      } else {  // the first token: g_0's gradient only where it had prior mass
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) {
          const float dgc = dgr[c] * lr[c];
          const float total = r[c] - dkr[c] * kr[c] - dgc;
          dxr[c] = kr[c] * (dkr[c] + total);
          r[c] = exp_flush(gr[c]) * total + dgc;
        }
      }
    }
    for (int64_t c = 0; c < w; ++c) r0p[b * D + d0 + c] = r[c];
  });
  return {dx, r0};
}

}  // namespace linattn_native
