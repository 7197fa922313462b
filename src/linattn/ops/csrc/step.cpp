// The generation step (spec section 9): one token of any mechanism, the state updated in place.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "gates.h"
#include "kernels.h"
#include "mechanism.h"
#include "step.h"
#include "tuning.h"

namespace linattn_native {

namespace {

// The checks of a ``recurrent_step`` call (on ``device``), before anything is read or written;
// the mechanism, parsed from the schema's ``rule`` and ``gate``.
Mechanism step_checks(c10::DeviceType device, const at::Tensor& state, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v,
                      const std::optional<at::Tensor>& beta, const std::optional<at::Tensor>& g,
                      double scale, c10::string_view rule, c10::string_view gate,
                      const std::optional<at::Tensor>& source,
                      const std::optional<at::Tensor>& b) {
  const Checks check{"linattn_native.recurrent_step", device};
  const Mechanism m = parse_mechanism(check.op, rule, gate);
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
  // The mechanism's inputs (no tensor op here: this is the fake kernel's check too).
  TORCH_CHECK(beta.has_value() == m.rule->reads_beta, check.op, ": beta must be ",
              m.rule->reads_beta ? "given" : "None", " for the ", m.rule->name, " rule");
  if (beta.has_value() && m.rule->input_keys == 0) check.shape("beta", *beta, {B, H}, "[B, H]");
  TORCH_CHECK(!b.has_value() || m.rule->input_keys > 0, check.op,
              ": b must be None for the ", m.rule->name, " rule");
  if (beta.has_value() && m.rule->input_keys > 0 && !b.has_value()) {
    const int64_t width = m.rule->input_keys * K;
    check.shape("beta", *beta, {B, H, width}, "[B, H, 2K] (the rule's inputs [a | b])");
  }
  if (beta.has_value() && b.has_value()) {  // a in beta's slot, b apart
    check.shape("beta", *beta, {B, H, K}, "[B, H, K] (the rule's a, with b given apart)");
    check.float32_cpu("b", *b);
    check.shape("b", *b, {B, H, K}, "[B, H, K]");
  }
  TORCH_CHECK(g.has_value() == m.gated(), check.op, ": g must be ",
              m.gated() ? "given for a gate" : "None without a gate");
  if (g.has_value()) {
    check.float32_cpu("g", *g);
    const int64_t kg = m.gate_width(K);
    const std::vector<int64_t> per_head{B, H}, per_token{B, H, kg};
    const bool ok = g->sizes() == per_token ||
                    (m.gate == Gate::kHead && g->sizes() == at::IntArrayRef(per_head));
    TORCH_CHECK(ok, check.op,
                ": g must be of shape [B, H, ", kg, "]", m.gate == Gate::kHead ? " or [B, H]" : "",
                " (the gate \"", gate, "\"), [B, H] = [", B, ", ", H, "], got ", g->sizes());
  }
  if (source.has_value()) {
    check.shape("source", *source, state.sizes(), "[B, H, K, V] (the state's)");
    TORCH_CHECK(source->is_contiguous(), check.op, ": source must be contiguous");
    if (device == c10::kCPU && state.numel() > 0) {
      // In place (the same memory) or apart: a partial overlap would read written numbers.
      const auto* s0 = static_cast<const char*>(source->data_ptr());
      const auto* d0 = static_cast<const char*>(state.data_ptr());
      const int64_t bytes = state.numel() * static_cast<int64_t>(sizeof(float));
      TORCH_CHECK(s0 == d0 || s0 + bytes <= d0 || d0 + bytes <= s0, check.op,
                  ": source and state must be the same memory or not overlap");
    }
  }
  checked_scale(check, scale);
  return m;
}

// Whether n numbers are all finite (x * 0 is 0 for finite x and NaN for NaN or Inf).
bool all_finite(const float* x, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i] * 0.0f;
  return acc == 0.0f;
}

// Whether n numbers all lie in [lo, hi] (NaN does not): a branch-free count, so that the loop
// vectorises (a per-channel gate is B H K numbers a call, 32 K at Qwen3-Next's B 8: checked one
// by one with an early exit it would be a serial cost before the parallel step).
bool all_within(const float* x, int64_t n, float lo, float hi) {
  float outside = 0.0f;
#pragma omp simd reduction(+ : outside)
  for (int64_t i = 0; i < n; ++i) outside += (x[i] >= lo && x[i] <= hi) ? 0.0f : 1.0f;
  return outside == 0.0f;
}

// Whether the small inputs of a step are in range: every number finite, the beta slot's in the
// rule's range (``Rule::input_low``, ``input_high``), every log-gate <= 0 (-inf: a reset). The
// state is not read here (step.h).
bool inputs_in_range(const Mechanism& m, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& beta, const at::Tensor& b,
                     const at::Tensor& g) {
  const auto finite = [](const at::Tensor& x) {
    return all_finite(x.data_ptr<float>(), x.numel());
  };
  bool ok = finite(q) && finite(k) && finite(v);
  if (ok && beta.defined()) {
    ok = finite(beta) &&
         all_within(beta.data_ptr<float>(), beta.numel(), m.rule->input_low, m.rule->input_high);
  }
  if (ok && b.defined()) ok = finite(b);
  const float inf = std::numeric_limits<float>::infinity();  // g = -inf: a reset
  if (ok && g.defined()) ok = all_within(g.data_ptr<float>(), g.numel(), -inf, 0.0f);
  return ok;
}

// The sizes and inputs of one step call, read in place (contiguous).
struct StepCall {
  const Rule* rule;
  int64_t H, Hq, group, K, V, kg;
  float scale;
  const float *q, *k, *v, *beta, *b, *g;
  int64_t beta_width;  // numbers of beta per value head: 1 (delta), 2K (dplr [a | b]) or K
                       // (dplr's a, b apart), 0

  // Value head p's step (p over B H): its decay and scaled q prepared into w [3K], the rule's
  // step from S_in [K, V] into its state S [K, V] (S_in = S: in place), o [V], prefetching
  // next (the next head's S_in, or nullptr); whether o (so the new state, step.h) is finite.
  bool head(int64_t p, const float* S_in, const float* next, float* S, float* o, float* w) const {
    const int64_t pq = (p / H) * Hq + (p % H) / group;  // the q/k head of value head p
    float *alpha = w, *qs = w + K;
    const float* qp = q + pq * K;
    // exp_flush (gates.h): vectorised, exp(-inf) = 0 exactly (a reset); a decay below float32's
    // normal range is 0, as the chunk form's. Separate loops: one loop with both cases compiled
    // to masked loads of g whatever kg, and without a gate (g null) each masked-off load of an
    // unmapped address cost an assist (the ungated steps were slower than the gated ones).
    if (kg > 1) {
      const float* gp = g + p * kg;
#pragma omp simd
      for (int64_t i = 0; i < K; ++i) alpha[i] = exp_flush(gp[i]);
    } else {
      const float a1 = kg == 1 ? exp_flush(g[p]) : 1.0f;
      std::fill(alpha, alpha + K, a1);
    }
#pragma omp simd
    for (int64_t i = 0; i < K; ++i) qs[i] = scale * qp[i];
    const float* rule_inputs = beta ? beta + p * beta_width : nullptr;
    // dplr's b: apart, or the second half of [a | b]
    const float* bp = b ? b + p * K : beta_width == 2 * K ? rule_inputs + K : nullptr;
    const StepHead h{qs, k + pq * K, v + p * V, rule_inputs, bp, alpha, w + 2 * K, S_in, next};
    rule->step(h, K, V, S, o);
    return all_finite(o, V);
  }
};

}  // namespace

// One generation step of any mechanism (``linattn.ops.recurrent_step``), the state updated in
// place, the inputs checked first in the same call: the step is tens of microseconds of
// memory traffic, less than the PyTorch calls that would check and compute it one by one.
//
//   S <- Diag(exp g) S;  the rule's read, correction and write (Rule::step);  o = S^T (scale q)
//
// state [B, H, K, V] contiguous; q, k [B, Hq, K] (value head p of a sequence reads q/k head
// p / group, group = H / Hq: grouped value heads, read in place); v [B, H, V]; beta [B, H]
// (delta), [B, H, 2K] ([a | b], dplr; or a [B, H, K] with ``b`` [B, H, K] apart) or None
// (additive); g [B, H] or [B, H, 1] (the gate
// "head"), [B, H, K] ("channel") or None ("none"); all float32 (shapes checked first; the inputs
// other than the state are copied when not contiguous). Returns o [B, H, V]; or an empty tensor
// when a value is out of range: an input (a NaN or Inf anywhere but a g of -inf, beta outside
// [0, 2], g > 0; checked before anything is written: the state unchanged), or the state (found
// in the pass, through o: a non-finite state entering or leaving the step; the step has run).
// The caller then names the value. ``source`` (the state's shape, contiguous, the same memory
// or apart): the state entering the step is read from it and the new state written into
// ``state`` (a step that keeps the state it was given, at the cost of the in-place one).
at::Tensor recurrent_step(at::Tensor& state, const at::Tensor& q_in, const at::Tensor& k_in,
                          const at::Tensor& v_in, const std::optional<at::Tensor>& beta_opt,
                          const std::optional<at::Tensor>& g_opt, double scale_d,
                          c10::string_view rule, c10::string_view gate,
                          const std::optional<at::Tensor>& source,
                          const std::optional<at::Tensor>& b_opt) {
  const Mechanism m = step_checks(c10::kCPU, state, q_in, k_in, v_in, beta_opt, g_opt, scale_d,
                                  rule, gate, source, b_opt);
  const int64_t B = state.size(0), H = state.size(1), K = state.size(2), V = state.size(3);
  const int64_t P = B * H, Hq = q_in.size(1);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor beta = beta_opt.has_value() ? beta_opt->contiguous() : at::Tensor();
  const at::Tensor b = b_opt.has_value() ? b_opt->contiguous() : at::Tensor();
  const at::Tensor g = g_opt.has_value() ? g_opt->contiguous() : at::Tensor();
  // 1. The inputs' checks, before anything is written.
  if (!inputs_in_range(m, q, k, v, beta, b, g)) return at::empty({0}, state.options());
  // 2. The step, head by head.
  at::Tensor o = at::empty({B, H, V}, state.options());
  const StepCall call{m.rule,
                      H,
                      Hq,
                      H / std::max<int64_t>(Hq, 1),
                      K,
                      V,
                      m.gate_width(K),
                      static_cast<float>(scale_d),
                      q.data_ptr<float>(),
                      k.data_ptr<float>(),
                      v.data_ptr<float>(),
                      beta.defined() ? beta.data_ptr<float>() : nullptr,
                      b.defined() ? b.data_ptr<float>() : nullptr,
                      g.defined() ? g.data_ptr<float>() : nullptr,
                      beta.defined() ? beta.numel() / std::max<int64_t>(P, 1) : 0};
  float *Sp = state.data_ptr<float>(), *op = o.data_ptr<float>();
  const float* Sin = source.has_value() ? source->data_ptr<float>() : Sp;
  // Heads in tasks of at least kStepGrain state numbers (a thread's share contiguous): a small
  // batch runs on the calling thread (waking the others would cost more than its microseconds
  // of work), a large one on all.
  const int64_t grain = std::max<int64_t>(1, kStepGrain / std::max<int64_t>(1, K * V));
  std::atomic<bool> finite{true};
  at::parallel_for(0, P, grain, [&](int64_t lo, int64_t hi) {
    // As the chunk form: a state decayed deep below float32's normal range would otherwise run
    // the step on subnormal numbers, tens of times slower (a key repeated over many tokens
    // leaves the state's other directions decaying towards 0).
    FlushSubnormals flush;
    std::vector<float> w(3 * K);
    bool ok = true;
    for (int64_t p = lo; p < hi; ++p) {
      const float* next = p + 1 < hi ? Sin + (p + 1) * K * V : nullptr;
      ok &= call.head(p, Sin + p * K * V, next, Sp + p * K * V, op + p * V, w.data());
    }
    if (!ok) finite = false;
  });
  return finite ? o : at::empty({0}, state.options());
}

at::Tensor recurrent_step_meta(at::Tensor& state, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& beta,
                               const std::optional<at::Tensor>& g, double scale,
                               c10::string_view rule, c10::string_view gate,
                               const std::optional<at::Tensor>& source,
                               const std::optional<at::Tensor>& b) {
  step_checks(c10::kMeta, state, q, k, v, beta, g, scale, rule, gate, source, b);
  return at::empty({state.size(0), state.size(1), state.size(3)}, state.options());
}

}  // namespace linattn_native
