// The update rules, a file each, and the one table of them (docs/design.md, "Rules are modules";
// spec
// section 8). The chunk loop (forward.cpp, backward.cpp) is written once for every rule and calls
// a rule only through its ``Rule`` below, once per chunk (never per element); what differs
// between the rules is in their files, in the spec's names:
//
//   additive.cpp  S <- S + k v^T: the scores A_qk, and the pseudo-values are the values, U = V.
//   delta.cpp     S <- S + k beta (v - S^T k)^T: the scores A_qk and A_kk, the UT transform
//                 (I + L) [W | U0] = diag(beta) [Kd | V] with L = diag(beta) A_kk, the
//                 pseudo-values U = U0 - W S, and the backward of each.
//   dplr.cpp      S <- Diag(exp g) S + a (b^T S) + k v^T (the generalized delta rule):
//                 the scores A_qk, A_qa (j <= i), A_bk, A_ba (j < i, b's gate exclusive), one
//                 unit-lower-triangular solve (I - A_ba) [W | U0] = [-Bd | A_bk V], the
//                 pseudo-values U_b = U0 - W S, stacked under V: U = [V; U_b], Ke = [Ke; Ae].
//
// Each file also defines its rule's generation step (``Rule::step``, on step.h's passes).
//
// The gate (none, one per head, one per key channel) is a parameter of every term (kg), not a rule.
// A new rule is a new file here that defines its ``Rule`` (its functions file-local), and a line
// in ``kRules`` below; the op schema's ``rule`` string is looked up there (mechanism.h), and
// nothing else names a rule. Its file name must differ from every other source's: the build names
// each object file after its source's name.
#pragma once

#include <c10/util/string_view.h>

#include <cstdint>

#include "../backward.h"
#include "../step.h"
#include "../terms.h"

namespace linattn_native {

// An update rule as the chunk loop sees it: its name and the functions that form and
// differentiate its terms of one chunk, with the flags the loop sizes its blocks from.
//
// A rule whose pseudo-values read the state (``pseudo_values`` given) forms X = [W | U0]
// [c, K + V] (row stride K + V) in ``pseudo_value_terms``, before the state is known, and then
// U = pseudo_values(X, S); the loop keeps X per chunk, reads W (X's first K columns) in the state
// gradient dS -= W^T dU, and hands the rule its own dU block. Otherwise U = V, read in place, and
// dU is dv itself.
//
// A rule that writes along more vectors than its keys (``writes`` = 2: the DPLR rule writes
// along k and a) stacks them along the chunk's token axis: its chunk has n = writes c write rows,
// Ke [n, K] = [k exp(G_c - G); a exp(G_c - G)], U [n, V] = [V; U_b] and A_q [c, n] = [A_qk |
// A_qa] (row stride writes C), so that the loop's three steps o = Qd S + A_q U, S <- D S + Ke^T U
// and their gradients stay as they are. X is then [n, K + V]: the U0 columns of the first c rows
// hold V, the last c rows (``state_row``) are [W | U0], the rows of U that read the state.
struct Rule {
  const char* name;    // the op schema's ``rule``
  bool reads_beta;     // the beta slot is an input (and dbeta an output)
  bool needs_Kd;       // the terms form Kd = k exp(G) (terms.h) for it
  int writes;          // write vectors per token: 1 (k), 2 (k and a: stacked rows)
  int64_t input_keys;  // the beta slot: 0, beta [B, HV, T]; m > 0, [B, HV, T, m K] ([a | b]: 2)
  float input_low;     // the range of the beta slot's numbers, checked by the step (every number
  float input_high;    // finite too): [0, 2] for the delta rule's beta, unbounded for [a | b]
  bool takes_bonus;    // RWKV-6's bonus u may be added to its read (the forward's ``bonus``)

  // The scores of a chunk into t: A_qk = scale decayed(q k^T) (j <= i) into t.A, and any of the
  // rule's own (the delta rule's A_kk into t.Akk), every decay formed once for all.
  void (*scores)(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t,
                 int64_t C, Scratch& w);

  // The terms of the pseudo-values that do not read the state, X = [W | U0] into t.X (r: the
  // rows Kd; a rule with writes > 1 forms its stacked Ke in t.Ke and points r.Kend at it);
  // nullptr: none.
  void (*pseudo_value_terms)(const ChunkRows& x, GatedRows& r, int64_t kg, int64_t K, int64_t V,
                             int64_t C, const Terms& t, Scratch& w);

  // The pseudo-values U [c, V] (row stride ldu) from X = [W | U0] and the state S [K, V] entering
  // the chunk; U may be X's U0 block itself (in place). nullptr: U = V.
  void (*pseudo_values)(int c, int64_t K, int64_t V, const float* X, const float* S, float* U,
                        int64_t ldu);

  // The backward of the rule's own terms (backward.cpp's step 8), after the loop's steps 4-7
  // (dU, dA of A_qk used up): the pseudo-values' and their terms' gradients into g and tg, and
  // those of its own scores. nullptr: none (U = V: dU is dv already).
  void (*backward)(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
                   const float* S, const TermGrads& tg, Scratch& w);

  // The generation step of one value head (step.h; spec section 9): its new state S [K, V] from
  // the state entering the step, h.S_in (S itself: in place), and o [V] = S^T (scale q) of the
  // new state, in column blocks, each read from memory once: decay, the rule's read and
  // correction, its write and the output.
  void (*step)(const StepHead& h, int64_t K, int64_t V, float* S, float* o);

  bool reads_state() const { return pseudo_values != nullptr; }
  // The columns of the block X the loop keeps per chunk: [W | U0], or none.
  int64_t x_cols(int64_t K, int64_t V) const { return reads_state() ? K + V : 0; }
  // The first of a chunk's (c tokens) write rows that read the state: the rows of U0 - W S.
  int64_t state_row(int64_t c) const { return (writes - 1) * c; }
};

extern const Rule kAdditiveRule;  // additive.cpp

// The additive rule's scores with a bonus u [K] (RWKV-6; additive.cpp), in place of
// ``Rule::scores`` with ``chunk_gates``'s exclusive read: A[i, j] = scale sum q_i k_j
// exp(G_{i-1} - G_j) (j < i), A[i, i] = scale sum q_i u k_i, into t.A.
void bonus_scores(const ChunkRows& x, int64_t kg, int64_t K, float scale, const float* u,
                  const Terms& t, int64_t C, Scratch& w);
extern const Rule kDeltaRule;     // delta.cpp
extern const Rule kDplrRule;      // dplr.cpp

// The table of the rules, the one place that lists them.
inline const Rule* const kRules[] = {&kAdditiveRule, &kDeltaRule, &kDplrRule};

// The rule named ``name``, or nullptr.
inline const Rule* find_rule(c10::string_view name) {
  for (const Rule* rule : kRules) {
    if (name == rule->name) return rule;
  }
  return nullptr;
}

}  // namespace linattn_native
