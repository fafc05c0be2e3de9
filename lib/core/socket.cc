#include "core/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>

#include "common/env.h"
#include "common/log.h"

namespace weft {

int remaining_ms(Deadline deadline, int cap_ms) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return left.count() > cap_ms ? cap_ms : static_cast<int>(left.count());
}

std::string SocketAddress::to_string() const {
  char host[INET6_ADDRSTRLEN] = "?";
  char text[INET6_ADDRSTRLEN + 16];
  if (storage.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host,
              sizeof(host));
    snprintf(text, sizeof(text), "%s:%u", host, port());
  } else {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host,
              sizeof(host));
    snprintf(text, sizeof(text), "[%s]:%u", host, port());
  }
  return text;
}

uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
}

void SocketAddress::set_port(uint16_t port) {
  if (storage.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  else
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

Status parse_socket_address(const std::string& text, SocketAddress* out) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return Error(weftInvalidArgument, "address '%s' is not host:port", text.c_str());
  std::string host = text.substr(0, colon);
  std::string port = text.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  long port_number = strtol(port.c_str(), &end, 10);
  if (*end != '\0' || port_number <= 0 || port_number > 65535)
    return Error(weftInvalidArgument, "address '%s' has an invalid port", text.c_str());
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr)
    return Error(weftInvalidArgument, "cannot resolve host '%s': %s", host.c_str(),
                 gai_strerror(rc));
  memcpy(&out->storage, result->ai_addr, result->ai_addrlen);
  out->length = result->ai_addrlen;
  freeaddrinfo(result);
  out->set_port(static_cast<uint16_t>(port_number));
  return Status::Ok();
}

namespace {

// WEFT_SOCKET_IFNAME: "eth,ib" prefixes; "^docker,lo" excludes; "=eth0" exact.
bool interface_matches(const std::string& spec, const char* name) {
  std::string_view rest(spec);
  bool exclude = !rest.empty() && rest.front() == '^';
  if (exclude) rest.remove_prefix(1);
  bool exact = !rest.empty() && rest.front() == '=';
  if (exact) rest.remove_prefix(1);
  bool matched = false;
  while (!rest.empty() && !matched) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    matched = exact ? item == name : std::string_view(name).starts_with(item);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return exclude ? !matched : matched;
}

}  // namespace

Status choose_interface_address(SocketAddress* out, std::string* ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return Error(weftSystemError, "getifaddrs failed: %s", strerror(errno));
  std::optional<std::string> spec = env_string("WEFT_SOCKET_IFNAME");
  const ifaddrs* chosen = nullptr;
  const ifaddrs* loopback = nullptr;
  for (const ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(it->ifa_addr)->sin6_addr))
      continue;
    if (spec) {
      if (!interface_matches(*spec, it->ifa_name)) continue;
    } else if (it->ifa_flags & IFF_LOOPBACK) {
      if (loopback == nullptr && family == AF_INET) loopback = it;
      continue;
    } else if (std::string_view(it->ifa_name).starts_with("docker") ||
               std::string_view(it->ifa_name).starts_with("virbr")) {
      continue;
    }
    // Prefer IPv4 among matches: it is what most clusters route.
    if (chosen == nullptr || (chosen->ifa_addr->sa_family == AF_INET6 && family == AF_INET))
      chosen = it;
  }
  if (chosen == nullptr) chosen = spec ? nullptr : loopback;
  if (chosen == nullptr) {
    freeifaddrs(list);
    // With WEFT_SOCKET_IFNAME set, the user named what does not exist.
    return Error(spec ? weftInvalidArgument : weftSystemError,
                 "no network interface matches WEFT_SOCKET_IFNAME=%s",
                 spec ? spec->c_str() : "(unset)");
  }
  size_t length =
      chosen->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  out->storage = {};
  memcpy(&out->storage, chosen->ifa_addr, length);
  out->length = static_cast<socklen_t>(length);
  out->set_port(0);
  if (ifname != nullptr) *ifname = chosen->ifa_name;
  freeifaddrs(list);
  return Status::Ok();
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status listen_on(SocketAddress* address, Fd* out) {
  Fd fd(socket(address->storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Error(weftSystemError, "socket failed: %s", strerror(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&address->storage), address->length) != 0)
    return Error(weftSystemError, "cannot bind the bootstrap listener to %s: %s",
                 address->to_string().c_str(), strerror(errno));
  if (listen(fd.get(), 1024) != 0)
    return Error(weftSystemError, "listen failed: %s", strerror(errno));
  socklen_t length = sizeof(address->storage);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address->storage), &length);
  address->length = length;
  *out = std::move(fd);
  return Status::Ok();
}

Status connect_to(const SocketAddress& address, Deadline deadline, Fd* out) {
  int backoff_ms = 1;
  while (true) {
    Fd fd(socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return Error(weftSystemError, "socket failed: %s", strerror(errno));
    int rc = connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length);
    int error = rc == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd pfd{fd.get(), POLLOUT, 0};
      int ready = poll(&pfd, 1, remaining_ms(deadline));
      if (ready == 0) error = ETIMEDOUT;
      socklen_t length = sizeof(error);
      if (ready > 0) getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
    }
    if (error == 0) {
      fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
      set_nodelay(fd.get());
      *out = std::move(fd);
      return Status::Ok();
    }
    bool retry = error == ECONNREFUSED || error == ECONNRESET || error == EAGAIN ||
                 error == ENETUNREACH || error == EHOSTUNREACH;
    if (!retry || remaining_ms(deadline) == 0)
      return Error(error == ETIMEDOUT || retry ? weftTimeout : weftSystemError,
                   "cannot connect to the bootstrap root at %s: %s", address.to_string().c_str(),
                   strerror(error));
    // The root may not listen yet: back off briefly before the next try.
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(backoff_ms, remaining_ms(deadline))));
    backoff_ms = std::min(backoff_ms * 2, 100);
  }
}

namespace {
Status wait_fd(int fd, short events, Deadline deadline, const char* what) {
  pollfd pfd{fd, events, 0};
  while (true) {
    int ready = poll(&pfd, 1, remaining_ms(deadline));
    if (ready > 0) return Status::Ok();
    if (ready == 0) return Error(weftTimeout, "timed out %s the bootstrap socket", what);
    if (errno != EINTR) return Error(weftSystemError, "poll failed: %s", strerror(errno));
  }
}
}  // namespace

Status write_all(int fd, const void* data, size_t size, Deadline deadline) {
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t written = send(fd, bytes, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (written > 0) {
      bytes += written;
      size -= static_cast<size_t>(written);
    } else if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      WEFT_RETURN_IF_ERROR(wait_fd(fd, POLLOUT, deadline, "writing to"));
    } else {
      return Error(weftRemoteError, "bootstrap connection lost while writing: %s", strerror(errno));
    }
  }
  return Status::Ok();
}

Status read_all(int fd, void* data, size_t size, Deadline deadline) {
  char* bytes = static_cast<char*>(data);
  while (size > 0) {
    ssize_t got = recv(fd, bytes, size, MSG_DONTWAIT);
    if (got > 0) {
      bytes += got;
      size -= static_cast<size_t>(got);
    } else if (got == 0) {
      return Error(weftRemoteError, "bootstrap connection closed by the peer");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      WEFT_RETURN_IF_ERROR(wait_fd(fd, POLLIN, deadline, "reading from"));
    } else {
      return Error(weftRemoteError, "bootstrap connection lost while reading: %s", strerror(errno));
    }
  }
  return Status::Ok();
}

Status send_frame(int fd, uint32_t type, const void* payload, size_t size, Deadline deadline) {
  // One write per frame: a header sent on its own could wait for the peer's
  // delayed acknowledgement (tens of ms) before the payload leaves.
  FrameHeader header{kFrameMagic, type, size};
  std::vector<uint8_t> frame(sizeof(header) + size);
  memcpy(frame.data(), &header, sizeof(header));
  if (size != 0) memcpy(frame.data() + sizeof(header), payload, size);
  return write_all(fd, frame.data(), frame.size(), deadline);
}

Status recv_frame(int fd, uint32_t* type, std::vector<uint8_t>* payload, Deadline deadline,
                  uint64_t max_payload) {
  FrameHeader header{};
  WEFT_RETURN_IF_ERROR(read_all(fd, &header, sizeof(header), deadline));
  WEFT_RETURN_IF_ERROR(check_frame_header(header, max_payload));
  *type = header.type;
  payload->resize(header.length);
  return read_all(fd, payload->data(), header.length, deadline);
}

Status random_bytes(void* buffer, size_t size) {
  char* bytes = static_cast<char*>(buffer);
  while (size > 0) {
    ssize_t got = getrandom(bytes, size, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return Error(weftSystemError, "getrandom failed: %s", strerror(errno));
    }
    bytes += got;
    size -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace weft
