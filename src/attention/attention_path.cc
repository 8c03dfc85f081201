// The attention family's path choice: LLMK_ATTENTION_PATH and whether a call runs the Hopper
// kernels (attention_runs_sm90, asked by the forward below and by the backward's launcher,
// sm80/backward.cu), and the forward's dispatch to the Hopper kernel (sm90/forward.cu) or the
// sm_80 one (sm80/forward.cu).
#include "attention/attention_params.h"
#include "common/cuda_check.h"
#include "common/env_path.h"

namespace llmk::detail {

bool attention_runs_sm90(const char* op, const std::function<bool(int device, const char** why)>& takes) {
  enum Path { automatic, sm80, sm90 };
  const int path = env_path(op, "LLMK_ATTENTION_PATH", {"auto", "sm80", "sm90"});
  if (path == sm80) return false;
  int device = 0;
  LLMK_CUDA_CHECK(cudaGetDevice(&device));
  const char* why = "";
  const bool hopper = takes(device, &why);
  LLMK_CHECK(hopper || path == automatic, op, ": LLMK_ATTENTION_PATH=sm90 cannot take this call: ", why);
  return hopper;
}

void attention_forward_cuda(const AttentionParams& p, DType dtype, cudaStream_t stream) {
  if (attention_runs_sm90("attention", [&](int device, const char** why) {
        return attention_sm90_takes(p, dtype, device, why);
      }))
    return attention_forward_sm90(p, dtype, stream);
  // The score variants are compiled into the Hopper forward only (in the sm_80 kernel their
  // mask cost 40-60 bytes of spills at head dims 64 and 128); the call writes nothing.
  LLMK_CHECK(!p.variants.any(), "attention: window, softcap and sinks run on the Hopper forward (an sm_90 GPU, "
             "an sm_90a build, head dims 64-256) and on the CPU backend; this call would run the sm_80 kernel");
  attention_forward_sm80(p, dtype, stream);
}

}  // namespace llmk::detail
