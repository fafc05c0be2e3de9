// Data parallel gradient bucketing: gradients live in bucket storage; a
// bucket's AllReduce goes out on the axis stream once its last gradient is
// ready (and every bucket before it has gone, so that all ranks issue the
// same sequence); finish() joins them.
#include <algorithm>
#include <cstring>
#include <set>

#include "parallel/internal.h"

namespace weft::parallel {

using detail::require;

std::vector<std::vector<size_t>> assign_buckets(std::span<const size_t> numels,
                                                size_t element_bytes, size_t first_bucket_bytes,
                                                size_t bucket_bytes) {
  require(bucket_bytes > 0, "bucket_bytes is 0");
  require(first_bucket_bytes > 0, "first_bucket_bytes is 0");
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  size_t bytes = 0;
  for (size_t i = numels.size(); i-- > 0;) {
    current.push_back(i);
    bytes += numels[i] * element_bytes;
    if (bytes >= (buckets.empty() ? first_bucket_bytes : bucket_bytes)) {
      buckets.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

struct DataParallel::State {
  Axis axis;
  BucketOptions options;
  size_t esize = 0;
  std::vector<std::string> names;
  std::vector<size_t> numels;
  std::set<std::string> known;
  bool finalized = false;

  std::vector<BucketInfo> buckets;
  std::vector<size_t> bucket_of, offset_of;  // per parameter
  std::unique_ptr<std::max_align_t[]> storage;
  size_t storage_bytes = 0;

  // Per step.
  std::vector<bool> ready;
  std::vector<size_t> missing;  // per bucket
  std::vector<std::unique_ptr<detail::Inflight>> inflight;
  size_t next = 0;  // the next bucket to launch
  std::vector<size_t> order;
  weftRedOp_t op = weftSum;
  bool premul = false;

  explicit State(Axis a) : axis(std::move(a)) {}
  ~State() {
    inflight.clear();  // joins what is in flight before the storage goes
    if (premul) weftRedOpDestroy(op, axis.comm());
  }

  void* bucket_data(size_t b) const {
    return reinterpret_cast<char*>(storage.get()) + buckets[b].offset * esize;
  }

  void launch(size_t b) {
    if (b == 0) order.clear();  // a new step
    order.push_back(b);
    void* data = bucket_data(b);
    size_t count = buckets[b].numel;
    if (axis.size() == 1) {
      if (options.reduction == Reduction::scaled_sum) scale(data, count);
      return;
    }
    weftDataType_t dtype = options.dtype;
    weftRedOp_t reduction = op;
    inflight[b]->launch(axis, "dp.bucket", "allreduce", count * esize,
                        [=](weftComm_t c, weftStream_t s) {
                          return weftAllReduce(data, data, count, dtype, reduction, c, s);
                        });
  }

  // The one-rank case of the pre-multiplied sum.
  void scale(void* data, size_t count) const {
    if (options.dtype == weftFloat32) {
      auto* values = static_cast<float*>(data);
      for (size_t i = 0; i < count; ++i) values[i] *= static_cast<float>(options.gradient_scale);
    } else {
      auto* values = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) values[i] *= options.gradient_scale;
    }
  }

  // Launches, in bucket order, every bucket whose gradients are all ready.
  void launch_ready() {
    while (next < buckets.size() && missing[next] == 0) launch(next++);
  }

  void reset() {
    ready.assign(names.size(), false);
    missing.clear();
    for (const BucketInfo& bucket : buckets) missing.push_back(bucket.params.size());
    next = 0;
  }
};

DataParallel::DataParallel(Axis axis, BucketOptions options)
    : state_(std::make_unique<State>(std::move(axis))) {
  State& s = *state_;
  s.esize = dtype_bytes(options.dtype);
  require(options.bucket_bytes > 0, "bucket_bytes is 0");
  require(options.first_bucket_bytes > 0, "first_bucket_bytes is 0");
  if (options.reduction == Reduction::scaled_sum)
    require(options.dtype == weftFloat32 || options.dtype == weftFloat64,
            "gradient_scale needs dtype weftFloat32 or weftFloat64");
  s.options = options;
}

DataParallel::~DataParallel() = default;

size_t DataParallel::add(std::string name, size_t numel) {
  State& s = *state_;
  require(!s.finalized, "parameter \"" + name + "\" added after finalize()");
  require(s.known.insert(name).second, "parameter \"" + name + "\" is registered twice");
  s.names.push_back(std::move(name));
  s.numels.push_back(numel);
  return s.names.size() - 1;
}

void DataParallel::finalize() {
  State& s = *state_;
  require(!s.finalized, "finalize() called twice");
  s.finalized = true;
  auto assignment =
      assign_buckets(s.numels, s.esize, s.options.first_bucket_bytes, s.options.bucket_bytes);
  s.bucket_of.assign(s.names.size(), 0);
  s.offset_of.assign(s.names.size(), 0);
  size_t offset = 0;
  for (size_t b = 0; b < assignment.size(); ++b) {
    BucketInfo info;
    info.params = assignment[b];
    info.offset = offset;
    for (size_t p : info.params) {
      s.bucket_of[p] = b;
      s.offset_of[p] = offset;
      offset += s.numels[p];
      info.numel += s.numels[p];
    }
    s.buckets.push_back(std::move(info));
    s.inflight.push_back(std::make_unique<detail::Inflight>());
  }
  s.storage_bytes = offset * s.esize;
  size_t slots = (s.storage_bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
  s.storage = std::make_unique<std::max_align_t[]>(std::max<size_t>(slots, 1));
  zero_grad();
  if (s.options.reduction == Reduction::avg) {
    s.op = weftAvg;
  } else if (s.options.reduction == Reduction::scaled_sum && s.axis.size() > 1) {
    float scale32 = static_cast<float>(s.options.gradient_scale);
    double scale64 = s.options.gradient_scale;
    void* scalar = s.options.dtype == weftFloat32 ? static_cast<void*>(&scale32) : &scale64;
    check(weftRedOpCreatePreMulSum(&s.op, scalar, s.options.dtype, weftScalarHostImmediate,
                                   s.axis.comm()));
    s.premul = true;
  }
  s.reset();
}

Tensor DataParallel::grad(size_t param) const {
  const State& s = *state_;
  require(s.finalized, "grad() before finalize()");
  require(param < s.names.size(), "param " + std::to_string(param) + " is not registered");
  return Tensor{reinterpret_cast<char*>(s.storage.get()) + s.offset_of[param] * s.esize,
                {s.numels[param]},
                s.options.dtype};
}

void DataParallel::mark_ready(size_t param) {
  State& s = *state_;
  require(s.finalized, "mark_ready() before finalize()");
  require(param < s.names.size(), "param " + std::to_string(param) + " is not registered");
  require(!s.ready[param], "parameter \"" + s.names[param] + "\" marked ready twice in a step");
  s.ready[param] = true;
  --s.missing[s.bucket_of[param]];
  s.launch_ready();
}

void DataParallel::finish() {
  State& s = *state_;
  require(s.finalized, "finish() before finalize()");
  // Gradients never marked are reduced as they are (zeros if untouched).
  std::fill(s.missing.begin(), s.missing.end(), 0);
  s.launch_ready();
  for (auto& op : s.inflight) op->join();
  s.reset();
}

void DataParallel::zero_grad() {
  State& s = *state_;
  require(s.finalized, "zero_grad() before finalize()");
  if (s.storage_bytes > 0) memset(s.storage.get(), 0, s.storage_bytes);
}

const std::vector<BucketInfo>& DataParallel::buckets() const {
  return state_->buckets;
}

const std::vector<size_t>& DataParallel::launch_order() const {
  return state_->order;
}

}  // namespace weft::parallel
