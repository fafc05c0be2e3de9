// One rank of a weftrun job that runs one adapter of lib/parallel over the
// world communicator for one layer and prints rank 0's ledger
// (Ledger::table) for weft_plan_test to set against weft-plan's closed forms.
// Context parallel (axis "cp"), with --batch B --head-dim D --seq S:
//   attention  --algo NAME --heads H --kv-heads K [--nodes N]  forward + backward
//   affine     --heads H                                       forward + backward
//   compressed --heads H --kv-heads K --block B --stride S     forward + backward
// Expert parallel (axis "expert:ep"), token t's slots to experts t, t+1, ...:
//   hier-moe   --experts E --topk K --hidden H --tokens T --nodes N
//              HierMoeDispatcher dispatch, combine and both backward passes
// Exit status 2 on bad arguments.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "weft/parallel.hpp"
#include "weft/parallel/ep.hpp"
#include "weft/weft.h"

namespace {

namespace par = weft::parallel;

struct Args {
  std::string mixer, algo = "ring";
  size_t batch = 1, heads = 1, kv_heads = 0, head_dim = 1, seq = 0, block = 1, stride = 1;
  size_t experts = 0, topk = 1, hidden = 0, tokens = 0;
  int nodes = 0;
};

bool parse(int argc, char** argv, Args& a) {
  if (argc < 2) return false;
  a.mixer = argv[1];
  size_t nodes = 0;
  const std::pair<const char*, size_t*> sizes[] = {
      {"--batch", &a.batch},       {"--heads", &a.heads},   {"--kv-heads", &a.kv_heads},
      {"--head-dim", &a.head_dim}, {"--seq", &a.seq},       {"--block", &a.block},
      {"--stride", &a.stride},     {"--nodes", &nodes},     {"--experts", &a.experts},
      {"--topk", &a.topk},         {"--hidden", &a.hidden}, {"--tokens", &a.tokens}};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string name = argv[i], value = argv[i + 1];
    bool known = name == "--algo";
    if (known) a.algo = value;
    for (const auto& [flag, target] : sizes)
      if (name == flag) *target = std::strtoul(value.c_str(), nullptr, 10), known = true;
    if (!known) return false;
  }
  a.nodes = static_cast<int>(nodes);
  if (a.mixer == "hier-moe") return a.experts > 0 && a.hidden > 0 && a.tokens > 0 && a.nodes > 0;
  return a.seq > 0 && (a.mixer == "attention" || a.mixer == "affine" || a.mixer == "compressed");
}

// Finite inputs of any values: only the traffic is looked at.
std::vector<float> filled(size_t n, float scale, float offset = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = offset + scale * std::sin(0.37f * float(i + 1));
  return v;
}

void run_attention(const par::Axis& axis, const Args& a) {
  par::AttentionShape shape;
  shape.batch = a.batch, shape.heads = a.heads, shape.kv_heads = a.kv_heads;
  shape.head_dim = a.head_dim;
  par::CpConfig config;
  config.algorithm = par::parse_cp_algorithm(a.algo);
  config.q_seq = a.seq;
  for (int r = 0; a.nodes > 0 && r < axis.size(); ++r)
    config.hosts.push_back("node" + std::to_string(r / (axis.size() / a.nodes)));
  par::ContextParallelAttention attention(axis, shape, config);
  const size_t kv = a.kv_heads == 0 ? a.heads : a.kv_heads;
  const size_t q_rows = attention.q_rows(), kv_rows = attention.kv_rows();
  std::vector<float> q = filled(q_rows * a.batch * a.heads * a.head_dim, 0.5f);
  std::vector<float> k = filled(kv_rows * a.batch * kv * a.head_dim, 0.4f);
  std::vector<float> v = filled(k.size(), 0.3f), out(q.size());
  attention.forward(q, k, v, out);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention.backward(filled(out.size(), 0.2f), dq, dk, dv);
}

void run_affine(const par::Axis& axis, const Args& a) {
  par::AffineShape shape{a.batch, a.heads, a.head_dim, a.head_dim};
  par::AffineStateCp affine(axis, shape, a.seq);
  const size_t keys = affine.rows() * a.batch * a.heads * a.head_dim;
  std::vector<float> q = filled(keys, 0.5f), k = filled(keys, 0.3f), v = filled(keys, 0.4f);
  std::vector<float> alpha = filled(keys, 0.05f, 0.9f);
  std::vector<float> beta = filled(affine.rows() * a.batch * a.heads, 0.1f, 0.5f);
  std::vector<float> out(keys);
  affine.forward(q, k, v, alpha, beta, out);
  std::vector<float> dq(keys), dk(keys), dv(keys), dalpha(keys), dbeta(beta.size());
  affine.backward(filled(keys, 0.2f), dq, dk, dv, dalpha, dbeta);
}

void run_compressed(const par::Axis& axis, const Args& a) {
  par::AttentionShape shape;
  shape.batch = a.batch, shape.heads = a.heads, shape.kv_heads = a.kv_heads;
  shape.head_dim = a.head_dim;
  par::CompressedConfig config;
  config.seq = a.seq, config.block = a.block, config.stride = a.stride;
  par::CompressedAttentionCp compressed(axis, shape, config);
  const size_t kv = a.kv_heads == 0 ? a.heads : a.kv_heads;
  std::vector<float> q = filled(compressed.rows() * a.batch * a.heads * a.head_dim, 0.5f);
  std::vector<float> k = filled(compressed.rows() * a.batch * kv * a.head_dim, 0.4f);
  std::vector<float> v = filled(k.size(), 0.3f), out(q.size());
  compressed.forward(q, k, v, out);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dweights(a.block);
  compressed.backward(filled(out.size(), 0.2f), dq, dk, dv, dweights);
}

void run_hier_moe(weftComm_t world, par::Ledger& ledger, const Args& a) {
  par::Axis axis(world, "expert:ep", &ledger);
  std::vector<int> nodes;
  for (int r = 0; r < axis.size(); ++r) nodes.push_back(r / (axis.size() / a.nodes));
  par::MoeOptions options;
  options.experts = static_cast<int>(a.experts), options.topk = static_cast<int>(a.topk);
  options.hidden = a.hidden;
  par::HierMoeDispatcher dispatcher(axis, options, nodes);
  const size_t t = a.tokens, h = a.hidden, k = a.topk;
  std::vector<int32_t> index(t * k);
  for (size_t i = 0; i < index.size(); ++i) index[i] = int32_t((i / k + i % k) % a.experts);
  std::vector<float> weight(t * k, 1.0f / float(k)), x = filled(t * h, 0.5f), out(t * h);
  par::HierMoeHandle handle = dispatcher.dispatch(x, t, index, weight);
  dispatcher.combine(handle, filled(handle.rows() * h, 0.4f), out);
  std::vector<float> d_expert(handle.rows() * h), dx(t * h), d_weight(t * k);
  dispatcher.combine_backward(handle, filled(t * h, 0.2f), d_expert);
  dispatcher.dispatch_backward(handle, d_expert, dx, d_weight);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) {
    std::fprintf(
        stderr,
        "usage: adapter_ledger_job attention|affine|compressed --seq S [--algo A --batch B "
        "--heads H --kv-heads K --head-dim D --block B --stride S --nodes N]\n"
        "       adapter_ledger_job hier-moe --experts E --topk K --hidden H --tokens T "
        "--nodes N\n");
    return 2;
  }
  weftComm_t world = nullptr;
  if (weftCommInitFromEnv(&world, nullptr) != weftSuccess) {
    std::fprintf(stderr, "adapter_ledger_job: weftCommInitFromEnv failed\n");
    return 1;
  }
  int rank = 0;
  weftCommUserRank(world, &rank);
  try {
    par::Ledger ledger;
    if (args.mixer == "hier-moe") {
      run_hier_moe(world, ledger, args);
    } else {
      par::Axis axis(world, "cp", &ledger);
      if (args.mixer == "attention")
        run_attention(axis, args);
      else if (args.mixer == "affine")
        run_affine(axis, args);
      else
        run_compressed(axis, args);
    }
    if (rank == 0) std::fputs(ledger.table().c_str(), stdout);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "adapter_ledger_job: rank %d: %s\n", rank, error.what());
    return 1;
  }
  weftCommDestroy(world);
  return 0;
}
