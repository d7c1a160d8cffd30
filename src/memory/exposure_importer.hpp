// The exposure helper's CUDA side (memory/exposure.hpp): maps a peer's exposed range into this rank (the
// allocation's fd taken from its owner for VMM memory, every allocation's for a range that several back side by side
// (memory/page_blob.hpp); the range where it lies for cudaMalloc memory of a rank that is a thread of this process;
// cudaMalloc memory of another process is refused), writes it into this rank's ExposureTable, and releases it when
// its owner withdraws it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "memory/exposure.hpp"
#include "memory/exposure_table.hpp"
#include "memory/memory_handle.hpp"

namespace braid::detail {

struct MemoryContext;
class PeerMapping;
class PagedMapping;

// NOTE [exposed descriptors of this process]
// An exposure request is read from the store, which only the job's processes can write (its frames carry MACs
// under the job secret where there is one), and its blob is unpacked as any peer's blob is. A blob that names
// this very process would make the helper take its address as memory without mapping anything (PeerMapping), so
// it is accepted only where a rank of the same communicator, a thread of this process, offered exactly that
// blob for exactly that exposure id (offer_exposure, from before the request is posted until its answers are in:
// withdraw_exposure_offer), as NOTE [descriptors naming this process] says for exchanges.
void offer_exposure(const MemoryContext& context, uint64_t id, const std::string& blob);
void withdraw_exposure_offer(const MemoryContext& context, uint64_t id);

// NOTE [no exposed cudaMalloc memory across processes]
// cudaIpcCloseMemHandle waits until the GPU of the process that opened the handle is idle (measured on H200 with a
// kernel spinning on another stream: bench/probes/busy_gpu_imports.cu), while importing and releasing VMM memory
// (pidfd_getfd, cuMemImportFromShareableHandle, cuMemMap, cuMemUnmap, cuMemRelease) and opening an IPC handle do
// not. A withdrawal comes at any time, also while this rank's calls spin waiting for the owner, who waits for this
// helper's answer: closing the owner's handle then would wait until the timeout. So the helper refuses cudaMalloc
// memory of another process (the owner's calls on it stay staged) and maps VMM memory and, for ranks that are
// threads of this process, cudaMalloc memory where it lies (nothing opened, nothing to close).
class CudaExposureImporter : public ExposureImporter {
 public:
  // `context`: this rank's (its device, its communicator's uid and ranks); `table`: where imports are written.
  CudaExposureImporter(const MemoryContext& context, ExposureTable& table);
  ~CudaExposureImporter() override;

  uintptr_t import(int owner, uint64_t id, const std::string& descriptor) override;
  void release(int owner, uint64_t id) noexcept override;

 private:
  uintptr_t import_pages(int owner, uint64_t id, const std::string& blob);
  // Refuses a blob naming this process that no rank of it offered (NOTE [exposed descriptors of this process]).
  void check_offered(int owner, uint64_t id, uint32_t pid, const std::string& blob) const;
  // Writes an import into the table; where its slot is taken, drops the import and throws.
  uintptr_t put_in_table(int owner, uint64_t id, uintptr_t address, uint64_t bytes);

  const MemoryContext& context_;
  ExposureTable& table_;
  std::mutex mutex_;
  std::map<std::pair<int, uint64_t>, std::shared_ptr<PeerMapping>> mappings_;
  std::map<std::pair<int, uint64_t>, std::shared_ptr<PagedMapping>> paged_;
};

}  // namespace braid::detail
