// MoE dispatch + combine through weft::parallel::MoeDispatcher against the
// same exchange written over MPI (counts by MPI_Alltoall, rows with their
// slot data by MPI_Alltoallv, back by MPI_Alltoallv), in one run: MPI
// launches the ranks and hands Weft its unique id. Identity experts, so the
// time is the exchange and the packing; rounds alternate the two and the
// median round is reported, and both outputs are checked equal.
//   mpirun -np N weft-ep-bench [-t TOKENS] [-h HIDDEN] [-e EXPERTS] [-k TOPK] [-r ROUNDS] [-i
//   ITERS]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "weft/parallel.hpp"

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The exchange over MPI: each token once per destination rank, with its
// slots' local experts (−1 elsewhere) and weights; the receiver groups by
// local expert, applies the identity expert, weights and sums per row, and
// sends one row back per received row.
struct MpiMoe {
  int ranks, rank, local, k;
  size_t h;

  void run(const std::vector<float>& x, size_t tokens, const std::vector<int32_t>& index,
           const std::vector<float>& weight, std::vector<float>& out) const {
    const size_t stride = h + 2 * size_t(k);  // in 4-byte words
    std::vector<std::vector<size_t>> sent(ranks);
    for (size_t t = 0; t < tokens; ++t)
      for (int p = 0; p < ranks; ++p)
        for (int j = 0; j < k; ++j)
          if (index[t * k + j] / local == p) {
            sent[p].push_back(t);
            break;
          }
    std::vector<int> scount(ranks), rcount(ranks), sdispl(ranks), rdispl(ranks);
    for (int p = 0; p < ranks; ++p) scount[p] = int(sent[p].size());
    MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, MPI_COMM_WORLD);
    int stotal = 0, rtotal = 0;
    for (int p = 0; p < ranks; ++p) {
      sdispl[p] = stotal, rdispl[p] = rtotal;
      stotal += scount[p], rtotal += rcount[p];
    }
    std::vector<float> send(size_t(stotal) * stride), recv(size_t(rtotal) * stride);
    for (int p = 0; p < ranks; ++p)
      for (size_t n = 0; n < sent[p].size(); ++n) {
        size_t t = sent[p][n];
        float* record = send.data() + (size_t(sdispl[p]) + n) * stride;
        std::memcpy(record, x.data() + t * h, h * 4);
        for (int j = 0; j < k; ++j) {
          int32_t g = index[t * k + j], e = g / local == p ? g - p * local : -1;
          std::memcpy(record + h + j, &e, 4);
          record[h + k + j] = weight[t * k + j];
        }
      }
    auto words = [&](std::vector<int> v) {
      for (int& c : v) c *= int(stride);
      return v;
    };
    MPI_Alltoallv(send.data(), words(scount).data(), words(sdispl).data(), MPI_FLOAT, recv.data(),
                  words(rcount).data(), words(rdispl).data(), MPI_FLOAT, MPI_COMM_WORLD);
    // Grouped by local expert, as the experts would need them (identity experts).
    std::vector<size_t> offset(local + 1, 0);
    for (int i = 0; i < rtotal; ++i)
      for (int j = 0; j < k; ++j) {
        int32_t e;
        std::memcpy(&e, recv.data() + size_t(i) * stride + h + j, 4);
        if (e >= 0) ++offset[e + 1];
      }
    for (int e = 0; e < local; ++e) offset[e + 1] += offset[e];
    std::vector<float> grouped(offset[local] * h);
    std::vector<size_t> fill(offset.begin(), offset.end() - 1), position(size_t(rtotal) * k);
    for (int i = 0; i < rtotal; ++i)
      for (int j = 0; j < k; ++j) {
        int32_t e;
        std::memcpy(&e, recv.data() + size_t(i) * stride + h + j, 4);
        if (e < 0) continue;
        position[size_t(i) * k + j] = fill[e];
        std::memcpy(grouped.data() + fill[e]++ * h, recv.data() + size_t(i) * stride, h * 4);
      }
    std::vector<float> back(size_t(rtotal) * h, 0.0f), home(size_t(stotal) * h);
    for (int i = 0; i < rtotal; ++i)
      for (int j = 0; j < k; ++j) {
        int32_t e;
        std::memcpy(&e, recv.data() + size_t(i) * stride + h + j, 4);
        if (e < 0) continue;
        float w = recv[size_t(i) * stride + h + k + j];
        const float* y = grouped.data() + position[size_t(i) * k + j] * h;
        for (size_t c = 0; c < h; ++c) back[size_t(i) * h + c] += w * y[c];
      }
    auto rows = [&](std::vector<int> v) {
      for (int& c : v) c *= int(h);
      return v;
    };
    MPI_Alltoallv(back.data(), rows(rcount).data(), rows(rdispl).data(), MPI_FLOAT, home.data(),
                  rows(scount).data(), rows(sdispl).data(), MPI_FLOAT, MPI_COMM_WORLD);
    std::fill(out.begin(), out.end(), 0.0f);
    for (int p = 0; p < ranks; ++p)
      for (size_t n = 0; n < sent[p].size(); ++n)
        for (size_t c = 0; c < h; ++c)
          out[sent[p][n] * h + c] += home[(size_t(sdispl[p]) + n) * h + c];
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  size_t tokens = 2048, hidden = 1024;
  int experts = 16, topk = 2, rounds = 11, iterations = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "-t") == 0) tokens = strtoull(argv[i + 1], nullptr, 10);
    if (strcmp(argv[i], "-h") == 0) hidden = strtoull(argv[i + 1], nullptr, 10);
    if (strcmp(argv[i], "-e") == 0) experts = atoi(argv[i + 1]);
    if (strcmp(argv[i], "-k") == 0) topk = atoi(argv[i + 1]);
    if (strcmp(argv[i], "-r") == 0) rounds = atoi(argv[i + 1]);
    if (strcmp(argv[i], "-i") == 0) iterations = atoi(argv[i + 1]);
  }
  int rank = 0, ranks = 1, status = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  try {
    weftUniqueId raw{};
    if (rank == 0) raw = weft::UniqueId::create().raw();
    MPI_Bcast(&raw, sizeof raw, MPI_BYTE, 0, MPI_COMM_WORLD);
    weft::Comm world = weft::Comm::init(ranks, weft::UniqueId::from_bytes(raw), rank,
                                        weft::Config().timeout_ms(120000));
    weft::parallel::MeshShape shape;
    shape.expert_ep = ranks;
    weft::parallel::Mesh mesh(world, shape);
    weft::parallel::Ledger ledger;
    weft::parallel::Axis ep = weft::parallel::Axis::expert(mesh, "ep", &ledger);
    weft::parallel::MoeOptions options;
    options.experts = experts, options.topk = topk, options.hidden = hidden;
    weft::parallel::MoeDispatcher dispatcher(ep, options);

    // Uniform routing: distinct experts per token from a fixed hash.
    std::vector<float> x(tokens * hidden), weight(tokens * topk, 0.5f), out(x.size()),
        reference(x.size());
    std::vector<int32_t> index(tokens * topk);
    for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 7 + rank) % 13) / 8.0f;
    for (size_t t = 0; t < tokens; ++t)
      for (int j = 0; j < topk; ++j)
        index[t * topk + j] =
            int32_t((t * 2654435761u + size_t(rank) * 40503u + size_t(j) * size_t(experts / topk)) %
                    size_t(experts));
    MpiMoe mpi{ranks, rank, experts / ranks, topk, hidden};

    std::function<void()> weft_once = [&] {
      weft::parallel::MoeHandle handle = dispatcher.dispatch(x, tokens, index, weight);
      dispatcher.combine(handle, handle.expert_input(), out);
    };
    std::function<void()> mpi_once = [&] { mpi.run(x, tokens, index, weight, reference); };
    weft_once(), mpi_once();
    int wrong = 0;
    for (size_t i = 0; i < out.size(); ++i)
      wrong += std::fabs(out[i] - reference[i]) > 1e-5f * std::max(1.0f, std::fabs(reference[i]));
    std::vector<double> weft_us, mpi_us;
    for (int r = 0; r < rounds; ++r)
      for (int which = 0; which < 2; ++which) {
        MPI_Barrier(MPI_COMM_WORLD);
        double start = seconds();
        for (int i = 0; i < iterations; ++i) (which == 0 ? weft_once : mpi_once)();
        double us = (seconds() - start) / iterations * 1e6, slowest = 0;
        MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        (which == 0 ? weft_us : mpi_us).push_back(slowest);
      }
    int all_wrong = 0;
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
      double w = median(weft_us), m = median(mpi_us);
      std::printf(
          "# ranks %d tokens/rank %zu hidden %zu experts %d topk %d (fp32, identity experts)\n"
          "  weft MoeDispatcher dispatch+combine  %10.1f us\n"
          "  MPI_Alltoallv dispatch+combine       %10.1f us\n"
          "  ratio MPI / weft %.2f; outputs differing: %d\n",
          ranks, tokens, hidden, experts, topk, w, m, m / w, all_wrong);
    }
    status = all_wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-ep-bench: %s\n", e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
