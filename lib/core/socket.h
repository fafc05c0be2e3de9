// TCP plumbing for the bootstrap: addresses, interface choice, and framed
// messages with deadlines. Every blocking call here takes a deadline.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "core/bootstrap_protocol.h"

namespace weft {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after_ms(int64_t ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}
// Milliseconds left until the deadline, clamped to [0, cap_ms].
int remaining_ms(Deadline deadline, int cap_ms = 1 << 30);

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  std::string to_string() const;  // "host:port"
  uint16_t port() const;
  void set_port(uint16_t port);
};

// Parses "host:port" (IPv4, [IPv6] or a resolvable name).
Status parse_socket_address(const std::string& text, SocketAddress* out);

// The address of the interface the bootstrap should use, per WEFT_SOCKET_IFNAME
// (prefix list, ^ to exclude, = for exact names); default: the first
// non-loopback interface that is up, else loopback.
Status choose_interface_address(SocketAddress* out, std::string* ifname);

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A listening socket bound to `address` (port 0: any); address gets the port.
Status listen_on(SocketAddress* address, Fd* out);
// Connects, retrying refused connections until the deadline (the listener may
// not be up yet when ranks start together).
Status connect_to(const SocketAddress& address, Deadline deadline, Fd* out);

// Sends small writes at once (no Nagle delay): the bootstrap's frames are latency-bound.
void set_nodelay(int fd);
Status write_all(int fd, const void* data, size_t size, Deadline deadline);
Status read_all(int fd, void* data, size_t size, Deadline deadline);
Status send_frame(int fd, uint32_t type, const void* payload, size_t size, Deadline deadline);
// Reads one frame (bootstrap_protocol.h); rejects a bad magic or a payload above max_payload.
Status recv_frame(int fd, uint32_t* type, std::vector<uint8_t>* payload, Deadline deadline,
                  uint64_t max_payload = kMaxFramePayload);

// Fills buffer with bytes from the kernel's random source.
Status random_bytes(void* buffer, size_t size);

}  // namespace weft
