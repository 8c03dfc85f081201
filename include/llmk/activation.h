// Activations of the transformer MLP, forward and backward: the gated SwiGLU (Llama,
// Mistral, Qwen) and GeGLU (Gemma), and bias + GELU (GPT-2, BERT, Falcon).
//
// Two input forms. The fused form takes the output of one gate-and-up projection,
// x = [..., 2 * d] with the gate in x[..., :d] and the up projection in x[..., d:] (the
// layout of vLLM's and FlashInfer's silu_and_mul); the two-tensor form takes gate and up
// as separate [..., d] tensors. Either way
//   out = act(gate) * up        act = silu(g) = g * sigmoid(g), or gelu(g)
// in fp32 math with one rounding to the dtype (f32, f16, bf16; every tensor of a call has
// the same dtype). The leading dims flatten into rows, which may be strided; the last dim
// is contiguous. GELU is the exact erf form (GeluApproximation::none) or the tanh form
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) of GPT-2 and Gemma.
//
// Backward, with dy = dL/dout: dgate = dy * up * act'(gate), dup = dy * act(gate).
// Tensors on the GPU run there (on `stream`); host tensors run the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "llmk/tensor.h"

namespace llmk {

enum class GeluApproximation { none, tanh };

// out: [..., d]; x: [..., 2 * d], the same leading dims. out must not overlap x.
void silu_and_mul(const TensorView& out, const TensorView& x, cudaStream_t stream = nullptr);
void gelu_and_mul(const TensorView& out, const TensorView& x,
                  GeluApproximation approximate = GeluApproximation::none,
                  cudaStream_t stream = nullptr);

// out, gate, up: [..., d]. out may be gate or up itself (in place); no other overlap.
// swiglu: silu(gate) * up (Llama); geglu: gelu(gate, approximate) * up (Gemma, tanh).
void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up,
            cudaStream_t stream = nullptr);
void geglu(const TensorView& out, const TensorView& gate, const TensorView& up,
           GeluApproximation approximate = GeluApproximation::none, cudaStream_t stream = nullptr);

// dx: [..., 2 * d] receives (dgate, dup) in the layout of x; dy: [..., d]. dx may be x
// itself (the gradient overwrites the saved input); dy must overlap neither.
void silu_and_mul_backward(const TensorView& dx, const TensorView& dy, const TensorView& x,
                           cudaStream_t stream = nullptr);
void gelu_and_mul_backward(const TensorView& dx, const TensorView& dy, const TensorView& x,
                           GeluApproximation approximate = GeluApproximation::none,
                           cudaStream_t stream = nullptr);

// dgate, dup, dy, gate, up: [..., d]. dgate may be gate and dup may be up (in place).
void swiglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dy,
                     const TensorView& gate, const TensorView& up, cudaStream_t stream = nullptr);
void geglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dy,
                    const TensorView& gate, const TensorView& up,
                    GeluApproximation approximate = GeluApproximation::none,
                    cudaStream_t stream = nullptr);

// Bias + GELU of the GPT-2 / BERT / Falcon MLP: out = gelu(x + bias), x: [..., d], bias:
// [d] of x's dtype; fp32 math, one rounding. out may be x itself (in place).
void bias_gelu(const TensorView& out, const TensorView& x, const TensorView& bias,
               GeluApproximation approximate = GeluApproximation::none,
               cudaStream_t stream = nullptr);

// Backward: dx = dy * gelu'(x + bias) and dbias = sum over rows of dx, in fp32, added in an
// order fixed by the shape, dtype, alignment and device: repeated calls give the same bits.
// One kernel launch; `workspace` is a CUDA f32 buffer (16-byte aligned) of at least
// bias_gelu_backward_workspace_size(rows, d, device) elements, required on the GPU and
// ignored on the CPU. Its contents on entry do not matter: where the rows are split over
// several blocks per column (hundreds of rows or more, unless d alone fills the GPU), the
// call keeps partial sums and arrival counters there, zeroing the counters first with a
// cudaMemsetAsync on `stream` (captured with the kernel in a CUDA graph), so a workspace
// serves one call at a time; elsewhere the size is 0. dx may be x or dy itself.
void bias_gelu_backward(const TensorView& dx, const TensorView& dbias, const TensorView& dy,
                        const TensorView& x, const TensorView& bias,
                        GeluApproximation approximate = GeluApproximation::none,
                        const std::optional<TensorView>& workspace = std::nullopt,
                        cudaStream_t stream = nullptr);
int64_t bias_gelu_backward_workspace_size(int64_t rows, int64_t d, int device_index = 0);

}  // namespace llmk
