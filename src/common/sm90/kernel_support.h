// Whether an sm_90a kernel of this build runs on a device: an sm_90 GPU, and machine code
// for it in the binary (a build without 90a in LLMK_CUDA_ARCHS has none). Remembered per
// (kernel, device), so the Hopper paths' dispatch pays for the queries once.
#pragma once

namespace llmk::detail::sm90 {

bool sm90a_kernel_runs(const void* kernel, int device);

}  // namespace llmk::detail::sm90
