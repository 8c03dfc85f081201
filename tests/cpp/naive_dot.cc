// The reference products of naive_dot.h.
#include "naive_dot.h"

#include <cmath>

namespace llmk::test {

namespace {

template <class B>
void dot_products(const double* a, const B* b, int64_t m, int64_t n, int64_t k, double* out, double* abs_out) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double* ar = a + i * k;
      const B* br = b + j * k;
      double s = 0, s_abs = 0;
      if (abs_out != nullptr) {
        for (int64_t c = 0; c < k; ++c) {
          const double prod = ar[c] * double(br[c]);
          s += prod;
          s_abs += std::fabs(prod);
        }
        abs_out[i * n + j] = s_abs;
      } else {
        for (int64_t c = 0; c < k; ++c) s += ar[c] * double(br[c]);
      }
      out[i * n + j] = s;
    }
}

}  // namespace

void naive_dot_products(const double* a, const double* b, int64_t m, int64_t n, int64_t k, double* out,
                        double* abs_out) {
  dot_products(a, b, m, n, k, out, abs_out);
}

void naive_dot_products(const double* a, const float* b, int64_t m, int64_t n, int64_t k, double* out,
                        double* abs_out) {
  dot_products(a, b, m, n, k, out, abs_out);
}

}  // namespace llmk::test
