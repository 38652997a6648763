#include "core/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace lt {

LogLevel log_level() {
  static LogLevel lvl = [] {
    const char* e = std::getenv("LT_LOG_LEVEL");
    if (!e) return LogLevel::Info;
    if (!std::strcmp(e, "debug")) return LogLevel::Debug;
    if (!std::strcmp(e, "warn")) return LogLevel::Warn;
    if (!std::strcmp(e, "error")) return LogLevel::Error;
    return LogLevel::Info;
  }();
  return lvl;
}

void log_write(LogLevel lvl, const std::string& msg) {
  static std::mutex mu;
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> g(mu);
  std::fprintf(stderr, "[lazytrain %s] %s\n", names[int(lvl)], msg.c_str());
}

}  // namespace lt
