// The update rules, a file each, and the one table of them (DESIGN.md: "Rules are modules"; spec
// section 8). The chunk loop (forward.cpp, backward.cpp) is written once for every rule and calls
// a rule only through its ``Rule`` below, once per chunk (never per element); what differs
// between the rules is in their files, in the spec's names:
//
//   additive.cpp  S <- S + k v^T: the scores A_qk, and the pseudo-values are the values, U = V.
//   delta.cpp     S <- S + k beta (v - S^T k)^T: the scores A_qk and A_kk, the UT transform
//                 (I + L) [W | U0] = diag(beta) [Kd | V] with L = diag(beta) A_kk, the
//                 pseudo-values U = U0 - W S, and the backward of each.
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
struct Rule {
  const char* name;  // the op schema's ``rule``
  bool reads_beta;   // beta [B, HV, T] is an input (and dbeta an output)
  bool needs_Kd;     // the terms form Kd = k exp(G) (terms.h) for it

  // The scores of a chunk into t: A_qk = scale decayed(q k^T) (j <= i) into t.A, and any of the
  // rule's own (the delta rule's A_kk into t.Akk), every decay formed once for all.
  void (*scores)(const ChunkRows& x, int64_t kg, int64_t K, float scale, const Terms& t,
                 int64_t C, Scratch& w);

  // The terms of the pseudo-values that do not read the state, X = [W | U0] into t.X (r: the
  // rows Kd); nullptr: none.
  void (*pseudo_value_terms)(const ChunkRows& x, const GatedRows& r, int64_t K, int64_t V,
                             int64_t C, const Terms& t);

  // The pseudo-values U [c, V] (row stride ldu) from X = [W | U0] and the state S [K, V] entering
  // the chunk; U may be X's U0 block itself (in place). nullptr: U = V.
  void (*pseudo_values)(int c, int64_t K, int64_t V, const float* X, const float* S, float* U,
                        int64_t ldu);

  // The backward of the rule's own terms (backward.cpp's step 8), after the loop's steps 4-7
  // (dU, dA of A_qk used up): the pseudo-values' and their terms' gradients into g and tg, and
  // those of its own scores. nullptr: none (U = V: dU is dv already).
  void (*backward)(const ChunkRows& x, const ChunkGrads& g, const Dims& d, const Recomputed& rc,
                   const float* S, const TermGrads& tg, Scratch& w);

  bool reads_state() const { return pseudo_values != nullptr; }
  // The columns of the block X the loop keeps per chunk: [W | U0], or none.
  int64_t x_cols(int64_t K, int64_t V) const { return reads_state() ? K + V : 0; }
};

extern const Rule kAdditiveRule;  // additive.cpp
extern const Rule kDeltaRule;     // delta.cpp

// The table of the rules, the one place that lists them.
inline const Rule* const kRules[] = {&kAdditiveRule, &kDeltaRule};

// The rule named ``name``, or nullptr.
inline const Rule* find_rule(c10::string_view name) {
  for (const Rule* rule : kRules) {
    if (name == rule->name) return rule;
  }
  return nullptr;
}

}  // namespace linattn_native
