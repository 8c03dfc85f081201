// The attention of one query row in double: the algorithm of the CPU references of the
// prefill and decode attention (attention/attention_cpu.cc,
// decode/attention_decode_cpu.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace llmk::detail {

// Every score dot(j) * scale of the `keys` visible keys, their max, the exponentials and the
// weighted sum of the values value(j, c), c < d. Leaves the normalized output in out[0, d)
// (0 for a row without keys) and returns the natural-log log-sum-exp (-inf without keys).
// `scores` is scratch space.
template <class Dot, class Value>
double attend_row_host(int64_t keys, int d, double scale, Dot&& dot, Value&& value, std::vector<double>& scores,
                       std::vector<double>& out) {
  scores.resize(static_cast<size_t>(keys));
  out.assign(static_cast<size_t>(d), 0.0);
  if (keys == 0) return -std::numeric_limits<double>::infinity();
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < keys; ++j) {
    scores[j] = dot(j) * scale;
    max_score = std::max(max_score, scores[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < keys; ++j) {
    const double w = std::exp(scores[j] - max_score);
    sum += w;
    for (int c = 0; c < d; ++c) out[c] += w * value(j, c);
  }
  for (int c = 0; c < d; ++c) out[c] /= sum;
  return max_score + std::log(sum);
}

}  // namespace llmk::detail
