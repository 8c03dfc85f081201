// llmk._C: loading it registers the CPU and CUDA kernels of every torch.ops.llmk op (the
// ops_*.cc files of this folder, through PyTorch's stable ABI); this module itself holds the
// few plain functions that are not tensor ops: what GPU llmk sees and how it was built.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "llmk/llmk.h"
#include "peer_groups.h"
#include "torch_bridge.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_C, m) {
  m.doc() = "llmk: fused GPU kernels for transformer language models (torch ops and build facts)";

  // The attention head dims, from the C++ library's one list (llmk.attention_head_dims() and
  // `llmk info` derive theirs from these): what attention accepts, whether this build has CUDA
  // kernels for one (LLMK_HEAD_DIMS), the Hopper kernels' as compiled, and attention_decode's.
  m.def("attention_head_dims", &llmk::attention_head_dims);
  m.def("attention_head_dim_compiled", &llmk::attention_head_dim_compiled, "head_dim"_a);
  m.def("attention_sm90_head_dims", &llmk::attention_sm90_head_dims);
  m.def("attention_decode_head_dims", &llmk::attention_decode_head_dims);
  m.def("cuda_device_count", &llmk::cuda_device_count);
  m.def("build_cuda_archs", &llmk::build_cuda_archs);
  m.def("build_ptx_arch", &llmk::build_ptx_arch);
  // The op schemas' activation names as the C++ side parses them (python/llmk/ops/activation.py
  // keeps the same table; test_op_table.py holds the two equal).
  m.def("gemm_activation_names", &llmk::torch_ops::gemm_activation_names);
  m.def("gelu_approximation_names", &llmk::torch_ops::gelu_approximation_names);
  // Peer buffers and groups (include/llmk/all_reduce.h): llmk.distributed allocates one buffer
  // per rank on the rank's current device, exchanges the handles through the process group,
  // maps the peers' and registers the group for the op all_reduce_add_rmsnorm_.
  m.def("peer_buffer_bytes", &llmk::peer_buffer_bytes, "world"_a, "capacity"_a);
  m.def("allocate_peer_buffer", [](size_t bytes) { return reinterpret_cast<uintptr_t>(llmk::allocate_peer_buffer(bytes)); },
        "bytes"_a);
  m.def("free_peer_buffer", [](uintptr_t buffer) { llmk::free_peer_buffer(reinterpret_cast<void*>(buffer)); }, "buffer"_a);
  m.def(
      "peer_buffer_handle",
      [](uintptr_t buffer) {
        const auto h = llmk::peer_buffer_handle(reinterpret_cast<void*>(buffer));
        return nb::bytes(reinterpret_cast<const char*>(h.data()), h.size());
      },
      "buffer"_a);
  m.def(
      "open_peer_buffer",
      [](nb::bytes handle) {
        return reinterpret_cast<uintptr_t>(
            llmk::open_peer_buffer(static_cast<const uint8_t*>(handle.data()), handle.size()));
      },
      "handle"_a);
  m.def("close_peer_buffer", [](uintptr_t mapped) { llmk::close_peer_buffer(reinterpret_cast<void*>(mapped)); },
        "mapped"_a);
  m.def(
      "register_peer_group",
      [](int rank, int world, size_t capacity, const std::vector<uintptr_t>& buffers) {
        LLMK_CHECK(buffers.size() <= static_cast<size_t>(llmk::kPeerMaxRanks), "register_peer_group: ",
                   static_cast<int64_t>(buffers.size()), " buffers, at most ", llmk::kPeerMaxRanks);
        llmk::PeerGroup g;
        g.rank = rank;
        g.world = world;
        g.capacity = capacity;
        for (size_t r = 0; r < buffers.size(); ++r) g.buffers[r] = reinterpret_cast<void*>(buffers[r]);
        return llmk::torch_ops::register_peer_group(g);
      },
      "rank"_a, "world"_a, "capacity"_a, "buffers"_a);
  m.def("unregister_peer_group", &llmk::torch_ops::unregister_peer_group, "id"_a);
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
