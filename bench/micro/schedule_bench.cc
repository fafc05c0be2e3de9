// Schedule generation: how long building (and compiling, for the executor)
// one rank's program takes, per algorithm and rank count. Programs are
// cached per shape, so this is the cost of the first call of a shape.
#include <benchmark/benchmark.h>

#include <string>

#include "algorithms/schedule.h"
#include "core/program.h"

namespace {

using weft::algo::Algorithm;
using weft::algo::Collective;

void build_program(benchmark::State& state, Collective collective, Algorithm algorithm) {
  weft::algo::Params params;
  params.collective = collective;
  params.algorithm = algorithm;
  params.nranks = static_cast<int>(state.range(0));
  params.rank = params.nranks / 2;
  params.count = static_cast<uint64_t>(state.range(1));
  params.chunk = 128 << 10;  // elements per message, as the tuner picks for 4-byte types
  size_t steps = 0;
  for (auto _ : state) {
    std::shared_ptr<const weft::CompiledProgram> program;
    weft::Status status = weft::build_program(params, &program);
    if (!status.ok()) {
      state.SkipWithError(status.message().c_str());
      return;
    }
    steps = program->program.steps.size();
    benchmark::DoNotOptimize(program);
  }
  state.counters["steps"] = static_cast<double>(steps);
  state.counters["ns_per_step"] =
      benchmark::Counter(static_cast<double>(steps) * state.iterations(),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void shapes(benchmark::internal::Benchmark* bench) {
  for (int64_t nranks : {8, 64, 1024})
    for (int64_t count : {int64_t{1} << 10, int64_t{1} << 24}) bench->Args({nranks, count});
}

BENCHMARK_CAPTURE(build_program, allreduce_ring, Collective::AllReduce, Algorithm::Ring)
    ->Apply(shapes);
BENCHMARK_CAPTURE(build_program, allreduce_tree, Collective::AllReduce, Algorithm::Tree)
    ->Apply(shapes);
BENCHMARK_CAPTURE(build_program, allreduce_rhd, Collective::AllReduce, Algorithm::Rhd)
    ->Apply(shapes);
BENCHMARK_CAPTURE(build_program, allreduce_rd, Collective::AllReduce, Algorithm::Rd)->Apply(shapes);
BENCHMARK_CAPTURE(build_program, allgather_bruck, Collective::AllGather, Algorithm::Bruck)
    ->Apply(shapes);
BENCHMARK_CAPTURE(build_program, alltoall_pairwise, Collective::AllToAll, Algorithm::Pairwise)
    ->Apply(shapes);
BENCHMARK_CAPTURE(build_program, broadcast_chain, Collective::Broadcast, Algorithm::Chain)
    ->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
