#include "core/program.h"

#include <algorithm>

namespace weft {

Status compile_program(algo::Program program, CompiledProgram* out) {
  const size_t n = program.steps.size();
  out->dependents_begin.assign(n + 1, 0);
  for (const algo::Step& step : program.steps)
    for (uint32_t i = 0; i < step.num_deps; ++i)
      ++out->dependents_begin[program.deps[step.first_dep + i] + 1];
  for (size_t i = 0; i < n; ++i) out->dependents_begin[i + 1] += out->dependents_begin[i];
  out->dependents.assign(out->dependents_begin[n], 0);
  std::vector<uint32_t> fill(out->dependents_begin.begin(), out->dependents_begin.end() - 1);
  for (uint32_t index = 0; index < n; ++index) {
    const algo::Step& step = program.steps[index];
    for (uint32_t i = 0; i < step.num_deps; ++i) {
      uint32_t dep = program.deps[step.first_dep + i];
      if (dep >= index)
        return Error(weftInternalError, "program step %u depends on a later step %u", index, dep);
      out->dependents[fill[dep]++] = index;
    }
  }
  // The k-th Send to a peer matches the k-th Recv there: number them in program order.
  std::vector<uint32_t> sends, recvs;
  out->message_index.assign(n, 0);
  out->max_messages_per_peer = 0;
  for (uint32_t index = 0; index < n; ++index) {
    const algo::Step& step = program.steps[index];
    if (step.kind != algo::StepKind::Send && step.kind != algo::StepKind::Recv) continue;
    std::vector<uint32_t>& counters = step.kind == algo::StepKind::Send ? sends : recvs;
    if (static_cast<size_t>(step.peer) >= counters.size()) counters.resize(step.peer + 1, 0);
    out->message_index[index] = counters[step.peer]++;
    out->max_messages_per_peer = std::max(out->max_messages_per_peer, counters[step.peer]);
  }
  if (out->max_messages_per_peer > kMaxMessagesPerPeer)
    return Error(weftInvalidArgument,
                 "the schedule needs %u messages with one peer (limit %u): use a larger chunk",
                 out->max_messages_per_peer, kMaxMessagesPerPeer);
  out->program = std::move(program);
  return Status::Ok();
}

Status build_program(const algo::Params& params, std::shared_ptr<const CompiledProgram>* out) {
  algo::Program program;
  std::string error;
  if (!algo::build(params, &program, &error))
    return Error(weftInvalidArgument, "%s", error.c_str());
  auto compiled = std::make_shared<CompiledProgram>();
  WEFT_RETURN_IF_ERROR(compile_program(std::move(program), compiled.get()));
  *out = std::move(compiled);
  return Status::Ok();
}

Status ProgramCache::get(const algo::Params& params, std::shared_ptr<const CompiledProgram>* out) {
  Key key{static_cast<int>(params.collective),
          static_cast<int>(params.algorithm),
          params.root,
          params.count,
          params.chunk,
          params.in_place};
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    std::shared_ptr<const CompiledProgram> compiled;
    WEFT_RETURN_IF_ERROR(build_program(params, &compiled));
    if (entries_.size() >= kMaxEntries) entries_.clear();  // shapes churn: start over
    it = entries_.emplace(key, std::move(compiled)).first;
  }
  *out = it->second;
  return Status::Ok();
}

}  // namespace weft
