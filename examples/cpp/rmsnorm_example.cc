// Normalizes a few rows with llmk::rmsnorm: on the GPU when there is one, else on the CPU
// reference backend. Prints the first outputs and checks that the rows have unit RMS.
#include <cmath>
#include <cstdio>
#include <vector>

#include <cuda_runtime_api.h>
#include <llmk/llmk.h>

int main() {
  const int64_t rows = 4, hidden = 4096;
  std::vector<float> x(rows * hidden), w(hidden, 1.0f), y(rows * hidden);
  for (int64_t i = 0; i < rows * hidden; ++i) x[i] = std::sin(0.001f * static_cast<float>(i));

  const bool gpu = llmk::cuda_device_count() > 0;
  float *x_d = x.data(), *w_d = w.data(), *y_d = y.data();
  const llmk::Device device{gpu ? llmk::DeviceType::cuda : llmk::DeviceType::cpu, 0};
  if (gpu) {
    cudaMalloc(reinterpret_cast<void**>(&x_d), x.size() * 4);
    cudaMalloc(reinterpret_cast<void**>(&w_d), w.size() * 4);
    cudaMalloc(reinterpret_cast<void**>(&y_d), y.size() * 4);
    cudaMemcpy(x_d, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(w_d, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
  }
  try {
    llmk::rmsnorm(llmk::TensorView(y_d, llmk::DType::f32, device, {rows, hidden}),
                  llmk::TensorView(x_d, llmk::DType::f32, device, {rows, hidden}),
                  llmk::TensorView(w_d, llmk::DType::f32, device, {hidden}), 1e-6);
  } catch (const llmk::Error& e) {
    std::fprintf(stderr, "llmk error: %s\n", e.what());
    return 1;
  }
  if (gpu) {
    cudaMemcpy(y.data(), y_d, y.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(x_d);
    cudaFree(w_d);
    cudaFree(y_d);
  }
  double mean_sq = 0;
  for (int64_t c = 0; c < hidden; ++c) mean_sq += double(y[c]) * y[c];
  std::printf("ran on %s; y[0, :3] = %.5f %.5f %.5f; mean(y[0]^2) = %.5f (1 for unit weight)\n",
              gpu ? "the GPU" : "the CPU", y[0], y[1], y[2], mean_sq / hidden);
  return std::fabs(mean_sq / hidden - 1.0) < 1e-3 ? 0 : 1;
}
