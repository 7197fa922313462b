// The kernels registered with torch.library as the ops ``torch.ops.linattn_native.*``: a schema
// each, the CPU kernel, and a Meta kernel (the same checks, the outputs' shapes and strides), so
// that fake tensors (torch.compile, torch.export, opcheck) can run them without data. Their
// autograd is registered in Python (``linattn.ops.library``), which wraps the chunk form's two
// kernels in one op with its backward.

#include <torch/library.h>

#include "block_cache.h"
#include "kernels.h"
#include "schedule.h"

namespace linattn_native {

TORCH_LIBRARY(linattn_native, m) {
  m.def(
      "chunk_forward(Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g, Tensor S0, float scale,"
      " int C, bool keep) -> (Tensor, Tensor, Tensor)");
  m.def(
      "chunk_backward(Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g, Tensor states,"
      " Tensor d_o, Tensor dS_final, float scale, int C)"
      " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "recurrent_step(Tensor(a!) state, Tensor q, Tensor k, Tensor v, Tensor? beta, Tensor? g,"
      " float scale) -> Tensor");
  m.def("empty_huge(int[] sizes, ScalarType dtype) -> Tensor", &empty_huge);
  m.def("cache_release() -> int", &cache_release);
  m.def("cache_bytes() -> int", &cache_bytes);
  m.def("threads_used(int n) -> int", &threads_used);
}

TORCH_LIBRARY_IMPL(linattn_native, CPU, m) {
  m.impl("chunk_forward", &chunk_forward);
  m.impl("chunk_backward", &chunk_backward);
  m.impl("recurrent_step", &recurrent_step);
}

TORCH_LIBRARY_IMPL(linattn_native, Meta, m) {
  m.impl("chunk_forward", &chunk_forward_meta);
  m.impl("chunk_backward", &chunk_backward_meta);
  m.impl("recurrent_step", &recurrent_step_meta);
}

}  // namespace linattn_native
