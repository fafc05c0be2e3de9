// ZeRO-1/2/3 and HSDP against a single-process Adam: shard coverage, exact
// parameters after each step, the ledger against the closed forms, errors.
#include <cstring>
#include <functional>
#include <numeric>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Axis;
using parallel::Zero;
using parallel::ZeroOptions;

const std::vector<size_t> kNumels = {7, 13, 5, 11, 3, 9};
const std::vector<int> kLayers = {0, 0, 1, 1, 2, 2};

// Dyadic values: their sums over ranks are exact, so every rank's shard
// sees bit for bit the gradient the single-process reference sees.
float grad_value(int rank, size_t param, size_t i, int step) {
  return static_cast<float>(static_cast<int>((rank * 5 + param * 3 + i + step) % 9) - 4) * 0.25f;
}

struct Reference {
  std::vector<std::vector<float>> params, m, v;
  explicit Reference(const std::vector<std::vector<float>>& initial) : params(initial) {
    for (const auto& p : params) {
      m.emplace_back(p.size(), 0.0f);
      v.emplace_back(p.size(), 0.0f);
    }
  }
  void step(int ranks, int step, bool average, const parallel::AdamOptions& adam) {
    for (size_t p = 0; p < params.size(); ++p) {
      std::vector<float> g(params[p].size(), 0.0f);
      for (size_t i = 0; i < g.size(); ++i) {
        for (int r = 0; r < ranks; ++r) g[i] += grad_value(r, p, i, step);
        if (average) g[i] /= static_cast<float>(ranks);
      }
      parallel::adam_step(params[p], g, m[p], v[p], step, adam);
    }
  }
};

// Backward with this rank's gradients of `step` (in reverse order), then the step.
void take_step(Zero& zero, int stage, int rank, int step) {
  auto fill_grad = [&](size_t p) {
    auto g = zero.grad(p);
    for (size_t i = 0; i < g.size(); ++i) g[i] = grad_value(rank, p, i, step);
    zero.mark_ready(p);
  };
  if (stage < 3) {
    for (size_t p = kNumels.size(); p-- > 0;) fill_grad(p);
  } else {
    for (int layer = 2; layer >= 0; --layer) {
      zero.backward_begin(layer);
      for (size_t p = kNumels.size(); p-- > 0;)
        if (kLayers[p] == layer) fill_grad(p);
      zero.backward_end(layer);
    }
  }
  zero.step();
}

struct Setup {
  int stage;
  bool average;
  int hsdp;  // replicas (1: none)
};

void run_case(const RankContext& context, const weft::Comm& world, const Setup& setup) {
  parallel::MeshShape shape;
  shape.hsdp = setup.hsdp;
  parallel::Mesh mesh(world, shape);
  parallel::Ledger ledger;
  ZeroOptions options;
  options.stage = setup.stage;
  options.bucket_bytes = 64;  // stage 2: several buckets
  options.average = setup.average;
  options.pad_multiple = 4;
  options.adam.lr = 0.05f;
  std::string what = "stage " + std::to_string(setup.stage) + " hsdp " + std::to_string(setup.hsdp);
  Zero zero = setup.hsdp > 1 ? Zero(Axis(mesh, "dp_shard", &ledger),
                                    Axis(mesh, "dp_replicate", &ledger), options)
                             : Zero(Axis(mesh, "dp", &ledger), options);
  std::vector<std::vector<float>> initial;
  for (size_t p = 0; p < kNumels.size(); ++p) {
    zero.add("p" + std::to_string(p), kNumels[p], kLayers[p]);
    initial.push_back(random_floats(kNumels[p], 100 + p));
  }
  zero.finalize();
  for (size_t p = 0; p < kNumels.size(); ++p) zero.set_param(p, initial[p]);
  EXPECT_TRUE(zero.coverage_ok()) << what;
  size_t owned = 0;
  for (const auto& range : zero.owned()) owned += range.end - range.begin;
  size_t total_owned = 0;
  weft::check(
      weftAllReduce(&owned, &total_owned, 1, weftUint64, weftSum, mesh.group("dp_shard"), nullptr));
  size_t total = 0;
  for (size_t n : kNumels) total += n;
  EXPECT_EQ(total_owned, total) << what;
  EXPECT_EQ(zero.padded_numel() % std::lcm(4, mesh.size("dp_shard")), 0u);

  Reference reference(initial);
  int ranks = context.nranks, rank = context.rank;
  auto compare_params = [&](const char* when) {
    for (size_t p = 0; p < kNumels.size(); ++p) {
      auto got = zero.param(p);
      expect_close(std::vector<float>(got.begin(), got.end()), reference.params[p],
                   setup.average ? 1e-6 : 0.0,
                   (what + " " + when + " p" + std::to_string(p)).c_str());
    }
  };
  // Stage 3: every unit gathered in turn, its parameters checked, freed.
  auto forward_pass = [&](const char* when) {
    for (int layer = 0; layer <= 2; ++layer) {
      zero.forward_begin(layer);
      for (size_t p = 0; p < kNumels.size(); ++p)
        if (kLayers[p] == layer) {
          auto got = zero.param(p);
          expect_close(std::vector<float>(got.begin(), got.end()), reference.params[p],
                       setup.average ? 1e-6 : 0.0, (what + " " + when).c_str());
        }
      zero.forward_end(layer);
    }
  };
  constexpr int kSteps = 2;
  for (int step = 1; step <= kSteps; ++step) {
    if (setup.stage < 3)
      compare_params("before the step");
    else
      forward_pass("in forward");
    take_step(zero, setup.stage, rank, step);
    reference.step(ranks, step, setup.average, options.adam);
  }
  // The ledger before the check below gathers again.
  parallel::ModelConfig config;
  config.dp = ranks;
  config.hsdp = setup.hsdp;
  config.zero = setup.stage;
  config.param_numels = kNumels;
  config.param_layers = kLayers;
  config.bucket_bytes = options.bucket_bytes;
  config.pad_multiple = options.pad_multiple;
  config.steps = kSteps;
  auto differences = ledger.compare(parallel::Ledger::expected(config));
  EXPECT_TRUE(differences.empty()) << what << ": " << differences.front() << "\n" << ledger.table();
  if (setup.stage < 3) {
    compare_params("after the last step");
  } else {
    forward_pass("after the last step");
  }
}

class ZeroStages : public ::testing::TestWithParam<int> {};

TEST_P(ZeroStages, ExactAgainstSingleProcessAdam) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    for (int stage : {1, 2, 3}) run_case(context, world, {stage, false, 1});
    run_case(context, world, {2, true, 1});
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroStages, ::testing::Values(1, 2, 3));

TEST(ZeroHybrid, ShardWithinReplicasAllReduceAcross) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    run_case(context, world, {3, false, 2});
    run_case(context, world, {1, true, 2});
  });
}

// The full parameters (stage 3: each unit gathered in turn).
std::vector<std::vector<float>> full_params(Zero& zero, int stage) {
  std::vector<std::vector<float>> out(kNumels.size());
  for (int layer = 0; layer <= 2; ++layer) {
    if (stage == 3) zero.forward_begin(layer);
    for (size_t p = 0; p < kNumels.size(); ++p)
      if (kLayers[p] == layer) out[p].assign(zero.param(p).begin(), zero.param(p).end());
    if (stage == 3) zero.forward_end(layer);
  }
  return out;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

// A run stopped after step 1 and continued from its exported shards (same mesh), or from
// the whole-model state (any mesh: re-sharded), takes step 2 bit for bit as the run that
// did not stop.
void checkpoint_case(const RankContext& context, const weft::Comm& world, int stage) {
  parallel::Mesh mesh(world, parallel::MeshShape{});
  ZeroOptions options;
  options.stage = stage;
  options.average = false;  // sums of dyadic gradients: the reference is exact
  options.bucket_bytes = 64;
  options.pad_multiple = 4;
  options.adam.lr = 0.05f;
  const std::string what = "stage " + std::to_string(stage);
  auto make = [&](Zero& zero) {
    for (size_t p = 0; p < kNumels.size(); ++p)
      zero.add("p" + std::to_string(p), kNumels[p], kLayers[p]);
    zero.finalize();
  };
  std::vector<std::vector<float>> initial;
  for (size_t p = 0; p < kNumels.size(); ++p) initial.push_back(random_floats(kNumels[p], 7 + p));
  Zero uninterrupted(Axis(mesh, "dp"), options);
  make(uninterrupted);
  for (size_t p = 0; p < kNumels.size(); ++p) uninterrupted.set_param(p, initial[p]);
  take_step(uninterrupted, stage, context.rank, 1);
  const parallel::ZeroShard saved = uninterrupted.export_shard();
  EXPECT_EQ(saved.steps, 1) << what;
  size_t owned = 0;
  for (const auto& range : saved.ranges) owned += range.end - range.begin;
  EXPECT_EQ(saved.params.size(), owned) << what;

  Reference reference(initial);
  reference.step(context.nranks, 1, false, options.adam);
  parallel::ZeroShard whole;
  whole.steps = 1;
  for (size_t p = 0; p < kNumels.size(); ++p) {
    whole.ranges.push_back({p, 0, kNumels[p]});
    for (auto [from, to] : {std::pair{&reference.params, &whole.params},
                            {&reference.m, &whole.m},
                            {&reference.v, &whole.v}})
      to->insert(to->end(), (*from)[p].begin(), (*from)[p].end());
  }
  parallel::Ledger ledger;
  Zero from_shard(Axis(mesh, "dp", &ledger), options), from_whole(Axis(mesh, "dp"), options);
  make(from_shard);
  make(from_whole);
  from_shard.import_shard(saved);
  from_whole.import_shard(whole);
  EXPECT_TRUE(ledger.entries().empty()) << what << ": an import is not a step's traffic\n"
                                        << ledger.table();

  take_step(uninterrupted, stage, context.rank, 2);
  take_step(from_shard, stage, context.rank, 2);
  take_step(from_whole, stage, context.rank, 2);
  reference.step(context.nranks, 2, false, options.adam);
  const auto want = full_params(uninterrupted, stage);
  const auto shard_params = full_params(from_shard, stage),
             whole_params = full_params(from_whole, stage);
  for (size_t p = 0; p < kNumels.size(); ++p) {
    const std::string param = what + " p" + std::to_string(p);
    expect_same_bits(want[p], reference.params[p], param + " uninterrupted");
    expect_same_bits(shard_params[p], want[p], param + " resumed from its shard");
    expect_same_bits(whole_params[p], want[p], param + " resumed from the whole model");
  }
  const parallel::ZeroShard after = uninterrupted.export_shard();
  for (const Zero* resumed : {&from_shard, &from_whole}) {
    const parallel::ZeroShard got = resumed->export_shard();
    EXPECT_EQ(got.steps, 2) << what;
    expect_same_bits(got.m, after.m, what + " first moments");
    expect_same_bits(got.v, after.v, what + " second moments");
  }
}

TEST_P(ZeroStages, ExportImportResumesBitwise) {
  run_ranks(GetParam(), [](const RankContext& context) {
    weft::Comm world = world_of(context);
    for (int stage : {1, 2, 3}) checkpoint_case(context, world, stage);
  });
}

TEST(ZeroErrors, BadInputIsNamedAndNothingHangs) {
  run_ranks(2, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    parallel::Mesh mesh(world, parallel::MeshShape{});
    ZeroOptions options;
    options.stage = 4;
    expect_error([&] { Zero z(Axis(mesh, "dp"), options); }, "stage 4 is not 1, 2 or 3");
    options.stage = 2;
    options.bucket_bytes = 0;
    expect_error([&] { Zero z(Axis(mesh, "dp"), options); }, "bucket_bytes is 0");
    options.bucket_bytes = 1024;
    Zero z(Axis(mesh, "dp"), options);
    z.add("a", 4, 1);
    expect_error([&] { z.add("a", 4, 1); }, "parameter \"a\" is registered twice");
    expect_error([&] { z.add("b", 4, 0); }, "register in forward order");
    z.finalize();
    expect_error([&] { z.forward_begin(1); }, "is for ZeRO stage 3");
    expect_error([&] { z.set_param(0, std::vector<float>(3)); }, "value has 3 elements");
    parallel::ZeroShard state;
    state.ranges = {{0, 0, 5}};
    expect_error([&] { z.import_shard(state); }, "range [0, 5) of \"a\" is outside its 4");
    state.ranges = {{3, 0, 1}};
    expect_error([&] { z.import_shard(state); }, "range of param 3 is not registered");
    state.ranges = {{0, 0, 4}};
    expect_error([&] { z.import_shard(state); }, "import_shard() params has 0 elements");
    state.ranges = {};
    expect_error([&] { z.import_shard(state); }, "is in none of the ranges");
    options.stage = 3;
    Zero z3(Axis(mesh, "dp"), options);
    z3.add("w", 6, 0);
    z3.finalize();
    expect_error([&] { z3.param(0); }, "is not gathered");
    expect_error([&] { z3.forward_begin(5); }, "layer 5 has no registered parameters");
    z3.forward_begin(0);
    EXPECT_EQ(z3.param(0).size(), 6u);
    z3.forward_end(0);
  });
}

}  // namespace
}  // namespace weft::testing
