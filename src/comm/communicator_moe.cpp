// MoeBuffer::create: the communicator hands its CUDA backend's collective context to the moe layer
// (moe/moe_buffer.cpp), which makes the buffer from that context alone.
#include "braid/braid.hpp"
#include "collectives/collective_context.hpp"

namespace braid {

MoeBuffer MoeBuffer::create(Communicator& comm, const MoeShape& shape) {
  return create_on(comm.cuda_context("MoeBuffer::create"), shape);
}

}  // namespace braid
