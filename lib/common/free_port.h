// A TCP port for a listener that a process will bind a moment later (weftrun's bootstrap
// root, the tests' roots). Header-only: weftrun uses it without linking the library.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>

namespace weft {

inline bool tcp_port_is_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return free;
}

// The first port of the kernel's ephemeral range (outgoing connections' local ports).
inline int ephemeral_port_low() {
  int low = 32768;
  if (FILE* range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (fscanf(range, "%d", &low) != 1) low = 32768;
    fclose(range);
  }
  return low;
}

// An even port P with P and P + 1 free, below the ephemeral range: there no outgoing
// connection (another job's, UCX's) can take it between this check and the bind, as
// happened to kernel-chosen ports under ctest -j. 0 when none is found.
inline int free_port_pair() {
  constexpr int kLowest = 10000;
  const int low = ephemeral_port_low();
  std::minstd_rand random(
      static_cast<unsigned>(getpid()) * 2654435761u ^
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; low > kLowest + 2 && attempt < 1000; ++attempt) {
    const int port = kLowest + static_cast<int>(random() % ((low - kLowest - 1) / 2)) * 2;
    if (tcp_port_is_free(port) && tcp_port_is_free(port + 1)) return port;
  }
  return 0;
}

}  // namespace weft
