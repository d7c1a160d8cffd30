// The BRAID_* table: parsing, typed values, unknown names with close matches, and docs/config.md in step.
#include <gtest/gtest.h>

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/config.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace braid {
namespace {

TEST(Config, DefaultsApplyWhenUnset) {
  Config config = Config::parse({}, nullptr);
  EXPECT_EQ(config.string("BRAID_LOG_LEVEL"), "warn");
  EXPECT_DOUBLE_EQ(*config.real("BRAID_TIMEOUT_S"), 300.0);
  EXPECT_EQ(config.integer("BRAID_STORE_PORT_OFFSET"), 1);
  EXPECT_FALSE(config.integer("BRAID_RANK").has_value());
  EXPECT_FALSE(config.is_set("BRAID_RANK"));
}

TEST(Config, SetValuesParseByType) {
  Config config = Config::parse({{"BRAID_TIMEOUT_S", "2.5"}, {"BRAID_RANK", "3"}, {"BRAID_LOG_LEVEL", "debug"},
                                 {"BRAID_STORE_ADDR", "10.0.0.1:29500"}, {"OTHER", "x"}},
                                nullptr);
  EXPECT_DOUBLE_EQ(*config.real("BRAID_TIMEOUT_S"), 2.5);
  EXPECT_EQ(config.integer("BRAID_RANK"), 3);
  EXPECT_EQ(config.string("BRAID_LOG_LEVEL"), "debug");
  EXPECT_EQ(config.string("BRAID_STORE_ADDR"), "10.0.0.1:29500");
  EXPECT_TRUE(config.is_set("BRAID_RANK"));
}

void expect_invalid(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error containing '" << fragment << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
  }
}

TEST(Config, MalformedValuesNameTheVariable) {
  Config config = Config::parse({{"BRAID_TIMEOUT_S", "soon"}, {"BRAID_RANK", "1x"}, {"BRAID_LOG_LEVEL", "loud"}}, nullptr);
  expect_invalid([&] { config.real("BRAID_TIMEOUT_S"); }, "BRAID_TIMEOUT_S='soon' is not a number");
  expect_invalid([&] { config.integer("BRAID_RANK"); }, "BRAID_RANK='1x' is not an integer");
  expect_invalid([&] { config.string("BRAID_LOG_LEVEL"); }, "BRAID_LOG_LEVEL='loud' is not one of error|warn|info|debug|trace");
}

TEST(Config, TimeoutsOutsideTheirRangeNameTheOption) {
  EXPECT_DOUBLE_EQ(timeout_seconds(2.5, "options.timeout_s"), 2.5);
  EXPECT_DOUBLE_EQ(timeout_seconds(kMaxTimeoutS, "options.timeout_s"), kMaxTimeoutS);
  EXPECT_GT(timeout_seconds(0.0, "options.timeout_s"), 0.0);  // 0: BRAID_TIMEOUT_S
  EXPECT_DOUBLE_EQ(timeout_seconds(kMinTimeoutS, "options.timeout_s"), kMinTimeoutS);
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 1e7,
                     1e-300, 1e-4}) {
    expect_invalid([&] { timeout_seconds(bad, "options.timeout_s"); }, "'options.timeout_s'");
  }
}

// A value outside a variable's range is refused naming the variable, never narrowed (narrowed,
// BRAID_DEVICE=4294967296 would be GPU 0).
TEST(Config, IntegersOutsideTheirRangeNameTheVariable) {
  Config config = Config::parse({{"BRAID_DEVICE", "4294967296"}, {"BRAID_RANK", "-1"}, {"BRAID_LOCAL_RANK", "3"}}, nullptr);
  expect_invalid([&] { config.integer_in("BRAID_DEVICE", 0, INT_MAX); }, "BRAID_DEVICE=4294967296 is out of range");
  expect_invalid([&] { config.integer_in("BRAID_RANK", 0, INT_MAX); }, "BRAID_RANK=-1 is out of range");
  EXPECT_EQ(config.integer_in("BRAID_LOCAL_RANK", 0, INT_MAX), 3);
  EXPECT_EQ(config.integer_in("BRAID_LOCAL_SIZE", 0, INT_MAX), std::nullopt);  // unset
}

TEST(Config, NamesOutsideTheTableAreAnInternalError) {
  Config config = Config::parse({}, nullptr);
  try {
    config.string("BRAID_NOT_A_VARIABLE");
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInternal);
  }
}

TEST(Config, UnknownBraidNamesWarnWithCloseMatches) {
  std::vector<std::string> warnings;
  Config::parse({{"BRAID_TIMEOUT", "5"}, {"BRAID_LOG_LEVLE", "info"}, {"BRAID_ZZZZZZZZZZZZZZZ", "1"}, {"NOT_BRAID", "1"}},
                &warnings);
  ASSERT_EQ(warnings.size(), 3u);
  std::string all;
  for (const std::string& warning : warnings) all += warning + "\n";
  EXPECT_NE(all.find("BRAID_TIMEOUT is ignored; did you mean BRAID_TIMEOUT_S?"), std::string::npos) << all;
  EXPECT_NE(all.find("BRAID_LOG_LEVLE is ignored; did you mean BRAID_LOG_LEVEL?"), std::string::npos) << all;
  EXPECT_NE(all.find("unknown environment variable BRAID_ZZZZZZZZZZZZZZZ is ignored\n"), std::string::npos) << all;
}

// The first log call of a process with an unknown BRAID_* variable set warns and returns, rather than warn from
// inside the log level's own static initialisation and wait on itself for ever. The death test's child is a fresh
// process (threadsafe style re-executes the binary), so its first log call is really the first; an alarm turns
// a hang into a failure.
TEST(ConfigDeathTest, FirstLogCallWithAnUnknownVariableWarnsAndReturns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("BRAID_NOT_A_REAL_VARIABLE", "1", 1);
        alarm(20);
        BRAID_WARN("first line of this process");
        std::fflush(stderr);
        std::_Exit(log_enabled(LogLevel::kWarn) ? 0 : 3);
      },
      testing::ExitedWithCode(0), "unknown environment variable BRAID_NOT_A_REAL_VARIABLE is ignored");
}

TEST(Config, CloseNamesAreRankedByDistance) {
  std::vector<std::string> close = close_config_names("BRAID_RANKK");
  ASSERT_FALSE(close.empty());
  EXPECT_EQ(close.front(), "BRAID_RANK");
}

TEST(Config, EveryTableEntryIsDocumentedInDocsConfigMd) {
  std::ifstream file(std::string(BRAID_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(file.good()) << "docs/config.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  for (const ConfigVar& var : config_table()) {
    std::string row = std::string("| `") + var.name + "` |";
    EXPECT_NE(text.str().find(row), std::string::npos) << var.name << " has no row in docs/config.md";
    if (var.default_value != nullptr) {
      std::string with_default = row + " " + std::string(var.type == ConfigType::kEnum ? "enum" : var.type == ConfigType::kInt ? "int" : var.type == ConfigType::kDouble ? "number" : "string") + " | `" + var.default_value + "` |";
      EXPECT_NE(text.str().find(with_default), std::string::npos) << var.name << ": docs/config.md should read: " << with_default;
    }
  }
}

}  // namespace
}  // namespace braid
