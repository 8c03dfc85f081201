// Gated activations of the transformer MLP: SwiGLU (Llama, Mistral, Qwen) and GeGLU
// (Gemma), forward and backward.
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

#include "llmk/tensor.h"

namespace llmk {

enum class GeluApproximation { none, tanh };

// out: [..., d]; x: [..., 2 * d], the same leading dims. out must not overlap x.
void silu_and_mul(const TensorView& out, const TensorView& x, cudaStream_t stream = nullptr);
void gelu_and_mul(const TensorView& out, const TensorView& x,
                  GeluApproximation approximate = GeluApproximation::none,
                  cudaStream_t stream = nullptr);

// out, gate, up: [..., d]. out may be gate or up itself (in place); no other overlap.
void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up,
            cudaStream_t stream = nullptr);

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

}  // namespace llmk
