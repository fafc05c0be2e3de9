#include "transports/shm/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>

namespace weft::shm {

namespace {

constexpr const char* kShmDir = "/dev/shm";

std::string unique_name(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  std::random_device random;
  char name[96];
  snprintf(name, sizeof(name), "/%s-%d-%llx-%08x", prefix.c_str(), static_cast<int>(getpid()),
           static_cast<unsigned long long>(counter.fetch_add(1)), random());
  return name;
}

Status no_room(const std::string& name, size_t bytes, int error) {
  std::optional<uint64_t> room = free_bytes();
  std::string free_text = room ? std::to_string(*room) : "unknown";
  return Error(weftSystemError,
               "cannot reserve %zu bytes of shared memory in %s for %s (%s; %s bytes free): "
               "enlarge %s (e.g. docker --shm-size), lower WEFT_SHM_BYTES or set "
               "WEFT_SHM_DISABLE=1",
               bytes, kShmDir, name.c_str(), strerror(error), free_text.c_str(), kShmDir);
}

Status map(int fd, size_t bytes, const std::string& name, std::byte** out) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED)
    return Error(weftSystemError, "mmap of %s%s (%zu bytes) failed: %s", kShmDir, name.c_str(),
                 bytes, strerror(errno));
  *out = static_cast<std::byte*>(data);
  return Status::Ok();
}

}  // namespace

std::optional<uint64_t> free_bytes() {
  struct statvfs fs {};
  if (statvfs(kShmDir, &fs) != 0) return std::nullopt;
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    this->~Segment();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

Segment::~Segment() {
  unlink();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
}

Status Segment::create(const std::string& prefix, size_t bytes, Segment* out) {
  return create_named(unique_name(prefix), bytes, out);
}

Status Segment::create_named(const std::string& name, size_t bytes, Segment* out) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return Error(weftSystemError, "shm_open(%s) in %s failed: %s", name.c_str(), kShmDir,
                 strerror(errno));
  Segment segment;
  segment.name_ = name;
  segment.linked_ = true;  // from here on, every error path unlinks (the destructor)
  segment.size_ = bytes;
  // posix_fallocate commits the pages now; ftruncate alone would leave a hole
  // that faults with SIGBUS when tmpfs runs out later.
  // A request beyond what is free fails before committing any page.
  std::optional<uint64_t> room = free_bytes();
  int error = room && bytes > *room ? ENOSPC : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  Status status = error == 0 ? map(fd, bytes, name, &segment.data_) : no_room(name, bytes, error);
  close(fd);
  if (!status.ok()) {
    segment.size_ = 0;
    return status;
  }
  *out = std::move(segment);
  return Status::Ok();
}

Status Segment::open(const std::string& name, size_t bytes, Segment* out) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0)
    return Error(weftSystemError, "shm_open(%s) in %s failed: %s (is the peer on this node?)",
                 name.c_str(), kShmDir, strerror(errno));
  struct stat info {};
  Status status;
  if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != bytes)
    status = Error(weftSystemError, "%s%s is %lld bytes, expected %zu", kShmDir, name.c_str(),
                   static_cast<long long>(info.st_size), bytes);
  Segment segment;
  if (status.ok()) status = map(fd, bytes, name, &segment.data_);
  close(fd);
  WEFT_RETURN_IF_ERROR(status);
  segment.size_ = bytes;
  segment.name_ = name;
  *out = std::move(segment);
  return Status::Ok();
}

Status Segment::anonymous(size_t bytes, Segment* out) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED)
    return Error(weftSystemError, "mmap of %zu bytes failed: %s", bytes, strerror(errno));
  Segment segment;
  segment.data_ = static_cast<std::byte*>(data);
  segment.size_ = bytes;
  *out = std::move(segment);
  return Status::Ok();
}

bool Segment::prefault(size_t offset, size_t bytes) const {
  bytes = std::min(bytes, size_ - std::min(offset, size_));
  if (data_ == nullptr || bytes == 0) return true;
  // madvise takes whole pages: start at the page that holds `offset`.
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page;
  return madvise(data_ + start, offset + bytes - start, MADV_POPULATE_WRITE) == 0;
}

void Segment::unlink_name(const std::string& name) {
  shm_unlink(name.c_str());
}

void Segment::unlink() {
  if (linked_) unlink_name(name_);
  linked_ = false;
}

int remove_orphans(const std::string& prefix) {
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) return 0;
  int removed = 0;
  std::string head = prefix + "-";
  while (dirent* entry = readdir(dir)) {
    std::string name = entry->d_name;
    if (name.compare(0, head.size(), head) != 0) continue;
    char* end = nullptr;
    long pid = strtol(name.c_str() + head.size(), &end, 10);
    if (end == name.c_str() + head.size() || *end != '-' || pid <= 0) continue;
    // EPERM: alive under another user; only ESRCH means gone.
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, int timeout_ms) {
  struct timespec timeout {
    timeout_ms / 1000, (timeout_ms % 1000) * 1000000L
  };
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &timeout, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace weft::shm
