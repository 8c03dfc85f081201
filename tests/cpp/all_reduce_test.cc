// all_reduce_add_rmsnorm: peer buffer sizes and the group's checks (CPU), a group of one rank
// as add_rmsnorm_, and on the GPU groups of 2 and 4 ranks simulated in one process on one
// device (each rank's buffer allocated here, each rank's call on its own stream, the calls
// waiting for each other on the device as separate processes' do) against the reference: the
// ranks' x summed in fp32 in rank order and rounded, added to the residual and rounded
// (bit-exact, and the same bits on every rank), then the double RMSNorm of that. Calls in a
// row with different row counts take both slot parities and the call counts of many blocks;
// values equal to a slot's empty mark (bf16 / f16 -0.0, the f32 word 0x80008000) arrive.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "test_util.h"

namespace llmk::test {
namespace {

TEST(AllReduceCpu, PeerBufferBytes) {
  EXPECT_EQ(peer_buffer_bytes(2, 1 << 20), size_t{16384} + 2 * 3 * (1 << 20));
  EXPECT_EQ(peer_buffer_bytes(8, 16), size_t{16384} + 2 * 9 * 16);
  expect_error([] { peer_buffer_bytes(0, 1024); }, "world must be 1..8");
  expect_error([] { peer_buffer_bytes(9, 1024); }, "world must be 1..8");
  expect_error([] { peer_buffer_bytes(2, 24); }, "capacity must be a positive multiple of 16");
  expect_error([] { allocate_peer_buffer(100); }, "smaller than a peer buffer's header");
  expect_error([] { open_peer_buffer(nullptr, 64); }, "a handle is 64 bytes");
}

// A group whose buffers are never touched (the checks run first).
PeerGroup fake_group(int rank, int world) {
  PeerGroup g;
  g.rank = rank;
  g.world = world;
  g.capacity = 1 << 20;
  for (int r = 0; r < world; ++r) g.buffers[r] = reinterpret_cast<void*>(uintptr_t{1} << (20 + r));
  return g;
}

TEST(AllReduceCpu, RejectsBadGroupsAndHostTensorsWithoutWriting) {
  HostTensor x(DType::bf16, 3, 64), res(DType::bf16, 3, 64), w(DType::bf16, 1, 64);
  x.randomize();
  res.randomize();
  w.randomize();
  const HostTensor x0 = x, res0 = res;
  auto call = [&](const PeerGroup& g) { all_reduce_add_rmsnorm(g, x.view(), res.view(), w.view(true), 1e-6); };
  PeerGroup g = fake_group(0, 2);
  g.world = 9;
  expect_error([&] { call(g); }, "world must be 1..8");
  expect_error([&] { call(fake_group(2, 2)); }, "group rank 2 is not in 0..1");
  g = fake_group(1, 2);
  g.buffers[0] = nullptr;
  expect_error([&] { call(g); }, "buffer of rank 0 is missing");
  g = fake_group(0, 2);
  g.buffers[1] = reinterpret_cast<void*>(uintptr_t{1} << 20 | 8);
  expect_error([&] { call(g); }, "buffer of rank 1 is not a peer buffer");
  g = fake_group(0, 2);
  g.capacity = 100;
  expect_error([&] { call(g); }, "capacity must be a positive multiple of 16");
  expect_error([&] { call(fake_group(0, 2)); }, "x is on the CPU");
  EXPECT_FALSE(all_reduce_add_rmsnorm_fits(fake_group(0, 2), x.view()));
  EXPECT_EQ(x.bytes, x0.bytes);
  EXPECT_EQ(res.bytes, res0.bytes);
}

TEST(AllReduceCpu, OneRankIsAddRmsnorm) {
  for (DType dt : all_dtypes()) {
    HostTensor x(dt, 5, 96), res(dt, 5, 96), w(DType::f32, 1, 96);
    x.randomize();
    res.randomize();
    w.randomize();
    HostTensor want_x = x, want_res = res;
    add_rmsnorm_(want_x.view(), want_res.view(), w.view(true), 1e-5, 1.0);
    PeerGroup g;
    g.world = 1;
    g.capacity = 16;
    all_reduce_add_rmsnorm(g, x.view(), res.view(), w.view(true), 1e-5, 1.0);
    EXPECT_EQ(x.bytes, want_x.bytes) << dtype_name(dt);
    EXPECT_EQ(res.bytes, want_res.bytes) << dtype_name(dt);
  }
}

// `world` ranks on this process's device: a peer buffer each, and a stream each.
struct SimulatedGroup {
  int world;
  size_t capacity;
  std::vector<void*> buffers;
  std::vector<cudaStream_t> streams;

  SimulatedGroup(int world_, size_t capacity_) : world(world_), capacity(capacity_) {
    for (int r = 0; r < world; ++r) {
      buffers.push_back(allocate_peer_buffer(peer_buffer_bytes(world, capacity)));
      streams.emplace_back();
      EXPECT_EQ(cudaStreamCreateWithFlags(&streams.back(), cudaStreamNonBlocking), cudaSuccess);
    }
  }
  ~SimulatedGroup() {
    for (int r = 0; r < world; ++r) {
      free_peer_buffer(buffers[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
  // After the device is synchronized: every rank's message slots marked empty again (every
  // word 0x80008000: each vector sent was read) and each block's call count `calls`.
  void expect_clean(uint32_t calls) const {
    const size_t bytes = peer_buffer_bytes(world, capacity), header = bytes - 2 * (world + 1) * capacity;
    std::vector<uint32_t> words(bytes / 4);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(cudaMemcpy(words.data(), buffers[r], bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int b = 0; b < 128; ++b) EXPECT_EQ(words[b], calls) << "rank " << r << " block " << b << "'s call count";
      size_t unmarked = 0;
      for (size_t i = header / 4; i < words.size(); ++i) unmarked += words[i] != 0x80008000u;
      EXPECT_EQ(unmarked, 0u) << "rank " << r << ": words of its message slots left unread";
    }
  }
  PeerGroup group(int rank) const {
    PeerGroup g;
    g.rank = rank;
    g.world = world;
    g.capacity = capacity;
    for (int r = 0; r < world; ++r) g.buffers[r] = buffers[r];
    return g;
  }
};

// One call on every rank: fresh x per rank, the same residual and weight, and the reference.
// Every rank's blocks with rows spin until the other ranks' arrive (and, up to 16 rows, until
// their own rank's other blocks have sent their shares), so the simulated ranks' blocks must be
// resident together: more than 128 rows (every block busy) only at small d (few threads per
// block).
struct Call {
  DType dt;
  int64_t rows, d;
  double offset, eps = 1e-5;
  std::vector<HostTensor> xs;  // the device copies below refer to these (and to res, w)
  HostTensor res, want_res, want, w;
  std::vector<std::unique_ptr<DeviceTensor>> dx, dres;
  std::unique_ptr<DeviceTensor> dw;

  // marks: x holds values equal to a slot's empty mark, on every rank (every 7th column) or
  // on one rank (every 5th); f32 also values whose sum over two ranks is the mark (-2^-135,
  // every 11th: the two-shot kernel sends that sum to the gather slots).
  Call(int world, DType dt_, DType wdt, int64_t rows_, int64_t d_, int64_t res_stride, double offset_,
       bool marks = false)
      : dt(dt_), rows(rows_), d(d_), offset(offset_) {
    for (int r = 0; r < world; ++r) {
      xs.emplace_back(dt, rows, d);
      xs.back().randomize();
    }
    if (marks) {
      const uint32_t f32_mark = 0x80008000u;
      float mark = -0.0f;
      if (dt == DType::f32) std::memcpy(&mark, &f32_mark, sizeof(mark));
      const uint32_t f32_half_mark = 0x80004000u;
      float half_mark = 0.0f;
      std::memcpy(&half_mark, &f32_half_mark, sizeof(half_mark));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < d; ++c)
          for (int r = 0; r < world; ++r)
            if (c % 7 == 0 || (c % 5 == 0 && r == (c / 5) % world)) xs[r].set(i, c, mark);
            else if (dt == DType::f32 && c % 11 == 0) xs[r].set(i, c, half_mark);
    }
    res = HostTensor(dt, rows, d, res_stride);
    res.randomize(0.0f, 2.0f);
    w = HostTensor(wdt, 1, d);
    w.randomize(1.0f, 0.2f);
    want_res = res;
    want = HostTensor(dt, rows, d);
    HostTensor sum(dt, rows, d);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < d; ++c) {
        float total = 0.0f;
        for (int r = 0; r < world; ++r) total += xs[r].get(i, c);
        sum.set(i, c, total);
        want_res.set(i, c, sum.get(i, c) + res.get(i, c));
      }
    rmsnorm(want.view(), want_res.view(), w.view(true), eps, offset);
    dw = std::make_unique<DeviceTensor>(w);
    for (int r = 0; r < world; ++r) {
      dx.push_back(std::make_unique<DeviceTensor>(xs[r]));
      dres.push_back(std::make_unique<DeviceTensor>(res));
    }
  }
  void launch(const SimulatedGroup& sg, int rank) const {
    all_reduce_add_rmsnorm(sg.group(rank), dx[rank]->view(), dres[rank]->view(), dw->view(true), eps, offset,
                           sg.streams[rank]);
  }
  // After the device is synchronized: rank 0's results against the reference, every rank's
  // bits equal to rank 0's.
  void check() const {
    SCOPED_TRACE(testing::Message() << dtype_name(dt) << " weight " << dtype_name(w.dtype) << " rows " << rows
                                    << " d " << d << " residual stride " << want_res.row_stride << " offset "
                                    << offset);
    const HostTensor x0 = dx[0]->download(), res0 = dres[0]->download();
    expect_equal_elements(res0, want_res, "residual");
    expect_close(x0, want, dtype_rtol(dt), "x");
    for (size_t r = 1; r < dx.size(); ++r) {
      EXPECT_EQ(dx[r]->download().bytes, x0.bytes) << "rank " << r << "'s x differs from rank 0's";
      EXPECT_EQ(dres[r]->download().bytes, res0.bytes) << "rank " << r << "'s residual differs from rank 0's";
    }
  }
};

void run_call(const SimulatedGroup& sg, DType dt, DType wdt, int64_t rows, int64_t d, int64_t res_stride,
              double offset, bool marks = false) {
  SCOPED_TRACE(testing::Message() << "world " << sg.world);
  const Call call(sg.world, dt, wdt, rows, d, res_stride, offset, marks);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int r = 0; r < sg.world; ++r) call.launch(sg, r);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  call.check();
}

// Sets LLMK_ALL_REDUCE_KERNEL for one scope (nullptr: unset, the size rule).
struct KernelScope {
  explicit KernelScope(const char* kernel) {
    if (kernel != nullptr) setenv("LLMK_ALL_REDUCE_KERNEL", kernel, 1);
    else unsetenv("LLMK_ALL_REDUCE_KERNEL");
  }
  ~KernelScope() { unsetenv("LLMK_ALL_REDUCE_KERNEL"); }
};

TEST(AllReduceGpu, RanksMatchTheReference) {
  LLMK_REQUIRE_GPU();
  for (const char* kernel : {"one_shot", "two_shot"})
    for (int world : {2, 3, 4}) {
      SCOPED_TRACE(kernel);
      const KernelScope scope(kernel);
      const SimulatedGroup sg(world, 1 << 20);
      for (DType dt : all_dtypes()) {
        const int64_t d = dt == DType::f32 ? 2048 : 4096;
        run_call(sg, dt, dt, 1, d, d, 0.0);
        run_call(sg, dt, DType::f32, 3, d, d + 64, 1.0);
        run_call(sg, dt, dt, 17, d, d, 0.0);
        run_call(sg, dt, dt, 300, 64, 64, 0.0);  // blocks loop over rows
        run_call(sg, dt, dt, 2, 8192 * 4 / static_cast<int64_t>(dtype_size(dt)), -1, 0.0);  // threads loop
        run_call(sg, dt, dt, 5, 48 / static_cast<int64_t>(dtype_size(dt)), -1, 0.0);  // 3 vectors: chunks of 1 or 0
      }
    }
}

// A value equal to the empty mark travels as its neighbour (a lost mark would leave the receiver
// waiting: the short timeout turns that into a trap instead of a hang).
TEST(AllReduceGpu, ValuesEqualToTheEmptyMarkArrive) {
  LLMK_REQUIRE_GPU();
  setenv("LLMK_ALL_REDUCE_TIMEOUT_S", "20", 1);
  for (const char* kernel : {"one_shot", "two_shot"})
    for (int world : {2, 4}) {
      SCOPED_TRACE(kernel);
      const KernelScope scope(kernel);
      const SimulatedGroup sg(world, 1 << 20);
      uint32_t calls = 0;
      for (DType dt : all_dtypes()) {
        run_call(sg, dt, dt, 3, 2048, -1, 0.0, true);
        run_call(sg, dt, dt, 130, 256, -1, 0.0, true);
        calls += 2;
      }
      sg.expect_clean(calls);
    }
  unsetenv("LLMK_ALL_REDUCE_TIMEOUT_S");
}

// Calls queued back to back on each rank's stream, rank by rank (rank 0's whole sequence is
// launched before rank 1's first call): ranks run calls ahead of each other as far as the slots
// let them, through both slot parities and both kernels (the kernel is picked at launch, the
// same for a call on every rank).
TEST(AllReduceGpu, CallsBackToBackOnBothKernels) {
  LLMK_REQUIRE_GPU();
  for (int world : {2, 4}) {
    SCOPED_TRACE(testing::Message() << "world " << world);
    const SimulatedGroup sg(world, 256 << 10);
    std::vector<std::unique_ptr<Call>> calls;
    for (int k = 0; k < 12; ++k)
      calls.push_back(std::make_unique<Call>(world, DType::bf16, DType::bf16, 1 + k % 5 * 7, 1024 + 512 * (k % 2), -1, 0.0));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int r = 0; r < world; ++r)
      for (size_t k = 0; k < calls.size(); ++k) {
        const KernelScope scope(k % 3 == 0 ? "two_shot" : k % 3 == 1 ? "one_shot" : nullptr);
        calls[k]->launch(sg, r);
      }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const auto& call : calls) call->check();
    sg.expect_clean(static_cast<uint32_t>(calls.size()));
  }
}

TEST(AllReduceGpu, ManyCallsInARowOnBothKernels) {
  LLMK_REQUIRE_GPU();
  const SimulatedGroup sg(4, 256 << 10);
  for (int call = 0; call < 40; ++call) {
    const KernelScope scope(call % 3 == 0 ? "two_shot" : call % 3 == 1 ? "one_shot" : nullptr);
    run_call(sg, DType::bf16, DType::bf16, 1 + call % 7 * 3, 1024 + 512 * (call % 2), -1, 0.0);
  }
  sg.expect_clean(40);
}

TEST(AllReduceGpu, RejectsUnfitCallsWithoutWriting) {
  LLMK_REQUIRE_GPU();
  const SimulatedGroup sg(2, 4096);
  HostTensor x(DType::bf16, 4, 1024), res(DType::bf16, 4, 1024), w(DType::bf16, 1, 1024);
  x.randomize();
  res.randomize();
  w.randomize();
  DeviceTensor dx(x), dres(res), dw(w);
  const PeerGroup g = sg.group(0);
  auto view = [](const DeviceTensor& t, int64_t rows, int64_t d, int64_t stride, int64_t offset_elems) {
    const int64_t shape[2] = {rows, d}, strides[2] = {stride, 1};
    return TensorView(static_cast<uint16_t*>(t.data) + offset_elems, DType::bf16, Device{DeviceType::cuda, 0}, 2,
                      shape, strides);
  };
  EXPECT_FALSE(all_reduce_add_rmsnorm_fits(g, dx.view()));
  expect_error([&] { all_reduce_add_rmsnorm(g, dx.view(), dres.view(), dw.view(true), 1e-6); },
               "more than the group's capacity of 4096");
  EXPECT_TRUE(all_reduce_add_rmsnorm_fits(g, view(dx, 2, 1024, 1024, 0)));
  EXPECT_FALSE(all_reduce_add_rmsnorm_fits(g, view(dx, 1, 1024, 1024, 4)));
  expect_error([&] { all_reduce_add_rmsnorm(g, view(dx, 1, 1024, 1024, 4), view(dres, 1, 1024, 1024, 0),
                                            dw.view(true), 1e-6); },
               "16-byte aligned");
  expect_error([&] { all_reduce_add_rmsnorm(g, view(dx, 1, 1020, 1024, 0), view(dres, 1, 1020, 1024, 0),
                                            dw.view(true), 1e-6); },
               "whole 16-byte vectors");
  expect_error([&] { all_reduce_add_rmsnorm(g, view(dx, 2, 512, 1024, 0), view(dres, 2, 512, 1024, 0),
                                            dw.view(true), 1e-6); },
               "rows must be contiguous");
  expect_error([&] { all_reduce_add_rmsnorm(g, view(dx, 1, 1024, 1024, 0), view(dres, 1, 1024, 1024, 4),
                                            dw.view(true), 1e-6); },
               "residual must start 16-byte aligned");
  expect_error([&] { all_reduce_add_rmsnorm(g, view(dx, 1, 1024, 1024, 0), view(dres, 1, 1024, 1024, 0),
                                            dw.view(true), 0.0); },
               "eps must be");
  expect_error([&] { all_reduce_add_rmsnorm(g, view(dx, 1, 1024, 1024, 0), view(dx, 1, 1024, 1024, 0),
                                            dw.view(true), 1e-6); },
               "x and residual are the same tensor");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dx.download().bytes, x.bytes);
  EXPECT_EQ(dres.download().bytes, res.bytes);
}

}  // namespace
}  // namespace llmk::test
