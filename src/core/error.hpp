// Internal helpers to raise braid::Error with a formatted message.
#pragma once

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "braid/error.hpp"

namespace braid {

// Throws Error(code, message) with the message formatted by fmt.
template <typename... Args>
[[noreturn]] void raise(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Throws kInvalidArgument naming the argument: "<function>: argument '<name>' <problem>".
template <typename... Args>
[[noreturn]] void raise_invalid_argument(const char* function, const char* argument,
                                         fmt::format_string<Args...> problem, Args&&... args) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("{}: argument '{}' {}", function, argument,
                          fmt::format(problem, std::forward<Args>(args)...)));
}

// Throws kSystemError for a failed OS call, with errno's text.
[[noreturn]] inline void raise_system(const char* call, int err, const std::string& context) {
  throw Error(ErrorCode::kSystemError,
              fmt::format("{} failed: {} (errno {}){}{}", call, std::strerror(err), err,
                          context.empty() ? "" : " while ", context));
}

}  // namespace braid
