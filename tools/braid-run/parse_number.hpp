// A number from the whole of a text, or nothing: braid-run's option values and the pids of /proc's entries.
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <system_error>

namespace braid::run {

template <typename T>
std::optional<T> parse_number(const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

}  // namespace braid::run
