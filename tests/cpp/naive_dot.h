// The tests' double-precision reference products (O(m n k) loops shared by the gemm,
// rmsnorm_linear and quantized_gemm tests), in one place.
#pragma once

#include <cstdint>

namespace llmk::test {

// out[i n + j] = sum_c a[i k + c] * b[j k + c] (a [m, k] and b [n, k] dense, row-major), in
// double, summed in c order; abs_out, when given, the same sums of |a b|. out and abs_out
// hold m n values.
void naive_dot_products(const double* a, const double* b, int64_t m, int64_t n, int64_t k, double* out,
                        double* abs_out = nullptr);
void naive_dot_products(const double* a, const float* b, int64_t m, int64_t n, int64_t k, double* out,
                        double* abs_out = nullptr);

}  // namespace llmk::test
