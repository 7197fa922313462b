// The extension as a Python module: the generation step bound directly (pybind11), for the eager
// fast path of ``linattn.ops.recurrent_step`` (``_native.fast_step``). A call through torch.ops
// parses each of the op's eleven arguments against its schema before the dispatcher runs it:
// 2.7 us an (empty) call, where a direct binding takes 0.9 us, on a step whose whole work can be
// a few microseconds. Everything else (torch.compile, the fake kernel, opcheck, other callers)
// goes through the registered op (ops.cpp), the same C++ function.

#include <torch/extension.h>

#include <optional>
#include <string>

#include "kernels.h"

namespace {

// ``linattn_native::recurrent_step`` (step.cpp) with Python's strings; the state updated in place
// (a Tensor is a handle: this one shares the caller's storage). The GIL is released: the step
// runs on the intra-op threads and takes no Python object.
at::Tensor recurrent_step(at::Tensor state, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const std::optional<at::Tensor>& beta,
                          const std::optional<at::Tensor>& g, double scale,
                          const std::string& rule, const std::string& gate,
                          const std::optional<at::Tensor>& source,
                          const std::optional<at::Tensor>& b) {
  return linattn_native::recurrent_step(state, q, k, v, beta, g, scale, rule, gate, source, b);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("recurrent_step", &recurrent_step, pybind11::call_guard<pybind11::gil_scoped_release>(),
        "The generation step (the op recurrent_step's CPU kernel), called directly.");
}
