// Which row of the mechanism table (docs/design.md) a chunk-form call runs: the update rule and
// the gate, passed in
// the ops' schema (``str rule, str gate``, as ``linattn.ops.mechanism.Mechanism`` resolved them at
// the public op) and parsed once at the entry point. Nothing below reads the mechanism from the
// tensors: whether beta and g are given, and g's width, are checked against it instead.
//
// Strings rather than integers: a traced graph and an error message then read as the table does
// ("delta", "channel"), and a new rule is a new name in rules.h's table, not a renumbering.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <string>

#include "rules/rules.h"

namespace linattn_native {

// The gate on the state: none, one log-decay per head, or one per key channel.
enum class Gate { kNone, kHead, kChannel };

// The update rule (one of rules.h's ``rule_table()``) and the gate.
struct Mechanism {
  const Rule* rule;
  Gate gate;

  bool gated() const { return gate != Gate::kNone; }

  // The log-gates per token the kernels read: 0 (no gate), 1 (one per head) or K (one per key
  // channel; a per-channel gate of K = 1 is one number per token, as a per-head gate).
  int64_t gate_width(int64_t K) const {
    return gate == Gate::kNone ? 0 : gate == Gate::kHead ? 1 : K;
  }
};

// The mechanism named by an op's ``rule`` and ``gate`` arguments; ``op`` names the op in errors.
inline Mechanism parse_mechanism(const char* op, c10::string_view rule, c10::string_view gate) {
  Mechanism m{find_rule(rule), Gate::kNone};
  if (!m.rule) {
    std::string names;  // the table's: "additive", "delta"
    for (const Rule* r : rule_table()) {
      names += std::string(names.empty() ? "\"" : ", \"") + r->name + "\"";
    }
    TORCH_CHECK(false, op, ": rule must be one of ", names, ", got \"", rule, "\"");
  }
  if (gate == "head") {
    m.gate = Gate::kHead;
  } else if (gate == "channel") {
    m.gate = Gate::kChannel;
  } else {
    TORCH_CHECK(gate == "none", op, ": gate must be \"none\", \"head\" or \"channel\", got \"",
                gate, "\"");
  }
  return m;
}

}  // namespace linattn_native
