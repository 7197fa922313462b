// The chunk form fused chunk by chunk on the CPU (spec sections 5.1 and 8; docs/design.md,
// "Backends").
//
// The same algebra as the PyTorch chunk loop ``chunk`` (its module docstring gives the equations),
// computed chunk by chunk with every block of a chunk in the cache: for each chunk of c <= C tokens
// of a head with incoming state S [K, V] and cumulative log-gates G_i = g_1 + ... + g_i,
//
//   1. gates:      Qd = scale q * exp(G),  Ke = k * exp(G_c - G),  D = exp(G_c)
//   2. masked:     A_qk[i, j] = scale sum_k q_ik k_jk exp(G_ik - G_jk)  (j <= i)
//   3. delta rule: L[i, j] = beta_i sum_k k_ik k_jk exp(G_ik - G_jk)  (j < i),
//                  (I + L) [W, U0] = diag(beta) [k * exp(G), v]   (the UT transform)
//                  U = U0 - W S                                  (linear attention: U = v)
//      dplr rule:  (I - A_ba) [W, U0] = [-b * exp(G_{i-1}), A_bk v]  (A_b*: b's gate exclusive),
//                  U = [v; U0 - W S], Ke = [k; a] * exp(G_c - G), A_qk = [A_qk | A_qa]
//                  (its writes along k and a stacked: 2 c rows; rules/dplr.cpp)
//   4. outputs:    o = Qd S + A_qk U
//   5. state:      S <- D * S + Ke^T U
//
// Only step 5 carries anything from one chunk to the next: steps 1-3 are parallel across chunks
// too (schedule.h). In the fused schedule the heads of a thread are taken chunk by chunk in the
// inner loop, so that the rows read and written (the [B, T, H, D] layout keeps the H heads of a
// token side by side) stream through memory in order. Every product is one call of
// the BLAS that PyTorch links (MKL or OpenBLAS), on matrices of 64 x 64 or so that stay in the L1
// and L2 caches; the elementwise work (gates, masks) is in plain loops the compiler vectorises.
//
// ``chunk_forward`` (forward.cpp) runs these steps for every mechanism and saves the state
// entering each chunk; ``chunk_backward`` (backward.cpp) differentiates them for every mechanism,
// chunk by chunk from the last, each chunk recomputed from its saved state (memory linear in T).
//
// Inputs are float32, bfloat16 or float16 (each in its own; a chunk's rows of the last two are
// converted into float32 blocks as the chunk is reached, and o and the gradients written in their
// input's dtype from blocks: convert.h; states, gates and all arithmetic are float32),
// q, k [B, H, T, K], v [B, HV, T, V], beta [B, HV, T], g [B, HV, T, 1 | K]
// (grouped value heads: HV = group H, value head j reads q/k head j / group in place; the backward
// writes dq, dk per value head and sums each group at the end; group = 1 the plain case), each
// with unit stride in its last dimension (any strides elsewhere: the [B, T, H, D] tensors of the
// public ops are read in place). Every log-gate is <= 0 and every input finite (the public ops
// check), but a log-gate may be -inf (a reset): each is floored at kGateFloor, and the cumulative
// log-gates are summed exactly as pairs of floats (``Gates``), so that every decay
// exp(G_i - G_j) has float32's accuracy whatever the gates (resets, steep gates).
//
// reads = R > 1 (DeltaProduct: n_h writes per token, one read): q and o have one row per R write
// rows, read after the last of them; each chunk's queries are spread over its write rows
// (zeros between; from the chunk's float32 rows, after a bfloat16 or float16 q's conversion) so
// that steps 1-3 and 5 run as for R = 1, and step 4 forms the query rows' outputs only
// (``Sizes``, checks.h; ``query_rows``, layout.h).
//
// The mechanism (the rule and the gate) is passed in the ops' schema and parsed once
// (mechanism.h: the rule's name looked up in rules.h's table); nothing reads it from the tensors'
// shapes. The loop calls the rule through its table entry (``Rule``), once per chunk, and names
// no rule.
//
// The files: forward (the chunk loop: steps 1-5, U then O then S written once for both
// schedules), backward (its gradient, a free function per step; backward.h its terms), rules/ (a
// file per update rule: additive.cpp, delta.cpp, dplr.cpp, their scores, UT transform or solve,
// pseudo-values and the backward of those, each file defining its ``Rule``; rules.h the table of
// them and what a new rule adds), terms (step 1, the gates, the one place
// both passes form them), products (the masked decayed products A_qk and A_kk, one halving
// recursion for the per-channel blocks), gates (cumulative log-gates as pairs, exp, the floor),
// triangular (the UT transform's solves, by substitution), blas (the BLAS wrappers), schedule
// (how the work is spread over the threads: fused per head, or split into (chunk, head) pairs),
// block_cache (the output allocator), mechanism, checks and layout (the entry's mechanism and
// checks, where a chunk's rows are), convert (bfloat16 and float16 rows to and from float32),
// tuning.h (the machine-tuned constants, from linattn/ops/tuning.py), step (the generation step),
// conv (the layers' short convolution), logsumexp (LightNet's gate) and ops.cpp (the
// torch.library registration).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace linattn_native {

// o [B, HV, T, V] (a view of a [B, T, HV, V] tensor), the final state [B, HV, K, V], and (keep) the
// state entering every chunk [N, B HV, K, V] for the backward pass (else an empty tensor).
// reads = R > 1: q [B, H, T / R, K] and o [B, HV, T / R, V], query i read after write row
// i R + R - 1 (DeltaProduct: n_h writes per token, one read; ``Sizes``, checks.h), the outputs of
// the other rows never formed.
// bonus [HV, K] (the additive rule only, reads = 1): RWKV-6's read, o_t = S_{t-1}^T (scale q_t)
// + scale (q_t^T Diag(u) k_t) v_t (rules/additive.cpp), the states as without it.
std::tuple<at::Tensor, at::Tensor, at::Tensor> chunk_forward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
    const at::Tensor& S0, double scale_d, int64_t C64, bool keep, c10::string_view rule,
    c10::string_view gate, int64_t reads, const std::optional<at::Tensor>& bonus);

// dq, dk [B, H, T, K], dv [B, HV, T, V], dbeta [B, HV, T] (empty for the additive rule), dg
// [B, HV, T, kg] (empty without decay) and dS0 [B, HV, K, V], from the states ``chunk_forward``
// kept; reads = R > 1: d_o [B, HV, T / R, V] and dq [B, H, T / R, K] (as ``chunk_forward``).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> chunk_backward(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const std::optional<at::Tensor>& beta_opt, const std::optional<at::Tensor>& g_opt,
    const at::Tensor& states_in, const at::Tensor& d_o_in, const at::Tensor& dS_final,
    double scale_d, int64_t C64, c10::string_view rule, c10::string_view gate, int64_t reads);

// One generation step of the mechanism (rule, gate), the state [B, HV, K, V] updated in place, or
// written from ``source`` where given (q, k [B, H, K], HV = G H): o [B, HV, V], or an empty
// tensor when a value is out of range (an input: the state unchanged; the state: found by the
// step, step.cpp). The dplr rule's inputs: [a | b] [B, HV, 2K] in beta's slot, or a [B, HV, K]
// there and ``b`` [B, HV, K] apart (no concatenation per call).
at::Tensor recurrent_step(at::Tensor& state, const at::Tensor& q_in, const at::Tensor& k_in,
                          const at::Tensor& v_in, const std::optional<at::Tensor>& beta_opt,
                          const std::optional<at::Tensor>& g_opt, double scale_d,
                          c10::string_view rule, c10::string_view gate,
                          const std::optional<at::Tensor>& source,
                          const std::optional<at::Tensor>& b);

// The fake (meta) kernel of the step: the same checks and the output's shape, no data (the
// chunk ops' fake kernels are ``linattn.ops.library``'s, registered on the op that is traced).
at::Tensor recurrent_step_meta(at::Tensor& state, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& beta,
                               const std::optional<at::Tensor>& g, double scale,
                               c10::string_view rule, c10::string_view gate,
                               const std::optional<at::Tensor>& source,
                               const std::optional<at::Tensor>& b);

// The short causal depthwise convolution, channels last (conv.cpp): x [B, T, C] (unit stride
// over C), weight [C, W], bias [C] or None, state [B, C, S >= W - 1] or None (zeros), then SiLU
// (``silu``); y [B, T, C]. The backward returns dx, dw, dbias (empty without bias) and dstate
// (empty without state).
at::Tensor short_conv_forward(const at::Tensor& x, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& state, bool silu);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> short_conv_backward(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& state, bool silu);
at::Tensor short_conv_forward_meta(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias,
                                   const std::optional<at::Tensor>& state, bool silu);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> short_conv_backward_meta(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& state, bool silu);

// Preconditioned DeltaNet's curvature scan and preconditioned keys (atk.cpp): kp [B, T, H, K],
// A_T [B, H, K] and, with keep, every A_t [B, T, H, K] (else empty) for the backward; the
// backward's (dk, dg, dbeta, dA0, dcenter).
std::tuple<at::Tensor, at::Tensor, at::Tensor> atk_forward(const at::Tensor& k,
                                                           const at::Tensor& g,
                                                           const at::Tensor& beta,
                                                           const at::Tensor& A0,
                                                           const at::Tensor& center,
                                                           double log_x, double eps, bool keep);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> atk_backward(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, const at::Tensor& A_all, const at::Tensor& dkp,
    const at::Tensor& dA_end, double log_x, double eps);
// LightNet's gate (logsumexp.cpp): from key logits x [B, T, D] (contiguous) and the initial
// log-normaliser z0 [B, D] or None (-inf), the keys k, log-decays g [B, T, D] and the last z
// [B, D]. The backward takes k, g, their gradients (None: zeros), dz_last and ``first_constant``
// [B, D] (bool: g_0 is the constant 0 there, no prior mass), and returns dx and the gradient
// of z0 (where z0 was finite).
std::tuple<at::Tensor, at::Tensor, at::Tensor> logsumexp_gate_forward(
    const at::Tensor& x, const std::optional<at::Tensor>& z0);
std::tuple<at::Tensor, at::Tensor> logsumexp_gate_backward(
    const at::Tensor& k, const at::Tensor& g, const std::optional<at::Tensor>& dk,
    const std::optional<at::Tensor>& dg, const std::optional<at::Tensor>& dz_last,
    const at::Tensor& first_constant);

// TTT-Linear's dual form (ttt.cpp): q, k, v [B, T, H, D] (unit stride along D), eta [B, T, H],
// the layer norm's w, b [H, D], the state W0 [B, H, D, D], h0 [B, H, D]; mini-batches of ``size``
// tokens. The forward returns o [B, T, H, D], and with ``keep`` z (o's input to its layer norm)
// and the state entering every ``every``-th mini-batch [B, H, n / every, D, D] and
// [B, H, n / every, D] (else empty), and the final state. The backward returns dq, dk, dv, deta
// [B, T, H], dw, db, dW0 and dh0 from them, the states between the saved ones recomputed.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ttt_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& eta,
    const at::Tensor& w, const at::Tensor& bias, const at::Tensor& W0, const at::Tensor& h0,
    double scale, double eps, int64_t size, int64_t every, bool keep);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
ttt_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& eta,
             const at::Tensor& w, const at::Tensor& bias, const at::Tensor& Ws,
             const at::Tensor& hs, const at::Tensor& z, const at::Tensor& d_o,
             const std::optional<at::Tensor>& dW, const std::optional<at::Tensor>& dh,
             double scale, double eps, int64_t size, int64_t every);

// Titans' chunk form (ttt.cpp), in TTT-Linear's layouts: theta, alpha, eta [B, T, H], the
// memory and momentum M0, S0 [B, H, D, D], chunks of ``size`` tokens; with ``keep`` z and the
// memories entering every ``every``-th chunk [B, H, n / every, D, D]. The backward returns dq,
// dk, dv, dtheta, dalpha, deta, dw, db, dM0 and dS0.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> titans_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& theta,
    const at::Tensor& alpha, const at::Tensor& eta, const at::Tensor& w, const at::Tensor& bias,
    const at::Tensor& M0, const at::Tensor& S0, double eps, int64_t size, int64_t every,
    bool keep);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor, at::Tensor, at::Tensor>
titans_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& theta, const at::Tensor& alpha, const at::Tensor& eta,
                const at::Tensor& w, const at::Tensor& bias, const at::Tensor& Ms,
                const at::Tensor& Ss, const at::Tensor& z, const at::Tensor& d_o,
                const std::optional<at::Tensor>& dM, const std::optional<at::Tensor>& dS,
                double eps, int64_t size, int64_t every);

}  // namespace linattn_native

namespace linattn_native {

// Preconditioned DeltaNet's write keys (atk.cpp): ``atk_forward`` with the write strengths
// ``strength`` [B, T, HV] (HV = G H) applied, w [B, T, HV, K] = strength kp (value head h G + j
// on key head h) in place of kp; the backward takes dw and dr (None, or [B, T, H, K]: k's
// gradient from elsewhere, added into dk) and returns (dk, dg, dbeta, dA0, dcenter, dstrength).
std::tuple<at::Tensor, at::Tensor, at::Tensor> atk_write_forward(
    const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta, const at::Tensor& A0,
    const at::Tensor& center, const at::Tensor& strength, double log_x, double eps, bool keep);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
atk_write_backward(const at::Tensor& k, const at::Tensor& g, const at::Tensor& beta,
                   const at::Tensor& A0, const at::Tensor& center, const at::Tensor& strength,
                   const at::Tensor& A_all, const at::Tensor& dw, const at::Tensor& dA_end,
                   const std::optional<at::Tensor>& dr, double log_x, double eps);

}  // namespace linattn_native
