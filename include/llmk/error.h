// llmk::Error and the LLMK_CHECK macro: every rejected call throws an Error whose
// message names the op, the argument and the offending values.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// Message pieces are formatted without iostreams: a module linked against a static copy of
// libstdc++ (as GCC toolsets build them) can crash in iostream locale code when another
// libstdc++ is loaded in the same process.
inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, char v) { s += v; }
inline void append(std::string& s, bool v) { s += v ? "true" : "false"; }
inline void append(std::string& s, double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  s += buf;
}
inline void append(std::string& s, const void* v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", v);
  s += buf;
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
void append(std::string& s, T v) {
  s += std::to_string(v);
}
template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
void append(std::string& s, T v) {
  append(s, static_cast<double>(v));
}

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::string message;
  (append(message, parts), ...);
  return message;
}

template <class... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
  throw Error(concat(parts...));
}

}  // namespace detail
}  // namespace llmk

// LLMK_CHECK(cond, "rmsnorm: weight has ", n, " elements, expected ", d)
#define LLMK_CHECK(cond, ...)                        \
  do {                                               \
    if (!(cond)) ::llmk::detail::throw_error(__VA_ARGS__); \
  } while (0)
