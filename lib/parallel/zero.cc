// ZeRO-1/2/3 (FSDP) over fp32 parameters: flat buckets padded to a multiple
// of the shard group, each rank owning one 1/N shard of every bucket with
// its Adam state; hybrid sharding adds an AllReduce over the replicate axis.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "parallel/internal.h"

namespace weft::parallel {

using detail::require;

void adam_step(std::span<float> params, std::span<const float> grads, std::span<float> m,
               std::span<float> v, int step, const AdamOptions& options) {
  require(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
          "params, grads, m and v differ in size");
  require(step >= 1, "step " + std::to_string(step) + " must be at least 1");
  auto correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(options.beta1), step));
  auto correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(options.beta2), step));
  for (size_t i = 0; i < params.size(); ++i) {
    float g = grads[i];
    m[i] = options.beta1 * m[i] + (1.0f - options.beta1) * g;
    v[i] = options.beta2 * v[i] + (1.0f - options.beta2) * g * g;
    float update = (m[i] / correction1) / (std::sqrt(v[i] / correction2) + options.eps);
    params[i] -= options.lr * (update + options.weight_decay * params[i]);
  }
}

namespace {

struct Bucket {
  std::vector<size_t> params;
  std::vector<size_t> offsets;  // of each parameter in the bucket
  size_t numel = 0, padded = 0, shard = 0;
  size_t flat = 0;          // offset in the full flat buffers (stages 1/2)
  size_t shard_offset = 0;  // offset in the packed shard buffers
  int layer = 0;            // stage 3 unit
};

// Stage 3 per-unit state.
struct Unit {
  std::vector<float> full, grads;  // empty while freed
  std::unique_ptr<detail::Inflight> gather = std::make_unique<detail::Inflight>();
  std::unique_ptr<detail::Inflight> reduce = std::make_unique<detail::Inflight>();
  bool gathered = false;   // its AllGather was launched
  bool available = false;  // and joined
};

}  // namespace

struct Zero::State {
  Axis shard;
  std::unique_ptr<Axis> replicate;
  ZeroOptions options;
  int n = 1, rank = 0;
  std::string prefix;  // "zero1", ...

  std::vector<std::string> names;
  std::vector<size_t> numels;
  std::vector<int> layers;
  std::set<std::string> known;
  bool finalized = false;

  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, offset_in;    // per parameter
  std::vector<float> full_params, full_grads;  // stages 1/2
  std::vector<float> shard_params, shard_grads, m, v;
  size_t padded_total = 0, shard_total = 0;
  std::vector<Unit> units;  // stage 3, one per bucket
  // Stage 2 readiness.
  std::vector<bool> ready;
  std::vector<size_t> missing;
  std::vector<std::unique_ptr<detail::Inflight>> reduces;
  size_t next = 0;
  int steps = 0;

  explicit State(Axis s) : shard(std::move(s)) {}
  ~State() {
    // Join whatever is in flight before the buffers it reads go.
    reduces.clear();
    units.clear();
  }

  weftRedOp_t op() const { return options.average ? weftAvg : weftSum; }

  void reduce_scatter(detail::Inflight& inflight, const std::string& pattern, const float* full,
                      float* part, size_t count) {
    if (n == 1) {
      std::copy(full, full + count, part);
      return;
    }
    weftRedOp_t reduction = op();
    inflight.launch(shard, pattern, "reducescatter", count * n * sizeof(float),
                    [=](weftComm_t c, weftStream_t s) {
                      return weftReduceScatter(full, part, count, weftFloat32, reduction, c, s);
                    });
  }

  void all_gather(detail::Inflight& inflight, const std::string& pattern, const float* part,
                  float* full, size_t count) {
    if (n == 1) {
      std::copy(part, part + count, full);
      return;
    }
    detail::launch_all_gather(inflight, shard, pattern, part, full, count);
  }

  // HSDP: shard gradients AllReduced over the replicas.
  void reduce_replicas(float* data, size_t count) {
    if (!replicate || replicate->size() == 1) return;
    weftRedOp_t reduction = op();
    detail::blocking(*replicate, "hsdp.grads", "allreduce", count * sizeof(float),
                     [=](weftComm_t c, weftStream_t s) {
                       return weftAllReduce(data, data, count, weftFloat32, reduction, c, s);
                     });
  }

  void launch_bucket_reduce(size_t b) {
    const Bucket& bucket = buckets[b];
    reduce_scatter(*reduces[b], prefix + ".grads", full_grads.data() + bucket.flat,
                   shard_grads.data() + bucket.shard_offset, bucket.shard);
  }

  void launch_ready() {
    while (next < buckets.size() && missing[next] == 0) launch_bucket_reduce(next++);
  }

  void reset_readiness() {
    ready.assign(names.size(), false);
    missing.clear();
    for (const Bucket& bucket : buckets) missing.push_back(bucket.params.size());
    next = 0;
  }

  size_t unit_of_layer(int layer) const {
    for (size_t b = 0; b < buckets.size(); ++b)
      if (buckets[b].layer == layer) return b;
    detail::fail("layer " + std::to_string(layer) + " has no registered parameters");
  }

  void gather_unit(size_t b, const char* pattern) {
    Unit& unit = units[b];
    if (unit.gathered) return;
    unit.full.resize(buckets[b].padded);
    all_gather(*unit.gather, pattern, shard_params.data() + buckets[b].shard_offset,
               unit.full.data(), buckets[b].shard);
    unit.gathered = true;
  }

  void make_available(size_t b) {
    units[b].gather->join();
    units[b].available = true;
  }

  void free_unit(size_t b) {
    Unit& unit = units[b];
    std::vector<float>().swap(unit.full);
    unit.gathered = unit.available = false;
  }

  void finish_unit_reduce(size_t b) {
    units[b].reduce->join();
    std::vector<float>().swap(units[b].grads);
  }

  // The bucket of parameter id, after checking that it exists.
  size_t bucket_checked(size_t id, const char* what) const {
    require(finalized, std::string(what) + " before finalize()");
    require(id < names.size(), "param " + std::to_string(id) + " is not registered");
    return bucket_of[id];
  }

  // Where element e of parameter id (owned by this rank) lives in the shard buffers.
  size_t shard_index(size_t id, size_t e) const {
    const Bucket& bucket = buckets[bucket_of[id]];
    return bucket.shard_offset + offset_in[id] + e - rank * bucket.shard;
  }

  // Stages 1/2: full_params from every rank's shard_params, by one AllGather of every
  // bucket's shard; with several buckets the rank-major result is scattered back into the
  // bucket layout. A step's gather is booked in the ledger; a checkpoint's import is not
  // traffic of a step, so it is not.
  void gather_full_params(bool booked) {
    bool single = buckets.size() == 1;
    std::vector<float> staging(single ? 0 : shard_total * n);
    float* target = single ? full_params.data() : staging.data();
    if (booked) {
      detail::Inflight gather;
      all_gather(gather, prefix + ".params", shard_params.data(), target, shard_total);
      gather.join();
    } else {
      check(weftAllGather(shard_params.data(), target, shard_total, weftFloat32, shard.comm(),
                          shard.stream()));
      check(weftStreamSynchronize(shard.stream()));
    }
    if (!single)
      for (int r = 0; r < n; ++r)
        for (const Bucket& bucket : buckets)
          std::copy_n(staging.begin() + r * shard_total + bucket.shard_offset, bucket.shard,
                      full_params.begin() + bucket.flat + r * bucket.shard);
  }

  void require_stage3(const char* what) const {
    require(options.stage == 3, std::string(what) + " is for ZeRO stage 3 (this is stage " +
                                    std::to_string(options.stage) + ")");
    require(finalized, std::string(what) + " before finalize()");
  }
};

Zero::Zero(Axis shard, ZeroOptions options) : state_(std::make_unique<State>(std::move(shard))) {
  State& s = *state_;
  require(options.stage >= 1 && options.stage <= 3,
          "stage " + std::to_string(options.stage) + " is not 1, 2 or 3");
  require(options.bucket_bytes > 0, "bucket_bytes is 0");
  require(options.pad_multiple > 0, "pad_multiple is 0");
  s.options = options;
  s.n = s.shard.size();
  s.rank = s.shard.rank();
  s.prefix = "zero" + std::to_string(options.stage);
}

Zero::Zero(Axis shard, Axis replicate, ZeroOptions options) : Zero(std::move(shard), options) {
  state_->replicate = std::make_unique<Axis>(std::move(replicate));
}

Zero::~Zero() = default;

size_t Zero::add(std::string name, size_t numel, int layer) {
  State& s = *state_;
  require(!s.finalized, "parameter \"" + name + "\" added after finalize()");
  require(layer >= 0, "layer " + std::to_string(layer) + " of \"" + name + "\" is negative");
  require(s.layers.empty() || layer >= s.layers.back(),
          "layer " + std::to_string(layer) + " of \"" + name + "\" comes after layer " +
              std::to_string(s.layers.empty() ? 0 : s.layers.back()) +
              " (register in forward order)");
  require(s.known.insert(name).second, "parameter \"" + name + "\" is registered twice");
  s.names.push_back(std::move(name));
  s.numels.push_back(numel);
  s.layers.push_back(layer);
  return s.names.size() - 1;
}

void Zero::finalize() {
  State& s = *state_;
  require(!s.finalized, "finalize() called twice");
  s.finalized = true;
  std::vector<std::vector<size_t>> groups;
  if (s.options.stage == 1) {
    groups.emplace_back(s.names.size());
    std::iota(groups.back().begin(), groups.back().end(), 0);
  } else if (s.options.stage == 2) {
    groups =
        assign_buckets(s.numels, sizeof(float), s.options.bucket_bytes, s.options.bucket_bytes);
  } else {
    for (size_t p = 0; p < s.names.size(); ++p) {
      if (p == 0 || s.layers[p] != s.layers[p - 1]) groups.emplace_back();
      groups.back().push_back(p);
    }
  }
  size_t quantum = std::lcm(static_cast<size_t>(s.n), s.options.pad_multiple);
  s.bucket_of.assign(s.names.size(), 0);
  s.offset_in.assign(s.names.size(), 0);
  for (size_t b = 0; b < groups.size(); ++b) {
    Bucket bucket;
    bucket.params = groups[b];
    bucket.layer = s.layers.empty() ? 0 : s.layers[groups[b].front()];
    for (size_t p : bucket.params) {
      s.bucket_of[p] = b;
      s.offset_in[p] = bucket.numel;
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += s.numels[p];
    }
    bucket.padded = (bucket.numel + quantum - 1) / quantum * quantum;
    bucket.shard = bucket.padded / s.n;
    bucket.flat = s.padded_total;
    bucket.shard_offset = s.shard_total;
    s.padded_total += bucket.padded;
    s.shard_total += bucket.shard;
    s.buckets.push_back(std::move(bucket));
    s.reduces.push_back(std::make_unique<detail::Inflight>());
  }
  if (s.options.stage < 3) {
    s.full_params.assign(s.padded_total, 0.0f);
    s.full_grads.assign(s.padded_total, 0.0f);
  } else {
    s.units.resize(s.buckets.size());
  }
  for (auto* buffer : {&s.shard_params, &s.shard_grads, &s.m, &s.v})
    buffer->assign(s.shard_total, 0.0f);
  s.reset_readiness();
}

std::span<float> Zero::param(size_t id) {
  State& s = *state_;
  size_t b = s.bucket_checked(id, "param()");
  if (s.options.stage < 3)
    return {s.full_params.data() + s.buckets[b].flat + s.offset_in[id], s.numels[id]};
  require(s.units[b].available, "parameter \"" + s.names[id] + "\" of layer " +
                                    std::to_string(s.buckets[b].layer) + " is not gathered");
  return {s.units[b].full.data() + s.offset_in[id], s.numels[id]};
}

std::span<float> Zero::grad(size_t id) {
  State& s = *state_;
  size_t b = s.bucket_checked(id, "grad()");
  if (s.options.stage < 3)
    return {s.full_grads.data() + s.buckets[b].flat + s.offset_in[id], s.numels[id]};
  require(!s.units[b].grads.empty() || s.numels[id] == 0,
          "the gradient of \"" + s.names[id] + "\" exists between backward_begin(" +
              std::to_string(s.buckets[b].layer) + ") and backward_end()");
  return {s.units[b].grads.data() + s.offset_in[id], s.numels[id]};
}

void Zero::set_param(size_t id, std::span<const float> value) {
  State& s = *state_;
  const Bucket& bucket = s.buckets[s.bucket_checked(id, "set_param()")];
  detail::require_size("value", value.size(), s.numels[id]);
  size_t begin = s.offset_in[id], own = s.rank * bucket.shard;
  if (s.options.stage < 3)
    std::copy(value.begin(), value.end(), s.full_params.begin() + bucket.flat + begin);
  for (size_t i = 0; i < value.size(); ++i) {
    size_t at = begin + i;
    if (at >= own && at < own + bucket.shard)
      s.shard_params[bucket.shard_offset + at - own] = value[i];
  }
}

void Zero::mark_ready(size_t id) {
  State& s = *state_;
  s.bucket_checked(id, "mark_ready()");
  require(!s.ready[id], "parameter \"" + s.names[id] + "\" marked ready twice in a step");
  s.ready[id] = true;
  if (s.options.stage != 2) return;  // stage 1 reduces in step(), stage 3 in backward_end()
  --s.missing[s.bucket_of[id]];
  s.launch_ready();
}

void Zero::forward_begin(int layer) {
  State& s = *state_;
  s.require_stage3("forward_begin()");
  size_t b = s.unit_of_layer(layer);
  s.gather_unit(b, "zero3.gather_fwd");
  if (b + 1 < s.units.size()) s.gather_unit(b + 1, "zero3.gather_fwd");  // prefetch
  s.make_available(b);
}

void Zero::forward_end(int layer) {
  State& s = *state_;
  s.require_stage3("forward_end()");
  size_t b = s.unit_of_layer(layer);
  require(s.units[b].available, "forward_end(" + std::to_string(layer) + ") without forward_begin");
  s.free_unit(b);
}

void Zero::backward_begin(int layer) {
  State& s = *state_;
  s.require_stage3("backward_begin()");
  size_t b = s.unit_of_layer(layer);
  s.gather_unit(b, "zero3.gather_bwd");
  if (b > 0) s.gather_unit(b - 1, "zero3.gather_bwd");  // prefetch
  s.make_available(b);
  s.units[b].grads.assign(s.buckets[b].padded, 0.0f);
}

void Zero::backward_end(int layer) {
  State& s = *state_;
  s.require_stage3("backward_end()");
  size_t b = s.unit_of_layer(layer);
  Unit& unit = s.units[b];
  require(unit.available && !unit.grads.empty(),
          "backward_end(" + std::to_string(layer) + ") without backward_begin");
  s.reduce_scatter(*unit.reduce, "zero3.grads", unit.grads.data(),
                   s.shard_grads.data() + s.buckets[b].shard_offset, s.buckets[b].shard);
  s.free_unit(b);
  if (b + 1 < s.units.size()) s.finish_unit_reduce(b + 1);
}

void Zero::step() {
  State& s = *state_;
  require(s.finalized, "step() before finalize()");
  if (s.options.stage == 3) {
    for (size_t b = 0; b < s.units.size(); ++b) {
      s.finish_unit_reduce(b);
      s.reduce_replicas(s.shard_grads.data() + s.buckets[b].shard_offset, s.buckets[b].shard);
    }
  } else {
    if (s.options.stage == 1)
      s.launch_bucket_reduce(0);
    else {
      std::fill(s.missing.begin(), s.missing.end(), 0);
      s.launch_ready();
    }
    for (auto& reduce : s.reduces) reduce->join();
    s.reduce_replicas(s.shard_grads.data(), s.shard_total);
  }
  adam_step(s.shard_params, s.shard_grads, s.m, s.v, ++s.steps, s.options.adam);
  std::fill(s.shard_grads.begin(), s.shard_grads.end(), 0.0f);
  if (s.options.stage < 3) {
    s.gather_full_params(true);
    std::fill(s.full_grads.begin(), s.full_grads.end(), 0.0f);
  }
  s.reset_readiness();
}

ZeroShard Zero::export_shard() const {
  const State& s = *state_;
  ZeroShard out;
  out.steps = s.steps;
  out.ranges = owned();
  for (const ShardRange& range : out.ranges) {
    const size_t at = s.shard_index(range.param, range.begin);
    for (auto [from, to] :
         {std::pair{&s.shard_params, &out.params}, {&s.m, &out.m}, {&s.v, &out.v}})
      to->insert(to->end(), from->begin() + at, from->begin() + at + (range.end - range.begin));
  }
  return out;
}

void Zero::import_shard(const ZeroShard& state) {
  State& s = *state_;
  require(s.finalized, "import_shard() before finalize()");
  require(state.steps >= 0,
          "import_shard(): steps " + std::to_string(state.steps) + " is negative");
  size_t total = 0;
  for (const ShardRange& range : state.ranges) {
    require(range.param < s.names.size(),
            "import_shard(): range of param " + std::to_string(range.param) + " is not registered");
    require(range.begin <= range.end && range.end <= s.numels[range.param],
            "import_shard(): range [" + std::to_string(range.begin) + ", " +
                std::to_string(range.end) + ") of \"" + s.names[range.param] +
                "\" is outside its " + std::to_string(s.numels[range.param]) + " elements");
    total += range.end - range.begin;
  }
  detail::require_size("import_shard() params", state.params.size(), total);
  detail::require_size("import_shard() m", state.m.size(), total);
  detail::require_size("import_shard() v", state.v.size(), total);
  // Every element this rank owns must come from some range; later ranges win.
  std::vector<bool> covered(s.shard_total, false);
  size_t at = 0;
  for (const ShardRange& range : state.ranges) {
    const Bucket& bucket = s.buckets[s.bucket_of[range.param]];
    const size_t own = s.rank * bucket.shard, base = s.offset_in[range.param];
    const size_t lo = std::max(base + range.begin, own);
    const size_t hi = std::min(base + range.end, own + bucket.shard);
    for (size_t e = lo; e < hi; ++e) {
      const size_t from = at + (e - base - range.begin), to = bucket.shard_offset + e - own;
      s.shard_params[to] = state.params[from], s.m[to] = state.m[from], s.v[to] = state.v[from];
      covered[to] = true;
    }
    at += range.end - range.begin;
  }
  for (const ShardRange& range : owned())
    for (size_t e = range.begin; e < range.end; ++e)
      require(covered[s.shard_index(range.param, e)],
              "import_shard(): element " + std::to_string(e) + " of \"" + s.names[range.param] +
                  "\", owned by rank " + std::to_string(s.rank) + ", is in none of the ranges");
  s.steps = state.steps;
  if (s.options.stage < 3) s.gather_full_params(false);
}

std::vector<ShardRange> Zero::owned() const {
  const State& s = *state_;
  require(s.finalized, "owned() before finalize()");
  std::vector<ShardRange> ranges;
  for (const Bucket& bucket : s.buckets) {
    size_t own_begin = s.rank * bucket.shard, own_end = own_begin + bucket.shard;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      size_t begin = bucket.offsets[i], end = begin + s.numels[bucket.params[i]];
      size_t lo = std::max(begin, own_begin), hi = std::min(end, own_end);
      if (lo < hi) ranges.push_back({bucket.params[i], lo - begin, hi - begin});
    }
  }
  return ranges;
}

bool Zero::coverage_ok() const {
  const State& s = *state_;
  std::vector<size_t> base(s.names.size() + 1, 0);
  for (size_t p = 0; p < s.names.size(); ++p) base[p + 1] = base[p] + s.numels[p];
  std::vector<int32_t> owners(base.back(), 0);
  for (const ShardRange& range : owned())
    for (size_t i = range.begin; i < range.end; ++i) ++owners[base[range.param] + i];
  if (s.n > 1 && !owners.empty()) {
    // A check, not traffic of the step: not booked in the ledger.
    check(weftAllReduce(owners.data(), owners.data(), owners.size(), weftInt32, weftSum,
                        s.shard.comm(), s.shard.stream()));
    check(weftStreamSynchronize(s.shard.stream()));
  }
  return std::all_of(owners.begin(), owners.end(), [](int32_t count) { return count == 1; });
}

size_t Zero::shard_numel() const {
  return state_->shard_total;
}
size_t Zero::padded_numel() const {
  return state_->padded_total;
}

}  // namespace weft::parallel
