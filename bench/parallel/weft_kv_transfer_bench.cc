// KvTransfer (prefill → decode, heads resharded) against the bytes' ceiling on
// the same ranks: one contiguous weftSend/weftRecv of a decode rank's whole
// share from each prefill rank it shares heads with. Rounds alternate the
// two; the median round is reported as GB/s of the decode side's bytes, with
// the received cache checked on every round.
//   weftrun -n P+D weft-kv-transfer-bench [-p P] [-d D] [-l LAYERS] [-H KV_HEADS]
//     [-e HEAD_DIM] [-t PAGE_TOKENS] [-n PAGES] [-r ROUNDS]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

}  // namespace

int main(int argc, char** argv) {
  int prefill = 1, decode = 1, rounds = 9;
  par::KvCacheShape shape{32, 8, 128, 16};
  size_t pages = 64;
  for (int c; (c = getopt(argc, argv, "p:d:l:H:e:t:n:r:")) != -1;) {
    const int v = std::atoi(optarg);
    switch (c) {
      case 'p':
        prefill = v;
        break;
      case 'd':
        decode = v;
        break;
      case 'l':
        shape.layers = v;
        break;
      case 'H':
        shape.kv_heads = v;
        break;
      case 'e':
        shape.head_dim = v;
        break;
      case 't':
        shape.page_tokens = v;
        break;
      case 'n':
        pages = size_t(v);
        break;
      case 'r':
        rounds = v;
        break;
      default:
        std::fprintf(stderr,
                     "usage: weftrun -n P+D %s [-p P] [-d D] [-l L] [-H H] [-e E] [-t T] "
                     "[-n PAGES] [-r ROUNDS]\n",
                     argv[0]);
        return 2;
    }
  }
  try {
    weft::Comm world = weft::Comm::from_env();
    if (world.size() != prefill + decode || rounds < 1 || pages < 1) {
      std::fprintf(stderr, "weft-kv-transfer-bench: needs -p + -d = %d ranks, -r and -n >= 1\n",
                   world.size());
      return 2;
    }
    const int rank = world.rank();
    const bool on_prefill = rank < prefill;
    weft::Comm pair = world.split(0, rank);
    par::Axis axis(pair.get(), "pd");
    par::KvTransferGroups groups;
    for (int r = 0; r < prefill + decode; ++r)
      (r < prefill ? groups.prefill : groups.decode).push_back(r);
    par::KvTransfer transfer(axis, shape, groups);
    const int tp = on_prefill ? prefill : decode, tp_rank = on_prefill ? rank : rank - prefill;
    par::PagedKvCache cache(shape, tp, tp_rank, pages);
    std::vector<size_t> table(pages);
    for (size_t i = 0; i < pages; ++i) table[i] = on_prefill ? i : pages - 1 - i;
    if (on_prefill)
      for (int l = 0; l < shape.layers; ++l)
        for (size_t p = 0; p < pages; ++p) {
          auto page = cache.page(l, p);
          for (size_t i = 0; i < page.size(); ++i) page[i] = float((l * 131 + p * 7 + i) % 1000);
        }
    // The ceiling: per (prefill, decode) pair, the pair's whole share as one message.
    std::vector<float> flat(size_t(shape.layers) * pages * cache.page_floats());
    auto ceiling = [&] {
      weft::check(weftGroupStart());
      size_t at = 0;  // a receiver's peers each fill their own part
      for (int q = 0; q < (on_prefill ? decode : prefill); ++q) {
        auto [b, e] = transfer.shared_heads(q);
        if (b >= e) continue;
        const size_t n =
            size_t(shape.layers) * pages * size_t(e - b) * 2 * shape.page_tokens * shape.head_dim;
        const int peer = on_prefill ? prefill + q : q;
        weft::check(on_prefill
                        ? weftSend(flat.data(), n, weftFloat32, peer, pair.get(), nullptr)
                        : weftRecv(flat.data() + at, n, weftFloat32, peer, pair.get(), nullptr));
        at += on_prefill ? 0 : n;
      }
      weft::check(weftGroupEnd());
    };
    std::vector<double> kv_s, raw_s;
    long bad = 0;
    for (int round = 0; round < rounds + 1; ++round) {  // round 0 warms up
      weft::check(weftBarrier(world.get(), nullptr));
      double t0 = seconds();
      if (on_prefill) {
        for (int l = 0; l < shape.layers; ++l) transfer.send_layer(cache, l, table);
        transfer.finish();
      } else {
        transfer.receive(cache, table);
        transfer.finish();
      }
      double t1 = seconds();
      weft::check(weftBarrier(world.get(), nullptr));
      double t2 = seconds();
      ceiling();
      double t3 = seconds();
      if (round == 0) continue;
      kv_s.push_back(t1 - t0), raw_s.push_back(t3 - t2);
      // Spot check with one prefill rank (it holds every head): its page i, from this rank's
      // first head on, is this rank's page table[i].
      if (!on_prefill && prefill == 1)
        for (int l = 0; l < shape.layers; ++l)
          for (size_t i = 0; i < pages; i += 7) {
            auto page = cache.page(l, table[i]);
            const size_t offset =
                size_t(cache.head_begin()) * 2 * shape.page_tokens * shape.head_dim;
            for (size_t k = 0; k < page.size(); k += 97)
              bad += page[k] != float((l * 131 + i * 7 + offset + k) % 1000);
          }
    }
    if (rank == prefill) {
      const double bytes = double(shape.layers) * pages * cache.page_floats() * sizeof(float);
      std::printf(
          "# weft-kv-transfer-bench: prefill tp %d -> decode tp %d, %d layers x %zu pages "
          "of %d tokens, %d KV heads of %d (fp32): %.2f MiB per decode rank\n",
          prefill, decode, shape.layers, pages, shape.page_tokens, shape.kv_heads, shape.head_dim,
          bytes / (1 << 20));
      std::printf("kv transfer  median %8.3f ms  %6.2f GB/s (%d rounds)\n", median(kv_s) * 1e3,
                  bytes / median(kv_s) / 1e9, rounds);
      std::printf("one message  median %8.3f ms  %6.2f GB/s\n", median(raw_s) * 1e3,
                  bytes / median(raw_s) / 1e9);
      std::printf("ratio (one message / kv transfer time): %.2f; checked values wrong: %ld\n",
                  median(raw_s) / median(kv_s), bad);
    }
    return bad == 0 ? 0 : 1;
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "weft-kv-transfer-bench: %s\n", e.what());
    return 1;
  }
}
