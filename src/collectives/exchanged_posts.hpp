// What a rank posts in the host exchange of a large eager call's buffer (NOTE [exchanged exposures],
// call_buffers.cpp), and what every rank reads from all the posts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/plan.hpp"
#include "collectives/selection.hpp"

namespace braid::collectives {

// "<collective> <buffer> <bytes> <in place: 0|1> <announcement word>".
std::string exchanged_post(Collective collective, ExchangedBuffer buffer, size_t bytes, bool in_place, uint64_t word);

struct ExchangedPosts {
  std::vector<uint64_t> words;  // [rank]: its announcement
  bool same_placement;          // every rank's call is in place, or none is
};
// Every rank's post, read by rank `rank`. Throws Error(kMismatch) naming the first rank whose post is of another
// call (collective, buffer or bytes) than rank `rank`'s, and kInternal for a post not of that form.
ExchangedPosts read_exchanged_posts(const std::vector<std::string>& posts, int rank);

}  // namespace braid::collectives
