// Pass 1 of gated slot attention and ABC (``linattn.ops.slots``), fused chunk by chunk: the key
// memory S [K, M] whose gate decays its slots (the value side) while the read contracts its keys,
//
//   S_t = S_{t-1} Diag(exp g_t) + k_t s_t^T,   y_t = S_t^T (scale q_t)   (y_t [M]: slot scores)
//
// (Zhang et al. 2024, "Gated Slot Attention", section 3; spec sections 5 and 8). In a chunk of c
// tokens with cumulative log-gates G_i = g_1 + ... + g_i (per slot, as pairs of floats: gates.h)
// and S entering it, the gate is factored out of the slots,
//
//   y_t = exp(G_t) * (Q_t S + sum_{i <= t} A_ti exp(-G_i) s_i),   A = tril(Q K^T), Q = scale q
//   S  <- S Diag(exp G_c) + K^T (exp(G_c - G) * s)
//
// so that the chunk's scores A are ungated: one product Q K^T for all M slots (a per-slot gate
// on the value side would otherwise need one product per slot). exp(-G_i) grows as the slot
// decays: a slot whose decay over the chunk passes kSlotLimit (a steep gate, a reset) is taken
// out of the product (its column of exp(-G) s zero) and summed exactly pair by pair,
// sum_{i <= t} A_ti exp(G_t - G_i) s_i, from the pairs of G. The state's update reads only
// decays exp(G_c - G_i) <= 1 and needs no such care.
//
// The backward, chunk by chunk from the last from the states and scores the forward kept, dY =
// exp(G) * dy and W = exp(-G) * s, Wd = exp(G_c - G) * s:
//
//   dQ = dY S^T + tril(dY W^T) K,   dK = tril(dY W^T)^T Q + Wd dS^T,
//   ds = exp(-G) * (A^T dY) + exp(G_c - G) * (K dS),
//   dG = y * dy - W * (A^T dY) - Wd * (K dS)  (+ at row c: sum over rows of Wd * (K dS) and
//        exp(G_c) * colsum(S * dS)),   dg = the sum of dG over the chunk's rows from the token on,
//   dS <- dS Diag(exp G_c) + Q^T dY
//
// (the steep slots' pairwise sums differentiated alike). Inputs: q, k [B, T, H, K], s, g
// [B, T, H, M] contiguous float32, S0 [N, H, K, M], and cu_seqlens [N + 1] (int64, B = 1) or
// None (N = B): each (sequence, head) is one task.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "blas.h"
#include "block_cache.h"
#include "gates.h"
#include "schedule.h"

namespace linattn_native {
namespace {

// The largest decay of a slot over a chunk that the factored form carries: exp(-G) stays below
// FLT_MAX^(1/2), so its products with inputs of modest size stay far inside float32's range.
const float kSlotLimit = std::log(FLT_MAX) / 2.0f;

// The chunks the kept states have room for, from the shapes alone (so that the fake kernel
// knows them): B ceil(T / C) without cu_seqlens; with N sequences, ceil(T / C) + N - 1 (a
// sequence's ceil(len / C) is floor((len - 1) / C) + 1, and those floors sum to at most
// floor((T - 1) / C)), at least the chunks there are.
int64_t chunk_room(int64_t B, int64_t T, int64_t C, int64_t N, bool packed) {
  const int64_t per_row = (T + C - 1) / C;
  return packed ? std::max<int64_t>(per_row + N - 1, 0) : B * per_row;
}

struct Slots {
  int64_t B, T, H, K, M, N, C;
  const float *q, *k, *s, *g;
  std::vector<int64_t> start, end, first_chunk;  // per sequence: tokens [start, end) of row b
  std::vector<int64_t> row;                       // per sequence: its batch row
  int64_t chunks;                                 // all sequences' chunks
  int64_t room;                                   // ``chunk_room``: the kept states' rows
};

Slots prepare(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& s,
              const at::Tensor& g, const at::Tensor& S0, const std::optional<at::Tensor>& cu,
              int64_t C) {
  for (const auto* t : {&q, &k, &s, &g, &S0}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->device().is_cpu() && t->is_contiguous(), op,
                ": q, k, s, g and S0 must be contiguous float32 CPU tensors");
  }
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && s.dim() == 4 && g.sizes() == s.sizes() &&
                  s.size(0) == q.size(0) && s.size(1) == q.size(1) && s.size(2) == q.size(2),
              op, ": q, k must be [B, T, H, K] and s, g [B, T, H, M]");
  TORCH_CHECK(C >= 1, op, ": C must be >= 1, got ", C);
  Slots p{q.size(0), q.size(1), q.size(2), q.size(3), s.size(3), 0, C,
          q.data_ptr<float>(), k.data_ptr<float>(), s.data_ptr<float>(), g.data_ptr<float>(),
          {}, {}, {}, {}, 0, 0};
  if (cu.has_value()) {
    const at::Tensor& b = *cu;
    TORCH_CHECK(b.scalar_type() == at::kLong && b.dim() == 1 && b.size(0) >= 2 && p.B == 1, op,
                ": cu_seqlens must be int64 [N + 1] with B = 1");
    const at::Tensor c = b.contiguous();
    const int64_t* x = c.data_ptr<int64_t>();
    TORCH_CHECK(x[0] == 0 && x[b.size(0) - 1] == p.T, op, ": cu_seqlens must run from 0 to T");
    for (int64_t n = 0; n + 1 < b.size(0); ++n) {
      TORCH_CHECK(x[n + 1] >= x[n], op, ": cu_seqlens must be non-decreasing");
      p.start.push_back(x[n]);
      p.end.push_back(x[n + 1]);
      p.row.push_back(0);
    }
  } else {
    for (int64_t b = 0; b < p.B; ++b) {
      p.start.push_back(0);
      p.end.push_back(p.T);
      p.row.push_back(b);
    }
  }
  p.N = static_cast<int64_t>(p.start.size());
  TORCH_CHECK(S0.dim() == 4 && S0.size(0) == p.N && S0.size(1) == p.H && S0.size(2) == p.K &&
                  S0.size(3) == p.M,
              op, ": S0 must be [N, H, K, M]");
  for (int64_t n = 0; n < p.N; ++n) {
    p.first_chunk.push_back(p.chunks);
    p.chunks += (p.end[n] - p.start[n] + C - 1) / C;
  }
  p.room = chunk_room(p.B, p.T, C, p.N, cu.has_value());
  TORCH_CHECK(p.chunks <= p.room, op, ": ", p.chunks, " chunks exceed the room ", p.room);
  return p;
}

// One chunk's working blocks (a task's, reused from chunk to chunk).
struct Blocks {
  int64_t C, K, M;
  std::vector<float> Q, hi, lo, zeros, E, F, W, Wd, A, Y, S, D, acc;
  std::vector<float> gh, gl, gs, gd, gds, gdG;  // the steep slots' columns, gathered
  std::vector<char> steep;
  std::vector<int64_t> idx;  // the steep slots
  Blocks(int64_t C_, int64_t K_, int64_t M_)
      : C(C_), K(K_), M(M_), Q(C_ * K_), hi(C_ * M_), lo(C_ * M_), zeros(M_, 0.0f), E(C_ * M_),
        F(C_ * M_), W(C_ * M_), Wd(C_ * M_), A(C_ * C_), Y(C_ * M_), S(K_ * M_), D(M_), acc(M_),
        gh(C_ * M_), gl(C_ * M_), gs(C_ * M_), gd(C_ * M_), gds(C_ * M_), gdG(C_ * M_), steep(M_),
        idx(M_) {}
};

// Steps shared by both passes for a chunk of c rows from token t0 of head h, batch row b: the
// scaled queries, the gates' pairs, exp(G), exp(-G), W = exp(-G) s (0 in steep slots), Wd and A.
// Returns whether any slot is steep.
bool chunk_terms(const Slots& p, Blocks& w, int64_t b, int64_t h, int64_t t0, int c,
                 float scale) {
  const int64_t K = p.K, M = p.M, C = p.C;
  const int64_t rq = p.H * K, rs = p.H * M;
  const float* qr = p.q + (b * p.T + t0) * rq + h * K;
  const float* kr = p.k + (b * p.T + t0) * rq + h * K;
  const float* sr = p.s + (b * p.T + t0) * rs + h * M;
  const float* gr = p.g + (b * p.T + t0) * rs + h * M;
  for (int r = 0; r < c; ++r) {
    for (int64_t x = 0; x < K; ++x) w.Q[r * K + x] = scale * qr[r * rq + x];
  }
  cumulative_gates(gr, rs, c, M, w.zeros.data(), Gates{w.hi.data(), w.lo.data()});
  const float* hiC = w.hi.data() + (c - 1) * M;
  const float* loC = w.lo.data() + (c - 1) * M;
  bool any = false;
  float* D = w.D.data();
  for (int64_t m = 0; m < M; ++m) {
    w.steep[m] = hiC[m] < -kSlotLimit;
    D[m] = exp_pair(hiC[m], loC[m]);
    any = any || w.steep[m];
  }
  // W = exp(-G) s outside the steep slots, Wd = exp(G_c) exp(-G) s (the steep slots' below)
  for (int r = 0; r < c; ++r) {
    const float* hi = w.hi.data() + r * M;
    const float* lo = w.lo.data() + r * M;
    const float* sv = sr + r * rs;
    float* E = w.E.data() + r * M;
    float* F = w.F.data() + r * M;
    float* W = w.W.data() + r * M;
    float* Wd = w.Wd.data() + r * M;
#pragma omp simd
    for (int64_t m = 0; m < M; ++m) {
      E[m] = exp_pair(hi[m], lo[m]);
      F[m] = exp_pair(-hi[m], -lo[m]);
      const float Fs = F[m] * sv[m];
      W[m] = w.steep[m] ? 0.0f : Fs;
      Wd[m] = D[m] * Fs;
    }
  }
  for (int64_t m = 0; m < M && any; ++m) {
    if (!w.steep[m]) continue;
    for (int r = 0; r < c; ++r) {
      const float e = end_decay(hiC[m], loC[m], w.hi[r * M + m], w.lo[r * M + m]);
      w.Wd[r * M + m] = e * sr[r * rs + m];
    }
  }
  lower_products(c, c, 1, K, 1.0f, w.Q.data(), K, kr, rq, w.A.data(), C);
  for (int r = 0; r < c; ++r) {
    std::fill(w.A.data() + r * C + r + 1, w.A.data() + r * C + c, 0.0f);
  }
  return any;
}

// The steep slots' columns of G's pairs, of s and (d_y given) of d_y, side by side in ``w.g*``
// ([c, ns] each, ``w.idx`` their slots), so that their pairwise sums run over ns lanes, not M;
// returns ns.
int64_t gather_steep(Blocks& w, int c, const float* sr, int64_t rs, const float* dyr) {
  const int64_t M = w.M;
  int64_t ns = 0;
  for (int64_t m = 0; m < M; ++m) {
    if (w.steep[m]) w.idx[ns++] = m;
  }
  for (int r = 0; r < c; ++r) {
    for (int64_t j = 0; j < ns; ++j) {
      const int64_t m = w.idx[j];
      w.gh[r * ns + j] = w.hi[r * M + m];
      w.gl[r * ns + j] = w.lo[r * M + m];
      w.gs[r * ns + j] = sr[r * rs + m];
      if (dyr) w.gd[r * ns + j] = dyr[r * rs + m];
    }
  }
  return ns;
}

}  // namespace

// scores [B, T, H, M], the final state [N, H, K, M] and (keep) the state entering every chunk
// [room, H, K, M] (``chunk_room``; the rows past the chunks zero), else empty.
std::tuple<at::Tensor, at::Tensor, at::Tensor> slot_scores_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& s, const at::Tensor& g,
    const at::Tensor& S0, const std::optional<at::Tensor>& cu, double scale_d, int64_t C,
    bool keep) {
  const char* op = "linattn_native.slot_scores_forward";
  const Slots p = prepare(op, q, k, s, g, S0, cu, C);
  const int64_t K = p.K, M = p.M, H = p.H;
  const float scale = static_cast<float>(scale_d);
  at::Tensor out = fresh(s.sizes(), s.options());
  at::Tensor Sfin = fresh(S0.sizes(), S0.options());
  at::Tensor states = fresh({keep ? p.room : 0, H, K, M}, S0.options());
  if (keep && p.room > p.chunks) states.narrow(0, p.chunks, p.room - p.chunks).zero_();
  float* o = out.data_ptr<float>();
  float* fin = Sfin.data_ptr<float>();
  float* st = states.data_ptr<float>();
  const float* S0p = S0.data_ptr<float>();
  const int64_t rs = H * M, rq = H * K;
  parallel_tasks(p.N * H, [&](int64_t lo_task, int64_t hi_task) {
    Blocks w(C, K, M);
    for (int64_t task = lo_task; task < hi_task; ++task) {
      const int64_t n = task / H, h = task % H, b = p.row[n];
      float* S = w.S.data();
      std::copy(S0p + task * K * M, S0p + (task + 1) * K * M, S);
      int64_t j = p.first_chunk[n];
      for (int64_t t0 = p.start[n]; t0 < p.end[n]; t0 += C, ++j) {
        const int c = static_cast<int>(std::min(C, p.end[n] - t0));
        if (keep) std::copy(S, S + K * M, st + (j * H + h) * K * M);
        const bool steep = chunk_terms(p, w, b, h, t0, c, scale);
        const float* kr = p.k + (b * p.T + t0) * rq + h * K;
        const float* sr = p.s + (b * p.T + t0) * rs + h * M;
        float* Y = w.Y.data();
        gemm(false, false, c, M, K, 1.0f, w.Q.data(), K, S, M, 0.0f, Y, M);
        lower_times(c, c, 1, M, 1.0f, w.A.data(), C, w.W.data(), M, 1.0f, Y, M);
        float* orow = o + (b * p.T + t0) * rs + h * M;
        for (int r = 0; r < c; ++r) {
#pragma omp simd
          for (int64_t m = 0; m < M; ++m) orow[r * rs + m] = w.E[r * M + m] * Y[r * M + m];
        }
        if (steep) {  // the steep slots pair by pair, gathered side by side (``gather_steep``)
          const int64_t ns = gather_steep(w, c, sr, rs, nullptr);
          float* acc = w.acc.data();
          for (int r = 0; r < c; ++r) {
            const float *hr = w.gh.data() + r * ns, *lr = w.gl.data() + r * ns;
            std::fill(acc, acc + ns, 0.0f);
            for (int i = 0; i <= r; ++i) {
              const float a = w.A[r * C + i];
              const float *hi = w.gh.data() + i * ns, *lo = w.gl.data() + i * ns;
              const float* si = w.gs.data() + i * ns;
#pragma omp simd
              for (int64_t j = 0; j < ns; ++j) {
                acc[j] += a * decay(hr[j], lr[j], hi[j], lo[j]) * si[j];
              }
            }
            for (int64_t j = 0; j < ns; ++j) orow[r * rs + w.idx[j]] += acc[j];
          }
        }
        const float* D = w.D.data();
        for (int64_t x = 0; x < K; ++x) {
#pragma omp simd
          for (int64_t m = 0; m < M; ++m) S[x * M + m] *= D[m];
        }
        gemm(true, false, K, M, c, 1.0f, kr, rq, w.Wd.data(), M, 1.0f, S, M);
      }
      std::copy(S, S + K * M, fin + task * K * M);
    }
  });
  return {out, Sfin, states};
}

// dq, dk [B, T, H, K], ds, dg [B, T, H, M] and dS0 [N, H, K, M] from the forward's states and
// the scores y and their gradients d_y [B, T, H, M] and the final state's (dS [N, H, K, M]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> slot_scores_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& s, const at::Tensor& g,
    const at::Tensor& states, const std::optional<at::Tensor>& cu, const at::Tensor& y,
    const at::Tensor& d_y, const at::Tensor& dS_final, double scale_d, int64_t C) {
  const char* op = "linattn_native.slot_scores_backward";
  const Slots p = prepare(op, q, k, s, g, dS_final, cu, C);
  const int64_t K = p.K, M = p.M, H = p.H;
  for (const auto* t : {&y, &d_y}) {
    TORCH_CHECK(t->sizes() == s.sizes() && t->is_contiguous() && t->scalar_type() == at::kFloat,
                op, ": y and d_y must be contiguous float32 tensors shaped as s");
  }
  TORCH_CHECK(states.is_contiguous() && states.scalar_type() == at::kFloat && states.dim() == 4 &&
                  states.size(0) == p.room && states.size(1) == H && states.size(2) == K &&
                  states.size(3) == M,
              op, ": states must be the forward's [room, H, K, M]");
  const float scale = static_cast<float>(scale_d);
  at::Tensor dq = fresh(q.sizes(), q.options());
  at::Tensor dk = fresh(k.sizes(), k.options());
  at::Tensor ds = fresh(s.sizes(), s.options());
  at::Tensor dg = fresh(g.sizes(), g.options());
  at::Tensor dS0 = fresh(dS_final.sizes(), dS_final.options());
  const float* st = states.data_ptr<float>();
  const float* dy = d_y.data_ptr<float>();
  const float* yp = y.data_ptr<float>();
  const float* dSf = dS_final.data_ptr<float>();
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dsp = ds.data_ptr<float>(),
        *dgp = dg.data_ptr<float>(), *dS0p = dS0.data_ptr<float>();
  const int64_t rs = H * M, rq = H * K;
  parallel_tasks(p.N * H, [&](int64_t lo_task, int64_t hi_task) {
    Blocks w(C, K, M);
    std::vector<float> dY(C * M), dG(C * M), dA(C * C), dQ(C * K), dK(C * K), dW(C * M),
        dWd(C * M), dsl(C * M), dGC(M), run(M), dS(K * M);
    for (int64_t task = lo_task; task < hi_task; ++task) {
      const int64_t n = task / H, h = task % H, b = p.row[n];
      std::copy(dSf + task * K * M, dSf + (task + 1) * K * M, dS.data());
      const int64_t count = (p.end[n] - p.start[n] + C - 1) / C;
      for (int64_t i = count - 1; i >= 0; --i) {
        const int64_t t0 = p.start[n] + i * C, j = p.first_chunk[n] + i;
        const int c = static_cast<int>(std::min(C, p.end[n] - t0));
        const float* S = st + (j * H + h) * K * M;
        const bool steep = chunk_terms(p, w, b, h, t0, c, scale);
        const float* kr = p.k + (b * p.T + t0) * rq + h * K;
        const float* sr = p.s + (b * p.T + t0) * rs + h * M;
        const float* gr = p.g + (b * p.T + t0) * rs + h * M;
        const float* dyr = dy + (b * p.T + t0) * rs + h * M;
        const float* yr = yp + (b * p.T + t0) * rs + h * M;
        for (int r = 0; r < c; ++r) {
#pragma omp simd
          for (int64_t m = 0; m < M; ++m) {
            const float d = dyr[r * rs + m];
            dY[r * M + m] = w.E[r * M + m] * d;
            dG[r * M + m] = yr[r * rs + m] * d;  // d y_t / d G_t = y_t (the pairwise sums too)
            dsl[r * M + m] = 0.0f;
          }
        }
        lower_products(c, c, 1, M, 1.0f, dY.data(), M, w.W.data(), M, dA.data(), C);
        for (int r = 0; r < c; ++r) {
          std::fill(dA.data() + r * C + r + 1, dA.data() + r * C + c, 0.0f);
        }
        if (steep) {  // the steep slots' pairwise sums, gathered side by side
          const int64_t ns = gather_steep(w, c, sr, rs, dyr);
          std::fill(w.gds.begin(), w.gds.begin() + c * ns, 0.0f);
          std::fill(w.gdG.begin(), w.gdG.begin() + c * ns, 0.0f);
          for (int r = 0; r < c; ++r) {
            const float *hr = w.gh.data() + r * ns, *lr = w.gl.data() + r * ns;
            const float* d = w.gd.data() + r * ns;
            for (int x = 0; x <= r; ++x) {
              const float a = w.A[r * C + x];
              const float *hi = w.gh.data() + x * ns, *lo = w.gl.data() + x * ns;
              const float* sx = w.gs.data() + x * ns;
              float* dsx = w.gds.data() + x * ns;
              float* dGx = w.gdG.data() + x * ns;
              float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
              for (int64_t j = 0; j < ns; ++j) {
                const float ed = decay(hr[j], lr[j], hi[j], lo[j]) * d[j];
                sum += ed * sx[j];
                dsx[j] += a * ed;
                dGx[j] -= a * ed * sx[j];
              }
              dA[r * C + x] += sum;
            }
          }
          for (int r = 0; r < c; ++r) {
            for (int64_t j = 0; j < ns; ++j) {
              dsl[r * M + w.idx[j]] += w.gds[r * ns + j];
              dG[r * M + w.idx[j]] += w.gdG[r * ns + j];
            }
          }
        }
        // dQ = dY S^T + dA K;  dK = dA^T Q + Wd dS^T
        gemm(false, true, c, K, M, 1.0f, dY.data(), M, S, M, 0.0f, dQ.data(), K);
        lower_times(c, c, 1, K, 1.0f, dA.data(), C, kr, rq, 1.0f, dQ.data(), K);
        lower_transposed_times(c, c, K, 1.0f, dA.data(), C, w.Q.data(), K, 0.0f, dK.data(), K);
        gemm(false, true, c, K, M, 1.0f, w.Wd.data(), M, dS.data(), M, 1.0f, dK.data(), K);
        // dW = A^T dY;  dWd = K dS
        lower_transposed_times(c, c, M, 1.0f, w.A.data(), C, dY.data(), M, 0.0f, dW.data(), M);
        gemm(false, false, c, M, K, 1.0f, kr, rq, dS.data(), M, 0.0f, dWd.data(), M);
        const float* hiC = w.hi.data() + (c - 1) * M;
        const float* loC = w.lo.data() + (c - 1) * M;
        const float* D = w.D.data();
        std::fill(dGC.begin(), dGC.end(), 0.0f);
        float* dsr = dsp + (b * p.T + t0) * rs + h * M;
        for (int r = 0; r < c; ++r) {
          const float* hi = w.hi.data() + r * M;
          const float* lo = w.lo.data() + r * M;
#pragma omp simd
          for (int64_t m = 0; m < M; ++m) {
            const int64_t at = r * M + m;
            const float F = w.F[at];
            const float eC = w.steep[m] ? end_decay(hiC[m], loC[m], hi[m], lo[m]) : D[m] * F;
            dsr[r * rs + m] = (w.steep[m] ? 0.0f : F * dW[at]) + eC * dWd[at] + dsl[at];
            const float wd = w.Wd[at] * dWd[at];
            dG[at] -= w.W[at] * dW[at] + wd;
            dGC[m] += wd;
          }
        }
        // the chunk's decay of the state: d exp(G_c) = colsum(S * dS); then dS <- D dS + Q^T dY
        for (int64_t x = 0; x < K; ++x) {
#pragma omp simd
          for (int64_t m = 0; m < M; ++m) {
            dGC[m] += D[m] * S[x * M + m] * dS[x * M + m];
            dS[x * M + m] *= D[m];
          }
        }
        for (int64_t m = 0; m < M; ++m) dG[(c - 1) * M + m] += dGC[m];
        gemm(true, false, K, M, c, 1.0f, w.Q.data(), K, dY.data(), M, 1.0f, dS.data(), M);
        std::fill(run.begin(), run.end(), 0.0f);
        float* dgr = dgp + (b * p.T + t0) * rs + h * M;
        for (int r = c - 1; r >= 0; --r) {
          for (int64_t m = 0; m < M; ++m) run[m] += dG[r * M + m];
          floored_gradient_row(run.data(), gr + r * rs, M, dgr + r * rs, kGateFloor);
        }
        float* dqr = dqp + (b * p.T + t0) * rq + h * K;
        float* dkr = dkp + (b * p.T + t0) * rq + h * K;
        for (int r = 0; r < c; ++r) {
#pragma omp simd
          for (int64_t x = 0; x < K; ++x) {
            dqr[r * rq + x] = scale * dQ[r * K + x];
            dkr[r * rq + x] = dK[r * K + x];
          }
        }
      }
      std::copy(dS.begin(), dS.end(), dS0p + task * K * M);
    }
  });
  return {dq, dk, ds, dg, dS0};
}

// The fake (meta) kernels: the shapes from the inputs' shapes alone.
std::tuple<at::Tensor, at::Tensor, at::Tensor> slot_scores_forward_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& s, const at::Tensor& g,
    const at::Tensor& S0, const std::optional<at::Tensor>& cu, double, int64_t C, bool keep) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && s.dim() == 4 && g.sizes() == s.sizes() &&
                  S0.dim() == 4 && C >= 1,
              "linattn_native.slot_scores_forward: q, k must be [B, T, H, K], s, g [B, T, H, M], "
              "S0 [N, H, K, M] and C >= 1");
  const int64_t N = cu.has_value() ? cu->size(0) - 1 : q.size(0);
  const int64_t room = chunk_room(q.size(0), q.size(1), C, N, cu.has_value());
  return {at::empty(s.sizes(), s.options()), at::empty(S0.sizes(), S0.options()),
          at::empty({keep ? room : 0, q.size(2), q.size(3), s.size(3)}, S0.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> slot_scores_backward_meta(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& s, const at::Tensor& g,
    const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
    const at::Tensor& dS_final, double, int64_t) {
  return {at::empty(q.sizes(), q.options()), at::empty(k.sizes(), k.options()),
          at::empty(s.sizes(), s.options()), at::empty(g.sizes(), g.options()),
          at::empty(dS_final.sizes(), dS_final.options())};
}

TORCH_LIBRARY_FRAGMENT(linattn_native, m) {
  m.def(
      "slot_scores_forward(Tensor q, Tensor k, Tensor s, Tensor g, Tensor S0, Tensor? cu_seqlens,"
      " float scale, int C, bool keep) -> (Tensor, Tensor, Tensor)");
  m.def(
      "slot_scores_backward(Tensor q, Tensor k, Tensor s, Tensor g, Tensor states,"
      " Tensor? cu_seqlens, Tensor y, Tensor d_y, Tensor dS_final, float scale, int C)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("slot_scores_forward", &slot_scores_forward);
  m.impl("slot_scores_backward", &slot_scores_backward);
}

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("slot_scores_forward", &slot_scores_forward_meta);
  m.impl("slot_scores_backward", &slot_scores_backward_meta);
}

}  // namespace linattn_native
