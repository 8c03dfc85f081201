// Core pieces: TensorView, row flattening, host f16/bf16 conversions, device_info.
#include "common/rows.h"
#include "test_util.h"

namespace llmk::test {
namespace {

TEST(TensorView, ContiguousShapeAndStrides) {
  TensorView t(nullptr, DType::bf16, Device{}, {2, 3, 4});
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.size(-2), 3);
  expect_error([&] { t.size(3); }, "out of range");
}

TEST(Rows, FlattensLeadingDims) {
  alignas(16) static float buf[4096];
  const int64_t shape[3] = {2, 3, 8}, strides[3] = {3 * 24, 24, 1};  // rows spaced 24 apart
  auto r = detail::as_rows("op", "x", TensorView(buf, DType::f32, Device{}, 3, shape, strides));
  EXPECT_EQ(r.rows, 6);
  EXPECT_EQ(r.d, 8);
  EXPECT_EQ(r.row_stride, 24);
  const int64_t shape1[3] = {1, 5, 8}, strides1[3] = {999, 16, 1};  // size-1 dims are free
  r = detail::as_rows("op", "x", TensorView(buf, DType::f32, Device{}, 3, shape1, strides1));
  EXPECT_EQ(r.rows, 5);
  EXPECT_EQ(r.row_stride, 16);
  const int64_t shape2[2] = {4, 8}, strides2[2] = {4, 1};  // rows overlap
  expect_error([&] { detail::as_rows("op", "x", TensorView(buf, DType::f32, Device{}, 2, shape2, strides2)); },
               "rows overlap");
}

TEST(HostTypes, HalfAndBFloat16RoundTrip) {
  using detail::from_float;
  using detail::HostBFloat16;
  using detail::HostHalf;
  using detail::to_float;
  EXPECT_EQ(from_float<HostHalf>(1.0f).bits, 0x3c00);
  EXPECT_EQ(from_float<HostHalf>(-2.0f).bits, 0xc000);
  EXPECT_EQ(from_float<HostHalf>(65504.0f).bits, 0x7bff);
  EXPECT_EQ(from_float<HostHalf>(1e6f).bits, 0x7c00);             // overflow to inf
  EXPECT_EQ(from_float<HostHalf>(5.9604645e-8f).bits, 0x0001);    // smallest subnormal
  EXPECT_EQ(from_float<HostHalf>(1.0f + 1.0f / 2048).bits, 0x3c00);  // tie to even
  EXPECT_EQ(from_float<HostHalf>(1.0f + 3.0f / 2048).bits, 0x3c02);  // tie to even, up
  EXPECT_EQ(from_float<HostBFloat16>(1.0f).bits, 0x3f80);
  EXPECT_EQ(from_float<HostBFloat16>(1.0f + 1.0f / 256).bits, 0x3f80);   // tie to even
  EXPECT_EQ(from_float<HostBFloat16>(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(to_float(from_float<HostBFloat16>(std::nanf("")))));
  EXPECT_TRUE(std::isnan(to_float(from_float<HostHalf>(std::nanf("")))));
  for (uint32_t bits = 0; bits < 0x7c00; ++bits)  // every finite half survives a round trip
    ASSERT_EQ(from_float<HostHalf>(to_float(HostHalf{uint16_t(bits)})).bits, bits);
}

TEST(DeviceInfo, ReportsDeviceOrReason) {
  const DeviceInfo info = device_info(0);
  if (!has_gpu()) {
    EXPECT_FALSE(info.available);
    EXPECT_FALSE(info.error.empty());
    return;
  }
  EXPECT_TRUE(info.available);
  EXPECT_GT(info.sm_count, 0);
  EXPECT_GT(info.peak_bandwidth_gbs, 100.0);
  EXPECT_GT(info.l2_bytes, 0);
}

}  // namespace
}  // namespace llmk::test
