// torch.ops.llmk tensor-parallel ops: all_reduce_add_rmsnorm_ (a group's all-reduce, residual
// add and RMSNorm in one kernel over peer buffers; the group by its id in peer_groups.h).
// Schema and fake: python/llmk/ops/distributed.py; the public function: llmk.distributed.
#include <torch/csrc/stable/ops.h>

#include "peer_groups.h"
#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

void all_reduce_add_rmsnorm_(Tensor x, Tensor residual, Tensor weight, double eps, double offset, int64_t group) {
  const OpCall op("all_reduce_add_rmsnorm_", x);
  llmk::all_reduce_add_rmsnorm(peer_group(op.name(), group), op.view(x, "x"), op.view(residual, "residual"),
                               op.view(weight, "weight"), eps, offset, op.stream());
}

void register_distributed(torch::stable::detail::StableLibrary& m) {
  m.impl("all_reduce_add_rmsnorm_", TORCH_BOX(&all_reduce_add_rmsnorm_));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_distributed(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_distributed(m); }

}  // namespace llmk::torch_ops
