#include "memory/exposure.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <string_view>
#include <exception>

#include "core/error.hpp"
#include "core/log.hpp"

namespace braid::detail {

namespace {

constexpr double kHelperWaitS = 1.0;  // how long one blocking read of the mailbox lasts (the helper then looks again)
constexpr double kAnswerRoundS = 0.2;  // how long the owner waits for answers before it looks for peers gone
// What a peer whose service is gone counts as having answered: it holds nothing of this rank's any more.
constexpr std::string_view kGoneAnswer = "gone";

bool parse_number(std::string_view text, uint64_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

ExposureService::ExposureService(const std::function<std::unique_ptr<StoreClient>()>& connect, std::string prefix,
                                 int rank, int size, double timeout_s, ExposureImporter& importer)
    : prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      timeout_s_(timeout_s),
      importer_(importer),
      helper_store_(connect()),
      caller_store_(connect()) {
  helper_ = std::thread([this] { serve(); });
}

ExposureService::~ExposureService() {
  stopping_ = true;
  helper_store_->interrupt();  // a blocking read of the mailbox ends at once
  if (helper_.joinable()) helper_.join();
  try {
    caller_store_->set(gone_key(rank_), "1");
  } catch (const Error& error) {
    BRAID_INFO("exposure: rank {} could not tell its peers that its helper stopped: {}", rank_, error.what());
  }
}

// A request: "<kind> <owner> <id>\n" and, for an exposure, the descriptor's bytes.
std::string ExposureService::pack(const Request& request) {
  return fmt::format("{} {} {}\n", static_cast<char>(request.kind), request.owner, request.id) + request.descriptor;
}

std::optional<ExposureService::Request> ExposureService::unpack(const std::string& message) {
  const size_t line_end = message.find('\n');
  if (line_end == std::string::npos || line_end < 5 || message[1] != ' ') return std::nullopt;
  const char kind = message[0];
  if (kind != static_cast<char>(Kind::kExpose) && kind != static_cast<char>(Kind::kWithdraw)) return std::nullopt;
  const std::string_view header(message.data() + 2, line_end - 2);
  const size_t space = header.find(' ');
  uint64_t owner = 0, id = 0;
  if (space == std::string_view::npos || !parse_number(header.substr(0, space), owner) ||
      !parse_number(header.substr(space + 1), id) || owner > uint64_t(INT32_MAX) || id == 0) {
    return std::nullopt;
  }
  Request request{static_cast<Kind>(kind), static_cast<int>(owner), id, message.substr(line_end + 1)};
  if (request.kind == Kind::kWithdraw && !request.descriptor.empty()) return std::nullopt;
  return request;
}

std::string ExposureService::slots_key(int rank) const { return fmt::format("{}/exposure/{}/slots", prefix_, rank); }

std::string ExposureService::slot_key(int rank, uint64_t slot) const {
  return fmt::format("{}/exposure/{}/{}", prefix_, rank, slot);
}

std::string ExposureService::gone_key(int rank) const { return fmt::format("{}/exposure/gone/{}", prefix_, rank); }

std::string ExposureService::answer_key(int owner, uint64_t id, Kind kind, int peer) const {
  return fmt::format("{}/exposure/answer/{}/{}/{}/{}", prefix_, owner, id, static_cast<char>(kind), peer);
}

std::vector<std::pair<int, std::string>> ExposureService::ask_peers(const Request& request,
                                                                    std::vector<int>& silent) {
  const std::string message = pack(request);
  std::vector<std::string> keys;
  std::vector<int> peers;
  for (int offset = 1; offset < size_; ++offset) {  // NOTE [exposure mailboxes]
    const int peer = (rank_ + offset) % size_;
    const auto slot = static_cast<uint64_t>(caller_store_->add(slots_key(peer), 1) - 1);
    caller_store_->set(slot_key(peer, slot), message);
    keys.push_back(answer_key(rank_, request.id, request.kind, peer));
    peers.push_back(peer);
  }
  if (keys.empty()) return {};
  // Waits in short rounds, so that a peer whose service is gone (NOTE [exposure mailboxes]) is noticed at once.
  std::vector<std::pair<int, std::string>> answers;
  std::vector<bool> settled(keys.size(), false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  for (;;) {
    std::vector<std::string> waiting;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!settled[i]) waiting.push_back(keys[i]);
    }
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    const std::vector<std::string> missing =
        waiting.empty() ? waiting : caller_store_->wait(waiting, std::clamp(left, 0.0, kAnswerRoundS));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (settled[i]) continue;
      if (std::find(missing.begin(), missing.end(), keys[i]) == missing.end()) {
        std::optional<std::string> answer = caller_store_->try_get(keys[i]);
        caller_store_->remove(keys[i]);
        if (answer) answers.emplace_back(peers[i], std::move(*answer));
        settled[i] = true;
      } else if (caller_store_->try_get(gone_key(peers[i]))) {
        answers.emplace_back(peers[i], std::string(kGoneAnswer));
        settled[i] = true;
      }
    }
    if (std::find(settled.begin(), settled.end(), false) == settled.end()) return answers;
    if (left <= 0) break;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!settled[i]) silent.push_back(peers[i]);
  }
  return answers;
}

uint64_t ExposureIds::take() {
  const uint64_t first = next_;
  for (uint64_t id = first; id < first + slots_; ++id) {
    if (held_.count(id % slots_) != 0) continue;
    held_[id % slots_] = id;
    next_ = id + 1;
    return id;
  }
  return next_++;
}

void ExposureIds::release(uint64_t id) {
  auto it = held_.find(id % slots_);
  if (it != held_.end() && it->second == id) held_.erase(it);
}

ExposureService::Exposure ExposureService::expose(const std::string& descriptor,
                                                  const std::function<void(uint64_t id)>& before_post) {
  std::lock_guard<std::mutex> lock(caller_mutex_);
  Exposure exposure;
  exposure.id = ids_.take();
  if (before_post) before_post(exposure.id);
  std::vector<int> silent;
  for (const auto& [peer, answer] : ask_peers({Kind::kExpose, rank_, exposure.id, descriptor}, silent)) {
    if (answer.rfind("ok ", 0) == 0) continue;
    exposure.refused.push_back(peer);
    const std::string reason = answer == kGoneAnswer          ? std::string("its communicator is gone")
                               : answer.rfind("refused ", 0) == 0 ? answer.substr(8)
                                                                  : answer;
    exposure.reasons += fmt::format("rank {}: {}\n", peer, reason);
  }
  for (int peer : silent) {
    exposure.refused.push_back(peer);
    exposure.reasons += fmt::format("rank {}: did not answer within {} s\n", peer, timeout_s_);
  }
  std::sort(exposure.refused.begin(), exposure.refused.end());
  return exposure;
}

void ExposureService::withdraw(uint64_t id) {
  std::lock_guard<std::mutex> lock(caller_mutex_);
  std::vector<int> silent;
  ask_peers({Kind::kWithdraw, rank_, id, ""}, silent);
  if (silent.empty()) ids_.release(id);  // NOTE [exposure ids]
  if (!silent.empty()) {
    std::sort(silent.begin(), silent.end());
    raise(ErrorCode::kTimeout, "exposure: rank {} withdrew range {}, and rank(s) {} did not answer within {} s",
          rank_, id, fmt::join(silent, ", "), timeout_s_);
  }
}

std::string ExposureService::handle(const Request& request) {
  const std::pair<int, uint64_t> key{request.owner, request.id};
  if (request.kind == Kind::kWithdraw) {
    std::optional<uintptr_t> held;
    {
      std::lock_guard<std::mutex> lock(imported_mutex_);
      if (auto it = imported_.find(key); it != imported_.end()) {
        held = it->second;
        imported_.erase(it);
      }
    }
    if (held) importer_.release(request.owner, request.id);
    return "ok";
  }
  try {
    const uintptr_t address = importer_.import(request.owner, request.id, request.descriptor);
    std::lock_guard<std::mutex> lock(imported_mutex_);
    imported_[key] = address;
    return fmt::format("ok {:x}", address);
  } catch (const std::exception& error) {
    return fmt::format("refused {}", error.what());
  }
}

void ExposureService::serve() {
  for (uint64_t slot = 0;; ++slot) {
    std::string message;
    for (;;) {
      if (stopping_) return;
      try {
        message = helper_store_->get(slot_key(rank_, slot), kHelperWaitS);
        break;
      } catch (const Error& error) {
        if (error.code() == ErrorCode::kTimeout) continue;
        if (!stopping_) {
          BRAID_INFO("exposure: rank {}'s helper stopped: {}", rank_, error.what());
        }
        return;
      }
    }
    try {
      helper_store_->remove(slot_key(rank_, slot));
      const std::optional<Request> request = unpack(message);
      if (!request || request->owner == rank_ || request->owner < 0 || request->owner >= size_) {
        BRAID_WARN("exposure: rank {}'s helper dropped a malformed request in slot {}", rank_, slot);
        continue;
      }
      helper_store_->set(answer_key(request->owner, request->id, request->kind, rank_), handle(*request));
    } catch (const Error& error) {
      if (!stopping_) {
        BRAID_INFO("exposure: rank {}'s helper stopped: {}", rank_, error.what());
      }
      return;
    }
  }
}

std::optional<uintptr_t> ExposureService::imported(int owner, uint64_t id) const {
  std::lock_guard<std::mutex> lock(imported_mutex_);
  auto it = imported_.find({owner, id});
  if (it == imported_.end()) return std::nullopt;
  return it->second;
}

size_t ExposureService::imported_count() const {
  std::lock_guard<std::mutex> lock(imported_mutex_);
  return imported_.size();
}

}  // namespace braid::detail
