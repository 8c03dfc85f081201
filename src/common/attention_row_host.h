// The attention of one query row in double: the algorithm of the CPU references of the
// prefill and decode attention (attention/attention_cpu.cc,
// decode/attention_decode_cpu.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/attention_variants.h"

namespace llmk::detail {

// Head h's attention sink as attend_row_host takes it (-inf: none).
inline double sink_host(const AttentionVariants& v, int h) {
  return v.sinks ? double(v.sinks[h]) : -std::numeric_limits<double>::infinity();
}

// The score of a dot product: scale * dot, then softcap * tanh(. / softcap) when softcap > 0.
inline double attention_score_host(double dot, double scale, double softcap) {
  const double s = dot * scale;
  return softcap > 0 ? softcap * std::tanh(s / softcap) : s;
}

// Every score (attention_score_host) of the `keys` visible keys, their max, the exponentials
// and the weighted sum of the values value(j, c), c < d; `sink` (-inf: none) joins the
// denominator without a value. Leaves the normalized output in out[0, d) (0 for a row without
// keys) and returns the natural-log log-sum-exp, the sink's term included (-inf without keys
// and sink). `scores` is scratch space.
template <class Dot, class Value>
double attend_row_host(int64_t keys, int d, double scale, double softcap, double sink, Dot&& dot, Value&& value,
                       std::vector<double>& scores, std::vector<double>& out) {
  scores.resize(static_cast<size_t>(keys));
  out.assign(static_cast<size_t>(d), 0.0);
  if (keys == 0 && std::isinf(sink)) return -std::numeric_limits<double>::infinity();
  double max_score = sink;
  for (int64_t j = 0; j < keys; ++j) {
    scores[j] = attention_score_host(dot(j), scale, softcap);
    max_score = std::max(max_score, scores[j]);
  }
  double sum = std::exp(sink - max_score);
  for (int64_t j = 0; j < keys; ++j) {
    const double w = std::exp(scores[j] - max_score);
    sum += w;
    for (int c = 0; c < d; ++c) out[c] += w * value(j, c);
  }
  for (int c = 0; c < d; ++c) out[c] /= sum;
  return max_score + std::log(sum);
}

}  // namespace llmk::detail
