// CPU test of braid-bench's command line (ctest braid_bench_options, label cpu): nccl-tests' flags keep their
// meanings, braid's own flags are long options, and bad values stop the run with a message before it starts.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "options.hpp"

namespace braid::bench {
namespace {

// parse_options on "braid-bench <args>": its exit code (nothing: the run would start) and the options.
std::optional<int> parse(std::vector<std::string> args, Options& options) {
  args.insert(args.begin(), "braid-bench");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return parse_options(static_cast<int>(argv.size()), argv.data(), options);
}

TEST(BenchOptions, AnNcclTestsCommandLineKeepsItsMeanings) {
  Options o;
  ASSERT_EQ(parse({"-b", "8", "-e", "128M", "-f", "2", "-g", "2", "-c", "3", "-n", "7", "-w", "4", "-d", "float", "-o",
                   "max", "-r", "1", "-z", "1", "-G", "20", "-a", "1", "-N", "2", "-R", "2", "-T", "30"},
                  o),
            std::nullopt);
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, size_t(128) << 20);
  EXPECT_EQ(o.step_factor, 2u);
  EXPECT_EQ(o.threads, 2);  // -g 2 with one thread: two ranks
  EXPECT_EQ(o.check_iters, 3);
  EXPECT_TRUE(o.check);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.warmup_iters, 4);
  EXPECT_EQ(o.type, DataType::kFloat32);
  EXPECT_EQ(o.op, ReduceOp::kMax);
  EXPECT_EQ(o.root, 1);
  EXPECT_TRUE(o.blocking);
  EXPECT_EQ(o.graph_calls, 20);
  EXPECT_EQ(o.average, 1);
  EXPECT_EQ(o.run_cycles, 2);
  EXPECT_TRUE(o.symmetric);  // -R 2: symmetric buffers
  EXPECT_FALSE(o.registered);
  EXPECT_EQ(o.timeout_s, 30.0);
  EXPECT_EQ(o.collectives, std::vector<Collective>{Collective::kAllReduce});
}

TEST(BenchOptions, ThreadsTimesGpusAndLongOptions) {
  Options o;
  ASSERT_EQ(parse({"-t", "2", "-g", "2", "--coll", "all", "-c", "0", "-R", "1"}, o), std::nullopt);
  EXPECT_EQ(o.threads, 4);
  EXPECT_EQ(o.collectives.size(), std::size(kAllCollectives));
  EXPECT_FALSE(o.check);
  EXPECT_TRUE(o.registered);
  EXPECT_FALSE(o.blocking);
  EXPECT_EQ(o.average, 3);  // the max over ranks unless -a says otherwise
}

TEST(BenchOptions, VmmBuffersRegisteredOrNot) {
  Options o;
  ASSERT_EQ(parse({"--vmm", "1", "--register", "1"}, o), std::nullopt);
  EXPECT_TRUE(o.vmm);
  EXPECT_TRUE(o.registered);
  EXPECT_STREQ(buffers_name(o), "registered-vmm");
  Options plain;
  ASSERT_EQ(parse({"--vmm", "1"}, plain), std::nullopt);
  EXPECT_STREQ(buffers_name(plain), "vmm");
  Options malloced;
  ASSERT_EQ(parse({}, malloced), std::nullopt);
  EXPECT_STREQ(buffers_name(malloced), "cudaMalloc");
}

TEST(BenchOptions, StepBytesAddInsteadOfMultiplying) {
  Options o;
  ASSERT_EQ(parse({"-b", "1M", "-e", "4M", "-i", "1M"}, o), std::nullopt);
  const size_t m = size_t(1) << 20;
  EXPECT_EQ(o.sizes(), (std::vector<size_t>{m, 2 * m, 3 * m, 4 * m}));
  Options f;
  ASSERT_EQ(parse({"-b", "1K", "-e", "8K", "-f", "2"}, f), std::nullopt);
  EXPECT_EQ(f.sizes(), (std::vector<size_t>{1024, 2048, 4096, 8192}));
}

TEST(BenchOptions, BadValuesStopTheRunBeforeItStarts) {
  const std::vector<std::vector<std::string>> bad{
      {"-n", "0"},                     // below the range
      {"-c", "allreduce"},             // -c counts checked calls (nccl-tests); --coll names the collective
      {"-z", "2"},                     // 0 or 1
      {"-a", "4"},                     // 0 to 3
      {"-T", "-1"},                    // seconds above 0
      {"-i", "1M", "-f", "2"},         // one step rule
      {"-R", "1", "--register", "1"},  // one way to say the buffers
      {"--symmetric", "1", "--register", "1"},
      {"--symmetric", "1", "--vmm", "1"},
      {"--json", "/nonexistent-directory/rows.json"},  // checked at the start
      {"-b", "2M", "-e", "1M"},
  };
  for (const std::vector<std::string>& args : bad) {
    Options o;
    const std::optional<int> code = parse(args, o);
    ASSERT_TRUE(code.has_value()) << args[0];
    EXPECT_NE(*code, 0) << args[0];
  }
}

TEST(BenchOptions, RankTimesCombineAsAverageSays) {
  const std::vector<double> times{3.0, 1.0, 2.0};
  EXPECT_EQ(combine_rank_times(times, 0), 3.0);  // rank 0's
  EXPECT_EQ(combine_rank_times(times, 1), 2.0);  // the mean
  EXPECT_EQ(combine_rank_times(times, 2), 1.0);  // the min
  EXPECT_EQ(combine_rank_times(times, 3), 3.0);  // the max
}

}  // namespace
// README.md and --help agree: every option --help lists is in the README under one of its names, and a table row
// of the README for a single option states the default --help prints, in parentheses.
TEST(BenchOptions, TheReadmeAndHelpAgree) {
  Options options;
  ::testing::internal::CaptureStdout();
  ASSERT_EQ(parse({"--help"}, options), std::optional<int>(0));
  const std::string help = ::testing::internal::GetCapturedStdout();
  std::ifstream file(std::string(BRAID_SOURCE_DIR) + "/tools/braid-bench/README.md");
  ASSERT_TRUE(file.good()) << "tools/braid-bench/README.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  const std::string readme = text.str();
  auto in_readme = [&](const std::string& name) {
    const std::regex token("[`/ ,]" + std::regex_replace(name, std::regex("-"), "\\-") + "([`/ ,=]|$)");
    return std::regex_search(readme, token);
  };
  const std::regex option_line(R"(^  ((-[A-Za-z],)?--?[A-Za-z][A-Za-z0-9_-]*(,--?[A-Za-z][A-Za-z0-9_-]*)*)([^\n]*))");
  int options_seen = 0;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (!std::regex_search(line, match, option_line)) continue;
    std::vector<std::string> names;
    std::stringstream list(match[1].str());
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
    if (names.back() == "--help") continue;
    ++options_seen;
    bool found = false;
    for (const std::string& name : names) found = found || in_readme(name);
    EXPECT_TRUE(found) << match[1] << " (braid-bench --help) is in no table or line of tools/braid-bench/README.md";
    std::smatch with_default;
    const std::string rest = match[4].str();
    if (names.size() != 1 || !std::regex_search(rest, with_default, std::regex(R"(=\[?([^\] ]+)\]?)"))) continue;
    const std::regex row("\\| `" + std::regex_replace(names[0], std::regex("-"), "\\-") + "[^`|]*` \\|([^\\n]*)");
    std::smatch readme_row;
    if (!std::regex_search(readme, readme_row, row)) continue;  // listed beside other options: no single default
    EXPECT_NE(readme_row[1].str().find("(" + with_default[1].str() + ")"), std::string::npos)
        << names[0] << ": --help gives the default " << with_default[1] << ", README.md's row reads:" << readme_row[1];
  }
  EXPECT_GE(options_seen, 30) << help;
}

}  // namespace braid::bench
