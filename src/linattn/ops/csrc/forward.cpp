// The forward pass of the chunk form (kernels.h gives the steps; spec section 8), one function
// per step: ``chunk_gates`` (G, Qd, Ke), ``chunk_scores`` (A_qk and the delta rule's A_kk),
// ``ut_transform`` (L, W, U0), ``pseudo_values`` (U = U0 - W S), ``chunk_outputs``
// (o = Qd S + A_qk U) and ``state_pass`` (S <- D S + Ke^T U).

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "blas.h"
#include "checks.h"
#include "gates.h"
#include "kernels.h"
#include "layout.h"
#include "products.h"

namespace linattn_native {
namespace {

// One chunk of c <= C tokens of one head: its rows in the inputs (row strides ld*), beta [c]
// (stride sb) and the log-gates g [c, kg] (row stride sg), nullptr where the mechanism has none.
struct ChunkRows {
  const float *q, *k, *v;
  int64_t ldq, ldk, ldv;
  const float* beta;
  int64_t sb;
  const float* g;
  int64_t sg;
  int c;
};

// The rows that read the incoming state (q_alpha Qread = Qd) and write the next one (Kend = Ke).
struct StateRows {
  const float* Qread;
  int64_t ldqr;
  float q_alpha;
  const float* Kend;
  int64_t ldke;
};

// Step G, Qd, Ke: the cumulative log-gates G (into ``G``), Qd = scale q exp(G) and
// Ke = k exp(G_c - G). Without decay, the inputs themselves (the scale folded into a product).
StateRows chunk_gates(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Gates& G,
                      Scratch& w) {
  if (kg == 0) return {x.q, x.ldq, scale, x.k, x.ldk};
  const int c = x.c, Ki = static_cast<int>(K);
  cumulative_gates(x.g, x.sg, c, kg, w.zeros.data(), G);
  const float* Gc = G.hi + static_cast<int64_t>(c - 1) * kg;
  const float* Lc = G.lo + static_cast<int64_t>(c - 1) * kg;
  for (int i = 0; i < c; ++i) {
    const float* Gi = G.hi + static_cast<int64_t>(i) * kg;
    const float* Li = G.lo + static_cast<int64_t>(i) * kg;
    const float* qi = x.q + i * x.ldq;
    const float* ki = x.k + i * x.ldk;
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
  return {w.Qd.data(), K, 1.0f, w.Ke.data(), K};
}

// Step A_qk (and A_kk): the masked, decayed scores inside the chunk, A [c, C] (j <= i); with the
// delta rule also A_kk into L (j < i), sharing its decays.
void chunk_scores(const ChunkRows& x, bool delta, int64_t kg, int64_t K, float scale,
                  const Gates& G, int64_t C, float* A, float* L, Scratch& w) {
  const int Ki = static_cast<int>(K);
  if (delta) {
    decayed_product_pair(x.q, x.ldq, x.k, x.ldk, x.k, x.ldk, G, kg, x.c, Ki, scale, A, L, C, w);
  } else {
    decayed_products(x.q, x.ldq, x.k, x.ldk, G, kg, x.c, Ki, false, scale, A, C, w);
  }
}

// Step L, W, U0 (the UT transform): L = diag(beta) A_kk (in place), then
// (I + L) [W | U0] = diag(beta) [k exp(G) | v], solved into X [c, K + V] (row stride ldx).
void ut_transform(const ChunkRows& x, int64_t kg, int64_t K, int64_t V, const Gates& G,
                  int64_t C, float* L, float* X, int64_t ldx) {
  const int c = x.c, Ki = static_cast<int>(K), Vi = static_cast<int>(V);
  for (int i = 0; i < c; ++i) {
    const float bi = x.beta[i * x.sb];
    float* Li = L + static_cast<int64_t>(i) * C;
#pragma omp simd
    for (int j = 0; j < i; ++j) Li[j] *= bi;
    const float* ki = x.k + i * x.ldk;
    const float* vi = x.v + i * x.ldv;
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
}

// Step U: the pseudo-values U = U0 - W S in place of U0 (X = [W | U0]; S [K, V] entering).
void pseudo_values(int c, int64_t K, int64_t V, float* X, int64_t ldx, const float* S) {
  gemm(false, false, c, V, K, -1.0f, X, ldx, S, V, 1.0f, X + K, ldx);
}

// Step o: the read of the incoming state plus the masked product inside the chunk,
// o = Qd S + A_qk U (O [c, V], row stride ldo).
void chunk_outputs(int c, int64_t K, int64_t V, const StateRows& r, const float* S,
                   const float* A, int64_t C, const float* U, int64_t ldu, float* O, int64_t ldo) {
  gemm(false, false, c, V, K, r.q_alpha, r.Qread, r.ldqr, S, V, 0.0f, O, ldo);
  gemm(false, false, c, V, c, 1.0f, A, C, U, ldu, 1.0f, O, ldo);
}

// Step D and the state pass: the state leaving the chunk, S <- D * S + Ke^T U, with
// D = exp(G_c) on S's rows (one per channel, or one for all).
void state_pass(int c, int64_t kg, int64_t K, int64_t V, const Gates& G, const StateRows& r,
                const float* U, int64_t ldu, float* S) {
  const int Ki = static_cast<int>(K), Vi = static_cast<int>(V);
  if (kg > 0) {
    const float* Gc = G.hi + static_cast<int64_t>(c - 1) * kg;
    const float* Lc = G.lo + static_cast<int64_t>(c - 1) * kg;
    for (int ch = 0; ch < Ki; ++ch) {
      const float d = exp_flush(Gc[kg == 1 ? 0 : ch] + Lc[kg == 1 ? 0 : ch]);
      float* row = S + ch * V;
#pragma omp simd
      for (int j = 0; j < Vi; ++j) row[j] *= d;
    }
  }
  gemm(true, false, K, V, c, 1.0f, r.Kend, r.ldke, U, ldu, 1.0f, S, V);
}

// The inputs of a chunk-form call, checked, their rows where the BLAS reads them.
struct ForwardInputs {
  Sizes sz;
  bool delta;
  int64_t kg;
  at::Tensor q, k, v, beta, g;
  const float *qp, *kp, *vp, *bp, *gp;

  ForwardInputs(const Sizes& sizes, const at::Tensor& q_in, const at::Tensor& k_in,
                const at::Tensor& v_in, const std::optional<at::Tensor>& beta_opt,
                const std::optional<at::Tensor>& g_opt, int64_t gates)
      : sz(sizes), delta(beta_opt.has_value()), kg(gates), q(blas_rows(q_in)),
        k(blas_rows(k_in)), v(blas_rows(v_in)), beta(delta ? *beta_opt : at::Tensor()),
        g(kg > 0 ? unit_rows(*g_opt) : at::Tensor()), qp(q.data_ptr<float>()),
        kp(k.data_ptr<float>()), vp(v.data_ptr<float>()),
        bp(delta ? beta.data_ptr<float>() : nullptr), gp(kg > 0 ? g.data_ptr<float>() : nullptr) {}

  // The rows of chunk n (tokens [n C, n C + c)) of value head p; q and k of its q/k head,
  // read in place (grouped value heads share them).
  ChunkRows rows(int64_t n, int64_t p) const {
    const int64_t b = p / sz.HV, h = p % sz.HV, hq = sz.qk_head(h), t0 = n * sz.C;
    const int c = static_cast<int>(std::min<int64_t>(sz.C, sz.T - t0));
    return {chunk_rows(q, qp, b, hq, t0),
            chunk_rows(k, kp, b, hq, t0),
            chunk_rows(v, vp, b, h, t0),
            q.stride(2),
            k.stride(2),
            v.stride(2),
            delta ? chunk_rows(beta, bp, b, h, t0) : nullptr,
            delta ? beta.stride(2) : 0,
            kg > 0 ? chunk_rows(g, gp, b, h, t0) : nullptr,
            kg > 0 ? g.stride(2) : 0,
            c};
  }
};

// One chunk of one head, every step in order; S [K, V] the running state, updated.
void forward_chunk(const ChunkRows& x, const ForwardInputs& in, float scale, float* S, float* O,
                   int64_t ldo, Scratch& w) {
  const int64_t K = in.sz.K, V = in.sz.V, C = in.sz.C, ldx = K + V;  // X = [W | U] after the solve
  const Gates G{w.G.data(), w.G.data() + C * K};
  const StateRows r = chunk_gates(x, in.kg, K, scale, G, w);
  chunk_scores(x, in.delta, in.kg, K, scale, G, C, w.A.data(), w.L.data(), w);
  const float* U = x.v;  // the additive rule's pseudo-values: v
  int64_t ldu = x.ldv;
  if (in.delta) {
    ut_transform(x, in.kg, K, V, G, C, w.L.data(), w.X.data(), ldx);
    pseudo_values(x.c, K, V, w.X.data(), ldx, S);
    U = w.X.data() + K, ldu = ldx;
  }
  chunk_outputs(x.c, K, V, r, S, w.A.data(), C, U, ldu, O, ldo);
  state_pass(x.c, in.kg, K, V, G, r, U, ldu, S);
}

}  // namespace

// The checks of a ``chunk_forward`` call (on ``device``): its sizes and the gate width kg.
std::pair<Sizes, int64_t> forward_sizes(c10::DeviceType device, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& beta,
                                        const std::optional<at::Tensor>& g, const at::Tensor& S0,
                                        double scale, int64_t C) {
  const Checks check{"linattn_native.chunk_forward", device};
  const Sizes sz(check, q, k, v, C);
  if (beta.has_value()) check.shape("beta", *beta, {sz.B, sz.HV, sz.T}, "[B, HV, T]");
  const int64_t kg = g.has_value() ? check.gate(*g, sz.B, sz.HV, sz.T, sz.K) : 0;
  check.shape("S0", S0, {sz.B, sz.HV, sz.K, sz.V}, "[B, HV, K, V]");
  checked_scale(check, scale);
  return {sz, kg};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> chunk_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
    const at::Tensor& S0, double scale_d, int64_t C64, bool keep) {
  const std::pair<Sizes, int64_t> checked =
      forward_sizes(c10::kCPU, q_in, k_in, v_in, beta_opt, g_opt, S0, scale_d, C64);
  const Sizes& sz = checked.first;
  const int64_t kg = checked.second;
  const int64_t B = sz.B, HV = sz.HV, K = sz.K, V = sz.V, P = sz.P, N = sz.N, C = sz.C;
  const float scale = static_cast<float>(scale_d);
  const ForwardInputs in(sz, q_in, k_in, v_in, beta_opt, g_opt, kg);

  at::Tensor o = fresh_public(sz, V, in.q.options());
  // The running states, contiguous (a clone keeps the strides of a transposed S0 otherwise).
  at::Tensor S = S0.reshape({P, K, V}).clone(at::MemoryFormat::Contiguous);
  at::Tensor states = keep ? fresh({N, P, K, V}, in.q.options()) : at::empty({0}, in.q.options());
  float *op = o.data_ptr<float>(), *Sp = S.data_ptr<float>();
  float* statep = keep ? states.data_ptr<float>() : nullptr;

  // The heads of a thread are taken chunk by chunk in the inner loop, so that the rows read and
  // written stream through memory in order ([B, T, H, D] keeps a token's heads side by side).
  at::parallel_for(0, P, 1, [&](int64_t lo, int64_t hi) {
    FlushSubnormals flush;
    Scratch w(C, K, V);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t p = lo; p < hi; ++p) {
        float* Sh = Sp + p * K * V;
        if (keep) std::memcpy(statep + (n * P + p) * K * V, Sh, sizeof(float) * K * V);
        float* O = chunk_rows(o, op, p / HV, p % HV, n * C);
        forward_chunk(in.rows(n, p), in, scale, Sh, O, o.stride(2), w);
      }
    }
  });
  return {o, S.view({B, HV, K, V}), states};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> chunk_forward_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& beta, const std::optional<at::Tensor>& g,
    const at::Tensor& S0, double scale, int64_t C, bool keep) {
  const Sizes sz = forward_sizes(c10::kMeta, q, k, v, beta, g, S0, scale, C).first;
  const at::TensorOptions options = q.options();
  return {at::empty({sz.B, sz.T, sz.HV, sz.V}, options).transpose(1, 2),
          at::empty({sz.B, sz.HV, sz.K, sz.V}, options),
          keep ? at::empty({sz.N, sz.P, sz.K, sz.V}, options) : at::empty({0}, options)};
}

}  // namespace linattn_native
