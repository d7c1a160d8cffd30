// Uses braid's public C and C++ headers only. Without a GPU the first call fails saying so.
#include <braid/braid.h>
#include <braid/braid.hpp>

#include <cstdio>

int main() {
  braid::StoreHost store;
  braidComm_t comm = nullptr;
  braidResult_t result = braidCommInitRank(&comm, store.address().c_str(), 0, 1, 0, -1);
  std::printf("braidCommInitRank: %s%s%s\n", braidGetErrorString(result), result == braidSuccess ? "" : ": ",
              braidGetLastError());
  if (result == braidSuccess) braidCommDestroy(comm);
  return result == braidSuccess || result == braidNoDevice ? 0 : 1;
}
