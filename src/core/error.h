// Errors with context. Every user-facing failure is an lt::Error whose message
// names the thing (file, field, tensor), and the expected vs actual value.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace lt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace lt

// LT_CHECK(cond, "format {}", args...): throws lt::Error with the message when cond is false.
#define LT_CHECK(cond, ...)            \
  do {                                 \
    if (!(cond)) ::lt::fail(__VA_ARGS__); \
  } while (0)
