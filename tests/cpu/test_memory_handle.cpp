// The wire form of memory handles (export_handle blobs and the registration exchange): round trips, and every
// kind of bad blob refused with kInvalidArgument naming the argument; a fuzz run of the unpacker over random
// mutations and truncations never crashes and never accepts a blob that is not a valid one.
#include <cuda_runtime_api.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>

#include "braid/braid.hpp"
#include "core/hash.hpp"
#include "memory/memory_handle.hpp"

namespace braid::detail {
namespace {

MemoryDescriptor sample(MemoryKind kind) {
  MemoryDescriptor d;
  d.kind = kind;
  d.host_id = this_host_id();
  d.pid = 4242;
  d.device = 3;
  d.pci_bus_id = "00000000:1B:00.0";
  d.allocation_base = 0x7f0000000000;
  d.allocation_bytes = 64 << 20;
  d.address = d.allocation_base + 4096;
  d.bytes = 1 << 20;
  d.id = 17;
  for (size_t i = 0; i < d.ipc_handle.size(); ++i) d.ipc_handle[i] = static_cast<uint8_t>(i * 7 + 1);
  d.fd = kind == MemoryKind::kPosixFd ? 9 : -1;
  return d;
}

void expect_refused(const std::string& blob, const std::string& words) {
  try {
    unpack(blob, "import_handle", "blob", this_host_id());
    ADD_FAILURE() << "accepted a bad blob; expected '" << words << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find("argument 'blob'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

// A blob with its checksum recomputed, so a field check (not the checksum) must catch the damage.
std::string resealed(std::string blob) {
  const size_t body = blob.size() - 8;
  const uint64_t hash = stable_hash(std::string_view(blob).substr(0, body));
  for (size_t i = 0; i < 8; ++i) blob[body + i] = static_cast<char>((hash >> (8 * i)) & 0xff);
  return blob;
}

TEST(MemoryHandle, RoundTripsBothKinds) {
  for (MemoryKind kind : {MemoryKind::kLegacyIpc, MemoryKind::kPosixFd}) {
    const MemoryDescriptor d = sample(kind);
    const MemoryDescriptor back = unpack(pack(d), "import_handle", "blob", this_host_id());
    EXPECT_EQ(back.kind, d.kind);
    EXPECT_EQ(back.host_id, d.host_id);
    EXPECT_EQ(back.pid, d.pid);
    EXPECT_EQ(back.device, d.device);
    EXPECT_EQ(back.pci_bus_id, d.pci_bus_id);
    EXPECT_EQ(back.address, d.address);
    EXPECT_EQ(back.bytes, d.bytes);
    EXPECT_EQ(back.allocation_base, d.allocation_base);
    EXPECT_EQ(back.allocation_bytes, d.allocation_bytes);
    EXPECT_EQ(back.id, d.id);
    EXPECT_EQ(back.ipc_handle, d.ipc_handle);
    EXPECT_EQ(back.fd, d.fd);
    EXPECT_EQ(back.offset(), 4096u);
  }
}

TEST(MemoryHandle, RefusesEmptyTruncatedAndForeignBlobs) {
  const std::string blob = pack(sample(MemoryKind::kLegacyIpc));
  expect_refused("", "empty");
  for (size_t length = 1; length < blob.size(); ++length) {
    try {
      unpack(blob.substr(0, length), "import_handle", "blob", this_host_id());
      ADD_FAILURE() << "accepted a blob truncated to " << length << " bytes";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    }
  }
  expect_refused("XXXX" + blob.substr(4), "magic");
  std::string other_version = blob;
  other_version[4] = static_cast<char>(kMemoryHandleVersion + 1);
  expect_refused(other_version, "format version " + std::to_string(kMemoryHandleVersion + 1));
  std::string damaged = blob;
  damaged[40] ^= 1;
  expect_refused(damaged, "checksum");
  expect_refused(blob + "x", "checksum");
}

TEST(MemoryHandle, RefusesInconsistentFields) {
  MemoryDescriptor outside = sample(MemoryKind::kLegacyIpc);
  outside.bytes = outside.allocation_bytes;  // runs past the allocation's end
  expect_refused(pack(outside), "outside its allocation");
  MemoryDescriptor before = sample(MemoryKind::kLegacyIpc);
  before.address = before.allocation_base - 1;
  expect_refused(pack(before), "outside its allocation");
  MemoryDescriptor empty = sample(MemoryKind::kLegacyIpc);
  empty.bytes = 0;
  expect_refused(pack(empty), "empty");
  MemoryDescriptor no_fd = sample(MemoryKind::kPosixFd);
  no_fd.fd = -1;
  expect_refused(pack(no_fd), "file descriptor");
  std::string unknown_kind = pack(sample(MemoryKind::kLegacyIpc));
  unknown_kind[6] = 9;
  expect_refused(resealed(unknown_kind), "unknown memory kind 9");
  MemoryDescriptor elsewhere = sample(MemoryKind::kLegacyIpc);
  elsewhere.host_id = "boot:another-host";
  expect_refused(pack(elsewhere), "another host");
  // The same blob is fine where no host is expected (the caller checks nothing of the kind).
  EXPECT_NO_THROW(unpack(pack(elsewhere), "import_handle", "blob", ""));
}

TEST(MemoryHandle, FuzzedBlobsNeverCrashTheUnpacker) {
  std::mt19937_64 random(20261122);
  const std::string valid[] = {pack(sample(MemoryKind::kLegacyIpc)), pack(sample(MemoryKind::kPosixFd))};
  size_t accepted = 0, refused = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string blob = valid[trial % 2];
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (random() % 4) {
        case 0: blob[random() % blob.size()] = static_cast<char>(random()); break;
        case 1: blob.resize(random() % (blob.size() + 1)); break;
        case 2: blob.insert(random() % (blob.size() + 1), 1, static_cast<char>(random())); break;
        case 3: if (trial % 3 == 0 && blob.size() >= 8) blob = resealed(blob); break;  // damage the checksum can't see
      }
      if (blob.empty()) break;
    }
    try {
      const MemoryDescriptor d = unpack(blob, "import_handle", "blob", this_host_id());
      // Whatever is accepted must be self-consistent.
      EXPECT_GT(d.bytes, 0u);
      EXPECT_LE(d.offset() + d.bytes, d.allocation_bytes);
      EXPECT_EQ(pack(d), blob) << "an accepted blob must be exactly the packing of what it says";
      ++accepted;
    } catch (const Error& error) {
      ASSERT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 150000u) << "resealed blobs with changed payload bytes are valid; most mutations are not";
  RecordProperty("accepted", static_cast<int>(accepted));
}

// A blob that names this process takes the same-process path (its address or descriptor number used as it
// is), so import_handle takes one only if this process exported it and keeps the export alive: a forged blob
// naming this process is refused, naming the argument, before anything touches CUDA or a descriptor.
TEST(MemoryHandle, ABlobNamingThisProcessMustBeOneOfItsExports) {
  for (const MemoryKind kind : {MemoryKind::kLegacyIpc, MemoryKind::kPosixFd}) {
    MemoryDescriptor forged = sample(kind);
    forged.pid = static_cast<uint32_t>(::getpid());
    forged.fd = kind == MemoryKind::kPosixFd ? 0 : -1;  // this process's stdin, were it taken
    try {
      import_handle(pack(forged));
      ADD_FAILURE() << "a forged blob naming this process was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
      EXPECT_NE(std::string(error.what()).find("argument 'blob'"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("no such live export"), std::string::npos) << error.what();
    }
  }
}

// With a job secret a blob carries the job's signature (HMAC-SHA256 of its fields): an importer with the secret
// takes only blobs signed with it; one without a secret cannot check a signature and takes the blob as before.
TEST(MemoryHandle, WithAJobSecretOnlyTheJobsSignedBlobsAreTaken) {
  const std::string secret = "the-job-secret-0123456789abcdef", other = "another-secret-0123456789abcdef";
  const MemoryDescriptor d = sample(MemoryKind::kPosixFd);
  const std::string signed_blob = pack(d, secret);
  EXPECT_NE(signed_blob, pack(d));
  EXPECT_EQ(pack(unpack(signed_blob, "import_handle", "blob", this_host_id(), secret), secret), signed_blob);
  EXPECT_EQ(unpack(signed_blob, "import_handle", "blob", this_host_id(), "").address, d.address);
  const auto refused = [](const std::string& blob, const std::string& key, const std::string& words) {
    try {
      unpack(blob, "import_handle", "blob", this_host_id(), key);
      ADD_FAILURE() << "accepted; expected '" << words << "'";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
      EXPECT_NE(std::string(error.what()).find("argument 'blob'"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
      EXPECT_EQ(std::string(error.what()).find(key), std::string::npos) << "the secret shows: " << error.what();
    }
  };
  refused(pack(d), secret, "not signed");
  refused(signed_blob, other, "signature is not this job's");
  // A field changed and the checksum made right again: the signature no longer matches.
  MemoryDescriptor moved = d;
  moved.address += 4096;
  std::string altered = pack(moved);  // unsigned, then given the original's signature
  const std::string original_signature = signed_blob.substr(signed_blob.size() - 8 - 32, 32);
  const size_t signature_at = altered.size() - 8 - 2;  // the empty signature's length field (u16)
  altered = altered.substr(0, signature_at);
  const uint16_t length = 32;
  altered.append(reinterpret_cast<const char*>(&length), 2);
  altered += original_signature;
  const uint64_t checksum = stable_hash(altered);
  altered.append(reinterpret_cast<const char*>(&checksum), 8);
  refused(altered, secret, "signature is not this job's");
}

TEST(MemoryHandle, ExportAndImportWithoutAGpuFailClearly) {
  // import_handle checks the blob before it touches CUDA: bad blobs are refused on any machine.
  try {
    import_handle("not a handle");
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "a GPU is present; the no-GPU path is not reachable";
  char host[64];
  try {
    export_handle(host, sizeof host);
    ADD_FAILURE() << "export_handle worked with no GPU";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNoDevice) << error.what();
  }
}

void expect_device_refused(const std::function<void()>& call, const std::string& function) {
  try {
    call();
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find(function + ": argument 'device'"), std::string::npos) << error.what();
  }
}

// -1 is the current device; a device below it is refused before CUDA is touched, one past the GPUs once counted.
TEST(MemoryHandle, ADeviceBelowMinusOneIsRefusedNamingIt) {
  char host[64];
  const std::string blob = pack(sample(MemoryKind::kPosixFd));  // another process's: passes the blob checks
  for (const int device : {-2, -100}) {
    expect_device_refused([&] { export_handle(host, sizeof host, device); }, "export_handle");
    expect_device_refused([&] { import_handle(blob, device); }, "import_handle");
  }
}

TEST(MemoryHandle, ADevicePastTheGpusIsRefusedNamingIt) {
  char host[64];
  const std::string blob = pack(sample(MemoryKind::kPosixFd));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no GPU: devices cannot be counted";
  expect_device_refused([&] { export_handle(host, sizeof host, devices); }, "export_handle");
  expect_device_refused([&] { import_handle(blob, devices); }, "import_handle");
}

}  // namespace
}  // namespace braid::detail
