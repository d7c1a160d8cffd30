// The CPU tests' check that a call throws braid::Error with a given code.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "braid/error.hpp"

namespace braid {

// Runs `call`, expects it to throw braid::Error with `code`; returns the message ("" when it did not throw).
inline std::string expect_error(const std::function<void()>& call, ErrorCode code) {
  try {
    call();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), code) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected braid::Error(" << error_code_name(code) << ")";
  return "";
}

}  // namespace braid
