// The LLMK_*_PATH switches (LLMK_NORM_PATH, LLMK_ATTENTION_PATH, LLMK_GEMM_PATH): test and
// benchmark switches that force one of a family's kernels, read on every call so that one
// process can run each path. One parser for all of them.
#pragma once

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "llmk/error.h"

namespace llmk::detail {

// The index in `names` of the environment variable `var`'s value; unset, empty or "auto"
// is 0 (names[0] must be "auto"). Another value is an error naming `op`, the variable and
// the accepted names.
inline int env_path(const char* op, const char* var, std::initializer_list<const char*> names) {
  const char* env = std::getenv(var);
  if (env == nullptr || *env == '\0') return 0;
  int index = 0;
  for (const char* name : names) {
    if (std::strcmp(env, name) == 0) return index;
    ++index;
  }
  std::string accepted;
  for (const char* name : names) accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  throw_error(op, ": ", var, "=", env, " is not one of ", accepted);
}

}  // namespace llmk::detail
