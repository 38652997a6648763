// Minimal leveled logging to stderr. LT_LOG_LEVEL=debug|info|warn|error.
#pragma once
#include <fmt/format.h>

namespace lt {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };
LogLevel log_level();
void log_write(LogLevel lvl, const std::string& msg);

template <typename... A> void log_debug(fmt::format_string<A...> f, A&&... a) {
  if (log_level() <= LogLevel::Debug) log_write(LogLevel::Debug, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void log_info(fmt::format_string<A...> f, A&&... a) {
  if (log_level() <= LogLevel::Info) log_write(LogLevel::Info, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void log_warn(fmt::format_string<A...> f, A&&... a) {
  if (log_level() <= LogLevel::Warn) log_write(LogLevel::Warn, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace lt
