#include "collectives/exchanged_posts.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "core/error.hpp"

namespace braid::collectives {
namespace {

struct Post {
  int collective, buffer;
  unsigned long long bytes, word;
  int in_place;
};

Post parse(const std::string& text, int rank) {
  Post post{};
  char end = 0;
  if (std::sscanf(text.c_str(), "%d %d %llu %d %llu%c", &post.collective, &post.buffer, &post.bytes, &post.in_place,
                  &post.word, &end) != 5 ||
      (post.in_place != 0 && post.in_place != 1)) {
    raise(ErrorCode::kInternal, "eager call's buffer: rank {} posted '{}', not '<collective> <buffer> <bytes> "
          "<in place> <word>'", rank, text);
  }
  return post;
}

}  // namespace

std::string exchanged_post(Collective collective, ExchangedBuffer buffer, size_t bytes, bool in_place, uint64_t word) {
  return fmt::format("{} {} {} {} {}", static_cast<int>(collective), static_cast<int>(buffer), bytes,
                     in_place ? 1 : 0, word);
}

ExchangedPosts read_exchanged_posts(const std::vector<std::string>& posts, int rank) {
  const Post mine = parse(posts.at(static_cast<size_t>(rank)), rank);
  ExchangedPosts read{std::vector<uint64_t>(posts.size()), true};
  for (size_t r = 0; r < posts.size(); ++r) {
    const Post post = parse(posts[r], static_cast<int>(r));
    if (post.collective != mine.collective || post.buffer != mine.buffer || post.bytes != mine.bytes) {
      raise(ErrorCode::kMismatch,
            "{}: rank {} exchanged buffer {} of {} bytes of {}, rank {} buffer {} of {} bytes of {} (the ranks' calls "
            "differ)", collective_name(static_cast<unsigned int>(mine.collective)), r, post.buffer, post.bytes,
            collective_name(static_cast<unsigned int>(post.collective)), rank, mine.buffer, mine.bytes,
            collective_name(static_cast<unsigned int>(mine.collective)));
    }
    read.same_placement = read.same_placement && post.in_place == mine.in_place;
    read.words[r] = post.word;
  }
  return read;
}

}  // namespace braid::collectives
