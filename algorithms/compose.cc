#include "algorithms/compose.h"

#include <cassert>
#include <cstdio>
#include <cstdlib>

namespace weft::algo::detail {

namespace {

Range moved(const Range& range, const SubBuffers& buffers, uint64_t scratch_base) {
  if (range.count == 0) return range;
  switch (range.buf) {
    case Buf::Input:
      assert(range.offset + range.count <= buffers.input.count);
      return Range{buffers.input.offset + range.offset, range.count, buffers.input.buf};
    case Buf::Output:
      assert(range.offset + range.count <= buffers.output.count);
      return Range{buffers.output.offset + range.offset, range.count, buffers.output.buf};
    case Buf::Scratch:
      return Range{scratch_base + range.offset, range.count, Buf::Scratch};
  }
  return range;
}

}  // namespace

std::vector<uint32_t> funnel(Emitter& e, const std::vector<uint32_t>& after) {
  constexpr size_t kFanIn = 4;
  if (after.size() <= kFanIn) return after;
  return {e.join(after)};
}

std::vector<uint32_t> compose(Emitter& e, const Program& sub, const std::vector<int>& members,
                              const SubBuffers& buffers, const std::vector<uint32_t>& after_all) {
  if (sub.steps.empty()) return after_all;
  const std::vector<uint32_t> after = funnel(e, after_all);
  const uint64_t scratch_base = sub.scratch_count > 0 ? e.scratch(sub.scratch_count).offset : 0;
  std::vector<uint32_t> index(sub.steps.size());
  std::vector<bool> waited_for(sub.steps.size(), false);
  std::vector<uint32_t> deps;
  for (size_t i = 0; i < sub.steps.size(); ++i) {
    const Step& s = sub.steps[i];
    deps.clear();
    for (uint32_t k = 0; k < s.num_deps; ++k) {
      const uint32_t dep = sub.deps[s.first_dep + k];
      deps.push_back(index[dep]);
      waited_for[dep] = true;
    }
    if (s.num_deps == 0) deps = after;
    const Range a = moved(s.a, buffers, scratch_base);
    const Range dst = moved(s.dst, buffers, scratch_base);
    switch (s.kind) {
      case StepKind::Send:
        index[i] = e.send(members[s.peer], a, deps);
        break;
      case StepKind::Recv:
        index[i] = e.recv(members[s.peer], dst, deps);
        break;
      case StepKind::Reduce:
        index[i] = e.reduce(dst, a, moved(s.b, buffers, scratch_base), deps);
        break;
      case StepKind::Copy:
        index[i] = e.copy(dst, a, deps);
        break;
    }
  }
  std::vector<uint32_t> last;
  for (size_t i = 0; i < sub.steps.size(); ++i) {
    if (!waited_for[i]) last.push_back(index[i]);
  }
  return last;
}

std::vector<uint32_t> compose_built(Emitter& e, const Params& sub, const std::vector<int>& members,
                                    const SubBuffers& buffers, const std::vector<uint32_t>& after,
                                    Builder builder) {
  Program program;
  if (builder != nullptr) {
    Emitter inner(&program);
    builder(sub, inner);
    return compose(e, program, members, buffers, after);
  }
  std::string error;
  if (!build(sub, &program, &error)) {
    // The outer algorithm chose these parameters; failing here is its bug.
    std::fprintf(stderr, "weft: sub-schedule failed: %s\n", error.c_str());
    std::abort();
  }
  return compose(e, program, members, buffers, after);
}

}  // namespace weft::algo::detail
