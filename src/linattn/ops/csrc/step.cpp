// The generation step (spec section 9): one token of any mechanism, the state updated in place.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "checks.h"
#include "kernels.h"
#include "tuning.h"

namespace linattn_native {

namespace {

// The checks of a ``recurrent_step`` call (on ``device``), before anything is read or written.
void step_checks(c10::DeviceType device, const at::Tensor& state, const at::Tensor& q,
                 const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& beta,
                 const std::optional<at::Tensor>& g, double scale) {
  const Checks check{"linattn_native.recurrent_step", device};
  check.float32_cpu("state", state);
  TORCH_CHECK(state.dim() == 4 && state.is_contiguous(), check.op,
              ": state must be a contiguous [B, H, K, V] tensor (updated in place), got shape ",
              state.sizes(), " and strides ", state.strides());
  // H: the value heads (H = group Hq with grouped value heads), Hq: q's and k's.
  const int64_t B = state.size(0), H = state.size(1), K = state.size(2), V = state.size(3);
  check.float32_cpu("q", q);
  const int64_t Hq = q.dim() == 3 ? q.size(1) : -1;
  TORCH_CHECK(Hq > 0 ? H % Hq == 0 : H == 0, check.op,
              ": q must be of shape [B, Hq, K] with Hq dividing the state's H = ", H,
              " (grouped value heads), got ", q.sizes());
  check.shape("q", q, {B, Hq, K}, "[B, Hq, K]");
  check.shape("k", k, {B, Hq, K}, "[B, Hq, K]");
  check.shape("v", v, {B, H, V}, "[B, H, V]");
  if (beta.has_value()) check.shape("beta", *beta, {B, H}, "[B, H]");
  if (g.has_value()) {
    check.float32_cpu("g", *g);
    const int64_t width = g->dim() == 3 ? g->size(2) : -1;
    TORCH_CHECK(width == 1 || width == K, check.op, ": g must be of shape [B, H, 1 | K] = [", B,
                ", ", H, ", 1 | ", K, "], got ", g->sizes());
    check.shape("g", *g, {B, H, width}, "[B, H, 1 | K]");
  }
  checked_scale(check, scale);
}

// Whether n numbers are all finite, in parallel in blocks of kStepGrain: at a large batch the
// check of the state is a pass over as many numbers as the step itself.
bool all_finite(const float* x, int64_t n) {
  return at::parallel_reduce(
      0, n, kStepGrain, true,
      [&](int64_t lo, int64_t hi, bool ok) {
        float acc = 0.0f;  // x * 0 is 0 for finite x and NaN for NaN or Inf
#pragma omp simd reduction(+ : acc)
        for (int64_t i = lo; i < hi; ++i) acc += x[i] * 0.0f;
        return ok && acc == 0.0f;
      },
      [](bool a, bool b) { return a && b; });
}

// The inputs of one head's step (q/k of its q/k head, read in place; beta and the log-gates g
// [kg] nullptr where the mechanism has none).
struct StepHead {
  const float *q, *k, *v, *beta, *g;
  int64_t kg;
};

// One head's step on its state S [K, V]: S <- Diag(exp g) S; u = v or beta (v - S^T k);
// S <- S + k u^T; o = S^T (scale q) into o [V] (u [V]: scratch).
void step_head(const StepHead& x, int64_t K, int64_t V, float scale, float* S, float* u,
               float* o) {
  // Decay and the read S^T k in one pass over S.
  std::fill(u, u + V, 0.0f);
  for (int64_t i = 0; i < K; ++i) {
    float* row = S + i * V;
    if (x.g) {
      const float a = std::exp(x.g[x.kg == 1 ? 0 : i]);
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) row[j] *= a;
    }
    if (x.beta) {
      const float ki = x.k[i];
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) u[j] += ki * row[j];
    }
  }
  if (x.beta) {
    const float b = *x.beta;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) u[j] = b * (x.v[j] - u[j]);
  } else {
    std::copy(x.v, x.v + V, u);
  }
  // The write k u^T and the read S^T (scale q) in one more pass.
  std::fill(o, o + V, 0.0f);
  for (int64_t i = 0; i < K; ++i) {
    float* row = S + i * V;
    const float ki = x.k[i], qi = scale * x.q[i];
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) {
      row[j] += ki * u[j];
      o[j] += qi * row[j];
    }
  }
}

}  // namespace

// One generation step of any mechanism (``linattn.ops.recurrent_step``), the state updated in
// place, every input checked first in the same call: the step is tens of microseconds of
// arithmetic, less than the PyTorch calls that would check and compute it one by one.
//
//   S <- Diag(exp g) S;  u = v (additive) or beta (v - S^T k) (delta);  S <- S + k u^T;
//   o = S^T (scale q)
//
// state [B, H, K, V] contiguous; q, k [B, Hq, K] (value head p of a sequence reads q/k head
// p / group, group = H / Hq: grouped value heads, read in place); v [B, H, V]; beta [B, H] or
// None; g [B, H, 1|K] or None; all float32 (shapes checked first; the inputs other than the state
// are copied when not contiguous). Returns o [B, H, V]; or, when an input is out of its range (a
// NaN or Inf anywhere but a g of -inf, beta outside [0, 2], g > 0), an empty tensor, with the
// state unchanged: the caller then names the input.
at::Tensor recurrent_step(at::Tensor& state, const at::Tensor& q_in, const at::Tensor& k_in,
                          const at::Tensor& v_in, const std::optional<at::Tensor>& beta_opt,
                          const std::optional<at::Tensor>& g_opt, double scale_d) {
  step_checks(c10::kCPU, state, q_in, k_in, v_in, beta_opt, g_opt, scale_d);
  const int64_t B = state.size(0), H = state.size(1), K = state.size(2), V = state.size(3);
  const int64_t P = B * H, Hq = q_in.size(1), group = H / std::max<int64_t>(Hq, 1);
  const bool delta = beta_opt.has_value(), gated = g_opt.has_value();
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor beta = delta ? beta_opt->contiguous() : at::Tensor();
  const at::Tensor g = gated ? g_opt->contiguous() : at::Tensor();
  const int64_t kg = gated ? g.size(-1) : 0;
  const float* bp = delta ? beta.data_ptr<float>() : nullptr;
  const float* gp = gated ? g.data_ptr<float>() : nullptr;
  float* Sp = state.data_ptr<float>();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  // 1. Checks, before anything is written.
  bool ok = all_finite(Sp, P * K * V) && all_finite(qp, B * Hq * K) &&
            all_finite(kp, B * Hq * K) && all_finite(vp, P * V);
  for (int64_t i = 0; ok && delta && i < P; ++i) ok = bp[i] >= 0.0f && bp[i] <= 2.0f;
  for (int64_t i = 0; ok && gated && i < P * kg; ++i) ok = gp[i] <= 0.0f;  // -inf: a reset
  if (!ok) return at::empty({0}, state.options());
  // 2. The step, head by head.
  at::Tensor o = at::empty({B, H, V}, state.options());
  float* op = o.data_ptr<float>();
  const float scale = static_cast<float>(scale_d);
  // Heads in tasks of at least kStepGrain state numbers: a small batch runs on the calling
  // thread (waking the others would cost more than its microseconds of work), a large one on all.
  const int64_t grain = std::max<int64_t>(1, kStepGrain / std::max<int64_t>(1, K * V));
  at::parallel_for(0, P, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> u(V);
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t pq = (p / H) * Hq + (p % H) / group;  // the q/k head of value head p
      const StepHead x{qp + pq * K, kp + pq * K, vp + p * V, delta ? bp + p : nullptr,
                       gated ? gp + p * kg : nullptr, kg};
      step_head(x, K, V, scale, Sp + p * K * V, u.data(), op + p * V);
    }
  });
  return o;
}

at::Tensor recurrent_step_meta(at::Tensor& state, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& beta,
                               const std::optional<at::Tensor>& g, double scale) {
  step_checks(c10::kMeta, state, q, k, v, beta, g, scale);
  return at::empty({state.size(0), state.size(1), state.size(3)}, state.options());
}

}  // namespace linattn_native
