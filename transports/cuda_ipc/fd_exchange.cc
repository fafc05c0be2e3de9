#include "transports/cuda_ipc/fd_exchange.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>

namespace weft::cuda_ipc {
namespace {

constexpr uint64_t kHelloMagic = 0x7765667469706331ull;  // "weftipc1"
constexpr uint32_t kMessageMagic = 0x77666478;           // "wfdx"

struct Hello {
  uint64_t magic;
  uint64_t token;
  int32_t from;
  int32_t to;
};

struct Header {
  uint32_t magic;
  uint32_t nfds;
  uint64_t nbytes;
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// FNV-1a over the id, from a per-purpose basis: the socket name and the
// token come from the same id but one cannot be read off the other.
uint64_t id_hash(const void* id, size_t bytes, uint64_t basis) {
  uint64_t h = basis;
  const auto* p = static_cast<const uint8_t*>(id);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string peer_text(int peer) {
  return "rank " + std::to_string(peer);
}

Status sys_error(const std::string& what, int peer) {
  return Error(weftSystemError, "cuda_ipc: %s with %s: %s", what.c_str(), peer_text(peer).c_str(),
               std::strerror(errno));
}

// Waits until `fd` is ready for `events` or the deadline passes.
Status wait_ready(int fd, short events, int64_t deadline_ms, int peer, const char* what) {
  for (;;) {
    const int64_t left = deadline_ms - now_ms();
    if (left <= 0) {
      return Error(weftTimeout, "cuda_ipc: timed out %s %s", what, peer_text(peer).c_str());
    }
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) return sys_error("poll", peer);
  }
}

// Writes all of `data`; the descriptors travel with its first byte.
Status write_all(int fd, const void* data, size_t len, const int* fds, size_t nfds,
                 int64_t deadline_ms, int peer) {
  const auto* p = static_cast<const std::byte*>(data);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  while (len > 0) {
    WEFT_RETURN_IF_ERROR(wait_ready(fd, POLLOUT, deadline_ms, peer, "sending to"));
    iovec iov{const_cast<std::byte*>(p), len};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds > 0) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
      std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return sys_error("sending", peer);
    }
    nfds = 0;  // sent with the first byte
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads exactly `len` bytes; descriptors that arrive with them go to *fds.
Status read_exact(int fd, void* data, size_t len, int64_t deadline_ms, int peer,
                  std::vector<UniqueFd>* fds) {
  auto* p = static_cast<std::byte*>(data);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  while (len > 0) {
    WEFT_RETURN_IF_ERROR(wait_ready(fd, POLLIN, deadline_ms, peer, "waiting for"));
    iovec iov{p, len};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return sys_error("receiving", peer);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (fds == nullptr) {
          ::close(received);  // descriptors where none belong are not kept
        } else {
          fds->emplace_back(received);
        }
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      return Error(weftRemoteError, "cuda_ipc: %s sent more than %zu descriptors in one message",
                   peer_text(peer).c_str(), kMaxFdsPerMessage);
    }
    if (n == 0) {
      return Error(weftRemoteError, "cuda_ipc: %s closed the connection", peer_text(peer).c_str());
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

sockaddr_un abstract_address(const std::string& name, socklen_t* length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file, gone with the socket.
  const size_t n = std::min(name.size(), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

FdExchange::~FdExchange() = default;

std::string FdExchange::socket_name(const void* id, size_t id_bytes, int rank) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(id_hash(id, id_bytes, 0xcbf29ce484222325ull)));
  return std::string("weft-ipc-") + hex + "-" + std::to_string(rank);
}

Status FdExchange::listen(const void* id, size_t id_bytes, int rank, int nranks) {
  if (id == nullptr || id_bytes == 0) {
    return Error(weftInvalidArgument, "cuda_ipc: id must not be empty");
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Error(weftInvalidArgument, "cuda_ipc: rank %d is outside 0..%d", rank, nranks - 1);
  }
  if (listener_.get() >= 0) return Error(weftInvalidUsage, "cuda_ipc: already listening");
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return sys_error("creating a socket", rank);
  const std::string name = socket_name(id, id_bytes, rank);
  socklen_t length = 0;
  const sockaddr_un addr = abstract_address(name, &length);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    return Error(weftSystemError, "cuda_ipc: binding @%s for rank %d: %s", name.c_str(), rank,
                 std::strerror(errno));
  }
  if (::listen(fd.get(), 128) != 0) return sys_error("listening", rank);
  listener_ = std::move(fd);
  rank_ = rank;
  nranks_ = nranks;
  name_ = name;
  id_.assign(static_cast<const uint8_t*>(id), static_cast<const uint8_t*>(id) + id_bytes);
  token_ = id_hash(id, id_bytes, 0x84222325cbf29ce4ull);
  return Status::Ok();
}

Status FdExchange::connection(int peer, int64_t deadline_ms, int* fd) {
  if (listener_.get() < 0) return Error(weftInvalidUsage, "cuda_ipc: listen() first");
  if (peer < 0 || peer >= nranks_ || peer == rank_) {
    return Error(weftInvalidArgument, "cuda_ipc: peer %d is not another rank of 0..%d", peer,
                 nranks_ - 1);
  }
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    // The higher rank dials, so each pair opens exactly one connection.
    WEFT_RETURN_IF_ERROR(peer > rank_ ? accept_from(peer, deadline_ms) : dial(peer, deadline_ms));
    it = peers_.find(peer);
  }
  *fd = it->second.get();
  return Status::Ok();
}

Status FdExchange::dial(int peer, int64_t deadline_ms) {
  const std::string name = socket_name(id_.data(), id_.size(), peer);
  socklen_t length = 0;
  const sockaddr_un addr = abstract_address(name, &length);
  int backoff_ms = 1;
  for (;;) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return sys_error("creating a socket", peer);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), length) == 0) {
      const Hello hello{kHelloMagic, token_, rank_, peer};
      WEFT_RETURN_IF_ERROR(
          write_all(fd.get(), &hello, sizeof(hello), nullptr, 0, deadline_ms, peer));
      peers_[peer] = std::move(fd);
      return Status::Ok();
    }
    if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR) {
      return sys_error("connecting to @" + name, peer);
    }
    // Not listening yet: the peer may still be starting. Back off, up to the deadline.
    const int64_t left = deadline_ms - now_ms();
    if (left <= 0) {
      return Error(weftTimeout, "cuda_ipc: %s never listened on @%s", peer_text(peer).c_str(),
                   name.c_str());
    }
    ::poll(nullptr, 0, static_cast<int>(std::min<int64_t>(backoff_ms, left)));
    backoff_ms = std::min(backoff_ms * 2, 50);
  }
}

Status FdExchange::accept_from(int peer, int64_t deadline_ms) {
  while (peers_.find(peer) == peers_.end()) {
    const Status ready =
        wait_ready(listener_.get(), POLLIN, deadline_ms, peer, "waiting for a connection from");
    if (!ready.ok()) return ready;
    UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return sys_error("accepting", peer);
    }
    // A caller that is not this user, or does not know the id, is dropped
    // and the wait goes on: it cannot make the exchange fail.
    ucred cred{};
    socklen_t cred_len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0 ||
        cred.uid != ::getuid()) {
      continue;
    }
    Hello hello{};
    const int64_t hello_deadline = std::min(deadline_ms, now_ms() + 1000);
    if (!read_exact(fd.get(), &hello, sizeof(hello), hello_deadline, peer, nullptr).ok()) continue;
    if (hello.magic != kHelloMagic || hello.token != token_ || hello.to != rank_ ||
        hello.from <= rank_ || hello.from >= nranks_ || peers_.count(hello.from) != 0) {
      continue;
    }
    peers_[hello.from] = std::move(fd);  // maybe another peer than the one awaited: kept
  }
  return Status::Ok();
}

Status FdExchange::send(int peer, const int* fds, size_t nfds, const void* bytes, size_t nbytes,
                        int64_t timeout_ms) {
  if (nfds > kMaxFdsPerMessage) {
    return Error(weftInvalidArgument, "cuda_ipc: nfds %zu exceeds %zu", nfds, kMaxFdsPerMessage);
  }
  if (nbytes > kMaxMessageBytes) {
    return Error(weftInvalidArgument, "cuda_ipc: nbytes %zu exceeds %zu", nbytes, kMaxMessageBytes);
  }
  if ((nfds > 0 && fds == nullptr) || (nbytes > 0 && bytes == nullptr)) {
    return Error(weftInvalidArgument, "cuda_ipc: fds or bytes is null");
  }
  const int64_t deadline = now_ms() + timeout_ms;
  int fd = -1;
  WEFT_RETURN_IF_ERROR(connection(peer, deadline, &fd));
  const Header header{kMessageMagic, static_cast<uint32_t>(nfds), nbytes};
  WEFT_RETURN_IF_ERROR(write_all(fd, &header, sizeof(header), fds, nfds, deadline, peer));
  return write_all(fd, bytes, nbytes, nullptr, 0, deadline, peer);
}

Status FdExchange::recv(int peer, FdMessage* out, int64_t timeout_ms) {
  const int64_t deadline = now_ms() + timeout_ms;
  int fd = -1;
  WEFT_RETURN_IF_ERROR(connection(peer, deadline, &fd));
  out->fds.clear();
  out->bytes.clear();
  Header header{};
  WEFT_RETURN_IF_ERROR(read_exact(fd, &header, sizeof(header), deadline, peer, &out->fds));
  if (header.magic != kMessageMagic || header.nbytes > kMaxMessageBytes ||
      header.nfds != out->fds.size()) {
    const size_t got = out->fds.size();
    out->fds.clear();
    return Error(weftRemoteError,
                 "cuda_ipc: malformed message from %s (%zu descriptors where it announced %u)",
                 peer_text(peer).c_str(), got, header.nfds);
  }
  out->bytes.resize(header.nbytes);
  return read_exact(fd, out->bytes.data(), out->bytes.size(), deadline, peer, nullptr);
}

}  // namespace weft::cuda_ipc
