// How much of ring attention's communication the block compute hides. Each
// round runs (a) the ring's k|v shifts alone (P−1 send/receive pairs of one
// block, as the forward posts them) and (b) a full ring attention forward +
// backward, whose ledger gives the time the caller waited for the shifts
// (exposed). Hidden = 1 − exposed / alone, per pass; the worst rank's median
// round is reported.
//   weftrun -n 4 weft-cp-ring-overlap [--seq N] [--heads N] [--dim N] [--batch N]
//                                     [--algo ring|zigzag] [--rounds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "weft/parallel.hpp"

namespace {

namespace par = weft::parallel;

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Exposed seconds of the ledger's entries of a pattern.
double exposed(const par::Ledger& ledger, const std::string& pattern) {
  double s = 0;
  for (const par::LedgerEntry& e : ledger.entries())
    if (e.pattern == pattern) s += e.exposed_s;
  return s;
}

// shifts send/receive pairs of `count` floats around the ring on comm.
void shifts_alone(weftComm_t comm, weftStream_t stream, int rank, int n, int shifts,
                  std::vector<float>& a, std::vector<float>& b) {
  for (int i = 0; i < shifts; ++i) {
    weft::check(weftGroupStart());
    weft::check(weftSend(a.data(), a.size(), weftFloat32, (rank + 1) % n, comm, stream));
    weft::check(weftRecv(b.data(), b.size(), weftFloat32, (rank + n - 1) % n, comm, stream));
    weft::check(weftGroupEnd());
    weft::check(weftStreamSynchronize(stream));
    std::swap(a, b);
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t seq = 1024, heads = 8, dim = 64, batch = 1;
  int rounds = 3;
  std::string algo = "zigzag";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string arg = argv[i];
    if (arg == "--seq") seq = strtoull(argv[i + 1], nullptr, 10);
    if (arg == "--heads") heads = strtoull(argv[i + 1], nullptr, 10);
    if (arg == "--dim") dim = strtoull(argv[i + 1], nullptr, 10);
    if (arg == "--batch") batch = strtoull(argv[i + 1], nullptr, 10);
    if (arg == "--rounds") rounds = atoi(argv[i + 1]);
    if (arg == "--algo") algo = argv[i + 1];
  }
  try {
    weft::Comm world = weft::Comm::from_env();
    int n = world.size(), rank = world.rank();
    par::MeshShape shape;
    shape.cp = n;
    par::Mesh mesh(world, shape);
    par::Ledger ledger;
    par::Axis cp(mesh, "cp", &ledger);
    par::AttentionShape sh;
    sh.batch = batch, sh.heads = heads, sh.head_dim = dim, sh.causal = true;
    par::CpConfig config;
    config.algorithm = par::parse_cp_algorithm(algo);
    config.q_seq = seq;
    par::ContextParallelAttention attention(cp, sh, config);
    size_t rows = attention.q_rows(), stride = batch * heads * dim;
    std::vector<float> q(rows * stride), k(q.size()), v(q.size()), out(q.size()), dq(q.size()),
        dk(q.size()), dv(q.size());
    for (size_t i = 0; i < q.size(); ++i) {
      q[i] = float((i * 7 + rank) % 13) / 13 - 0.5f;
      k[i] = float((i * 5 + rank) % 11) / 11 - 0.5f;
      v[i] = float((i * 3 + rank) % 17) / 17 - 0.5f;
    }
    std::vector<float> a(2 * q.size(), 1.0f), b(a.size());
    std::vector<double> hidden_fwd, hidden_bwd, alone_ms, exposed_ms, exposed_bwd_ms, step_ms;
    for (int round = -1; round < rounds; ++round) {  // round -1 warms the connections up
      double t0 = seconds();
      shifts_alone(mesh.group("cp"), mesh.stream("cp"), cp.rank(), n, n - 1, a, b);
      double alone = seconds() - t0;
      ledger.clear();
      t0 = seconds();
      attention.forward(q, k, v, out);
      attention.backward(out, dq, dk, dv);
      step_ms.push_back((seconds() - t0) * 1e3);
      double fwd = exposed(ledger, "cp.ring_kv");
      // Backward moves two blocks per step (k|v and the dk|dv accumulators).
      double bwd = exposed(ledger, "cp.ring_kv_bwd") + exposed(ledger, "cp.ring_dkv");
      if (round < 0) continue;
      hidden_fwd.push_back(std::max(0.0, 1 - fwd / alone));
      hidden_bwd.push_back(std::max(0.0, 1 - bwd / (2 * alone)));
      alone_ms.push_back(alone * 1e3);
      exposed_ms.push_back(fwd * 1e3);
      exposed_bwd_ms.push_back(bwd * 1e3);
    }
    // The worst rank's medians.
    double mine[2] = {median(hidden_fwd), median(hidden_bwd)}, worst[2];
    weft::check(weftAllReduce(mine, worst, 2, weftFloat64, weftMin, world.get(), nullptr));
    if (rank == 0)
      std::printf(
          "# weft-cp-ring-overlap: %d ranks, %s, seq %zu batch %zu heads %zu dim %zu (block %zu "
          "KiB k|v)\n# rank 0 median: step %.1f ms, shifts alone %.3f ms, exposed forward %.3f "
          "ms, backward %.3f ms\n# hidden (worst rank, median of %d rounds): forward %.1f%%, "
          "backward %.1f%%\n",
          n, algo.c_str(), seq, batch, heads, dim, a.size() * sizeof(float) / 1024, median(step_ms),
          median(alone_ms), median(exposed_ms), median(exposed_bwd_ms), rounds, 100 * worst[0],
          100 * worst[1]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-cp-ring-overlap: %s\n", e.what());
    return 1;
  }
}
