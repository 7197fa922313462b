// The forward pass of the chunk form (kernels.h gives the steps; spec section 8): the terms of
// each chunk from terms.h (``chunk_gates``: G, D, Qd, Ke) and from the rule's ``Rule`` (rules.h:
// ``scores``, A_qk and the delta rule's A_kk; ``pseudo_value_terms``, the delta rule's UT
// transform, L, W, U0; ``pseudo_values``, U = U0 - W S), then the two steps
// only the forward pass takes, ``chunk_outputs`` (o = Qd S + A_qk U) and ``state_pass``
// (S <- D S + Ke^T U), on one of the two schedules of schedule.h.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "blas.h"
#include "checks.h"
#include "convert.h"
#include "gates.h"
#include "kernels.h"
#include "layout.h"
#include "products.h"
#include "schedule.h"
#include "rules/rules.h"
#include "terms.h"

namespace linattn_native {
namespace {

constexpr const char* kForwardOp = "linattn_native.chunk_forward";

// Step o: the read of the incoming state plus the masked product inside the chunk,
// o = Qd S + A_q U on the query rows alone (O [c / R, V], row stride ldo; Qd and A_q's rows
// i R + R - 1, ``query_rows``; A_q [c, n], row stride lda, over the n write rows of U: n = c, or
// the rule's stacked rows, rules.h).
void chunk_outputs(int c, int64_t R, int64_t n, int64_t K, int64_t V, const GatedRows& r,
                   const float* S, const float* A, int64_t lda, const float* U, int64_t ldu,
                   float* O, int64_t ldo) {
  const QueryRows qr = query_rows(c, R, r.ldqr), ar = query_rows(c, R, lda);
  gemm(false, false, qr.rows, V, K, r.q_alpha, r.Qread + qr.first, qr.step, S, V, 0.0f, O, ldo);
  if (R == 1) {  // A_q lower in each c-column block (its causal mask): those columns alone
    lower_times(c, c, n / c, V, 1.0f, A, lda, U, ldu, 1.0f, O, ldo);
  } else {
    gemm(false, false, ar.rows, V, n, 1.0f, A + ar.first, ar.step, U, ldu, 1.0f, O, ldo);
  }
}

// Step D and the state pass: the state leaving the chunk, S <- D * S + Ke^T U over the n write
// rows, with D = exp(G_c) on S's rows (one per channel, or one for all; nullptr without decay).
void state_pass(int64_t n, int64_t kg, int64_t K, int64_t V, const float* D, const GatedRows& r,
                const float* U, int64_t ldu, float* S) {
  const int Ki = static_cast<int>(K), Vi = static_cast<int>(V);
  if (kg > 0) {
    for (int ch = 0; ch < Ki; ++ch) {
      const float d = D[kg == 1 ? 0 : ch];
      float* row = S + ch * V;
#pragma omp simd
      for (int j = 0; j < Vi; ++j) row[j] *= d;
    }
  }
  gemm(true, false, K, V, n, 1.0f, r.Kend, r.ldke, U, ldu, 1.0f, S, V);
}

// The inputs of a chunk-form call, checked, their rows where the BLAS reads them (float32), or
// where they are converted from (bfloat16, float16: convert.h).
struct ForwardInputs {
  Sizes sz;
  const Rule& rule;
  int64_t kg;
  at::Tensor q, k, v, beta, g, u;  // u: the additive rule's bonus [HV, K] (RWKV-6), or undefined
  const float* up;  // u's numbers, or nullptr
  bool staged;  // some input is read through a thread's blocks (``any_staged``, convert.h)

  ForwardInputs(const Sizes& sizes, const Rule& update_rule, const at::Tensor& q_in,
                const at::Tensor& k_in, const at::Tensor& v_in,
                const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
                int64_t gates, const std::optional<at::Tensor>& bonus)
      : sz(sizes), rule(update_rule), kg(gates), q(blas_rows(q_in)),
        k(blas_rows(k_in)), v(blas_rows(v_in)),
        beta(!rule.reads_beta ? at::Tensor()
             : rule.input_keys > 0 ? unit_rows(*beta_opt)
                                   : *beta_opt),
        g(kg > 0 ? unit_rows(*g_opt) : at::Tensor()),
        u(bonus ? bonus->contiguous() : at::Tensor()),
        up(bonus ? u.data_ptr<float>() : nullptr),
        staged(any_staged({q, k, v, beta, g})) {}

  // The bonus of value head p's head (u's row), or nullptr without one.
  const float* bonus(int64_t p) const { return up ? up + (p % sz.HV) * sz.K : nullptr; }

  // The rows of chunk n of value head p (``input_rows``, layout.h: q's from row n C / R, the
  // chunk's c / R query rows, which ``ForwardBlocks::queries`` spreads over its write rows).
  ChunkRows rows(int64_t n, int64_t p, Staging& stage) const {
    return input_rows(sz, q, k, v, beta, g, n, p, stage);
  }

  // One thread's blocks for the converted rows: the five inputs' and the outputs' (block 5).
  Staging staging() const { return linattn_native::staging(sz, rule.input_keys, 6, staged); }

  // Ask the cache for chunk n of value head p's input rows and its output rows (layout.h).
  void prefetch(int64_t n, int64_t p, const at::Tensor& o) const {
    prefetch_inputs(sz, q, k, v, beta, g, n, p);
    if (n < sz.N && p < sz.P && !streamed_output(o, staged)) {
      const int64_t t0 = n * sz.C;
      prefetch_rows(o, p / sz.HV, p % sz.HV, t0 / sz.R, std::min(sz.C, sz.T - t0) / sz.R, true);
    }
  }
};

// One thread's blocks for the terms of one chunk (terms.h): products.h's scratch and the gates'.
struct ForwardBlocks {
  Scratch w;
  std::vector<float> Kd, eG, eEnd, D, Qx;
  int64_t R;
  Staging stage;  // the converted rows of inputs and outputs that are not float32
  ForwardBlocks(const ForwardInputs& in, int64_t kg, bool needs_Kd)
      : w(in.sz.C, in.sz.K, in.sz.V), Kd(needs_Kd && kg > 0 ? in.sz.C * in.sz.K : 0),
        eG(in.sz.C * kg), eEnd(in.sz.C * kg), D(kg),
        Qx(in.sz.R > 1 ? in.sz.C * in.sz.K : 0, 0.0f), R(in.sz.R), stage(in.staging()) {}

  // x with its queries on the write rows (R > 1): q_i at row i R + R - 1 of Qx [C, K], zeros at
  // the others (never written), so that the terms (Qd, A_q) are formed as for R = 1 and the
  // outputs read their query rows (``chunk_outputs``). R = 1: x itself. The queries are spread
  // from x's float32 rows (q's own, or ``stage``'s conversion of them).
  ChunkRows queries(ChunkRows x) {
    if (R == 1) return x;
    const int64_t K = static_cast<int64_t>(w.zeros.size());
    spread_queries(x.c, R, K, x.q, x.ldq, Qx.data());
    x.q = Qx.data(), x.ldq = K;
    return x;
  }

  // The rows of chunk n of value head p as the terms read them: converted where not float32,
  // the queries on the write rows.
  ChunkRows rows(const ForwardInputs& in, int64_t n, int64_t p) {
    return queries(in.rows(n, p, stage));
  }

  // The terms of a chunk, all in these blocks (A_kk scaled into L in place).
  Terms local() {
    return {{w.G.data(), w.G.data() + w.Qd.size()},
            w.Qd.data(),
            w.Ke.data(),
            Kd.empty() ? nullptr : Kd.data(),
            eG.data(),
            eEnd.data(),
            D.data(),
            w.A.data(),
            w.L.data(),
            w.L.data(),
            w.X.data()};
  }
};

// The terms of one chunk of value head p that do not read the state, into ``t``: the gates
// (terms.h) and the rule's own (rules.h: the scores, or with a bonus the exclusive read's and
// the bonus; the pseudo-values' terms, as the delta rule's UT transform); the rows the later
// steps read.
GatedRows chunk_terms(const ChunkRows& x, const ForwardInputs& in, int64_t p, float scale,
                      const Terms& t, Scratch& w) {
  const int64_t K = in.sz.K, V = in.sz.V, C = in.sz.C;
  const float* u = in.bonus(p);
  GatedRows r = chunk_gates(x, in.kg, K, scale, w.zeros.data(), t, u != nullptr);
  if (u) {
    bonus_scores(x, in.kg, K, scale, u, t, C, w);
  } else {
    in.rule.scores(x, in.kg, K, scale, t, C, w);
  }
  if (in.rule.pseudo_value_terms) in.rule.pseudo_value_terms(x, r, in.kg, K, V, C, t, w);
  return r;
}

// Where a chunk's pseudo-values are (rows, row stride): the values (U = V, as the additive
// rule's), or the U0 block of [W | U0], which ``advance`` turns into U in place (a rule whose U
// reads the state, as the delta rule's).
std::pair<const float*, int64_t> values_at(const ChunkRows& x, const ForwardInputs& in,
                                           const Terms& t) {
  if (!in.rule.reads_state()) return {x.v, x.ldv};
  return {t.X + in.sz.K, in.sz.K + in.sz.V};
}

// Section 8's step of one chunk, written once for both schedules: U, then O, then S. The
// pseudo-values U from the state S entering the chunk (the rule's), the outputs o = Qd S + A_qk U
// into O (nullptr: not now; the split schedule forms them in a pass of their own), and the state
// leaving the chunk, S <- D S + Ke^T U, in place of S.
void advance(const ChunkRows& x, const ForwardInputs& in, const Terms& t, const GatedRows& r,
             float* S, float* O, int64_t ldo) {
  const int64_t K = in.sz.K, V = in.sz.V, n = in.rule.writes * x.c;
  if (in.rule.reads_state()) in.rule.pseudo_values(x.c, K, V, t.X, S, t.X + K, K + V);
  const auto [U, ldu] = values_at(x, in, t);
  if (O) {
    chunk_outputs(x.c, in.sz.R, n, K, V, r, S, t.A, in.rule.writes * in.sz.C, U, ldu, O, ldo);
  }
  state_pass(n, in.kg, K, V, t.D, r, U, ldu, S);
}

// The fused schedule (schedule.h): heads [lo, hi) chunk by chunk, every step of a chunk in turn.
// The heads of a thread are taken chunk by chunk in the inner loop, so that the rows read and
// written stream through memory in order ([B, T, H, D] keeps a token's heads side by side).
void forward_fused(const ForwardInputs& in, float scale, int64_t lo, int64_t hi, float* Sp,
                   float* statep, at::Tensor& o) {
  const int64_t K = in.sz.K, V = in.sz.V, C = in.sz.C, HV = in.sz.HV, P = in.sz.P, KV = K * V;
  ForwardBlocks blocks(in, in.kg, in.rule.needs_Kd);
  const Terms t = blocks.local();
  for (int64_t n = 0; n < in.sz.N; ++n) {
    for (int64_t p = lo; p < hi; ++p) {
      in.prefetch(p + 1 < hi ? n : n + 1, p + 1 < hi ? p + 1 : lo, o);  // the next chunk's rows
      float* S = Sp + p * KV;
      if (statep) std::memcpy(statep + (n * P + p) * KV, S, sizeof(float) * KV);
      const ChunkRows x = blocks.rows(in, n, p);
      const GatedRows r = chunk_terms(x, in, p, scale, t, blocks.w);
      const int64_t b = p / HV, h = p % HV, t0 = n * C / in.sz.R;  // o's query rows
      const auto [O, ldo] = output_rows(o, b, h, t0, blocks.stage.block(5));
      advance(x, in, t, r, S, O, ldo);
      write_rows(o, b, h, t0, static_cast<int>(x.c / in.sz.R), O);
    }
  }
}

// The split schedule's buffer of every chunk's terms: slot n P + p holds chunk n of head p's
// Qd [C, K] and D [kg] (with decay), Ke [writes C, K] (with decay, or stacked rows: rules.h),
// A_q [C, writes C] and [W | U] [writes C, K + V] (a rule whose U reads the state, as the delta
// rule's: ``Rule::x_cols``), each term at a 64-byte boundary (``padded``).
struct TermSlots {
  int64_t C, K, V, kg, writes, qd_size, ke_size, d_size, a_size, x_size, size;
  at::Tensor buffer;  // [N P, size]
  TermSlots(const ForwardInputs& in)
      : C(in.sz.C), K(in.sz.K), V(in.sz.V), kg(in.kg), writes(in.rule.writes),
        qd_size(kg > 0 ? padded(C * K) : 0),
        ke_size(kg > 0 || writes > 1 ? padded(writes * C * K) : 0),
        d_size(kg > 0 ? padded(kg) : 0), a_size(padded(C * writes * C)),
        x_size(padded(writes * C * in.rule.x_cols(K, V))),
        size(qd_size + ke_size + d_size + a_size + x_size),
        buffer(fresh({in.sz.N * in.sz.P, size}, at::TensorOptions().dtype(at::kFloat))) {}

  // Slot s's terms; the rest (G, Kd, the gates' exponentials, A_kk and L) in ``blocks``.
  Terms at(int64_t s, ForwardBlocks& blocks) const {
    float* slot = buffer.data_ptr<float>() + s * size;
    Terms t = blocks.local();
    if (qd_size > 0) t.Qd = slot;
    if (ke_size > 0) t.Ke = slot + qd_size;
    if (d_size > 0) t.D = slot + qd_size + ke_size;
    slot += qd_size + ke_size + d_size;
    t.A = slot;
    if (x_size > 0) t.X = slot + a_size;
    return t;
  }

  // The rows the later steps read from a slot's terms (``chunk_gates``'s answer, without Kd).
  GatedRows rows(const ChunkRows& x, float scale, const Terms& t) const {
    const float* Ke = ke_size > 0 ? t.Ke : x.k;
    const int64_t ldke = ke_size > 0 ? K : x.ldk;
    if (kg == 0) return {x.q, x.ldq, scale, Ke, ldke, x.k, x.ldk};
    return {t.Qd, K, 1.0f, Ke, ldke, nullptr, 0};
  }
};

// The split schedule (schedule.h): 1. every chunk's terms, parallel over (chunk, head) pairs;
// 2. the state pass (U, S) per head, saving the state entering each chunk; 3. the outputs from
// the saved states, parallel over (chunk, head) pairs again.
void forward_split(const ForwardInputs& in, float scale, float* Sp, float* statep,
                   at::Tensor& o) {
  const int64_t K = in.sz.K, V = in.sz.V, C = in.sz.C, HV = in.sz.HV, P = in.sz.P, N = in.sz.N;
  const int64_t KV = K * V;
  const TermSlots slots(in);
  parallel_tasks(N * P, [&](int64_t lo, int64_t hi) {
    ForwardBlocks blocks(in, in.kg, in.rule.needs_Kd);
    for (int64_t s = lo; s < hi; ++s) {
      chunk_terms(blocks.rows(in, s / P, s % P), in, s % P, scale, slots.at(s, blocks),
                  blocks.w);
    }
  });
  parallel_tasks(P, [&](int64_t lo, int64_t hi) {
    ForwardBlocks blocks(in, 0, false);
    for (int64_t p = lo; p < hi; ++p) {
      float* S = Sp + p * KV;
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(statep + (n * P + p) * KV, S, sizeof(float) * KV);
        const ChunkRows x = in.rows(n, p, blocks.stage);
        const Terms t = slots.at(n * P + p, blocks);
        advance(x, in, t, slots.rows(x, scale, t), S, nullptr, 0);
      }
    }
  });
  parallel_tasks(N * P, [&](int64_t lo, int64_t hi) {
    ForwardBlocks blocks(in, 0, false);
    for (int64_t s = lo; s < hi; ++s) {
      const int64_t n = s / P, p = s % P;
      const ChunkRows x = blocks.rows(in, n, p);
      const Terms t = slots.at(s, blocks);
      const auto [U, ldu] = values_at(x, in, t);  // U, as the state pass left it
      const int64_t b = p / HV, h = p % HV, t0 = n * C / in.sz.R;  // o's query rows
      const auto [O, ldo] = output_rows(o, b, h, t0, blocks.stage.block(5));
      const int64_t writes = in.rule.writes;
      chunk_outputs(x.c, in.sz.R, writes * x.c, K, V, slots.rows(x, scale, t), statep + s * KV,
                    t.A, writes * C, U, ldu, O, ldo);
      write_rows(o, b, h, t0, static_cast<int>(x.c / in.sz.R), O);
    }
  });
}

}  // namespace

// The checks of a ``chunk_forward`` call: its sizes and the gate width kg.
std::pair<Sizes, int64_t> forward_sizes(const Mechanism& mech, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& beta,
                                        const std::optional<at::Tensor>& g, const at::Tensor& S0,
                                        double scale, int64_t C, int64_t reads) {
  const Checks check{kForwardOp};
  const Sizes sz(check, q, k, v, C, reads);
  const int64_t kg = check.mechanism_inputs(mech, beta, g, sz.B, sz.HV, sz.T, sz.K);
  check.shape("S0", S0, {sz.B, sz.HV, sz.K, sz.V}, "[B, HV, K, V]");
  checked_scale(check, scale);
  return {sz, kg};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> chunk_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
    const at::Tensor& S0, double scale_d, int64_t C64, bool keep, c10::string_view rule,
    c10::string_view gate, int64_t reads, const std::optional<at::Tensor>& bonus) {
  const Mechanism mech = parse_mechanism(kForwardOp, rule, gate);
  const std::pair<Sizes, int64_t> checked =
      forward_sizes(mech, q_in, k_in, v_in, beta_opt, g_opt, S0, scale_d, C64, reads);
  const Sizes& sz = checked.first;
  const int64_t kg = checked.second;
  const int64_t B = sz.B, HV = sz.HV, K = sz.K, V = sz.V, P = sz.P, N = sz.N;
  if (bonus) {  // RWKV-6's bonus, an option of the additive rule alone
    const Checks check{kForwardOp};
    TORCH_CHECK(mech.rule->takes_bonus, kForwardOp, ": bonus is not an option of the ",
                mech.rule->name, " rule");
    TORCH_CHECK(sz.R == 1, kForwardOp, ": bonus reads every row (reads = 1), got reads = ", sz.R);
    check.shape("bonus", *bonus, {HV, K}, "[HV, K]");
  }
  const float scale = static_cast<float>(scale_d);
  const ForwardInputs in(sz, *mech.rule, q_in, k_in, v_in, beta_opt, g_opt, kg, bonus);

  at::Tensor o = fresh_public(sz, V, in.v.options(), sz.queries());  // in v's dtype
  // The running states, contiguous (a clone keeps the strides of a transposed S0 otherwise).
  at::Tensor S = S0.reshape({P, K, V}).clone(at::MemoryFormat::Contiguous);
  const bool split = split_schedule(P);  // the split schedule reads the saved states
  at::Tensor states = keep || split ? fresh({N, P, K, V}, S0.options())
                                    : at::empty({0}, S0.options());
  float* Sp = S.data_ptr<float>();
  float* statep = keep || split ? states.data_ptr<float>() : nullptr;
  if (split) {
    forward_split(in, scale, Sp, statep, o);
  } else {
    parallel_tasks(P, [&](int64_t lo, int64_t hi) {
      forward_fused(in, scale, lo, hi, Sp, statep, o);
    });
  }
  if (!keep) states = at::empty({0}, S0.options());
  return {o, S.view({B, HV, K, V}), states};
}

}  // namespace linattn_native
