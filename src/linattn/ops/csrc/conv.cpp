// The short causal depthwise convolution in front of DeltaNet's, Gated DeltaNet's, KDA's and
// Mamba-2's mixers (``linattn.ops.conv.short_conv``), with its SiLU, forward and backward, on
// rows of channels (the [B, T, C] layout the projections write):
//
//   z[b, t, c] = bias[c] + sum_{j < W} w[c, j] xs[b, t + j - (W - 1), c],   y = silu(z) or z
//
// xs: the last W - 1 inputs of ``state`` [B, C, S] (S >= W - 1; zeros without one), then x.
// The backward recomputes z from x (nothing saved but the inputs):
//
//   dz = dy silu'(z),  silu'(z) = s (1 + z (1 - s)),  s = sigmoid(z)   (dz = dy without SiLU)
//   dx[b, t, c]  = sum_j w[c, j] dz[b, t + (W - 1) - j, c]   (the terms with t + W - 1 - j < T)
//   dw[c, j]     = sum_{b, t} dz[b, t, c] xs[b, t + j - (W - 1), c],   dbias[c] = sum_{b, t} dz
//   dstate: the xs rows before x, as dx (the state's other entries are not read: 0).
//
// Work: tasks of kConvRows tokens of one sequence, parallel over the batch and time; every loop
// runs over a row's C channels, contiguous, so that it vectorises. dw and dbias are summed per
// task in float32 (at most kConvRows terms) and over tasks in float64, one accumulator per thread.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "checks.h"
#include "gates.h"
#include "kernels.h"

namespace linattn_native {
namespace {

constexpr int64_t kConvRows = 64;  // tokens of one task

// sigmoid(z) from exp(-|z|) in (0, 1] (``exp_flush``: no overflow; 0 below the normal range).
__attribute__((always_inline)) inline float sigmoid(float z) {
  const float e = exp_flush(-std::fabs(z));
  const float s = 1.0f / (1.0f + e);
  return z >= 0.0f ? s : e * s;
}

// The inputs of one call, as row pointers: xs row r of sequence b for r in [-(W - 1), T).
struct Conv {
  int64_t B, T, C, W;
  const float* x;  // x[b, t, c] at b sb + t st + c
  int64_t sb, st;
  const float* prefix;  // [B, W - 1, C]: the state's last W - 1 inputs, rows of channels
  const float* wT;      // [W, C]
  const float* bias;    // [C] or nullptr
  bool silu;

  const float* row(int64_t b, int64_t r) const {
    return r < 0 ? prefix + (b * (W - 1) + r + W - 1) * C : x + b * sb + r * st;
  }

  // z for token t of sequence b into out [C].
  void pre_activation(int64_t b, int64_t t, float* out) const {
    for (int64_t c = 0; c < C; ++c) out[c] = bias ? bias[c] : 0.0f;
    for (int64_t j = 0; j < W; ++j) {
      const float* xr = row(b, t + j - (W - 1));
      const float* wj = wT + j * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] += wj[c] * xr[c];
    }
  }
};

void forward_rows(const Conv& cv, int64_t b, int64_t t0, int64_t t1, float* y) {
  for (int64_t t = t0; t < t1; ++t) {
    float* out = y + (b * cv.T + t) * cv.C;
    cv.pre_activation(b, t, out);
    if (!cv.silu) continue;
#pragma omp simd
    for (int64_t c = 0; c < cv.C; ++c) out[c] *= sigmoid(out[c]);
  }
}

// The gradients of tokens [t0, t1) of sequence b: dx (and, for t0 = 0, the state's rows dprefix
// [W - 1, C]); dw [W, C] and dbias [C] of the task added into acc [(W + 1) C] (float64).
void backward_rows(const Conv& cv, int64_t b, int64_t t0, int64_t t1, const float* dy,
                   float* dx, float* dprefix, double* acc, std::vector<float>& dz_buf) {
  const int64_t C = cv.C, W = cv.W, end = std::min(cv.T, t1 + W - 1);
  dz_buf.resize(static_cast<size_t>((end - t0) * C));
  // 1. dz for the task's rows and the W - 1 after them (dx of the last rows reads those).
  for (int64_t t = t0; t < end; ++t) {
    float* dz = dz_buf.data() + (t - t0) * C;
    const float* g = dy + (b * cv.T + t) * C;
    if (!cv.silu) {
      std::copy(g, g + C, dz);
      continue;
    }
    cv.pre_activation(b, t, dz);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float s = sigmoid(dz[c]);
      dz[c] = g[c] * s * (1.0f + dz[c] * (1.0f - s));
    }
  }
  // 2. dx[t] = sum_j w_j dz[t + W - 1 - j]; rows before x (t < 0) into dprefix.
  const int64_t first = t0 == 0 && dprefix ? -(W - 1) : t0;
  for (int64_t t = first; t < t1; ++t) {
    float* out = t < 0 ? dprefix + (t + W - 1) * C : dx + (b * cv.T + t) * C;
    std::fill(out, out + C, 0.0f);
    for (int64_t j = 0; j < W; ++j) {
      const int64_t r = t + W - 1 - j;
      if (r < t0 || r >= end) continue;  // r < t0 only for t < 0: rows before the sequence
      const float* dz = dz_buf.data() + (r - t0) * C;
      const float* wj = cv.wT + j * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] += wj[c] * dz[c];
    }
  }
  // 3. dw[j] += sum_t dz[t] xs[t + j - (W - 1)], dbias += sum_t dz[t], over the task's rows.
  std::vector<float> part(static_cast<size_t>((W + 1) * C), 0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* dz = dz_buf.data() + (t - t0) * C;
    for (int64_t j = 0; j < W; ++j) {
      const float* xr = cv.row(b, t + j - (W - 1));
      float* pj = part.data() + j * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) pj[c] += dz[c] * xr[c];
    }
    float* pb = part.data() + W * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) pb[c] += dz[c];
  }
  for (size_t i = 0; i < part.size(); ++i) acc[i] += part[i];
}

// The entry's checks (naming the argument) and the call's rows: prefix from state, w transposed.
struct Prepared {
  Conv cv;
  at::Tensor prefix, wT;
};

Prepared prepare(const char* op, const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& state,
                 bool silu) {
  const Checks check{op};
  check.float32_cpu("x", x);
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, op,
              ": x must be a [B, T, C] tensor with unit stride over C, got shape ", x.sizes(),
              " and strides ", x.strides());
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  check.float32_cpu("weight", weight);
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == C && weight.size(1) >= 1, op,
              ": weight must be of shape [C, W] = [", C, ", W >= 1], got ", weight.sizes());
  const int64_t W = weight.size(1);
  if (bias.has_value()) check.shape("bias", *bias, {C}, "[C]");
  at::Tensor prefix = at::zeros({B, W - 1, C}, x.options());
  if (state.has_value()) {
    check.float32_cpu("state", *state);
    TORCH_CHECK(state->dim() == 3 && state->size(0) == B && state->size(1) == C &&
                    state->size(2) >= W - 1,
                op, ": state must be of shape [B, C, S] = [", B, ", ", C, ", S >= ", W - 1,
                "], got ", state->sizes());
    // its last W - 1 inputs, [B, C, W - 1] -> rows of channels [B, W - 1, C]
    prefix.copy_(state->narrow(2, state->size(2) - (W - 1), W - 1).transpose(1, 2));
  }
  at::Tensor wT = weight.t().contiguous();  // [W, C]
  at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  Conv cv{B, T, C, W, x.data_ptr<float>(), x.stride(0), x.stride(1), prefix.data_ptr<float>(),
          wT.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, silu};
  return {cv, prefix, wT};
}

// Tasks of kConvRows tokens over the batch: task i is sequence i / n, rows from (i % n) kConvRows.
template <typename F>
void for_rows(const Conv& cv, const F& body) {
  const int64_t n = (cv.T + kConvRows - 1) / kConvRows;
  at::parallel_for(0, cv.B * n, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / n, t0 = (i % n) * kConvRows;
      body(b, t0, std::min(cv.T, t0 + kConvRows));
    }
  });
}

}  // namespace

at::Tensor short_conv_forward(const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& state, bool silu) {
  const Prepared p = prepare("linattn_native.short_conv_forward", x, weight, bias, state, silu);
  at::Tensor y = at::empty({p.cv.B, p.cv.T, p.cv.C}, x.options());
  float* yp = y.data_ptr<float>();
  for_rows(p.cv, [&](int64_t b, int64_t t0, int64_t t1) { forward_rows(p.cv, b, t0, t1, yp); });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> short_conv_backward(
    const at::Tensor& dy_in, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& state, bool silu) {
  const char* op = "linattn_native.short_conv_backward";
  const Prepared p = prepare(op, x, weight, bias, state, silu);
  const Conv& cv = p.cv;
  const int64_t B = cv.B, T = cv.T, C = cv.C, W = cv.W;
  Checks{op}.shape("dy", dy_in, {B, T, C}, "[B, T, C]");
  const at::Tensor dy = dy_in.contiguous();
  at::Tensor dx = at::empty({B, T, C}, x.options());
  at::Tensor dprefix = at::zeros({B, W - 1, C}, x.options());
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  std::vector<double> acc(static_cast<size_t>(threads * (W + 1) * C), 0.0);
  const float* g = dy.data_ptr<float>();
  float *dxp = dx.data_ptr<float>(), *dpp = dprefix.data_ptr<float>();
  for_rows(cv, [&](int64_t b, int64_t t0, int64_t t1) {
    thread_local std::vector<float> dz_buf;
    const int64_t thread = std::min<int64_t>(at::get_thread_num(), threads - 1);
    float* dprefix_b = t0 == 0 ? dpp + b * (W - 1) * C : nullptr;
    backward_rows(cv, b, t0, t1, g, dxp, dprefix_b, acc.data() + thread * (W + 1) * C, dz_buf);
  });
  // the threads' sums: dw [C, W] (from [W, C]) and dbias [C]
  at::Tensor dw = at::empty({C, W}, x.options());
  at::Tensor dbias = bias.has_value() ? at::empty({C}, x.options()) : at::empty({0}, x.options());
  float *dwp = dw.data_ptr<float>(), *dbp = bias.has_value() ? dbias.data_ptr<float>() : nullptr;
  for (int64_t i = 0; i < (W + 1) * C; ++i) {
    double sum = 0.0;
    for (int64_t th = 0; th < threads; ++th) sum += acc[th * (W + 1) * C + i];
    const int64_t j = i / C, c = i % C;
    if (j < W) dwp[c * W + j] = static_cast<float>(sum);
    if (j == W && dbp) dbp[c] = static_cast<float>(sum);
  }
  // the state's gradient: its last W - 1 inputs were read, [B, W - 1, C] -> [B, C, S]
  at::Tensor dstate = at::empty({0}, x.options());
  if (state.has_value()) {
    const int64_t S = state->size(2);
    dstate = at::zeros({B, C, S}, x.options());
    dstate.narrow(2, S - (W - 1), W - 1).copy_(dprefix.transpose(1, 2));
  }
  return {dx, dw, dbias, dstate};
}

at::Tensor short_conv_forward_meta(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>&,
                                   const std::optional<at::Tensor>&, bool) {
  TORCH_CHECK(x.dim() == 3 && weight.dim() == 2, "linattn_native.short_conv_forward: x must be "
              "[B, T, C] and weight [C, W]");
  return at::empty({x.size(0), x.size(1), x.size(2)}, x.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> short_conv_backward_meta(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& state, bool) {
  TORCH_CHECK(x.dim() == 3 && weight.dim() == 2, "linattn_native.short_conv_backward: x must be "
              "[B, T, C] and weight [C, W]");
  return {at::empty(x.sizes(), x.options()), at::empty(weight.sizes(), x.options()),
          at::empty({bias.has_value() ? x.size(2) : 0}, x.options()),
          state.has_value() ? at::empty(state->sizes(), x.options()) : at::empty({0}, x.options())};
}

}  // namespace linattn_native
