#include "cuda_objects.hpp"
#include "bench.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective.hpp"
#include "rank_slots.hpp"
#include "reference.hpp"
#include "vmm_allocation.hpp"
#include "report.hpp"

namespace braid::bench {
namespace {



// The host side of the check moves data in chunks of this size, so its memory stays bounded at any -e.
constexpr size_t kHostChunkBytes = size_t(64) << 20;

// A device buffer: cudaMalloc'd or VMM memory (--vmm: as PyTorch's expandable segments make it), a plain user
// buffer which braid must serve through staging, or registered with the communicator (zero copy once its first use
// exchanged mappings; exposed to the peers under BRAID_EAGER_ZERO_COPY=1), or symmetric (comm.alloc, braid's
// zero-copy path; collective).
class Buffer {
 public:
  Buffer(Communicator& comm, size_t bytes, const Options& options) {
    if (options.symmetric) {
      memory_ = comm.alloc(bytes);
      data_ = memory_.local();
    } else {
      if (options.vmm) {
        vmm_ = std::make_unique<check::VmmAllocation>(bytes, comm.device());
        data_ = vmm_->pointer();
      } else {
        cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
        owned_ = true;
      }
      if (options.registered) registration_ = comm.register_buffer(data_, bytes);
    }
  }
  ~Buffer() {
    // Unwinding from a failure: cudaFree would wait for a kernel that may still spin on a dead peer, and hold
    // back the error message; the process is about to exit anyway.
    registration_.reset();  // deregistered (peers' mappings released) before the memory goes
    if (owned_ && std::uncaught_exceptions() == 0) cudaFree(data_);
    if (std::uncaught_exceptions() > 0) static_cast<void>(vmm_.release());  // left mapped, as cudaFree is skipped
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return static_cast<char*>(data_); }

 private:
  SymmetricMemory memory_;
  std::unique_ptr<check::VmmAllocation> vmm_;
  RegisteredBuffer registration_;
  void* data_ = nullptr;
  bool owned_ = false;
};





// One (placement, implementation) of a row on this rank, as shared with every rank at the end of the row.
constexpr int kSlots = 4;  // [out-of-place braid, out-of-place NCCL, in-place braid, in-place NCCL]

class RankBench {
 public:
  RankBench(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl)
      : comm_(comm), options_(options), rank_(comm.rank()), ranks_(comm.size()), library_(nccl) {}

  uint64_t run() {
    for (Collective coll : options_.collectives) {
      if (has_root(coll) && options_.root >= ranks_) {
        throw std::invalid_argument("-r/--root " + std::to_string(options_.root) + " is not a rank (there are " +
                                    std::to_string(ranks_) + ")");
      }
    }
    cuda(cudaSetDevice(comm_.device()), "cudaSetDevice");
    stream_ = std::make_unique<StreamHandle>();
    share_seed();
    if (library_) nccl_ = std::make_unique<NcclComm>(library_, comm_);
    start_report();

    const size_t bytes = std::max(options_.max_bytes, datatype_size(options_.type));
    send_ = std::make_unique<Buffer>(comm_, bytes, options_);
    recv_ = std::make_unique<Buffer>(comm_, bytes, options_);
    // With -c 0 nothing else writes the inputs: start from harmless finite values (0x3C bytes are about 1.06
    // in float16, 0.0115 in float32 and bfloat16), never from whatever the allocator left.
    cuda(cudaMemsetAsync(send_->data(), 0x3C, bytes, stream()), "cudaMemsetAsync");
    cuda(cudaMemsetAsync(recv_->data(), 0x3C, bytes, stream()), "cudaMemsetAsync");
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    host_.resize(kHostChunkBytes);

    for (int cycle = 0; options_.run_cycles == 0 || cycle < options_.run_cycles; ++cycle) {  // -N
      for (Collective coll : options_.collectives) run_collective(coll);
    }

    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.barrier();  // nobody frees buffers (symmetric ones are mapped by peers) while a peer still works
    if (report_) report_->summary();
    if (report_ && !options_.json_path.empty()) report_->write_json(options_.json_path);
    return wrong_total_;
  }

 private:
  cudaStream_t stream() const { return stream_->get(); }

  // Rank 0's random seed, for every rank's inputs: fresh per run, never copied as data.
  void share_seed() {
    uint64_t mine = 0;
    if (rank_ == 0) {
      std::random_device entropy;
      mine = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
    }
    std::vector<std::string> seeds = comm_.host_allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
    std::memcpy(&seed_, seeds[0].data(), sizeof(seed_));
  }

  void start_report() {
    cudaDeviceProp properties{};
    cuda(cudaGetDeviceProperties(&properties, comm_.device()), "cudaGetDeviceProperties");
    const std::string gpu = "GPU " + std::to_string(comm_.device()) + " " + properties.name + " (" +
                            comm_.peer(rank_).pci_bus_id + ")";
    std::vector<std::string> gpus = comm_.host_allgather(gpu);
    const std::vector<std::string> pids = comm_.host_allgather(std::to_string(getpid()));
    if (rank_ != 0) return;
    RunInfo info;
    info.ranks = ranks_;
    info.launch = std::all_of(pids.begin(), pids.end(), [&](const std::string& pid) { return pid == pids[0]; })
                      ? "threads"
                      : "processes";
    info.gpus = std::move(gpus);
    if (library_) {
      info.nccl_version = library_->version();
      info.nccl_path = library_->path();
    }
    if (const char* commit = std::getenv("BRAID_COMMIT")) info.commit = commit;
    report_ = std::make_unique<Report>(options_, std::move(info));
    report_->header();
  }

  void note(const std::string& text) {
    if (report_) report_->note(text);
  }

  void run_collective(Collective coll) {
    if (has_op(coll) && !reduction_supported(options_.type, options_.op)) {
      note(std::string(collective_name(coll)) + " skipped: " + reduce_op_name(options_.op) + " is not defined for " +
           datatype_name(options_.type) + " (braid does not serve this pair)");
      return;
    }
    if (!has_in_place(coll) && !options_.out_of_place()) {
      note(std::string(collective_name(coll)) +
           " skipped: --inplace 1 asks for in-place calls only, and it has no in-place form");
      return;
    }
    if (coll == Collective::kAllToAll && library_) {
      const std::string method = library_->all_to_all_method();
      if (method.empty()) {
        throw std::runtime_error("--compare nccl: " + library_->path() +
                                 " exports neither ncclAlltoAll nor ncclSend/ncclRecv: no NCCL alltoall to compare with");
      }
      note("nccl alltoall: " + method + (method == "ncclAlltoAll" ? "" : " (one per peer, in a group)") +
           (options_.in_place_too() ? "; not run in place: NCCL defines no in-place all-to-all" : ""));
    }
    if (report_) report_->begin(coll);
    int skipped = 0;
    for (size_t bytes : options_.sizes()) {
      const Shape shape = shape_of(coll, bytes, options_.type, ranks_, rank_);
      if (shape.empty()) {
        ++skipped;
        continue;
      }
      run_size(coll, shape);
    }
    if (skipped > 0) {
      note(std::to_string(skipped) + " size(s) skipped: fewer elements than " + collective_name(coll) + " needs");
    }
  }

  void run_size(Collective coll, const Shape& shape) {
    const size_t element = datatype_size(options_.type);
    const int root = has_root(coll) ? options_.root : -1;
    CheckSpec spec;
    spec.coll = coll;
    spec.data = DataSpec{seed_, options_.type, options_.op};
    spec.ranks = ranks_;
    spec.rank = rank_;
    spec.root = std::max(root, 0);
    spec.shape = shape;

    Slot slots[kSlots];
    for (int placement = 0; placement < 2; ++placement) {
      const bool in_place = placement == 1;
      if (in_place ? !options_.in_place_too() : !options_.out_of_place()) continue;
      // sendrecv has no in-place form: its slots stay "not run", and the row prints n/a.
      if (in_place && !has_in_place(coll)) continue;
      char* send = in_place ? recv_->data() + shape.in_place_send_offset * element : send_->data();
      char* recv = recv_->data() + (in_place ? shape.in_place_recv_offset * element : 0);
      for (int impl = 0; impl < (nccl_ ? 2 : 1); ++impl) {
        if (impl == 1 && in_place && !nccl_has_in_place(coll)) continue;  // its slot stays "not run": n/a
        Call call;
        if (impl == 0) {
          call = [&, send, recv](cudaStream_t s) {
            call_braid(comm_, coll, send, recv, shape, options_.type, options_.op, spec.root, s);
          };
        } else {
          call = [&, send, recv](cudaStream_t s) {
            nccl_->call(coll, send, recv, shape, options_.type, options_.op, spec.root, s);
          };
        }
        const std::string label = std::string(collective_name(coll)) + " " + std::to_string(shape.bytes) + " B " +
                                  datatype_name(options_.type) + (has_op(coll) ? std::string(" ") + reduce_op_name(options_.op) : "") +
                                  (in_place ? " in-place" : " out-of-place") + (impl == 0 ? " braid" : " nccl");
        Slot& slot = slots[placement * 2 + impl];
        std::optional<uint64_t> wrong;  // summed over the -c checked calls
        for (int i = 0; i < options_.check_iters; ++i) {
          if (const std::optional<uint64_t> once = check(spec, call, send, recv, in_place, label)) wrong = wrong.value_or(0) + *once;
        }
        slot.time_us = time_calls(call);
        slot.wrong = wrong.value_or(0);
        slot.state = wrong ? 2 : 1;
      }
    }
    finish_row(coll, shape, root, slots);
  }

  // The ranks' times combined as -a asks (the max by default) and #wrong summed over ranks; rank 0 prints the row.
  void finish_row(Collective coll, const Shape& shape, int root, const Slot (&slots)[kSlots]) {
    Slot total[kSlots];
    gather_slots(comm_, slots, kSlots, options_.average, total);
    for (const Slot& slot : total) wrong_total_ += slot.wrong;
    if (!report_) return;
    auto timing = [&](const Slot& slot) {
      if (slot.state == 0) return Timing{};
      return make_timing(coll, shape.bytes, ranks_, slot.time_us,
                         slot.state == 2 ? std::optional<uint64_t>(slot.wrong) : std::nullopt);
    };
    Row row;
    row.coll = coll;
    row.bytes = shape.bytes;
    row.count = shape.count;
    row.type = options_.type;
    row.op = options_.op;
    row.root = root;
    row.out_of_place = Placement{timing(total[0]), timing(total[1])};
    row.in_place = Placement{timing(total[2]), timing(total[3])};
    report_->row(row);
  }

  // Fresh inputs, poisoned outputs, one call, and this rank's output against the host reference.
  std::optional<uint64_t> check(const CheckSpec& spec, const Call& call, char* send, char* recv, bool in_place,
                                const std::string& label) {
    if (!options_.check) return std::nullopt;
    const size_t element = datatype_size(spec.data.type);
    // Every rank's earlier calls (peers' reads of our buffers among them) are over before inputs change.
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.barrier();
    // Poison the whole output first; the input then overwrites the part of it that in place is input.
    cuda(cudaMemsetAsync(recv, poison_byte(spec.data.type), spec.shape.recv_count * element, stream()),
         "cudaMemsetAsync");
    // In place, a non-root broadcast rank's buffer is output only: it stays poisoned.
    const bool input_unused = spec.coll == Collective::kBroadcast && in_place && rank_ != spec.root;
    if (!input_unused) upload_input(spec.data, send, spec.shape.send_count);
    // No barrier here: the collective itself must wait for peers whose inputs are not written yet.
    call(stream());
    cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    comm_.check();
    if (!output_defined(spec)) return 0;
    Mismatch mismatch;
    const size_t chunk = kHostChunkBytes / element;
    for (size_t first = 0; first < spec.shape.recv_count; first += chunk) {
      const size_t count = std::min(chunk, spec.shape.recv_count - first);
      cuda(cudaMemcpyAsync(host_.data(), recv + first * element, count * element, cudaMemcpyDeviceToHost, stream()),
           "cudaMemcpyAsync");
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
      compare_output(spec, first, count, host_.data(), mismatch);
    }
    if (mismatch.wrong > 0) {
      std::fprintf(stderr, "braid-bench: rank %d: %s: %llu of %zu elements wrong; first at element %zu: expected %s, got %s\n",
                   rank_, label.c_str(), static_cast<unsigned long long>(mismatch.wrong), spec.shape.recv_count,
                   mismatch.first_index, mismatch.expected.c_str(), mismatch.got.c_str());
    }
    return mismatch.wrong;
  }

  void upload_input(const DataSpec& data, char* destination, size_t count) {
    const size_t element = datatype_size(data.type);
    const size_t chunk = kHostChunkBytes / element;
    for (size_t first = 0; first < count; first += chunk) {
      const size_t n = std::min(chunk, count - first);
      generate_input(data, rank_, first, n, host_.data());
      cuda(cudaMemcpyAsync(destination + first * element, host_.data(), n * element, cudaMemcpyHostToDevice, stream()),
           "cudaMemcpyAsync");
      cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");  // host_ is refilled next
    }
  }

  // Per-call time of this rank, in microseconds: the median over repetitions (cuda_objects.hpp).
  double time_calls(const Call& call) {
    return bench::time_calls(comm_, stream(), call,
                             TimingPlan{options_.warmup_iters, options_.iters, options_.repeats, options_.graph_calls,
                                        options_.blocking});
  }

  Communicator& comm_;
  const Options& options_;
  const int rank_, ranks_;
  std::shared_ptr<NcclLibrary> library_;
  uint64_t seed_ = 0;
  // Destroyed in reverse: buffers and NCCL's communicator before the stream.
  std::unique_ptr<StreamHandle> stream_;
  std::unique_ptr<NcclComm> nccl_;
  std::unique_ptr<Buffer> send_, recv_;
  std::unique_ptr<Report> report_;
  std::vector<char> host_;
  uint64_t wrong_total_ = 0;
};

}  // namespace

uint64_t bench_run(Communicator& comm, const Options& options, const std::shared_ptr<NcclLibrary>& nccl) {
  return RankBench(comm, options, nccl).run();
}

}  // namespace braid::bench
