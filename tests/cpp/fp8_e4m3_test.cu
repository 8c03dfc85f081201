// The sm_80 path of the fp8 e4m3 -> fp16 pair conversion (common/fp8_e4m3.cuh), which the
// decode kernels' fp8 cache takes on GPUs before sm_89, run here on whatever GPU is at hand:
// every one of the 65536 byte pairs against a host decoding of the format.
#include <gtest/gtest.h>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/fp8_e4m3.cuh"
#include "test_util.h"

namespace {

__global__ void convert_every_pair(uint32_t* out) {
  const uint32_t pair = blockIdx.x * blockDim.x + threadIdx.x;
  if (pair < 65536) out[pair] = llmk::detail::e4m3x2_to_half2_bits(pair);
}

// e4m3 (bias 7, no infinities, S.1111.111 = NaN) as a float, from its definition.
float e4m3_value(uint32_t byte) {
  const int exponent = (byte >> 3) & 15, mantissa = byte & 7;
  const float sign = (byte & 0x80) ? -1.0f : 1.0f;
  if (exponent == 15 && mantissa == 7) return NAN;
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0f, -6);
  return sign * std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
}

float half_value(uint16_t bits) {
  __half h;
  static_assert(sizeof(h) == sizeof(bits));
  std::memcpy(&h, &bits, sizeof(bits));
  return __half2float(h);
}

TEST(Fp8E4M3Gpu, PortablePairConversionIsExact) {
  LLMK_REQUIRE_GPU();
  uint32_t* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 65536 * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(device, 0xff, 65536 * sizeof(uint32_t)), cudaSuccess);  // poisoned: NaN pairs
  convert_every_pair<<<256, 256>>>(device);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint32_t> out(65536);
  ASSERT_EQ(cudaMemcpy(out.data(), device, out.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
  int wrong = 0;
  for (uint32_t pair = 0; pair < 65536; ++pair) {
    for (int i = 0; i < 2; ++i) {
      const float want = e4m3_value((pair >> (8 * i)) & 0xff);
      const float got = half_value(static_cast<uint16_t>(out[pair] >> (16 * i)));
      const bool same = std::isnan(want) ? std::isnan(got) : got == want && std::signbit(got) == std::signbit(want);
      if (!same && ++wrong <= 5)
        ADD_FAILURE() << "pair 0x" << std::hex << pair << " byte " << i << ": got " << got << ", want " << want;
    }
  }
  EXPECT_EQ(wrong, 0);
}

}  // namespace
