// The protocol models (verify/models/*.pml, checked by spin under `ctest -L model`) against the code they model:
// each constant a model takes from the code equals the code's, and where a model reduces a constant on purpose
// (counter and flag widths, bounds), the relation its faithfulness argument rests on holds (NOTE [reduced widths]
// in each model). The models' #define lines are read with their #if/#ifdef blocks resolved for a configuration
// (the macros a run defines), as spin's preprocessor would.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "braid/device/sync_device.hpp"
#include "kernels/announced_launch.hpp"
#include "kernels/ll128_launch.hpp"
#include "kernels/ll_launch.hpp"
#include "kernels/matmul_sm90.hpp"
#include "kernels/pipeline_launch.hpp"

namespace braid {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot read " + path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A small evaluator for the preprocessor lines of a model: `defined(NAME)`, `!`, `&&`, `||` and parentheses in
// conditions; integers, names defined earlier, + - * / % << and parentheses in values.
class Expression {
 public:
  Expression(const std::string& text, const std::map<std::string, long long>& values, const std::set<std::string>& defined)
      : text_(text), values_(values), defined_(defined) {}

  long long condition() {
    const long long value = disjunction();
    finish();
    return value;
  }
  long long value() {
    const long long result = shift();
    finish();
    return result;
  }

 private:
  void skip_space() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  bool take(const std::string& token) {
    skip_space();
    if (text_.compare(at_, token.size(), token) != 0) return false;
    at_ += token.size();
    return true;
  }
  void finish() {
    skip_space();
    if (at_ != text_.size()) throw std::runtime_error("cannot read '" + text_ + "'");
  }
  std::string name() {
    skip_space();
    const size_t start = at_;
    while (at_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[at_])) || text_[at_] == '_')) ++at_;
    if (start == at_) throw std::runtime_error("a name expected in '" + text_ + "'");
    return text_.substr(start, at_ - start);
  }
  long long disjunction() {
    long long value = conjunction();
    while (take("||")) value = conjunction() || value;
    return value;
  }
  long long conjunction() {
    long long value = negation();
    while (take("&&")) value = negation() && value;
    return value;
  }
  long long negation() {
    if (take("!")) return !negation();
    if (take("(")) {
      const long long value = disjunction();
      if (!take(")")) throw std::runtime_error("')' expected in '" + text_ + "'");
      return value;
    }
    if (take("defined")) {
      const bool parenthesised = take("(");
      const std::string macro = name();
      if (parenthesised && !take(")")) throw std::runtime_error("')' expected in '" + text_ + "'");
      return defined_.count(macro) > 0 || values_.count(macro) > 0;
    }
    throw std::runtime_error("cannot read the condition '" + text_ + "'");
  }
  long long shift() {
    long long value = sum();
    while (take("<<")) value <<= sum();
    return value;
  }
  long long sum() {
    long long value = product();
    for (;;) {
      if (take("+")) {
        value += product();
      } else if (take("-")) {
        value -= product();
      } else {
        return value;
      }
    }
  }
  long long product() {
    long long value = atom();
    for (;;) {
      if (take("*")) {
        value *= atom();
      } else if (take("/")) {
        value /= atom();
      } else if (take("%")) {
        value %= atom();
      } else {
        return value;
      }
    }
  }
  long long atom() {
    if (take("(")) {
      const long long value = shift();
      if (!take(")")) throw std::runtime_error("')' expected in '" + text_ + "'");
      return value;
    }
    skip_space();
    if (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      size_t used = 0;
      const long long value = std::stoll(text_.substr(at_), &used, 0);
      at_ += used;
      return value;
    }
    const std::string macro = name();
    const auto found = values_.find(macro);
    if (found == values_.end()) throw std::runtime_error(macro + " is not a number in '" + text_ + "'");
    return found->second;
  }

  const std::string& text_;
  const std::map<std::string, long long>& values_;
  const std::set<std::string>& defined_;
  size_t at_ = 0;
};

// The numeric #defines of verify/models/<model>.pml in the configuration that defines `defined` (e.g. a run's
// -DWRAP), as spin's preprocessor would resolve them. Macros with parameters and values that are no integer
// expression (true, conditional expressions) are left out.
std::map<std::string, long long> model_constants(const std::string& model, std::set<std::string> defined = {}) {
  const std::string path = std::string(BRAID_SOURCE_DIR) + "/verify/models/" + model + ".pml";
  std::istringstream lines(read_text(path));
  std::map<std::string, long long> values;
  struct Block {
    bool parent_active, active, taken;
  };
  std::vector<Block> blocks;
  auto active = [&] { return blocks.empty() || blocks.back().active; };
  auto open = [&](bool condition) {
    const bool parent = active();
    blocks.push_back({parent, parent && condition, condition});
  };
  static const std::regex directive(R"(^\s*#\s*(\w+)\s*(.*?)\s*$)");
  static const std::regex define(R"(^([A-Za-z_]\w*)(\(?)\s*(.*)$)");
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (!std::regex_match(line, match, directive)) continue;
    const std::string kind = match[1];
    std::string rest = match[2];
    if (const size_t comment = rest.find("/*"); comment != std::string::npos) rest = rest.substr(0, comment);
    if (kind == "ifdef" || kind == "ifndef") {
      const std::string macro = std::regex_replace(rest, std::regex(R"(\s+)"), "");
      const bool is_defined = defined.count(macro) > 0 || values.count(macro) > 0;
      open(kind == "ifdef" ? is_defined : !is_defined);
    } else if (kind == "if") {
      open(Expression(rest, values, defined).condition() != 0);
    } else if (kind == "elif" || kind == "else") {
      if (blocks.empty()) throw std::runtime_error(path + ": #" + kind + " outside a block");
      Block& block = blocks.back();
      const bool condition = kind == "else" || Expression(rest, values, defined).condition() != 0;
      block.active = block.parent_active && !block.taken && condition;
      block.taken = block.taken || condition;
    } else if (kind == "endif") {
      if (blocks.empty()) throw std::runtime_error(path + ": #endif outside a block");
      blocks.pop_back();
    } else if (kind == "define" && active()) {
      std::smatch parts;
      const std::string definition = rest;
      if (!std::regex_match(definition, parts, define) || parts[2].length() > 0) continue;  // a macro with parameters
      const std::string macro = parts[1], text = parts[3];
      if (text.empty()) {
        defined.insert(macro);
        continue;
      }
      try {
        values[macro] = Expression(text, values, defined).value();
      } catch (const std::runtime_error&) {
        defined.insert(macro);  // not a number (true, a conditional expression): defined all the same
      }
    }
  }
  if (!blocks.empty()) throw std::runtime_error(path + ": unclosed #if");
  return values;
}

long long constant(const std::map<std::string, long long>& values, const std::string& name) {
  const auto found = values.find(name);
  if (found == values.end()) throw std::runtime_error("the model declares no " + name);
  return found->second;
}

// The signal pad's counters: 64 bits, compared by their difference (reached). The model's narrower counters are
// faithful while the largest distance between a slot and a waiter's target fits the signed window.
TEST(ModelConstants, SignalBarrier) {
  const auto model = model_constants("signal_barrier");
  using Counter = std::remove_pointer_t<decltype(device::SignalPad::local)>;
  static_assert(std::is_unsigned_v<Counter>);
  EXPECT_EQ(sizeof(Counter) * 8, 64u) << "the models take the pad's counters as 64-bit; update NOTE [reduced widths]";
  const long long bits = constant(model, "COUNTER_BITS"), mod = constant(model, "COUNTER_MOD");
  EXPECT_EQ(mod, 1LL << bits);
  EXPECT_LT(bits, static_cast<long long>(sizeof(Counter) * 8));
  EXPECT_LT(constant(model, "BARRIER_WINDOW"), mod / 2) << "a barrier's distance must fit the signed window";
  EXPECT_GE(constant(model, "COUNTER_START") + constant(model, "CALLS"), mod) << "the calls must wrap the counters";
  EXPECT_EQ(constant(model, "HALVES"), 2) << "staged.cuh alternates two staging halves by the epoch's parity";
  EXPECT_GE(constant(model, "RANKS"), 3);
  EXPECT_GE(constant(model, "CALLS"), 3);
}

TEST(ModelConstants, PipelineFifo) {
  const auto model = model_constants("pipeline_fifo");
  EXPECT_EQ(constant(model, "SLOTS"), kernels::kFifoDepth) << "the model's FIFO depth is the code's";
  EXPECT_EQ(constant(model, "CREDITS"), kernels::kFifoDepth) << "credits granted at init: kFifoDepth";
  const long long bits = constant(model, "COUNTER_BITS"), mod = constant(model, "COUNTER_MOD");
  const long long slots = constant(model, "SLOTS");
  EXPECT_EQ(mod, 1LL << bits);
  EXPECT_EQ(mod % slots, 0) << "count mod SLOTS must be the real slot";
  EXPECT_EQ(constant(model, "CREDIT_WINDOW"), constant(model, "CREDITS"));
  EXPECT_LE(constant(model, "CREDIT_WINDOW"), mod / 2) << "a sender's distance must fit the signed window";
  const long long pieces = constant(model, "CALLS") * constant(model, "ROUNDS");
  EXPECT_GT(pieces, slots) << "the calls must reuse every slot";
  EXPECT_GE(constant(model, "COUNTER_START") + pieces, mod) << "the calls must wrap the counters";
  EXPECT_GE(constant(model, "RANKS"), 3);
  EXPECT_GE(constant(model, "CALLS"), 3);
  // The mutant that grants one credit more widens the counters, so that the window holds its distance too.
  const auto extra = model_constants("pipeline_fifo", {"MUTANT_EXTRA_CREDIT"});
  EXPECT_EQ(constant(extra, "CREDITS"), slots + 1);
  EXPECT_LE(constant(extra, "CREDITS"), constant(extra, "COUNTER_MOD") / 2);
  EXPECT_EQ(constant(extra, "COUNTER_MOD") % slots, 0);
}

// LL: a line is 8 payload bytes in two halves of 4 data bytes and a 4-byte flag: 32 flag bits; the re-stamping
// period must stay below the flag's range (the model's too), and two parities alternate.
TEST(ModelConstants, LLLines) {
  const auto model = model_constants("ll_lines");
  const long long real_flag_bits = static_cast<long long>((kernels::kLLWireBytes - kernels::kLLLineBytes) / 2 * 8);
  EXPECT_EQ(real_flag_bits, 32);
  EXPECT_EQ(kernels::kLLRestampPeriod % 2, 0u) << "one re-stamping call of each parity a period";
  EXPECT_LT(kernels::kLLRestampPeriod, uint64_t(1) << real_flag_bits);
  const long long flag_bits = constant(model, "FLAG_BITS"), flag_mod = constant(model, "FLAG_MOD");
  const long long period = constant(model, "RESTAMP_PERIOD");
  EXPECT_EQ(flag_mod, 1LL << flag_bits);
  EXPECT_LT(flag_bits, real_flag_bits);
  EXPECT_EQ(period % 2, 0);
  EXPECT_LT(period, flag_mod) << "a polled line is at most a period old: the period must stay below the flag's range";
  EXPECT_GT(period, 2) << "a period of 2 would re-stamp on every call, which the code does not";
  const int world = 3;
  const size_t slot = (kernels::kLLMaxPayloadBytes / kernels::kLLLineBytes + 1) * kernels::kLLWireBytes;
  EXPECT_EQ(kernels::kLLSlotBytes, slot) << "a slot: the lines a call may send, then the plan line";
  EXPECT_EQ(kernels::ll_area_bytes(world), world * slot * static_cast<size_t>(constant(model, "PARITIES")));
  EXPECT_GE(constant(model, "RANKS"), 3);
  EXPECT_GE(constant(model, "CALLS"), 3);
  // The wrap configuration runs past the flag of the zeroed area (sequence FLAG_MOD) and the first wrap.
  const auto wrap = model_constants("ll_lines", {"WRAP"});
  EXPECT_GT(constant(wrap, "CALLS"), constant(wrap, "FLAG_MOD"));
  // LL128: the flag is the whole 64-bit sequence (the line's last 8 bytes): it never wraps, nor in the model.
  EXPECT_EQ((kernels::kLL128LineBytes - kernels::kLL128LinePayload) * 8, 64u);
  EXPECT_EQ(kernels::ll128_area_bytes(world), 2 * world * kernels::kLL128SlotBytes) << "two parities";
  const auto ll128 = model_constants("ll_lines", {"LL128"});
  EXPECT_GT(constant(ll128, "FLAG_MOD"), constant(ll128, "CALLS") + 1);
}

// CallOrder keeps kMaxCaptureChains chains (a private constant, read from its header): the model keeps one for
// every capture it opens, as the code does below its bound.
TEST(ModelConstants, CallOrder) {
  const auto model = model_constants("call_order");
  const std::string header = read_text(std::string(BRAID_SOURCE_DIR) + "/src/sync/call_order.hpp");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(header, match, std::regex(R"(kMaxCaptureChains\s*=\s*(\d+))")))
      << "src/sync/call_order.hpp no longer declares kMaxCaptureChains: update verify/models/call_order.pml";
  const long long real_chains = std::stoll(match[1]);
  EXPECT_GE(constant(model, "MAX_CHAINS"), constant(model, "CAPTURES")) << "no chain is pushed out in the model";
  EXPECT_GE(real_chains, constant(model, "CAPTURES")) << "nor in the code, for as many captures";
  EXPECT_GE(constant(model, "STREAMS"), 3);
  EXPECT_GE(constant(model, "OPS"), 7) << "the smallest program that holds a capture's two calls with a call between";
}

// The agreement model's failure code is the code's; its stopped plan is none of the plans it runs, as
// kStoppedPlan (every bit set) is no call's plan word.
TEST(ModelConstants, Agreement) {
  const auto model = model_constants("agreement");
  EXPECT_EQ(constant(model, "MISMATCH"), static_cast<long long>(device::kErrorPlanMismatch));
  EXPECT_NE(device::kErrorPlanMismatch, device::kErrorTimeout);
  EXPECT_EQ(device::kStoppedPlan, ~uint64_t(0));
  const long long stopped = constant(model, "STOPPED_PLAN");
  for (const char* plan : {"BARRIER_PLAN", "OTHER_BARRIER_PLAN", "FIFO_PLAN"}) {
    EXPECT_NE(constant(model, plan), stopped) << plan;
    EXPECT_NE(constant(model, plan), 0) << plan << ": plan 0 announces nothing";
  }
  EXPECT_GE(constant(model, "RANKS"), 3);
  EXPECT_GE(constant(model, "CALLS"), 2) << "a call enqueued after the failing one";
}

// The host-failure model's codes are the code's: a kernel's mismatch and the host's abort (the host's other codes,
// a peer's exit and a revocation, take the same path).
TEST(ModelConstants, HostFailure) {
  const auto model = model_constants("host_failure");
  EXPECT_EQ(constant(model, "MISMATCH"), static_cast<long long>(device::kErrorPlanMismatch));
  EXPECT_EQ(constant(model, "HOST_CODE"), static_cast<long long>(device::kErrorAborted));
  EXPECT_NE(constant(model, "NONE"), constant(model, "HOST_CODE"));
}

TEST(ModelConstants, AnnouncedGather) {
  const auto model = model_constants("announced_gather");
  EXPECT_EQ(constant(model, "HALVES"), 2) << "the staged rounds alternate the two staging halves";
  EXPECT_GE(constant(model, "ROUNDS"), 2) << "a round must follow a round for the halves' reuse";
  EXPECT_EQ(kernels::announcement_words(1, 1), 2u * kernels::kAnnouncedBuffers)
      << "the code keeps an announcement slot a barrier parity (and buffer), as the model";
  EXPECT_EQ(constant(model, "COUNTER_MOD") % 2, 0) << "the counters' wrap must keep the parity of the slots";
  EXPECT_GE(constant(model, "ANNOUNCING_CALLS"), 2) << "a slot is written again by a later call";
}

// The automatic exposure's model: enough allocations, handle values and ids for every replacement it makes, and
// more than one page (the check must cover every page, not the first).
TEST(ModelConstants, AutomaticExposure) {
  const auto model = model_constants("automatic_exposure");
  EXPECT_GE(constant(model, "PAGES"), 2);
  EXPECT_EQ(constant(model, "ALLOCATIONS"), constant(model, "PAGES") + constant(model, "REPLACES") + 1)
      << "index 0 is none, then the first pages and one allocation a replacement";
  EXPECT_GE(constant(model, "HANDLES"), 2 * constant(model, "PAGES") + 1)
      << "the program's and braid's retained allocations, and a fresh value beyond them";
  EXPECT_GE(constant(model, "IDS"), constant(model, "REPLACES") + 2) << "index 0 is none, then one id an exposure";
  EXPECT_GE(constant(model, "CALLS"), constant(model, "REPLACES") + 2) << "a call after each replacement";
}

// The models of an exchange of braid's Hopper GEMM (the epilogue reduce-scatter's, the all-gather under the loads'):
// a received block and a flag for each peer, a world the kernel takes, and calls enough for a rank a call ahead of
// a peer that still reads.
TEST(ModelConstants, HopperGemmExchanges) {
  for (const char* name : {"epilogue_exchange", "loads_gather"}) {
    const auto model = model_constants(name);
    EXPECT_GE(constant(model, "RANKS"), 3)
        << name << ": a rank receives from two peers, one of which may be a call ahead";
    EXPECT_LE(constant(model, "RANKS"), kernels::kSm90ExchangeMaxWorld) << name;
    EXPECT_EQ(constant(model, "SLOTS"), constant(model, "RANKS") - 1)
        << name << ": an area holds a received block for each peer (kernels::sm90_exchange_bytes)";
    EXPECT_GE(constant(model, "CALLS"), 3)
        << name << ": a block is rewritten by a later call while a slow peer may still read";
  }
  constexpr kernels::Sm90ExchangeKind kReduceScatter = kernels::Sm90ExchangeKind::kReduceScatter;
  EXPECT_EQ(kernels::sm90_exchange_bytes(kReduceScatter, 3, 128, 256, DataType::kBFloat16, 0),
            kernels::kSm90ExchangeFlagsOffset + 2u * 128 * 256 * 2);
  EXPECT_EQ(kernels::sm90_exchange_bytes(kReduceScatter, 3, 128, 512, DataType::kBFloat16, 0),
            kernels::kSm90ExchangeFlagsOffset + 2u * 128 * 512 * 2);
}

// The reduce-scatter by the copy engines' model: a world the kernel takes, a received block and a products block (with
// their counts and flags) for each peer, chunks as many as the control words hold, calls enough for a rank a call
// ahead of a peer that still reads, and a gate that waits for the counts of every warp of a chunk.
TEST(ModelConstants, EngineExchange) {
  const auto model = model_constants("engine_exchange");
  EXPECT_GE(constant(model, "RANKS"), 3) << "a rank receives from two peers, one of which may be a call ahead";
  EXPECT_LE(constant(model, "RANKS"), kernels::kSm90ExchangeMaxWorld);
  EXPECT_EQ(constant(model, "SLOTS"), constant(model, "RANKS") - 1)
      << "an area holds a received block and a products block for each peer (kernels::sm90_exchange_bytes)";
  EXPECT_GE(constant(model, "CALLS"), 3) << "a block is rewritten by a later call while a slow peer may still read";
  EXPECT_GE(constant(model, "CHUNKS"), 2) << "the gates, copies and posts take a block's chunks one after the other";
  EXPECT_LE(constant(model, "CHUNKS"), static_cast<long long>(kernels::kSm90EngineMaxChunks));
  EXPECT_GE(kernels::sm90_engine_chunks(2048), 2u) << "the code splits a block into several chunks, as the model";
  EXPECT_EQ(constant(model, "TILES"), constant(model, "SLOTS") * constant(model, "CHUNKS") * constant(model, "WARPS"));
  EXPECT_GE(constant(model, "WARPS"), 2) << "a chunk's rows are stored and counted by several warps";
  EXPECT_GE(kernels::sm90_engine_ready_target(128, 8), 2u) << "even the smallest chunk counts several warps";
  EXPECT_EQ(constant(model, "TARGET"), constant(model, "WARPS")) << "the gate waits for every count of the chunk";
  const auto low = model_constants("engine_exchange", {"MUTANT_LOW_TARGET"});
  EXPECT_LT(constant(low, "TARGET"), constant(low, "WARPS"));
  EXPECT_EQ(kernels::sm90_exchange_bytes(kernels::Sm90ExchangeKind::kEngineReduceScatter, 3, 128, 256,
                                         DataType::kBFloat16, 0),
            kernels::kSm90ExchangeFlagsOffset + 2u * 2 * 128 * 256 * 2)
      << "received blocks, then the products for each peer";
}

// Every model reads: its #if blocks close and its numeric constants evaluate.
TEST(ModelConstants, EveryModelReads) {
  for (const char* model : {"signal_barrier", "pipeline_fifo", "ll_lines", "call_order", "agreement", "host_failure",
                            "announced_gather", "automatic_exposure", "epilogue_exchange", "loads_gather",
                            "engine_exchange"}) {
    EXPECT_NO_THROW(model_constants(model)) << model;
  }
}

}  // namespace
}  // namespace braid
