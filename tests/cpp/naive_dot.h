// The tests' double-precision reference products, compiled optimized (naive_dot.cc): the
// tests' own code is built at -O0 for compile time, where these O(m n k) loops took most of
// the GPU tests' run time (tens of seconds a test at decode and split-K shapes).
#pragma once

#include <cstdint>
#include <vector>

namespace llmk::test {

// out[i n + j] = sum_c a[i k + c] * b[j k + c] (a [m, k] and b [n, k] dense, row-major), in
// double, summed in c order; abs_out, when given, the same sums of |a b|. out and abs_out
// hold m n values.
void naive_dot_products(const double* a, const double* b, int64_t m, int64_t n, int64_t k, double* out,
                        double* abs_out = nullptr);
void naive_dot_products(const double* a, const float* b, int64_t m, int64_t n, int64_t k, double* out,
                        double* abs_out = nullptr);

}  // namespace llmk::test
