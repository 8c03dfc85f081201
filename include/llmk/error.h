// llmk::Error and the LLMK_CHECK macro: every rejected call throws an Error whose
// message names the op, the argument and the offending values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace llmk {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure reported by the CUDA runtime (as opposed to a rejected argument).
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Parts>
[[noreturn]] void throw_error(Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw Error(message.str());
}

}  // namespace detail
}  // namespace llmk

// LLMK_CHECK(cond, "rmsnorm: weight has ", n, " elements, expected ", d)
#define LLMK_CHECK(cond, ...)                        \
  do {                                               \
    if (!(cond)) ::llmk::detail::throw_error(__VA_ARGS__); \
  } while (0)
