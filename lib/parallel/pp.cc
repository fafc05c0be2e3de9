// The pipeline executor: walks this rank's action list from the schedule
// generators. Compute actions call the stage functions on per-(chunk,
// micro-batch) buffers; each group of transfers is one weftGroupStart/End on
// the axis stream. A group with a receive is waited for before the compute
// that needs it (the stream runs in order, so that also completes the
// groups before it); a group of sends only is not, as the checker assumes.
#include <string>

#include "algorithms/pipeline/checker.h"
#include "parallel/internal.h"

namespace weft::parallel {

namespace pipe = weft::algo::pipeline;
using detail::now_s;
using detail::require;

namespace {

constexpr struct {
  PipelineSchedule schedule;
  pipe::Family family;
} kFamilies[] = {{PipelineSchedule::gpipe, pipe::Family::GPipe},
                 {PipelineSchedule::one_f_one_b, pipe::Family::OneFOneB},
                 {PipelineSchedule::interleaved, pipe::Family::Interleaved},
                 {PipelineSchedule::zero_bubble, pipe::Family::ZeroBubble}};

pipe::Family family_of(PipelineSchedule schedule) {
  for (const auto& f : kFamilies)
    if (f.schedule == schedule) return f.family;
  detail::fail("schedule " + std::to_string(int(schedule)) + " is not a pipeline schedule");
}

pipe::Params params_of(const PipelineOptions& options, int stages) {
  pipe::Params params;
  params.family = family_of(options.schedule);
  params.stages = stages;
  params.microbatches = options.microbatches;
  params.virtual_stages = options.virtual_stages;
  return params;
}

bool sends(pipe::Op op) {
  return op == pipe::Op::SendForward || op == pipe::Op::SendBackward;
}
bool forward_direction(pipe::Op op) {
  return op == pipe::Op::SendForward || op == pipe::Op::RecvForward;
}

}  // namespace

const char* pipeline_schedule_name(PipelineSchedule schedule) {
  return pipe::family_name(family_of(schedule));
}

bool parse_pipeline_schedule(std::string_view name, PipelineSchedule* out) {
  pipe::Family family;
  if (!pipe::parse_family(name, &family)) return false;
  for (const auto& f : kFamilies)
    if (f.family == family) *out = f.schedule;
  return true;
}

struct Pipeline::State {
  const Axis& axis;
  PipelineOptions options;
  pipe::Params params;
  pipe::Schedule schedule;
  PipelineProfile profile;
  // Per (chunk, micro-batch): the received input and output gradient, and
  // what this rank computed (output activation, input gradient).
  std::vector<std::vector<float>> input, output, output_grad, input_grad;

  State(const Axis& a, PipelineOptions o) : axis(a), options(o), params(params_of(o, a.size())) {
    std::string error;
    if (!pipe::build(params, &schedule, &error)) detail::fail("pipeline: " + error);
    require(options.activation_numel > 0 || axis.size() * options.virtual_stages == 1,
            "pipeline: activation_numel must be > 0 (the elements of one boundary transfer)");
  }
  size_t cell(int chunk, int microbatch) const {
    return size_t(chunk) * options.microbatches + microbatch;
  }
  std::vector<float>& buffer(std::vector<std::vector<float>>& set, int chunk, int microbatch) {
    std::vector<float>& b = set[cell(chunk, microbatch)];
    b.resize(options.activation_numel);
    return b;
  }
  // The stage before / after (chunk) on this rank: its buffer when it is
  // local (one rank holding every chunk), else the received one.
  std::span<const float> forward_input(int chunk, int mb) {
    const int p = axis.size(), s = pipe::stage_of(chunk, axis.rank(), p);
    if (s == 0) return {};
    return p == 1 ? buffer(output, chunk - 1, mb) : buffer(input, chunk, mb);
  }
  std::span<const float> backward_input(int chunk, int mb) {
    const int p = axis.size(), s = pipe::stage_of(chunk, axis.rank(), p);
    if (s == p * options.virtual_stages - 1) return {};
    return p == 1 ? buffer(input_grad, chunk + 1, mb) : buffer(output_grad, chunk, mb);
  }
};

Pipeline::Pipeline(const Axis& axis, PipelineOptions options)
    : state_(std::make_unique<State>(axis, options)) {}
Pipeline::~Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;

int Pipeline::stages() const {
  return state_->axis.size();
}
int Pipeline::rank() const {
  return state_->axis.rank();
}
int Pipeline::chunks() const {
  return state_->options.virtual_stages;
}
int Pipeline::stage(int chunk) const {
  return pipe::stage_of(chunk, rank(), stages());
}
const PipelineProfile& Pipeline::profile() const {
  return state_->profile;
}

double Pipeline::simulated_bubble() const {
  return pipe::check(state_->params, state_->schedule).bubble;
}
double Pipeline::formula_bubble() const {
  return pipe::bubble_formula(state_->params);
}

void Pipeline::run(const StageFunctions& fn) {
  State& s = *state_;
  require(bool(fn.forward) && bool(fn.backward), "pipeline: forward and backward are required");
  const bool split = s.options.schedule == PipelineSchedule::zero_bubble;
  require(!split || bool(fn.backward_weight),
          "pipeline: the zero-bubble schedule needs backward_weight");
  const size_t cells = size_t(s.options.virtual_stages) * s.options.microbatches;
  for (auto* set : {&s.input, &s.output, &s.output_grad, &s.input_grad}) set->assign(cells, {});
  const size_t numel = s.options.activation_numel, bytes = numel * sizeof(float);
  const Axis& axis = s.axis;
  const std::vector<pipe::Action>& list = s.schedule.ranks[axis.rank()];
  const double start = now_s();
  double compute = 0;
  auto timed = [&](auto&& work) {
    const double t0 = now_s();
    work();
    compute += now_s() - t0;
  };
  for (size_t i = 0; i < list.size();) {
    const pipe::Action& a = list[i];
    const int mb = a.microbatch, c = a.chunk;
    const bool last =
        pipe::stage_of(c, axis.rank(), axis.size()) == axis.size() * s.options.virtual_stages - 1;
    const bool first = pipe::stage_of(c, axis.rank(), axis.size()) == 0;
    switch (a.op) {
      case pipe::Op::Forward: {
        std::span<const float> in = s.forward_input(c, mb);
        std::span<float> out = last ? std::span<float>{} : s.buffer(s.output, c, mb);
        timed([&] { fn.forward(mb, c, in, out); });
        ++i;
        continue;
      }
      case pipe::Op::Backward:
      case pipe::Op::BackwardInput: {
        std::span<const float> dout = s.backward_input(c, mb);
        std::span<float> din = first ? std::span<float>{} : s.buffer(s.input_grad, c, mb);
        timed([&] { fn.backward(mb, c, dout, din); });
        ++i;
        continue;
      }
      case pipe::Op::BackwardWeight:
        timed([&] { fn.backward_weight(mb, c); });
        ++i;
        continue;
      default:
        break;
    }
    // A group of transfers: actions [i, end).
    size_t end = i;
    bool receives = false;
    check(weftGroupStart());
    for (; end < list.size() && pipe::is_comm(list[end].op) && list[end].group == a.group; ++end) {
      const pipe::Action& x = list[end];
      std::vector<std::vector<float>>& set = x.op == pipe::Op::SendForward    ? s.output
                                             : x.op == pipe::Op::SendBackward ? s.input_grad
                                             : x.op == pipe::Op::RecvForward  ? s.input
                                                                              : s.output_grad;
      std::vector<float>& b = s.buffer(set, x.chunk, x.microbatch);
      if (sends(x.op)) {
        check(weftSend(b.data(), numel, weftFloat32, x.peer, axis.comm(), axis.stream()));
      } else {
        check(weftRecv(b.data(), numel, weftFloat32, x.peer, axis.comm(), axis.stream()));
        receives = true;
      }
    }
    check(weftGroupEnd());
    double waited = 0;
    if (receives) {
      const double t0 = now_s();
      check(weftStreamSynchronize(axis.stream()));
      waited = now_s() - t0;
    }
    if (Ledger* ledger = axis.ledger()) {
      size_t nrecv = 0;
      for (size_t k = i; k < end; ++k) nrecv += sends(list[k].op) ? 0 : 1;
      for (size_t k = i; k < end; ++k) {
        const pipe::Op op = list[k].op;
        const double share = sends(op) ? 0.0 : waited / double(nrecv);
        ledger->record(forward_direction(op) ? "pp.forward" : "pp.backward",
                       sends(op) ? "send" : "recv", axis.name(), bytes, sends(op) ? bytes : 0,
                       "p2p", share, share);
      }
    }
    i = end;
  }
  check(weftStreamSynchronize(axis.stream()));
  s.profile.wall_s = now_s() - start;
  s.profile.compute_s = compute;
}

void expected_pipeline(const PipelineOptions& options, int stages, int rank, std::string_view dim,
                       int steps, Ledger& ledger) {
  if (stages <= 1) return;
  const size_t bytes = options.activation_numel * sizeof(float);
  const size_t v = size_t(options.virtual_stages);
  const size_t m = size_t(options.microbatches) * size_t(steps);
  // Chunks of this rank with a next stage (all but the last rank's last) and
  // with a previous one (all but rank 0's first).
  const size_t with_next = v - (rank == stages - 1 ? 1 : 0);
  const size_t with_prev = v - (rank == 0 ? 1 : 0);
  auto add = [&](const char* pattern, const char* primitive, size_t calls, bool sent) {
    for (size_t k = 0; k < calls; ++k)
      ledger.record(pattern, primitive, dim, bytes, sent ? bytes : 0, "", 0, 0);
  };
  add("pp.forward", "send", with_next * m, true);
  add("pp.forward", "recv", with_prev * m, false);
  add("pp.backward", "send", with_prev * m, true);
  add("pp.backward", "recv", with_next * m, false);
}

}  // namespace weft::parallel
