#include "memory/memory_handle.hpp"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string_view>

#include "bootstrap/job_secret.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"

namespace braid::detail {
namespace {

// Layout: magic "BRDH", version (u16), kind (u8), reserved (u8), then the fields in declaration order
// (integers little-endian, strings as u16 length + bytes), and last an FNV-1a checksum (u64) of all before it.
constexpr char kMagic[4] = {'B', 'R', 'D', 'H'};
constexpr size_t kMaxString = 256;

class Writer {
 public:
  template <typename T>
  void integer(T value) {
    for (size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
  }
  void string(const std::string& text) {
    integer<uint16_t>(static_cast<uint16_t>(text.size()));
    out_ += text;
  }
  void raw(const void* data, size_t bytes) { out_.append(static_cast<const char*>(data), bytes); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view in, const char* function, const char* argument) : in_(in), function_(function), argument_(argument) {}

  template <typename T>
  T integer(const char* field) {
    need(sizeof(T), field);
    uint64_t value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(in_[at_ + i])) << (8 * i);
    at_ += sizeof(T);
    return static_cast<T>(value);
  }
  std::string string(const char* field) {
    const uint16_t length = integer<uint16_t>(field);
    if (length > kMaxString) fail("field '{}' claims {} bytes (at most {})", field, length, kMaxString);
    need(length, field);
    std::string text(in_.substr(at_, length));
    at_ += length;
    return text;
  }
  void raw(void* data, size_t bytes, const char* field) {
    need(bytes, field);
    std::memcpy(data, in_.data() + at_, bytes);
    at_ += bytes;
  }
  size_t position() const { return at_; }

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> problem, Args&&... args) const {
    raise_invalid_argument(function_, argument_, "is not a valid braid memory handle: {}",
                           fmt::format(problem, std::forward<Args>(args)...));
  }

 private:
  void need(size_t bytes, const char* field) const {
    if (bytes > in_.size() - at_) fail("truncated at field '{}' ({} of {} bytes)", field, in_.size(), at_ + bytes);
  }
  std::string_view in_;
  size_t at_ = 0;
  const char* function_;
  const char* argument_;
};

std::string read_host_id() {
  std::ifstream boot_id("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot_id && std::getline(boot_id, id) && !id.empty()) return "boot:" + id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return std::string("host:") + name;
}

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kLegacyIpc: return "cudaMalloc memory (legacy CUDA IPC)";
    case MemoryKind::kPosixFd: return "VMM memory (POSIX fd)";
  }
  return "unknown memory kind";
}

const std::string& this_host_id() {
  static const std::string id = read_host_id();
  return id;
}

std::string pack(const MemoryDescriptor& d, const std::string& secret) {
  Writer w;
  w.raw(kMagic, sizeof(kMagic));
  w.integer<uint16_t>(kMemoryHandleVersion);
  w.integer<uint8_t>(static_cast<uint8_t>(d.kind));
  w.integer<uint8_t>(0);
  w.string(d.host_id);
  w.integer<uint32_t>(d.pid);
  w.integer<int32_t>(d.device);
  w.string(d.pci_bus_id);
  w.integer<uint64_t>(d.address);
  w.integer<uint64_t>(d.bytes);
  w.integer<uint64_t>(d.allocation_base);
  w.integer<uint64_t>(d.allocation_bytes);
  w.integer<uint64_t>(d.id);
  w.raw(d.ipc_handle.data(), d.ipc_handle.size());
  w.integer<int32_t>(d.fd);
  w.string(secret.empty() ? std::string() : job_mac(secret, w.out()));  // the signature: over every field before it
  w.integer<uint64_t>(stable_hash(w.out()));
  return w.out();
}

MemoryDescriptor unpack(const std::string& blob, const char* function, const char* argument, const std::string& expected_host,
                        const std::string& secret) {
  Reader r(blob, function, argument);
  if (blob.empty()) r.fail("it is empty");
  char magic[sizeof(kMagic)];
  r.raw(magic, sizeof(magic), "magic");
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) r.fail("it does not start with braid's magic bytes");
  const uint16_t version = r.integer<uint16_t>("version");
  if (version != kMemoryHandleVersion) r.fail("it has format version {}; this braid reads version {}", version, kMemoryHandleVersion);
  // The checksum covers everything before it; check it before trusting any field.
  if (blob.size() < r.position() + sizeof(uint64_t)) r.fail("truncated before its checksum ({} bytes)", blob.size());
  const size_t body = blob.size() - sizeof(uint64_t);
  uint64_t stored = 0;
  for (size_t i = 0; i < sizeof(uint64_t); ++i) stored |= static_cast<uint64_t>(static_cast<uint8_t>(blob[body + i])) << (8 * i);
  if (stored != stable_hash(std::string_view(blob).substr(0, body))) r.fail("its checksum does not match (damaged or truncated)");

  MemoryDescriptor d;
  const uint8_t kind = r.integer<uint8_t>("kind");
  if (kind != static_cast<uint8_t>(MemoryKind::kLegacyIpc) && kind != static_cast<uint8_t>(MemoryKind::kPosixFd)) {
    r.fail("unknown memory kind {}", kind);
  }
  d.kind = static_cast<MemoryKind>(kind);
  if (r.integer<uint8_t>("reserved") != 0) r.fail("its reserved byte is set");
  d.host_id = r.string("host_id");
  d.pid = r.integer<uint32_t>("pid");
  d.device = r.integer<int32_t>("device");
  d.pci_bus_id = r.string("pci_bus_id");
  d.address = r.integer<uint64_t>("address");
  d.bytes = r.integer<uint64_t>("bytes");
  d.allocation_base = r.integer<uint64_t>("allocation_base");
  d.allocation_bytes = r.integer<uint64_t>("allocation_bytes");
  d.id = r.integer<uint64_t>("id");
  r.raw(d.ipc_handle.data(), d.ipc_handle.size(), "ipc_handle");
  d.fd = r.integer<int32_t>("fd");
  const size_t signed_bytes = r.position();
  const std::string signature = r.string("signature");
  if (r.position() != body) r.fail("{} bytes follow its last field", body - r.position());
  if (!secret.empty() && signature.empty()) {
    r.fail("it is not signed, and this process has a job secret (BRAID_JOB_SECRET): only handles of the job's own "
           "processes are taken");
  }
  if (!secret.empty() && !same_proof(signature, job_mac(secret, std::string_view(blob).substr(0, signed_bytes)))) {
    r.fail("its signature is not this job's (BRAID_JOB_SECRET differs, or the handle was altered)");
  }

  if (d.bytes == 0) r.fail("its range is empty");
  if (d.allocation_bytes == 0 || d.allocation_base > UINT64_MAX - d.allocation_bytes) r.fail("its allocation size is invalid");
  if (d.address < d.allocation_base || d.address - d.allocation_base > d.allocation_bytes ||
      d.bytes > d.allocation_bytes - (d.address - d.allocation_base)) {
    r.fail("its range [{:#x}, +{}) lies outside its allocation [{:#x}, +{})", d.address, d.bytes, d.allocation_base,
           d.allocation_bytes);
  }
  if (d.kind == MemoryKind::kPosixFd && d.fd < 0) r.fail("a VMM handle without a file descriptor");
  if (d.device < 0) r.fail("no exporting device");
  if (!expected_host.empty() && d.host_id != expected_host) {
    raise_invalid_argument(function, argument, "was made on another host or boot ({}; this is {}): memory handles work between the processes of one host",
                           d.host_id, expected_host);
  }
  return d;
}

}  // namespace braid::detail
