#include "algorithms/pipeline/action.h"

namespace weft::algo::pipeline {

namespace {

struct FamilyName {
  Family family;
  const char* name;
};
constexpr FamilyName kFamilies[] = {{Family::GPipe, "gpipe"},
                                    {Family::OneFOneB, "1f1b"},
                                    {Family::Interleaved, "interleaved"},
                                    {Family::ZeroBubble, "zb"}};

}  // namespace

const char* family_name(Family family) {
  for (const FamilyName& f : kFamilies)
    if (f.family == family) return f.name;
  return "?";
}

bool parse_family(std::string_view name, Family* out) {
  for (const FamilyName& f : kFamilies)
    if (name == f.name) {
      *out = f.family;
      return true;
    }
  return false;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward:
      return "F";
    case Op::Backward:
      return "B";
    case Op::BackwardInput:
      return "I";
    case Op::BackwardWeight:
      return "W";
    case Op::SendForward:
      return "SEND_F";
    case Op::RecvForward:
      return "RECV_F";
    case Op::SendBackward:
      return "SEND_B";
    case Op::RecvBackward:
      return "RECV_B";
  }
  return "?";
}

std::string validate(const Params& p) {
  const std::string name = family_name(p.family);
  if (p.stages < 1) return "stages " + std::to_string(p.stages) + " must be >= 1";
  if (p.microbatches < 1) return "microbatches " + std::to_string(p.microbatches) + " must be >= 1";
  if (p.virtual_stages < 1)
    return "virtual_stages " + std::to_string(p.virtual_stages) + " must be >= 1";
  if (p.virtual_stages > 1 && p.family != Family::Interleaved)
    return "virtual_stages " + std::to_string(p.virtual_stages) +
           " needs the interleaved schedule (" + name + " has one chunk per rank)";
  if (p.costs.forward < 1 || p.costs.backward_input < 1 || p.costs.backward_weight < 1)
    return "costs must be >= 1 time unit each";
  // Interleaving walks the micro-batches in rounds of p (one per rank), so
  // every round must be full: the chunks of a rank would otherwise wait on
  // one another with nothing to fill the gap.
  if (p.family == Family::Interleaved && p.microbatches % p.stages != 0)
    return "microbatches " + std::to_string(p.microbatches) + " must be a multiple of stages " +
           std::to_string(p.stages) + " for the interleaved schedule";
  return "";
}

bool build(const Params& params, Schedule* schedule, std::string* error) {
  const std::string why = validate(params);
  if (!why.empty()) {
    if (error) *error = why;
    return false;
  }
  std::vector<std::vector<Action>> order;
  switch (params.family) {
    case Family::GPipe:
      order = gpipe_order(params);
      break;
    case Family::OneFOneB:
      order = one_f_one_b_order(params);
      break;
    case Family::Interleaved:
      order = interleaved_order(params);
      break;
    case Family::ZeroBubble:
      order = zero_bubble_order(params);
      break;
  }
  *schedule = lower(params, order);
  return true;
}

Schedule lower(const Params& params, const std::vector<std::vector<Action>>& compute) {
  const int p = params.stages, last = p * params.virtual_stages - 1;
  Schedule out;
  out.stages = p, out.microbatches = params.microbatches,
  out.virtual_stages = params.virtual_stages;
  out.ranks.resize(p);
  for (int r = 0; r < p; ++r) {
    std::vector<Action>& list = out.ranks[r];
    std::vector<Action> pending;  // sends of the previous compute action
    uint32_t group = 0;
    auto flush = [&](std::vector<Action> recvs) {
      if (pending.empty() && recvs.empty()) return;
      ++group;
      for (std::vector<Action>* part : {&pending, &recvs})
        for (Action a : *part) {
          a.group = group;
          list.push_back(a);
        }
      pending.clear();
    };
    const std::vector<Action>& order = compute[r];
    auto stage = [&](const Action& c) { return stage_of(c.chunk, r, p); };
    auto comm = [&](const Action& c, Op op, int neighbour) {
      return Action{op, c.microbatch, c.chunk, neighbour % p};
    };
    for (size_t k = 0; k < order.size(); ++k) {
      // The window starting here: this action and those that join it.
      size_t end = k + 1;
      while (end < order.size() && order[end].with_previous) ++end;
      std::vector<Action> recvs;
      for (size_t i = k; i < end && p > 1; ++i) {
        const Action& c = order[i];
        if (c.op == Op::Forward && stage(c) > 0)
          recvs.push_back(comm(c, Op::RecvForward, stage(c) - 1));
        if ((c.op == Op::Backward || c.op == Op::BackwardInput) && stage(c) < last)
          recvs.push_back(comm(c, Op::RecvBackward, stage(c) + 1));
      }
      flush(std::move(recvs));
      for (; k < end; ++k) {
        const Action& c = order[k];
        list.push_back(c);
        if (p > 1 && c.op == Op::Forward && stage(c) < last)
          pending.push_back(comm(c, Op::SendForward, stage(c) + 1));
        if (p > 1 && (c.op == Op::Backward || c.op == Op::BackwardInput) && stage(c) > 0)
          pending.push_back(comm(c, Op::SendBackward, stage(c) - 1));
      }
      --k;
    }
    flush({});
  }
  return out;
}

}  // namespace weft::algo::pipeline
