// The backward pass of the chunk form (spec section 8 differentiated), one free function per
// step over the chunk's recomputed terms (``Recomputed``) and their gradients (``TermGrads``,
// backward.h), in the order they run for each chunk (``chunk_step``):
//
//   recompute             G, exp(G), exp(G_c - G), D; Qd, Ke, Kd (terms.h); Gamma (one gate
//                         per token); the rule's scores A_qk (and A_kk), and pseudo-values:
//                         U = v, or the UT transform's [W | U0] and U = U0 - W S (rules/)
//   output_gradients      dU, dA, dQd, dKe from dO and dS'
//   read_gate_gradients   dG from Qd, G_c's share from D, Ke's share (dGe)
//   qk_score_gradients    A_qk's two factors: dQ, dK and the gates' share
//   state_gradient        dS = D dS' + Qd^T dO - W^T dU
//   the rule's backward   (``Rule::backward``, rules.h) the delta rule's (rules/delta.cpp): the
//                         UT transform's (dR_v, dR_k, dT; dv, dbeta, beta's share of dk), then
//                         A_kk's two factors (dK and the gates' share)
//   gate_gradients        dg: the reversed cumulative sum of dG, Ke's prefix sum
//
// Every mechanism of the mechanism table (docs/design.md), chunk by chunk from
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
// kg = 1 the sums of dM * M over the pairs across each gate, ``product_gate_gradient``); and
// D <dS', S> (row by row of S) for G_c. With kg = 1 each term is summed over the channels. dg is
// the reversed cumulative sum of dG inside the chunk (G_i = g_1 + ... + g_i) plus Ke's share,
// sum_{i < t} dKe_i * Ke_i. Terms without decay (the products' diagonals, Ke_c) never enter dg:
// their shares cancel exactly, and their rounding would swamp the small dg of steep gates.
//

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "backward.h"
#include "blas.h"
#include "checks.h"
#include "convert.h"
#include "gates.h"
#include "kernels.h"
#include "layout.h"
#include "products.h"
#include "rules/rules.h"
#include "schedule.h"
#include "terms.h"
#include "triangular.h"

namespace linattn_native {
namespace {

constexpr const char* kBackwardOp = "linattn_native.chunk_backward";

// The tensors of a backward call, checked, their rows where the BLAS reads them, and the
// gradients it writes; the mechanism's rule and gate width kg.
struct BackwardTensors {
  const Rule& rule;
  int64_t kg;
  float scale;
  Sizes sz;
  at::Tensor q, k, v, beta, g, d_o, states, dq, dk, dv, dg, dbeta, dS;

  bool staged = false;  // some input goes through a thread's blocks (``any_staged``)

  // The rows of chunk n of value head p (``input_rows``, layout.h: q's from row n C / R,
  // ``BackwardBlocks::spread``).
  ChunkRows rows(int64_t n, int64_t p, Staging& stage) const {
    return input_rows(sz, q, k, v, beta, g, n, p, stage);
  }

  // Where the gradients of chunk n of value head p go (the gradients' rows where float32, else
  // ``stage``'s blocks 6-10, which ``store`` writes back), and its dO (block 5 where converted);
  // dO and dq: the c / R query rows from row n C / R.
  ChunkGrads grads(int64_t n, int64_t p, Staging& stage) const {
    const int64_t b = p / sz.HV, h = p % sz.HV, t0 = n * sz.C;
    const int c = static_cast<int>(std::min<int64_t>(sz.C, sz.T - t0));
    const FloatRows dO = read_rows(d_o, b, h, t0 / sz.R, static_cast<int>(c / sz.R),
                                   stage.block(5));
    auto out = [&](const at::Tensor& x, int64_t slot, int64_t row) {
      return output_rows(x, b, h, row, stage.block(slot));
    };
    const auto [dQ, lddq] = out(dq, 6, t0 / sz.R);
    const auto [dK, lddk] = out(dk, 7, t0);
    const auto [dV, lddv] = out(dv, 8, t0);
    const auto [dB, sdb] = rule.reads_beta ? out(dbeta, 9, t0) : std::pair<float*, int64_t>{};
    const auto [dG, lddg] = kg > 0 ? out(dg, 10, t0) : std::pair<float*, int64_t>{};
    return {dO.p, dO.ld, dQ, dK, dV, dB, dG, lddq, lddk, lddv, sdb, lddg};
  }

  // The gradients of chunk n of value head p from ``grads``' blocks into the gradients that are
  // not float32 (in their dtype; nothing for float32, written in place).
  // (dq: its c / R query rows.)
  void store(int64_t n, int64_t p, const ChunkGrads& g, int c) const {
    const int64_t b = p / sz.HV, h = p % sz.HV, t0 = n * sz.C;
    write_rows(dq, b, h, t0 / sz.R, static_cast<int>(c / sz.R), g.dQ);
    write_rows(dk, b, h, t0, c, g.dK);
    write_rows(dv, b, h, t0, c, g.dV);
    if (rule.reads_beta) write_rows(dbeta, b, h, t0, c, g.dB);
    if (kg > 0) write_rows(dg, b, h, t0, c, g.dg);
  }

  // Ask the cache for chunk n of value head p's input rows, dO's, and its gradients' rows
  // (layout.h; nothing past the first chunk or the last head).
  void prefetch(int64_t n, int64_t p) const {
    prefetch_inputs(sz, q, k, v, beta, g, n, p);
    if (n < 0 || p >= sz.P) return;
    const int64_t b = p / sz.HV, h = p % sz.HV, t0 = n * sz.C;
    const int64_t c = std::min(sz.C, sz.T - t0);
    prefetch_rows(d_o, b, h, t0 / sz.R, c / sz.R);
    if (!streamed_output(dq, staged)) prefetch_rows(dq, b, h, t0 / sz.R, c / sz.R, true);
    for (const at::Tensor* x : {&dk, &dv, &dbeta, &dg}) {
      if (!streamed_output(*x, staged)) prefetch_rows(*x, b, h, t0, c, true);
    }
  }

  // One thread's blocks for the converted rows: five inputs, dO and five gradients.
  Staging staging() const { return linattn_native::staging(sz, rule.input_keys, 11, staged); }

  Dims dims(int c) const { return {c, sz.K, sz.V, sz.C, kg, scale, rule.writes}; }
  const float* state(int64_t n, int64_t p) const {  // the state entering chunk n of head p
    return states.data_ptr<float>() + (n * sz.P + p) * sz.K * sz.V;
  }
  float* dstate(int64_t p) const { return dS.data_ptr<float>() + p * sz.K * sz.V; }
};

// One thread's blocks for the backward pass of one chunk of one head (64-bit sizes): the
// recomputed terms and their gradients (the write rows' blocks for the rule's ``writes``).
struct BackwardBlocks {
  Scratch w;
  std::vector<float> Gam, Aqk, Akk, L, X, U, Qd, Ke, Kd, eG, eEnd, D;
  std::vector<float> dA, dU, dRk, dQd, dKe, dX, dY, dG, dGe, dG_diag, dG_end, dGx;
  std::vector<float> Qx, dOx, dQx;  // R > 1: the query rows on the write rows (``spread``)
  int64_t R;
  Staging stage;  // the converted rows of inputs and gradients that are not float32

  explicit BackwardBlocks(const BackwardTensors& t)
      : BackwardBlocks(t.sz, t.kg, t.rule.writes, t.staging()) {}
  BackwardBlocks(const Sizes& sz, int64_t kg, int64_t writes, Staging staging)
      : w(sz.C, sz.K, sz.V), Gam(kg == 1 ? sz.C * sz.C : 0), Aqk(writes * sz.C * sz.C),
        Akk(writes * sz.C * sz.C), L(sz.C * sz.C), X(writes * sz.C * (sz.K + sz.V)),
        U(writes * sz.C * sz.V), Qd(sz.C * sz.K), Ke(writes * sz.C * sz.K), Kd(sz.C * sz.K),
        eG(sz.C * std::max<int64_t>(kg, 1)), eEnd(eG.size()), D(std::max<int64_t>(kg, 1)),
        dA(writes * sz.C * sz.C), dU(writes * sz.C * sz.V), dRk(sz.C * sz.K), dQd(sz.C * sz.K),
        dKe(writes * sz.C * sz.K), dX(sz.C * sz.K), dY(sz.C * sz.K), dG(eG.size()),
        dGe(eG.size()), dG_diag(sz.C), dG_end(D.size()), dGx(eG.size()),
        Qx(sz.R > 1 ? sz.C * sz.K : 0, 0.0f),
        dOx(sz.R > 1 ? sz.C * sz.V : 0, 0.0f), dQx(Qx.size()), R(sz.R),
        stage(std::move(staging)) {}

  // x and g with their query rows on the write rows (R > 1): q_i and dO_i at row i R + R - 1 of
  // Qx and dOx, zeros at the others (never written), dq into dQx, so that every step runs as for
  // R = 1 on the numbers of the delta rule on the write rows with a zero dO at the rows not
  // read (their dq rows come out exactly 0; ``gather_queries`` copies the query rows out). The
  // rows are spread from x's and g's float32 rows (their own, or ``stage``'s conversion).
  void spread(ChunkRows& x, ChunkGrads& g, int64_t K, int64_t V) {
    if (R == 1) return;
    queries(x, K);
    spread_queries(x.c, R, V, g.dO, g.lddo, dOx.data());
    g.dO = dOx.data(), g.lddo = V, g.dQ = dQx.data(), g.lddq = K;
  }

  // x's query rows alone on the write rows (``spread``; the terms' recomputation reads no dO).
  void queries(ChunkRows& x, int64_t K) {
    if (R == 1) return;
    spread_queries(x.c, R, K, x.q, x.ldq, Qx.data());
    x.q = Qx.data(), x.ldq = K;
  }

  // Where the terms are written (terms.h; Kd formed for a rule that needs it only).
  Terms terms(const Rule& rule) {
    return {{w.G.data(), w.G.data() + w.Qd.size()}, Qd.data(), Ke.data(),
            rule.needs_Kd ? Kd.data() : nullptr, eG.data(), eEnd.data(), D.data(), Aqk.data(),
            Akk.data(), L.data(), X.data()};
  }

  // The term gradients' blocks; dU its own where U reads the state, else dv's rows (``g``).
  TermGrads grads(const Rule& rule, const ChunkGrads& g, int64_t V) {
    const bool own = rule.reads_state();
    return {dA.data(),  own ? dU.data() : g.dV, own ? V : g.lddv, dRk.data(), dQd.data(),
            dKe.data(), dX.data(), dY.data(), dG.data(), dGe.data(), dG_diag.data(),
            dG_end.data(), dGx.data()};
  }
};

// 1-3. The forward terms of the chunk, recomputed as the forward pass formed them: the gates
//      (terms.h; without decay the rows are the inputs), Gamma, the rule's scores and
//      pseudo-values (rules.h: U = v, or X = [W | U0] (the UT transform) and U = U0 - W S).
Recomputed recompute(const ChunkRows& x, const Dims& d, const Rule& rule, const float* S,
                     BackwardBlocks& b) {
  const Terms t = b.terms(rule);
  GatedRows r = chunk_gates(x, d.kg, d.K, d.scale, b.w.zeros.data(), t);
  if (d.kg == 1) token_decays(t.G, d.c, d.C, b.Gam.data(), t.eEnd);
  rule.scores(x, d.kg, d.K, d.scale, t, d.C, b.w);
  if (rule.pseudo_value_terms) rule.pseudo_value_terms(x, r, d.kg, d.K, d.V, d.C, t, b.w);
  Recomputed rc{t, r, b.Gam.data(), x.v, x.ldv};
  if (rule.reads_state()) {
    rule.pseudo_values(d.c, d.K, d.V, t.X, S, b.U.data(), d.V);
    rc.U = b.U.data(), rc.ldu = d.V;
  }
  return rc;
}

// dU = A_q^T dO + Ke dS' for c write rows (dU [c, V], row stride lddu; for the additive rule,
// dv; A_q's c columns of those rows, row stride lda).
void value_gradient(int c, int64_t K, int64_t V, const float* Aq, int64_t lda, const float* dO,
                    int64_t lddo, const float* Ke, int64_t ldke, const float* dS, float* dU,
                    int64_t lddu) {
  lower_transposed_times(c, c, V, 1.0f, Aq, lda, dO, lddo, 0.0f, dU, lddu);
  gemm(false, false, c, V, K, 1.0f, Ke, ldke, dS, V, 1.0f, dU, lddu);
}

// dS = D dS' + Qd^T dO - W^T dU in place of dS' [K, V] (D nullptr: no decay; W nullptr: the
// rule whose U is V; Qd = q_alpha Qr; W [c, K] with row stride ldw; dU row stride lddu).
void state_gradient(int c, int64_t kg, int64_t K, int64_t V, const float* D, float q_alpha,
                    const float* Qr, int64_t ldqr, const float* dO, int64_t lddo, const float* W,
                    int64_t ldw, const float* dU, int64_t lddu, float* dS) {
  const int Vi = static_cast<int>(V);
  for (int64_t ch = 0; D && ch < K; ++ch) {
    float* row = dS + ch * V;
    const float d = D[kg == 1 ? 0 : ch];
#pragma omp simd
    for (int j = 0; j < Vi; ++j) row[j] *= d;
  }
  gemm(true, false, K, V, c, q_alpha, Qr, ldqr, dO, lddo, 1.0f, dS, V);
  if (W) gemm(true, false, K, V, c, -1.0f, W, ldw, dU, lddu, 1.0f, dS, V);
}

// 4. dU = A_q^T dO + Ke dS';  dA = mask(dO U^T);  dQd = dO S^T;  dKe = U dS'^T (over the n
//    write rows; each c-column block of dA masked causally). Without decay dQd and the key
//    rows' dKe go straight into dq (scaled) and dk, a stacked rule's other rows into tg.dKe.
void output_gradients(const ChunkGrads& g, const Dims& d, const Recomputed& rc, const float* S,
                      const float* dSn, const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K), Vi = static_cast<int>(d.V);
  const int64_t K = d.K, V = d.V, n = d.rows(), lda = d.lda();
  for (int64_t at = 0; at < n; at += c) {  // block by block, as the split schedule's chain
    value_gradient(c, K, V, rc.t.A + at, lda, g.dO, g.lddo, rc.r.Kend + at * rc.r.ldke,
                   rc.r.ldke, dSn, tg.dU + at * tg.lddu, tg.lddu);
  }
  lower_products(c, c, n / c, Vi, 1.0f, g.dO, g.lddo, rc.U, rc.ldu, tg.dA, lda);  // masked below
  if (d.gated()) {
    gemm(false, true, c, Ki, Vi, 1.0f, g.dO, g.lddo, S, V, 0.0f, tg.dQd, K);
    gemm(false, true, n, Ki, Vi, 1.0f, rc.U, rc.ldu, dSn, V, 0.0f, tg.dKe, K);
  } else {
    gemm(false, true, c, Ki, Vi, d.scale, g.dO, g.lddo, S, V, 0.0f, g.dQ, g.lddq);
    gemm(false, true, c, Ki, Vi, 1.0f, rc.U, rc.ldu, dSn, V, 0.0f, g.dK, g.lddk);
    gemm(false, true, n - c, Ki, Vi, 1.0f, rc.U + c * rc.ldu, rc.ldu, dSn, V, 0.0f,
         tg.dKe + c * K, K);
  }
  for (int i = 0; i < c; ++i) {
    float* dAi = tg.dA + static_cast<int64_t>(i) * lda;
    for (int64_t block = 0; block < n; block += c) {
      for (int j = i + 1; j < c; ++j) dAi[block + j] = 0.0f;
    }
  }
}

// 5. dG from Qd; G_c's share from D (dG_end); Ke's share apart, in dGe: Ke_i = k_i exp(G_c - G_i)
//    depends on the gates after i only, and is added to dg as a prefix sum (step 9), not as G_c's
//    share less G_i's, whose rounding would be that of the undecayed Ke_c. A stacked rule's
//    rows (a_i exp(G_c - G_i)) add to token i's share alike.
void read_gate_gradients(const Dims& d, const Recomputed& rc, const float* S, const float* dSn,
                         const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K), Vi = static_cast<int>(d.V);
  const int64_t K = d.K, V = d.V, kg = d.kg;
  const bool channel = d.channel();
  std::fill(tg.dG_end, tg.dG_end + kg, 0.0f);
  std::fill(tg.dGx, tg.dGx + c * kg, 0.0f);
  for (int ch = 0; ch < Ki; ++ch) {
    const float *Sr = S + ch * V, *dSr = dSn + ch * V;
    float sS = 0.0f;
#pragma omp simd reduction(+ : sS)
    for (int j = 0; j < Vi; ++j) sS += dSr[j] * Sr[j];
    tg.dG_end[channel ? ch : 0] += rc.t.D[channel ? ch : 0] * sS;
  }
  for (int i = 0; i < c; ++i) {
    const float *a = tg.dQd + i * K, *x = rc.t.Qd + i * K;
    const float *e = tg.dKe + i * K, *y = rc.t.Ke + i * K;
    float *dGi = tg.dG + i * kg, *dGei = tg.dGe + i * kg;
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
    for (int64_t row = i + c; row < d.rows(); row += c) {  // a stacked rule's rows of token i
      const float *es = tg.dKe + row * K, *ys = rc.t.Ke + row * K;
      if (!channel) {
        float sk = 0.0f;
#pragma omp simd reduction(+ : sk)
        for (int ch = 0; ch < Ki; ++ch) sk += es[ch] * ys[ch];
        dGei[0] += sk;
      } else {
#pragma omp simd
        for (int ch = 0; ch < Ki; ++ch) dGei[ch] += es[ch] * ys[ch];
      }
    }
  }
}

// 6. A_qk's factors, no gate or one per token: dq = scale exp(G) dQd + dQ_A, dk = exp(G_c - G)
//    dKe + dK_A with dQ_A = scale (dA * Gamma) k, dK_A = scale (dA * Gamma)^T q, and the gates'
//    share (``product_gate_gradient``).
void qk_score_gradients(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                        const Recomputed& rc, const TermGrads& tg) {
  const int c = d.c, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, C = d.C, lda = d.lda();
  for (int i = 0; d.gated() && i < c; ++i) {
    const float a = d.scale * rc.t.eG[i], e = rc.t.eEnd[i];
    const float *dqd = tg.dQd + i * K, *dke = tg.dKe + i * K;
    float *dq_i = g.dQ + i * g.lddq, *dk_i = g.dK + i * g.lddk;
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      dq_i[ch] = a * dqd[ch];
      dk_i[ch] = e * dke[ch];
    }
  }
  if (d.gated()) {
    product_gate_gradient(tg.dA, rc.t.A, lda, c, tg.dGx);
    times_decays(c, tg.dA, lda, rc.Gam, C);
  }
  lower_product_gradient(c, c, 1, Ki, d.scale, tg.dA, lda, x.q, x.ldq, x.k, x.ldk, g.dQ, g.lddq,
                         1.0f, g.dK, g.lddk, 1.0f);
}

// 6, one gate per channel: the blocked backward of the factored product (products.h), and the
// gates' share (``channel_gate_share``). The diagonal of dA (no decay) is taken out of it and
// added to dq and dk alone.
void qk_channel_score_gradients(const ChunkRows& x, const ChunkGrads& g, const Dims& d,
                                const Recomputed& rc, const TermGrads& tg, Scratch& w) {
  const int c = d.c, Ki = static_cast<int>(d.K);
  const int64_t K = d.K, lda = d.lda();
  const float scale = d.scale;
  for (int i = 0; i < c; ++i) {
    float* dAii = tg.dA + static_cast<int64_t>(i) * (lda + 1);
    tg.dG_diag[i] = scale * *dAii;
    *dAii = 0.0f;
  }
  std::fill(tg.dX, tg.dX + c * K, 0.0f);
  std::fill(tg.dY, tg.dY + c * K, 0.0f);
  channel_product_backward({x.q, x.ldq}, {x.k, x.ldk}, rc.t.G, K, c, scale, tg.dA, lda, tg.dX,
                           tg.dY, w, rc.t.eEnd);
  channel_gate_share({x.q, x.ldq}, {x.k, x.ldk}, rc.t.G, K, c, scale, tg.dA, lda, tg.dGx, w,
                     rc.t.eEnd);
  for (int i = 0; i < c; ++i) {
    const float *qi = x.q + i * x.ldq, *ki = x.k + i * x.ldk;
    const float *dx = tg.dX + i * K, *dy = tg.dY + i * K;
    const float *a = tg.dQd + i * K, *e = tg.dKe + i * K;
    const float *eg = rc.t.eG + i * K, *ee = rc.t.eEnd + i * K;
    float *dq_i = g.dQ + i * g.lddq, *dk_i = g.dK + i * g.lddk;
    const float dd = tg.dG_diag[i];
#pragma omp simd
    for (int ch = 0; ch < Ki; ++ch) {
      dq_i[ch] = scale * eg[ch] * a[ch] + dx[ch] + dd * ki[ch];
      dk_i[ch] = ee[ch] * e[ch] + dy[ch] + dd * qi[ch];
    }
  }
}

// 9. dg: the reversed cumulative sum of dG inside the chunk, G_c's share at its end. Ke's share
//    (dGe) is the prefix sum sum_{i < t} dGe_i: Ke_i depends on g_t for t > i. The products'
//    share (dGx) is a term of dg itself (``product_gate_gradient``, ``channel_gate_share``). A
//    floored gate (g <= kGateFloor: its decay is exactly 0) has the floor's gradient, 0.
void gate_gradients(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const TermGrads& tg) {
  const int c = d.c;
  const int64_t kg = d.kg;
  float* last = tg.dG + (c - 1) * kg;
  for (int ch = 0; ch < kg; ++ch) last[ch] += tg.dG_end[ch];
  for (int i = c - 2; i >= 0; --i) {  // dG_i <- sum_{l >= i} dG_l
    float* dGi = tg.dG + i * kg;
#pragma omp simd
    for (int ch = 0; ch < kg; ++ch) dGi[ch] += dGi[ch + kg];
  }
  for (int i = 1; i < c; ++i) {  // dGe_i <- sum_{l <= i} dGe_l
    float* dGei = tg.dGe + i * kg;
#pragma omp simd
    for (int ch = 0; ch < kg; ++ch) dGei[ch] = dGei[ch] + dGei[ch - kg];
  }
  for (int i = c - 1; i >= 0; --i) {
    float* dGi = tg.dG + i * kg;
    if (i > 0) {
      const float* before = tg.dGe + (i - 1) * kg;  // sum_{l < i}
#pragma omp simd
      for (int ch = 0; ch < kg; ++ch) dGi[ch] += before[ch];
    }
    const float* pairs = tg.dGx + i * kg;
#pragma omp simd
    for (int ch = 0; ch < kg; ++ch) dGi[ch] += pairs[ch];
    floored_gradient_row(dGi, x.g + i * x.sg, kg, g.dg + i * g.lddg, kGateFloor);
  }
}

// Every step of one chunk's backward, in order, from the state S entering it and dS' (dSn), the
// gradient of the state leaving it, which becomes dS, the gradient of the state entering it.
void chunk_step(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Rule& rule,
                const float* S, float* dSn, BackwardBlocks& b) {
  const Recomputed rc = recompute(x, d, rule, S, b);
  const TermGrads tg = b.grads(rule, g, d.V);
  output_gradients(g, d, rc, S, dSn, tg);
  if (d.gated()) read_gate_gradients(d, rc, S, dSn, tg);
  if (d.channel()) {
    qk_channel_score_gradients(x, g, d, rc, tg, b.w);
  } else {
    qk_score_gradients(x, g, d, rc, tg);
  }
  const int64_t at = rule.state_row(d.c);  // the rows of U that read the state: U0 - W S
  state_gradient(d.c, d.kg, d.K, d.V, d.gated() ? rc.t.D : nullptr, rc.r.q_alpha, rc.r.Qread,
                 rc.r.ldqr, g.dO, g.lddo, rule.reads_state() ? rc.t.X + at * (d.K + d.V) : nullptr,
                 d.K + d.V, tg.dU + at * tg.lddu, tg.lddu, dSn);
  if (rule.backward) rule.backward(x, g, d, rc, S, tg, b.w);
  if (d.gated()) gate_gradients(x, g, d, tg);
}

// Every step of chunk n of head p (``chunk_step``), its query rows spread over its write rows
// and dq's gathered back where R > 1 (``BackwardBlocks::spread``).
void query_step(const BackwardTensors& t, int64_t n, int64_t p, float* dSn, BackwardBlocks& b) {
  ChunkRows x = t.rows(n, p, b.stage);
  const ChunkGrads out = t.grads(n, p, b.stage);  // where the gradients go
  ChunkGrads g = out;
  b.spread(x, g, t.sz.K, t.sz.V);
  chunk_step(x, g, t.dims(x.c), t.rule, t.state(n, p), dSn, b);
  if (t.sz.R > 1) gather_queries(x.c, t.sz.R, t.sz.K, b.dQx.data(), out.dQ, out.lddq);
  t.store(n, p, out, x.c);  // the gradients not float32 into their tensors
}

// The split schedule's slots of the state-gradient chain (schedule.h): slot n P + p holds what
// the chain reads of chunk n of head p: Qd [C, K] and D [kg] (with decay), Ke [writes C, K]
// (with decay, or a stacked rule's: rules.h), A_q [C, writes C], W [C, K] (a rule whose U reads
// the state, as the delta rule's), each at a 64-byte boundary (``padded``, layout.h).
struct ChainSlots {
  bool has_W;
  int64_t writes, CK, CC, qd_size, ke_size, gate_size, size;
  at::Tensor buffer;  // [N P, size]
  ChainSlots(const BackwardTensors& t)
      : has_W(t.rule.reads_state()), writes(t.rule.writes), CK(padded(t.sz.C * t.sz.K)),
        CC(padded(writes * t.sz.C * t.sz.C)), qd_size(t.kg > 0 ? CK : 0),
        ke_size(t.kg > 0 || writes > 1 ? padded(writes * t.sz.C * t.sz.K) : 0),
        gate_size(qd_size + ke_size + (t.kg > 0 ? padded(t.kg) : 0)),
        size(gate_size + CC + (has_W ? CK : 0)),
        buffer(fresh({t.sz.N * t.sz.P, size}, t.states.options())) {}
  float* slot(int64_t s) const { return buffer.data_ptr<float>() + s * size; }

  // Slot s from the recomputed terms of its chunk (c tokens).
  void store(int64_t s, const Recomputed& rc, const Dims& d) const {
    float* slot = this->slot(s);
    const int64_t c = d.c, K = d.K, ldx = d.K + d.V, at = (writes - 1) * c;
    if (qd_size > 0) std::memcpy(slot, rc.t.Qd, sizeof(float) * c * K);
    if (ke_size > 0) std::memcpy(slot + qd_size, rc.t.Ke, sizeof(float) * d.rows() * K);
    if (d.gated()) std::memcpy(slot + qd_size + ke_size, rc.t.D, sizeof(float) * d.kg);
    std::memcpy(slot + gate_size, rc.t.A, sizeof(float) * c * d.lda());
    for (int64_t i = 0; has_W && i < c; ++i) {  // W, the first K columns of X = [W | U0]
      std::memcpy(slot + gate_size + CC + i * K, rc.t.X + (at + i) * ldx, sizeof(float) * K);
    }
  }
};

// The state-gradient chain of one head from the last chunk, on the slots' terms: dU = A_q^T dO +
// Ke dS' (the rows that read the state), dS = D dS' + Qd^T dO - W^T dU, each chunk's dS' saved
// into dSp (slot-indexed).
void gradient_chain(const BackwardTensors& t, const ChainSlots& slots, int64_t p, float* dSp,
                    BackwardBlocks& b) {
  const int64_t K = t.sz.K, V = t.sz.V, KV = K * V, P = t.sz.P;
  const bool gated = t.kg > 0;
  float* dS = t.dstate(p);
  for (int64_t n = t.sz.N - 1; n >= 0; --n) {
    ChunkRows x = t.rows(n, p, b.stage);
    ChunkGrads g = t.grads(n, p, b.stage);  // dO alone is read here
    b.spread(x, g, K, V);
    const int64_t s = n * P + p, at = t.rule.state_row(x.c);
    std::memcpy(dSp + s * KV, dS, sizeof(float) * KV);
    const float* slot = slots.slot(s);
    const float* Qr = gated ? slot : x.q;
    const float* Ke = slots.ke_size > 0 ? slot + slots.qd_size : x.k;
    const int64_t ldke = slots.ke_size > 0 ? K : x.ldk;
    const float* W = slots.has_W ? slot + slots.gate_size + slots.CC : nullptr;
    float* dU = b.dU.data() + at * V;  // where chunk_step has them: the BLAS's same alignment
    if (W) {  // the rows of dU that W reads
      value_gradient(x.c, K, V, slot + slots.gate_size + at, slots.writes * t.sz.C, g.dO,
                     g.lddo, Ke + at * ldke, ldke, dS, dU, V);
    }
    state_gradient(x.c, t.kg, K, V, gated ? slot + slots.qd_size + slots.ke_size : nullptr,
                   gated ? 1.0f : t.scale, Qr, gated ? K : x.ldq, g.dO, g.lddo, W, K, dU, V, dS);
  }
}

// The split schedule (schedule.h) of the backward pass: 1. for every (chunk, head) pair, the
// terms the state-gradient chain reads (steps 1-3) into its slot; 2. per head, the chain, saving
// each chunk's dS'; 3. every step of every pair from its saved dS' (steps 1-3 computed again: the
// slots hold only what the chain reads).
void backward_split(const BackwardTensors& t) {
  const int64_t P = t.sz.P, N = t.sz.N, KV = t.sz.K * t.sz.V;
  const ChainSlots slots(t);
  const at::Tensor dS_in = fresh({N, P, t.sz.K, t.sz.V}, t.dS.options());  // dS' of every chunk
  float* dSp = dS_in.data_ptr<float>();
  parallel_tasks(N * P, [&](int64_t lo, int64_t hi) {
    BackwardBlocks b(t);
    for (int64_t s = lo; s < hi; ++s) {
      ChunkRows x = t.rows(s / P, s % P, b.stage);
      b.queries(x, t.sz.K);
      const Dims d = t.dims(x.c);
      slots.store(s, recompute(x, d, t.rule, t.state(s / P, s % P), b), d);
    }
  });
  parallel_tasks(P, [&](int64_t lo, int64_t hi) {
    BackwardBlocks b(t);
    for (int64_t p = lo; p < hi; ++p) gradient_chain(t, slots, p, dSp, b);
  });
  parallel_tasks(N * P, [&](int64_t lo, int64_t hi) {
    BackwardBlocks b(t);
    for (int64_t s = lo; s < hi; ++s) {
      // its own copy of dS', which the steps turn into dS
      query_step(t, s / P, s % P, dSp + s * KV, b);
    }
  });
}

// The fused schedule: heads [lo, hi) of a thread, chunk by chunk from the last.
void backward_fused(const BackwardTensors& t, int64_t lo, int64_t hi) {
  BackwardBlocks b(t);
  for (int64_t n = t.sz.N - 1; n >= 0; --n) {
    for (int64_t p = lo; p < hi; ++p) {
      t.prefetch(p + 1 < hi ? n : n - 1, p + 1 < hi ? p + 1 : lo);  // the next chunk's rows
      query_step(t, n, p, t.dstate(p), b);
    }
  }
}

// dq or dk per value head, d [B, HV, T, K] (a view of [B, T, HV, K]), summed over each group
// of value heads into its q/k head: [B, H, T, K] (a view of [B, T, H, K]) in ``dtype`` (d is
// float32 then: the sum is float32's, rounded once); d itself for group = 1.
at::Tensor group_sum(const at::Tensor& d, const Sizes& sz, at::ScalarType dtype) {
  if (sz.group == 1) return d;
  // [B, HV, T, K] -> [B, T, HV, K] -> [B, T, H, group, K], summed over group -> [B, T, H, K]
  const int64_t T = d.size(2);  // T, or q's T / R rows
  const at::Tensor sum = d.transpose(1, 2).view({sz.B, T, sz.H, sz.group, sz.K}).sum(3);
  return sum.to(dtype).transpose(1, 2);
}

// The checks of a ``chunk_backward`` call: its sizes and the gate width kg.
std::pair<Sizes, int64_t> backward_sizes(const Mechanism& mech, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const std::optional<at::Tensor>& beta,
                                         const std::optional<at::Tensor>& g,
                                         const at::Tensor& states, const at::Tensor& d_o,
                                         const at::Tensor& dS_final, double scale, int64_t C,
                                         int64_t reads) {
  const Checks check{kBackwardOp};
  const Sizes sz(check, q, k, v, C, reads);
  const int64_t B = sz.B, HV = sz.HV, T = sz.T, K = sz.K, V = sz.V;
  const int64_t kg = check.mechanism_inputs(mech, beta, g, B, HV, T, K);
  check.shape("states", states, {sz.N, sz.P, K, V}, "[ceil(T / C), B HV, K, V]");
  check.input_shape("d_o", d_o, {B, HV, sz.queries(), V}, "[B, HV, T / reads, V]");
  check.shape("dS_final", dS_final, {B, HV, K, V}, "[B, HV, K, V]");
  checked_scale(check, scale);
  return {sz, kg};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> chunk_backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
    const at::Tensor& states_in, const at::Tensor& d_o_in, const at::Tensor& dS_final,
    double scale_d, int64_t C64, c10::string_view rule, c10::string_view gate, int64_t reads) {
  const Mechanism mech = parse_mechanism(kBackwardOp, rule, gate);
  const auto [sz, kg] = backward_sizes(mech, q_in, k_in, v_in, beta_opt, g_opt, states_in,
                                       d_o_in, dS_final, scale_d, C64, reads);
  const int64_t B = sz.B, HV = sz.HV, T = sz.T, K = sz.K, V = sz.V, P = sz.P;
  BackwardTensors t{*mech.rule, kg, static_cast<float>(scale_d), sz};
  t.q = blas_rows(q_in), t.k = blas_rows(k_in), t.v = blas_rows(v_in);
  t.d_o = blas_rows(d_o_in), t.states = states_in.contiguous();
  const at::TensorOptions options = t.states.options();  // float32
  // Each gradient in its input's dtype; dq, dk of grouped heads float32 until their group sum.
  // dq: q's T / R rows.
  const bool grouped = sz.group > 1;
  t.dq = fresh_public(sz, K, grouped ? options : t.q.options(), sz.queries());
  t.dk = fresh_public(sz, K, grouped ? options : t.k.options());
  t.dv = fresh_public(sz, V, t.v.options());
  if (t.rule.reads_beta && t.rule.input_keys == 0) {  // beta [B, HV, T]
    t.beta = *beta_opt;
    t.dbeta = at::empty({B, T, HV}, t.beta.options()).transpose(1, 2);
  } else if (t.rule.reads_beta) {  // the rule's inputs [B, HV, T, m K] ([a | b])
    t.beta = unit_rows(*beta_opt);
    t.dbeta = fresh_public(sz, t.rule.input_keys * K, t.beta.options());
  }
  if (kg > 0) {
    t.g = unit_rows(*g_opt);
    t.dg = fresh_public(sz, kg, t.g.options());
  }
  t.staged = any_staged({t.q, t.k, t.v, t.beta, t.g, t.d_o});
  t.dS = dS_final.reshape({P, K, V}).clone(at::MemoryFormat::Contiguous);
  if (split_schedule(P)) {
    backward_split(t);
  } else {
    parallel_tasks(P, [&](int64_t lo, int64_t hi) { backward_fused(t, lo, hi); });
  }
  auto none = [&] { return at::empty({0}, options); };  // one each: outputs must not alias
  return {group_sum(t.dq, sz, t.q.scalar_type()),
          group_sum(t.dk, sz, t.k.scalar_type()),
          t.dv,
          t.rule.reads_beta ? t.dbeta : none(),
          kg > 0 ? t.dg : none(),
          t.dS.view({B, HV, K, V})};
}

}  // namespace linattn_native
