// CPU references of the gemm family: inputs converted exactly to double, products summed
// in double, the epilogue in double, one rounding per output. The oracle of the GPU tests
// and the host backend of llmk::gemm / llmk::rmsnorm_linear.
//
// gemm works on blocks of 64 rows x 64 output columns whose operands are first converted
// to double (64 x K each), so every element of a and b is converted O(M N / 64) times
// rather than O(M N) and the inner loop is a dense double dot product.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/activation_math.h"
#include "common/host_types.h"
#include "gemm/gemm.h"

namespace llmk::detail {

namespace {

constexpr int64_t kBlock = 64;

// double -> float rounded to odd (an inexact result gets its last mantissa bit set), so that
// a second rounding to f16 or bf16 (>= 2 fewer mantissa bits) equals a single rounding of
// the double: the output is rounded once.
float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(f) || static_cast<double>(f) == d) return f;
  uint32_t u = float_bits(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) --u;  // truncate toward zero
  return bits_float(u | 1u);
}

template <class T>
T round_out(double v) {
  if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return from_float<T>(round_to_odd_float(v));
}

template <class T>
double load(const void* base, int64_t index) {
  return static_cast<double>(to_float(static_cast<const T*>(base)[index]));
}

double activate(GemmActivation act, double v) {
  double value = v, slope = 0.0;
  switch (act) {
    case GemmActivation::gelu: act_value_and_slope(Activation::gelu, v, value, slope); return value;
    case GemmActivation::gelu_tanh: act_value_and_slope(Activation::gelu_tanh, v, value, slope); return value;
    case GemmActivation::none:
    case GemmActivation::silu_mul: break;
  }
  return v;
}

double silu(double g) {
  double value = 0.0, slope = 0.0;
  act_value_and_slope(Activation::silu, g, value, slope);
  return value;
}

template <class TIn, class TOut>
void gemm_typed(const GemmParams& p) {
  const int64_t k = p.k, n_out = p.n_out();
  const bool silu_mul = p.activation == GemmActivation::silu_mul;
  const int64_t half = p.n / 2;
  const int64_t cols_per_out = silu_mul ? 2 : 1;
  std::vector<double> a_blk(static_cast<size_t>(kBlock * k));
  std::vector<double> b_blk(static_cast<size_t>(kBlock * cols_per_out * k));
  std::vector<double> z(static_cast<size_t>(kBlock * cols_per_out));
  auto A = [&](int64_t i, int64_t kk) { return load<TIn>(p.a, p.a_k_major ? i * p.lda + kk : kk * p.lda + i); };
  auto B = [&](int64_t j, int64_t kk) { return load<TIn>(p.b, p.b_k_major ? j * p.ldb + kk : kk * p.ldb + j); };
  TOut* out = static_cast<TOut*>(p.out);
  for (int64_t j0 = 0; j0 < n_out; j0 += kBlock) {
    const int64_t nj = std::min(kBlock, n_out - j0);
    // b_blk rows: output column j's gate (or only) column, then (silu_mul) its up column.
    for (int64_t jj = 0; jj < nj; ++jj)
      for (int64_t c = 0; c < cols_per_out; ++c) {
        const int64_t col = j0 + jj + c * half;
        double* dst = &b_blk[static_cast<size_t>((jj * cols_per_out + c) * k)];
        for (int64_t kk = 0; kk < k; ++kk) dst[kk] = B(col, kk);
      }
    for (int64_t i0 = 0; i0 < p.m; i0 += kBlock) {
      const int64_t ni = std::min(kBlock, p.m - i0);
      for (int64_t ii = 0; ii < ni; ++ii)
        for (int64_t kk = 0; kk < k; ++kk) a_blk[static_cast<size_t>(ii * k + kk)] = A(i0 + ii, kk);
      for (int64_t ii = 0; ii < ni; ++ii) {
        const int64_t i = i0 + ii;
        const double* ar = &a_blk[static_cast<size_t>(ii * k)];
        for (int64_t jc = 0; jc < nj * cols_per_out; ++jc) {
          const double* br = &b_blk[static_cast<size_t>(jc * k)];
          double s = 0.0;
          for (int64_t kk = 0; kk < k; ++kk) s += ar[kk] * br[kk];
          z[static_cast<size_t>(jc)] = s;
        }
        for (int64_t jj = 0; jj < nj; ++jj) {
          const int64_t j = j0 + jj;
          double v;
          if (silu_mul) {
            double gate = z[static_cast<size_t>(2 * jj)], up = z[static_cast<size_t>(2 * jj + 1)];
            if (p.bias) {
              gate += load<TOut>(p.bias, j);
              up += load<TOut>(p.bias, j + half);
            }
            v = silu(gate) * up;
          } else {
            v = z[static_cast<size_t>(jj)];
            if (p.bias) v += load<TOut>(p.bias, j);
            v = activate(p.activation, v);
          }
          // residual may be out itself: this element is read before it is written.
          if (p.residual) v += load<TOut>(p.residual, i * p.ld_residual + j);
          out[i * p.ld_out + j] = round_out<TOut>(v);
        }
      }
    }
  }
}

template <class T, class TG>
void rmsnorm_linear_typed(const RmsnormLinearParams& p) {
  const int64_t k = p.k;
  std::vector<double> xn(static_cast<size_t>(k));
  std::vector<double> g(static_cast<size_t>(k));
  for (int64_t kk = 0; kk < k; ++kk) g[static_cast<size_t>(kk)] = load<TG>(p.g, kk);
  T* out = static_cast<T*>(p.out);
  for (int64_t i = 0; i < p.m; ++i) {
    double ss = 0.0;
    for (int64_t kk = 0; kk < k; ++kk) {
      const double v = load<T>(p.x, i * p.ldx + kk);
      xn[static_cast<size_t>(kk)] = v;
      ss += v * v;
    }
    // K == 0: an empty sum, out = 0 (rstd is never used).
    const double rstd = k > 0 ? 1.0 / std::sqrt(ss / static_cast<double>(k) + p.eps) : 0.0;
    for (int64_t kk = 0; kk < k; ++kk) xn[static_cast<size_t>(kk)] *= rstd * g[static_cast<size_t>(kk)];
    for (int64_t j = 0; j < p.n; ++j) {
      double s = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) s += xn[static_cast<size_t>(kk)] * load<T>(p.w, j * p.ldw + kk);
      out[i * p.ld_out + j] = round_out<T>(s);
    }
  }
}

}  // namespace

void gemm_cpu(const GemmParams& p) {
  dispatch_dtype(p.in_dtype, "gemm", [&](auto in_tag) {
    dispatch_dtype(p.out_dtype, "gemm", [&](auto out_tag) {
      gemm_typed<host_type_t<decltype(in_tag)>, host_type_t<decltype(out_tag)>>(p);
    });
  });
}

void rmsnorm_linear_cpu(const RmsnormLinearParams& p) {
  dispatch_act_weight(p.in_dtype, p.g_dtype, "rmsnorm_linear", [&](auto x_tag, auto g_tag) {
    rmsnorm_linear_typed<host_type_t<decltype(x_tag)>, host_type_t<decltype(g_tag)>>(p);
  });
}

}  // namespace llmk::detail
