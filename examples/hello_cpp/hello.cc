// hello_cpp: hello_weft with the C++ API. Every rank sends its rank to both
// ring neighbours, then the ranks sum their ranks with an AllReduce.
#include <cstdio>
#include <vector>
#include <weft/weft.hpp>

int main() {
  try {
    weft::Comm comm = weft::Comm::from_env();
    int rank = comm.rank(), size = comm.size();
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    std::vector<int32_t> mine{rank}, from_left{-1}, from_right{-1};
    {
      weft::Group group;  // every rank sends before anyone receives, without deadlock
      comm.send(mine, left);
      comm.send(mine, right);
      comm.recv(from_left, left);
      comm.recv(from_right, right);
      group.end();
    }
    std::vector<double> total{static_cast<double>(rank)};
    comm.all_reduce(total, weft::Op::sum);  // in place
    bool ok = from_left[0] == left && from_right[0] == right && total[0] == size * (size - 1) / 2.0;
    std::printf("hello from rank %d of %d: got %d from left, %d from right: %s\n", rank, size,
                from_left[0], from_right[0], ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  } catch (const weft::Error& error) {
    std::fprintf(stderr, "weft error: %s\n", error.what());
    return 1;
  }
}
