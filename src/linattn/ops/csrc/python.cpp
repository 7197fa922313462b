// The extension as a Python module: the eager fast path of ``linattn.ops.recurrent_step`` bound
// directly (pybind11; ``_native.fast_step``). A call through torch.ops parses each of the op's
// eleven arguments against its schema before the dispatcher runs it, several times what a direct
// binding costs, on a step whose whole work can be a few microseconds; and
// the fast path's own tests (a graph to record? the scale and gate to infer) take
// microseconds in Python. Everything else (torch.compile, the fake kernel, opcheck, other
// callers) goes through the registered op (ops.cpp): the same step, step.cpp.

#include <torch/extension.h>

#include <cmath>
#include <optional>
#include <string>
#include <string_view>

#include "kernels.h"

namespace {

// The fast path of ``linattn.ops.recurrent_step`` (``step.fused_step``) in one call: None where it
// does not apply, so that the caller takes its checked path (a graph to record: grad mode on and
// a tensor that requires grad; an empty state), else the step (``linattn_native::recurrent_step``,
// step.cpp, which checks every shape, dtype and small input's value first). ``scale`` None:
// 1 / sqrt(K); ``rule``: the rule's name, resolved by the caller; ``gate`` None: from g, "head"
// for [B, H], "channel" for [B, H, K]; ``out``: the state's new value written there, ``state``
// kept. The GIL is released: the step runs on the intra-op threads and takes no Python object.
std::optional<at::Tensor> fast_step(at::Tensor state, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, const std::optional<at::Tensor>& beta,
                                    const std::optional<at::Tensor>& g,
                                    std::optional<double> scale, std::string_view rule,
                                    std::optional<std::string> gate,
                                    std::optional<at::Tensor> out,
                                    const std::optional<at::Tensor>& b) {
  if (at::GradMode::is_enabled()) {
    const auto graph = [](const std::optional<at::Tensor>& x) {
      return x.has_value() && x->defined() && x->requires_grad();
    };
    if (state.requires_grad() || q.requires_grad() || k.requires_grad() || v.requires_grad() ||
        graph(beta) || graph(g) || graph(out) || graph(b)) {
      return std::nullopt;
    }
  }
  if (state.numel() == 0) return std::nullopt;  // the checked path's rules for B, H, K or V = 0
  TORCH_CHECK(state.dim() == 4, "state must be [B, H, K, V]");  // the checked path names it
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(state.size(2)));
  if (!gate) gate = !g.has_value() ? "none" : g->dim() == 2 ? "head" : "channel";
  std::optional<at::Tensor> source;
  if (out.has_value()) {  // the step from state into out
    source = state;
    state = *out;
  }
  return linattn_native::recurrent_step(state, q, k, v, beta, g, s,
                                        c10::string_view(rule.data(), rule.size()), *gate,
                                        source, b);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fast_step", &fast_step, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "recurrent_step's fast path: None where it does not apply, else the step.");
}
