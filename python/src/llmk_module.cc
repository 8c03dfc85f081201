// llmk._C: the nanobind bridge from DLPack arrays (torch tensors) to the C++ API. Each op
// takes its tensors, scalars and the caller's CUDA stream (an integer handle, 0 for the
// legacy default stream), and releases the GIL while it runs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "llmk/llmk.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using AnyArray = nb::ndarray<>;

llmk::DType to_dtype(nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == static_cast<uint8_t>(Code::Float) && dt.bits == 32) return llmk::DType::f32;
    if (dt.code == static_cast<uint8_t>(Code::Float) && dt.bits == 16) return llmk::DType::f16;
    if (dt.code == static_cast<uint8_t>(Code::Bfloat) && dt.bits == 16) return llmk::DType::bf16;
    if (dt.code == static_cast<uint8_t>(Code::Int) && dt.bits == 32) return llmk::DType::i32;
    if (dt.code == static_cast<uint8_t>(Code::Int) && dt.bits == 64) return llmk::DType::i64;
  }
  llmk::detail::throw_error("unsupported dtype (DLPack code ", int(dt.code), ", ", int(dt.bits),
                            " bits); llmk takes float32, float16, bfloat16 and int32/int64 indices");
}

llmk::TensorView view(const AnyArray& a) {
  LLMK_CHECK(a.device_type() == nb::device::cpu::value || a.device_type() == nb::device::cuda::value,
             "llmk takes CPU or CUDA tensors, got DLPack device type ", a.device_type());
  LLMK_CHECK(a.ndim() <= llmk::TensorView::kMaxDims, "at most ", llmk::TensorView::kMaxDims,
             " dims are supported, got ", a.ndim());
  int64_t shape[llmk::TensorView::kMaxDims], strides[llmk::TensorView::kMaxDims];
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  const llmk::Device device{a.device_type() == nb::device::cuda::value ? llmk::DeviceType::cuda
                                                                      : llmk::DeviceType::cpu,
                            static_cast<int32_t>(a.device_id())};
  return llmk::TensorView(a.data(), to_dtype(a.dtype()), device, static_cast<int>(a.ndim()),
                          shape, strides);
}

std::optional<llmk::TensorView> view(const std::optional<AnyArray>& a) {
  if (!a) return std::nullopt;
  return view(*a);
}

llmk::GeluApproximation gelu_approximation(const std::string& name) {
  if (name == "none") return llmk::GeluApproximation::none;
  if (name == "tanh") return llmk::GeluApproximation::tanh;
  llmk::detail::throw_error("approximate must be 'none' or 'tanh', got '", name, "'");
}

llmk::RopeStyle rope_style(const std::string& name) {
  if (name == "neox") return llmk::RopeStyle::neox;
  if (name == "gptj") return llmk::RopeStyle::gptj;
  llmk::detail::throw_error("rope style must be 'neox' or 'gptj', got '", name, "'");
}

// [factor, low_freq_factor, high_freq_factor, original_max_position], or none.
std::optional<llmk::Llama3RopeScaling> llama3_scaling(const std::optional<std::vector<double>>& v) {
  if (!v) return std::nullopt;
  LLMK_CHECK(v->size() == 4, "llama3 scaling takes 4 values (factor, low_freq_factor, "
             "high_freq_factor, original_max_position), got ", v->size());
  return llmk::Llama3RopeScaling{(*v)[0], (*v)[1], (*v)[2], (*v)[3]};
}

cudaStream_t stream_of(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

// Converts the arguments with the GIL held, then runs `fn` without it.
template <class F>
void without_gil(F&& fn) {
  nb::gil_scoped_release release;
  fn();
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "llmk: fused GPU kernels for transformer language models (C++ bridge)";

  // Rejected arguments raise ValueError; CUDA runtime failures raise RuntimeError.
  nb::exception<llmk::Error>(m, "LlmkError", PyExc_ValueError);
  nb::exception<llmk::CudaError>(m, "CudaError", PyExc_RuntimeError);

  m.def(
      "rmsnorm",
      [](AnyArray out, AnyArray x, AnyArray weight, double eps, double offset,
         std::optional<AnyArray> rstd, uintptr_t stream) {
        auto o = view(out), xv = view(x), w = view(weight);
        auto r = view(rstd);
        without_gil([&] { llmk::rmsnorm(o, xv, w, eps, offset, r, stream_of(stream)); });
      },
      "out"_a, "x"_a, "weight"_a, "eps"_a, "offset"_a = 0.0, "rstd"_a = nb::none(),
      "stream"_a = 0);

  m.def(
      "add_rmsnorm",
      [](AnyArray out, AnyArray residual_out, AnyArray x, AnyArray residual, AnyArray weight,
         double eps, double offset, uintptr_t stream) {
        auto o = view(out), ro = view(residual_out), xv = view(x), r = view(residual),
             w = view(weight);
        without_gil([&] { llmk::add_rmsnorm(o, ro, xv, r, w, eps, offset, stream_of(stream)); });
      },
      "out"_a, "residual_out"_a, "x"_a, "residual"_a, "weight"_a, "eps"_a, "offset"_a = 0.0,
      "stream"_a = 0);

  m.def(
      "rmsnorm_backward",
      [](AnyArray dx, AnyArray dweight, AnyArray dy, AnyArray x, AnyArray weight, double eps,
         double offset, std::optional<AnyArray> dresidual, std::optional<AnyArray> workspace,
         uintptr_t stream) {
        auto dxv = view(dx), dw = view(dweight), dyv = view(dy), xv = view(x), w = view(weight);
        auto dr = view(dresidual), ws = view(workspace);
        without_gil([&] {
          llmk::rmsnorm_backward(dxv, dw, dyv, xv, w, eps, offset, dr, ws, stream_of(stream));
        });
      },
      "dx"_a, "dweight"_a, "dy"_a, "x"_a, "weight"_a, "eps"_a, "offset"_a = 0.0,
      "dresidual"_a = nb::none(), "workspace"_a = nb::none(), "stream"_a = 0);

  m.def(
      "rmsnorm_swiglu",
      [](AnyArray out, AnyArray x, AnyArray gate, AnyArray weight, double eps, double offset,
         uintptr_t stream) {
        auto o = view(out), xv = view(x), g = view(gate), w = view(weight);
        without_gil([&] {
          llmk::rmsnorm_swiglu(o, xv, g, w, eps, offset, std::nullopt, stream_of(stream));
        });
      },
      "out"_a, "x"_a, "gate"_a, "weight"_a, "eps"_a, "offset"_a = 0.0, "stream"_a = 0);

  m.def(
      "rmsnorm_swiglu_backward",
      [](AnyArray dx, AnyArray dgate, AnyArray dweight, AnyArray dy, AnyArray x, AnyArray gate,
         AnyArray weight, double eps, double offset, std::optional<AnyArray> workspace,
         uintptr_t stream) {
        auto dxv = view(dx), dg = view(dgate), dw = view(dweight), dyv = view(dy), xv = view(x),
             g = view(gate), w = view(weight);
        auto ws = view(workspace);
        without_gil([&] {
          llmk::rmsnorm_swiglu_backward(dxv, dg, dw, dyv, xv, g, w, eps, offset, ws,
                                        stream_of(stream));
        });
      },
      "dx"_a, "dgate"_a, "dweight"_a, "dy"_a, "x"_a, "gate"_a, "weight"_a, "eps"_a,
      "offset"_a = 0.0, "workspace"_a = nb::none(), "stream"_a = 0);

  m.def("rmsnorm_backward_workspace_size", &llmk::rmsnorm_backward_workspace_size, "rows"_a,
        "d"_a, "device_index"_a = 0);

  m.def(
      "layernorm",
      [](AnyArray out, AnyArray x, std::optional<AnyArray> weight, std::optional<AnyArray> bias,
         double eps, std::optional<AnyArray> mean, std::optional<AnyArray> rstd, uintptr_t stream) {
        auto o = view(out), xv = view(x);
        auto w = view(weight), b = view(bias), mv = view(mean), rv = view(rstd);
        without_gil([&] { llmk::layernorm(o, xv, w, b, eps, mv, rv, stream_of(stream)); });
      },
      "out"_a, "x"_a, "weight"_a = nb::none(), "bias"_a = nb::none(), "eps"_a = 1e-5,
      "mean"_a = nb::none(), "rstd"_a = nb::none(), "stream"_a = 0);

  m.def(
      "layernorm_backward",
      [](AnyArray dx, std::optional<AnyArray> dweight, std::optional<AnyArray> dbias, AnyArray dy,
         AnyArray x, std::optional<AnyArray> weight, double eps, std::optional<AnyArray> workspace,
         uintptr_t stream) {
        auto dxv = view(dx), dyv = view(dy), xv = view(x);
        auto dw = view(dweight), db = view(dbias), w = view(weight), ws = view(workspace);
        without_gil([&] {
          llmk::layernorm_backward(dxv, dw, db, dyv, xv, w, eps, ws, stream_of(stream));
        });
      },
      "dx"_a, "dweight"_a, "dbias"_a, "dy"_a, "x"_a, "weight"_a, "eps"_a,
      "workspace"_a = nb::none(), "stream"_a = 0);

  m.def("layernorm_backward_workspace_size", &llmk::layernorm_backward_workspace_size, "rows"_a,
        "d"_a, "device_index"_a = 0);

  m.def(
      "silu_and_mul",
      [](AnyArray out, AnyArray x, uintptr_t stream) {
        auto o = view(out), xv = view(x);
        without_gil([&] { llmk::silu_and_mul(o, xv, stream_of(stream)); });
      },
      "out"_a, "x"_a, "stream"_a = 0);

  m.def(
      "gelu_and_mul",
      [](AnyArray out, AnyArray x, const std::string& approximate, uintptr_t stream) {
        auto o = view(out), xv = view(x);
        const auto a = gelu_approximation(approximate);
        without_gil([&] { llmk::gelu_and_mul(o, xv, a, stream_of(stream)); });
      },
      "out"_a, "x"_a, "approximate"_a = "none", "stream"_a = 0);

  m.def(
      "swiglu",
      [](AnyArray out, AnyArray gate, AnyArray up, uintptr_t stream) {
        auto o = view(out), g = view(gate), u = view(up);
        without_gil([&] { llmk::swiglu(o, g, u, stream_of(stream)); });
      },
      "out"_a, "gate"_a, "up"_a, "stream"_a = 0);

  m.def(
      "silu_and_mul_backward",
      [](AnyArray dx, AnyArray dy, AnyArray x, uintptr_t stream) {
        auto dxv = view(dx), dyv = view(dy), xv = view(x);
        without_gil([&] { llmk::silu_and_mul_backward(dxv, dyv, xv, stream_of(stream)); });
      },
      "dx"_a, "dy"_a, "x"_a, "stream"_a = 0);

  m.def(
      "gelu_and_mul_backward",
      [](AnyArray dx, AnyArray dy, AnyArray x, const std::string& approximate, uintptr_t stream) {
        auto dxv = view(dx), dyv = view(dy), xv = view(x);
        const auto a = gelu_approximation(approximate);
        without_gil([&] { llmk::gelu_and_mul_backward(dxv, dyv, xv, a, stream_of(stream)); });
      },
      "dx"_a, "dy"_a, "x"_a, "approximate"_a = "none", "stream"_a = 0);

  m.def(
      "swiglu_backward",
      [](AnyArray dgate, AnyArray dup, AnyArray dy, AnyArray gate, AnyArray up, uintptr_t stream) {
        auto dg = view(dgate), du = view(dup), dyv = view(dy), g = view(gate), u = view(up);
        without_gil([&] { llmk::swiglu_backward(dg, du, dyv, g, u, stream_of(stream)); });
      },
      "dgate"_a, "dup"_a, "dy"_a, "gate"_a, "up"_a, "stream"_a = 0);

  m.def(
      "bias_gelu",
      [](AnyArray out, AnyArray x, AnyArray bias, const std::string& approximate, uintptr_t stream) {
        auto o = view(out), xv = view(x), b = view(bias);
        const auto a = gelu_approximation(approximate);
        without_gil([&] { llmk::bias_gelu(o, xv, b, a, stream_of(stream)); });
      },
      "out"_a, "x"_a, "bias"_a, "approximate"_a = "none", "stream"_a = 0);

  m.def(
      "bias_gelu_backward",
      [](AnyArray dx, AnyArray dbias, AnyArray dy, AnyArray x, AnyArray bias,
         const std::string& approximate, std::optional<AnyArray> workspace, uintptr_t stream) {
        auto dxv = view(dx), db = view(dbias), dyv = view(dy), xv = view(x), b = view(bias);
        auto ws = view(workspace);
        const auto a = gelu_approximation(approximate);
        without_gil([&] { llmk::bias_gelu_backward(dxv, db, dyv, xv, b, a, ws, stream_of(stream)); });
      },
      "dx"_a, "dbias"_a, "dy"_a, "x"_a, "bias"_a, "approximate"_a = "none",
      "workspace"_a = nb::none(), "stream"_a = 0);

  m.def("bias_gelu_backward_workspace_size", &llmk::bias_gelu_backward_workspace_size, "rows"_a,
        "d"_a, "device_index"_a = 0);

  m.def(
      "softmax",
      [](AnyArray out, AnyArray x, double scale, bool log, uintptr_t stream) {
        auto o = view(out), xv = view(x);
        without_gil([&] {
          if (log) llmk::log_softmax(o, xv, scale, stream_of(stream));
          else llmk::softmax(o, xv, scale, stream_of(stream));
        });
      },
      "out"_a, "x"_a, "scale"_a = 1.0, "log"_a = false, "stream"_a = 0);

  m.def(
      "softmax_backward",
      [](AnyArray dx, AnyArray dy, AnyArray y, double scale, bool log, uintptr_t stream) {
        auto dxv = view(dx), dyv = view(dy), yv = view(y);
        without_gil([&] {
          if (log) llmk::log_softmax_backward(dxv, dyv, yv, scale, stream_of(stream));
          else llmk::softmax_backward(dxv, dyv, yv, scale, stream_of(stream));
        });
      },
      "dx"_a, "dy"_a, "y"_a, "scale"_a = 1.0, "log"_a = false, "stream"_a = 0);

  // RoPE in place on q (and k); the angles from cos_sin_cache when given, else from theta.
  m.def(
      "rope",
      [](AnyArray q, std::optional<AnyArray> k, AnyArray positions, std::optional<AnyArray> cache,
         double theta, int64_t rot_dim, const std::string& style,
         std::optional<std::vector<double>> llama3, bool inverse, uintptr_t stream) {
        auto qv = view(q), pv = view(positions);
        auto kv = k ? view(*k) : llmk::TensorView{};
        auto cv = view(cache);
        const llmk::RopeStyle st = rope_style(style);
        const llmk::RopeTheta freqs{rot_dim, theta, llama3_scaling(llama3)};
        without_gil([&] {
          const cudaStream_t s = stream_of(stream);
          if (cv && inverse) llmk::rope_backward(qv, kv, pv, *cv, st, s);
          else if (cv) llmk::rope(qv, kv, pv, *cv, st, s);
          else if (inverse) llmk::rope_backward(qv, kv, pv, freqs, st, s);
          else llmk::rope(qv, kv, pv, freqs, st, s);
        });
      },
      "q"_a, "k"_a.none(), "positions"_a, "cos_sin_cache"_a.none(), "theta"_a = 10000.0,
      "rot_dim"_a = 0, "style"_a = "neox", "llama3"_a.none() = nb::none(), "inverse"_a = false,
      "stream"_a = 0);

  // One fused AdamW step over lists of tensors (one entry per parameter).
  m.def(
      "adamw_step",
      [](const std::vector<AnyArray>& params, const std::vector<AnyArray>& grads,
         const std::vector<AnyArray>& exp_avgs, const std::vector<AnyArray>& exp_avg_sqs,
         const std::vector<AnyArray>& steps, double lr, std::optional<AnyArray> lr_tensor,
         double beta1, double beta2, double eps, double weight_decay, bool maximize,
         uintptr_t stream) {
        const size_t n = params.size();
        LLMK_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                       steps.size() == n,
                   "adamw_step: params, grads, exp_avgs, exp_avg_sqs and steps must have the same "
                   "length, got ", n, ", ", grads.size(), ", ", exp_avgs.size(), ", ",
                   exp_avg_sqs.size(), ", ", steps.size());
        std::vector<llmk::AdamWParam> list(n);
        for (size_t i = 0; i < n; ++i)
          list[i] = {view(params[i]), view(grads[i]), view(exp_avgs[i]), view(exp_avg_sqs[i]),
                     view(steps[i])};
        const llmk::AdamWOptions options{lr, beta1, beta2, eps, weight_decay, maximize};
        const llmk::TensorView lr_view = lr_tensor ? view(*lr_tensor) : llmk::TensorView{};
        without_gil([&] { llmk::adamw_step(list, options, lr_view, stream_of(stream)); });
      },
      "params"_a, "grads"_a, "exp_avgs"_a, "exp_avg_sqs"_a, "steps"_a, "lr"_a,
      "lr_tensor"_a.none(), "beta1"_a, "beta2"_a, "eps"_a, "weight_decay"_a, "maximize"_a = false,
      "stream"_a = 0);

  // Attention forward: [batch, seq, heads, head_dim] q, k, v, out; lse [batch, heads_q, seq_q] or none.
  m.def(
      "attention",
      [](AnyArray out, AnyArray q, AnyArray k, AnyArray v, std::optional<AnyArray> lse, double scale,
         bool causal, uintptr_t stream) {
        auto ov = view(out), qv = view(q), kv = view(k), vv = view(v);
        auto lv = lse ? view(*lse) : llmk::TensorView{};
        without_gil([&] { llmk::attention_forward(ov, qv, kv, vv, scale, causal, lv, stream_of(stream)); });
      },
      "out"_a, "q"_a, "k"_a, "v"_a, "lse"_a.none(), "scale"_a, "causal"_a = false, "stream"_a = 0);

  // Packed variable-length attention: [total, heads, head_dim] tensors, int32 cu_seqlens.
  m.def(
      "attention_varlen",
      [](AnyArray out, AnyArray q, AnyArray k, AnyArray v, AnyArray cu_seqlens_q, AnyArray cu_seqlens_k,
         int64_t max_seqlen_q, int64_t max_seqlen_k, std::optional<AnyArray> lse, double scale, bool causal,
         uintptr_t stream) {
        auto ov = view(out), qv = view(q), kv = view(k), vv = view(v), cq = view(cu_seqlens_q),
             ck = view(cu_seqlens_k);
        auto lv = lse ? view(*lse) : llmk::TensorView{};
        without_gil([&] {
          llmk::attention_varlen_forward(ov, qv, kv, vv, cq, ck, max_seqlen_q, max_seqlen_k, scale, causal, lv,
                                         stream_of(stream));
        });
      },
      "out"_a, "q"_a, "k"_a, "v"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "max_seqlen_q"_a, "max_seqlen_k"_a,
      "lse"_a.none(), "scale"_a, "causal"_a = false, "stream"_a = 0);

  m.def("attention_head_dim_compiled", &llmk::attention_head_dim_compiled, "head_dim"_a);
  m.def("cuda_device_count", &llmk::cuda_device_count);
  m.def("build_cuda_archs", &llmk::build_cuda_archs);
  m.def(
      "device_info",
      [](int index) {
        const llmk::DeviceInfo i = llmk::device_info(index);
        nb::dict d;
        d["available"] = i.available;
        d["error"] = i.error;
        d["index"] = i.index;
        d["name"] = i.name;
        d["compute_capability"] = nb::make_tuple(i.cc_major, i.cc_minor);
        d["sm_count"] = i.sm_count;
        d["max_threads_per_sm"] = i.max_threads_per_sm;
        d["shared_mem_per_block_optin"] = i.shared_mem_per_block_optin;
        d["shared_mem_per_sm"] = i.shared_mem_per_sm;
        d["l2_bytes"] = i.l2_bytes;
        d["memory_bus_bits"] = i.memory_bus_bits;
        d["memory_clock_khz"] = i.memory_clock_khz;
        d["sm_clock_khz"] = i.sm_clock_khz;
        d["peak_bandwidth_gbs"] = i.peak_bandwidth_gbs;
        d["peak_bf16_tflops"] = i.peak_bf16_tflops;
        return d;
      },
      "index"_a = 0);
}
