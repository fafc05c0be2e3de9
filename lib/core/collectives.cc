#include "core/collectives.h"

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/env.h"
#include "common/log.h"
#include "core/bootstrap_protocol.h"
#include "core/cuda/device_collectives.h"
#include "core/cuda/driver.h"
#include "core/group.h"
#include "core/tuner.h"

namespace weft {

namespace {

static_assert(std::is_same_v<size_t, uint64_t>, "AllToAllv counts are passed through as uint64_t");

// Largest element count Weft accepts in one buffer: far beyond any memory,
// small enough that offsets times element sizes cannot overflow.
constexpr uint64_t kMaxElements = uint64_t{1} << 56;

bool is_reduction(algo::Collective collective) {
  return collective == algo::Collective::AllReduce ||
         collective == algo::Collective::ReduceScatter || collective == algo::Collective::Reduce;
}

bool is_rooted(algo::Collective collective) {
  return collective == algo::Collective::Broadcast || collective == algo::Collective::Reduce ||
         collective == algo::Collective::Gather || collective == algo::Collective::Scatter;
}

const char* name_of(algo::Collective collective) {
  return algo::collective_name(collective);
}

// Whether the call uses NCCL's in-place layout for its collective.
bool detect_in_place(const CollectiveCall& call, int rank, size_t element) {
  auto send = static_cast<const std::byte*>(call.send);
  auto recv = static_cast<const std::byte*>(call.recv);
  if (send == nullptr || recv == nullptr) return false;
  uint64_t piece = call.count * element;
  switch (call.collective) {
    case algo::Collective::AllGather:
      return send == recv + rank * piece;
    case algo::Collective::ReduceScatter:
      return recv == send + rank * piece;
    case algo::Collective::Gather:
      return rank == call.root && send == recv + rank * piece;
    case algo::Collective::Scatter:
      return rank == call.root && recv == send + rank * piece;
    default:
      return send == recv;
  }
}

Status check_vector_counts(const char* name, const size_t* values, int nranks) {
  if (values == nullptr) return Error(weftInvalidArgument, "%s is NULL", name);
  for (int peer = 0; peer < nranks; ++peer)
    if (values[peer] > kMaxElements)
      return Error(weftInvalidArgument, "%s[%d] = %zu is out of range (a negative count?)", name,
                   peer, values[peer]);
  return Status::Ok();
}

}  // namespace

Status validate_collective(Communicator& comm, const CollectiveCall& call, size_t element) {
  const char* name = name_of(call.collective);
  if (element == 0)
    return Error(weftInvalidArgument, "%s: datatype %d is not a valid weftDataType_t", name,
                 static_cast<int>(call.dtype));
  if (is_reduction(call.collective)) {
    bool builtin = call.op >= 0 && call.op < weftNumOps;
    const Communicator::PreMulSum* custom = comm.premulsum(call.op);
    if (!builtin && custom == nullptr)
      return Error(weftInvalidArgument,
                   "%s: op %d is not a weftRedOp_t or an op created on this "
                   "communicator",
                   name, static_cast<int>(call.op));
    if (custom != nullptr && custom->dtype != call.dtype)
      return Error(weftInvalidArgument, "%s: op %d was created for %s, not %s", name,
                   static_cast<int>(call.op), dtype_name(custom->dtype), dtype_name(call.dtype));
  }
  if (is_rooted(call.collective) && (call.root < 0 || call.root >= comm.nranks()))
    return Error(weftInvalidArgument, "%s: root %d is out of range [0, %d)", name, call.root,
                 comm.nranks());
  if (call.count > kMaxElements / static_cast<uint64_t>(comm.nranks()) / element)
    return Error(weftInvalidArgument, "%s: count %llu of %s overflows the addressable size", name,
                 static_cast<unsigned long long>(call.count), dtype_name(call.dtype));
  if (call.collective == algo::Collective::AllToAllv) {
    WEFT_RETURN_IF_ERROR(check_vector_counts("sendcounts", call.send_counts, comm.nranks()));
    WEFT_RETURN_IF_ERROR(check_vector_counts("sdispls", call.send_displs, comm.nranks()));
    WEFT_RETURN_IF_ERROR(check_vector_counts("recvcounts", call.recv_counts, comm.nranks()));
    WEFT_RETURN_IF_ERROR(check_vector_counts("rdispls", call.recv_displs, comm.nranks()));
  }
  return Status::Ok();
}

namespace {

// What validate_collective says of a call with a built-in op (below weftNumOps) but without
// building a status: true only where it would return Ok (the fast path validates the calls
// it answers false for).
bool plainly_valid(const Communicator& comm, const CollectiveCall& call, size_t element) {
  return element != 0 && call.op >= 0 && call.op < weftNumOps &&
         (!is_rooted(call.collective) || (call.root >= 0 && call.root < comm.nranks())) &&
         call.count <= kMaxElements / static_cast<uint64_t>(comm.nranks()) / element;
}

// `reads`, `writes`: whether the call reads its input and writes its output on this rank.
inline Status check_buffers(const CollectiveCall& call, bool reads, bool writes,
                            const Communicator::PreMulSum* premul) {
  const char* name = name_of(call.collective);
  if (reads && call.send == nullptr)
    return Error(weftInvalidArgument, "%s: sendbuff is NULL with count %llu", name,
                 static_cast<unsigned long long>(call.count));
  if (writes && call.recv == nullptr)
    return Error(weftInvalidArgument, "%s: recvbuff is NULL with count %llu", name,
                 static_cast<unsigned long long>(call.count));
  WEFT_RETURN_IF_ERROR(
      cuda::check_host_buffers(name, reads ? call.send : nullptr, writes ? call.recv : nullptr));
  // The host executor reads a run-time PreMulSum scalar itself.
  if (premul != nullptr && !premul->immediate)
    WEFT_RETURN_IF_ERROR(
        cuda::check_host_memory(name, "the PreMulSum op's scalar", premul->pointer));
  return Status::Ok();
}

reduce::Op reduce_op(weftRedOp_t op) {
  switch (op) {
    case weftProd:
      return reduce::Op::Prod;
    case weftMax:
      return reduce::Op::Max;
    case weftMin:
      return reduce::Op::Min;
    default:
      return reduce::Op::Sum;  // sum, avg (then divided), pre-multiplied sums
  }
}

// The schedule parameters every path needs: who calls what, with how many elements.
algo::Params call_params(const Communicator& comm, const CollectiveCall& call) {
  algo::Params params;
  params.collective = call.collective;
  params.nranks = comm.nranks();
  params.rank = comm.rank();
  params.root = is_rooted(call.collective) ? call.root : 0;
  params.count = call.count;
  return params;
}

}  // namespace

algo::Params collective_params(const Communicator& comm, const CollectiveCall& call, size_t element,
                               bool premul) {
  algo::Params params = call_params(comm, call);
  params.in_place = !premul && detect_in_place(call, comm.rank(), element);
  params.layout = &comm.topology().layout;
  params.send_counts = call.send_counts;
  params.send_displs = call.send_displs;
  params.recv_counts = call.recv_counts;
  params.recv_displs = call.recv_displs;
  return params;
}

namespace {

// The size at which every rank plans an AllToAllv: per-peer pieces of a
// typical MoE dispatch (tokens × hidden × 2 bytes).
constexpr uint64_t kAllToAllvPlanBytes = 1 << 20;

// A direct algorithm's job description, or why it cannot run here.
Status prepare_direct(const Communicator& comm, const algo::Params& params, JobBatch& batch,
                      const DirectCall** out) {
  const char* algorithm = algo::algorithm_name(params.algorithm);
  const char* name = name_of(params.collective);
  if (!algo::supports(params.algorithm, params.collective))
    return Error(weftInvalidUsage, "%s: algorithm %s does not implement it", name, algorithm);
  if (!comm.direct()->available())
    return Error(weftInvalidUsage,
                 "%s: algorithm %s needs every rank on one node with shared memory, but %s", name,
                 algorithm, comm.direct()->unavailable_reason().c_str());
  // A spare call keeps its count arrays' capacity; only AllToAllv reads them.
  std::shared_ptr<DirectCall> call = batch.new_direct();
  call->collective = params.collective;
  call->algorithm = params.algorithm;
  call->count = params.count;
  call->root = params.root;
  if (params.collective == algo::Collective::AllToAllv) {
    if (params.in_place) return Error(weftInvalidArgument, "alltoallv has no in-place form");
    size_t n = static_cast<size_t>(params.nranks);
    if (!call->peers) call->peers = std::make_unique<DirectCall::PeerCounts>();
    DirectCall::PeerCounts& peers = *call->peers;
    peers.send_counts.assign(params.send_counts, params.send_counts + n);
    peers.send_displs.assign(params.send_displs, params.send_displs + n);
    peers.recv_counts.assign(params.recv_counts, params.recv_counts + n);
    peers.recv_displs.assign(params.recv_displs, params.recv_displs + n);
    if (peers.send_counts[params.rank] != peers.recv_counts[params.rank])
      return Error(weftInvalidArgument,
                   "alltoallv: this rank's send and receive counts to itself differ");
  }
  *out = call.get();
  batch.directs.push_back(std::move(call));
  return Status::Ok();
}

}  // namespace

void describe_math(const Communicator& comm, const CollectiveCall& call, uint64_t input_elements,
                   size_t element, const Communicator::PreMulSum* premul, JobMath* out) {
  JobMath& math = *out;  // filled in place: the fast path builds one per call
  math.dtype = call.dtype;
  math.element_size = element;
  math.op = reduce_op(call.op);
  if (premul != nullptr) {
    math.premul = true;
    memcpy(math.premul_value, premul->value, sizeof(premul->value));
    if (!premul->immediate) math.premul_source = premul->pointer;
    math.premul_count = input_elements;
  }
  if (call.op == weftAvg && is_reduction(call.collective) &&
      (call.collective != algo::Collective::Reduce || comm.rank() == call.root)) {
    math.divide_count = call.count;
    math.divisor = static_cast<uint64_t>(comm.nranks());
  }
}

CallShape call_shape(const CollectiveCall& call, int root, bool premul) {
  CallShape shape;
  shape.collective = call.collective;
  shape.dtype = static_cast<uint8_t>(call.dtype);
  shape.op =
      static_cast<uint8_t>(is_reduction(call.collective) ? (premul ? weftNumOps : call.op) : 0);
  shape.root = root;
  shape.count = call.count;
  return shape;
}

namespace {

// What every job of a collective call carries, whichever path runs it: its buffers, the
// reduction's math and the call's shape (for mismatch detection). `root`: the call's (0 for
// collectives without one); `input_elements`: what it reads of its input on this rank.
inline void describe_job(const Communicator& comm, const CollectiveCall& call, int root,
                         uint64_t input_elements, size_t element,
                         const Communicator::PreMulSum* premul, Job* job) {
  job->input = static_cast<std::byte*>(const_cast<void*>(call.send));
  job->output = static_cast<std::byte*>(call.recv);
  describe_math(comm, call, input_elements, element, premul, &job->math);
  job->tag_kind = TagKind::Collective;
  job->what = name_of(call.collective);
  job->shape = call_shape(call, root, premul != nullptr);
  // WEFT_CHECK=full hashes the inputs that must agree in size, and a Broadcast's root's.
  if (comm.direct()->check() == CheckMode::Full) {
    const bool hashed = call.collective == algo::Collective::Broadcast
                            ? comm.rank() == call.root
                            : is_reduction(call.collective) ||
                                  call.collective == algo::Collective::AllGather ||
                                  call.collective == algo::Collective::AllToAll ||
                                  call.collective == algo::Collective::Gather;
    job->hashed_input_bytes = hashed ? input_elements * element : 0;
  }
}

// AllToAllv's counts as every rank announces or reports them (its row and column of the
// count matrix), kept by the batch: the caller's arrays may change once the call returns.
void keep_alltoallv_counts(const Communicator& comm, const CollectiveCall& call, JobBatch& batch,
                           Job* job) {
  // Announced on a shared node, reported to the root without one.
  if ((!comm.direct()->shared() || comm.direct()->check() == CheckMode::Off) &&
      !comm.reports_calls())
    return;
  const size_t n = static_cast<size_t>(comm.nranks());
  auto counts = std::make_shared<std::vector<uint64_t>>(call.send_counts, call.send_counts + n);
  counts->insert(counts->end(), call.recv_counts, call.recv_counts + n);
  job->alltoallv_counts = counts->data();
  batch.alltoallv_counts.push_back(std::move(counts));
}

// Hierarchical AllToAllv relays pieces for other ranks, so it needs every
// rank's send counts: the job first allgathers them with the receive counts
// (Bruck, 2n counts per rank), then runs the schedule built from the gathered
// matrix (per call, not cached: counts vary). With the whole matrix on every
// rank, every rank checks it alike: a disagreement fails them all with the
// same message, whether or not their ranks share a node.
class HierAllToAllv final : public JobStage {
 public:
  // Takes over `job`, set up for the exchange, to gather the counts first.
  Status begin(Communicator& comm, const algo::Params& params, Job* job) {
    const size_t n = static_cast<size_t>(params.nranks);
    const size_t me = static_cast<size_t>(params.rank);
    params_ = params;
    for (auto [from, to] : {std::pair{params.send_counts, &send_counts_},
                            std::pair{params.send_displs, &send_displs_},
                            std::pair{params.recv_counts, &recv_counts_},
                            std::pair{params.recv_displs, &recv_displs_}})
      to->assign(from, from + n);
    params_.send_counts = send_counts_.data();
    params_.send_displs = send_displs_.data();
    params_.recv_counts = recv_counts_.data();
    params_.recv_displs = recv_displs_.data();
    // This rank's row and column stand in for the matrix until it is
    // gathered, so that argument errors show now, not mid-run.
    matrix_.assign(n * n, 0);
    for (size_t q = 0; q < n; ++q) {
      matrix_[q * n + me] = recv_counts_[q];
      matrix_[me * n + q] = send_counts_[q];
    }
    params_.all_send_counts = matrix_.data();
    std::string why;
    if (!algo::applicable(params_, &why)) return Error(weftInvalidArgument, "%s", why.c_str());

    algo::Params gather;
    gather.collective = algo::Collective::AllGather;
    gather.algorithm = algo::Algorithm::Bruck;
    gather.nranks = params.nranks;
    gather.rank = params.rank;
    gather.count = 2 * n;
    WEFT_RETURN_IF_ERROR(comm.programs().get(gather, &gather_));
    if (gather_->max_messages_per_peer > kSecondStageMessages)
      return Error(weftInternalError, "alltoallv: the count exchange needs %u messages per peer",
                   gather_->max_messages_per_peer);
    input_ = job->input;
    output_ = job->output;
    element_size_ = job->math.element_size;
    job->program = gather_.get();
    mine_ = send_counts_;
    mine_.insert(mine_.end(), recv_counts_.begin(), recv_counts_.end());
    rows_.assign(2 * n * n, 0);
    job->input = reinterpret_cast<std::byte*>(mine_.data());
    job->output = reinterpret_cast<std::byte*>(rows_.data());
    job->math.element_size = sizeof(uint64_t);
    job->next_stage = this;
    return Status::Ok();
  }

  Status next(Job* job, std::byte** scratch) override {
    const size_t n = static_cast<size_t>(params_.nranks);
    for (size_t from = 0; from < n; ++from)
      for (size_t to = 0; to < n; ++to) {
        const uint64_t sends = rows_[from * 2 * n + to], receives = rows_[to * 2 * n + n + from];
        if (sends != receives)
          return Error(weftInvalidUsage, "%s",
                       describe_count_mismatch(static_cast<int>(from), static_cast<int>(to), sends,
                                               receives, job->sequence)
                           .c_str());
        matrix_[from * n + to] = sends;
      }
    WEFT_RETURN_IF_ERROR(build_program(params_, &exchange_));
    if (exchange_->max_messages_per_peer > kMaxMessagesPerPeer - kSecondStageMessages)
      return Error(weftInvalidArgument,
                   "alltoallv: the schedule needs %u messages with one peer (limit %u): use a "
                   "larger chunk",
                   exchange_->max_messages_per_peer, kMaxMessagesPerPeer - kSecondStageMessages);
    scratch_.resize(exchange_->program.scratch_count * element_size_);
    job->program = exchange_.get();
    job->input = input_;
    job->output = output_;
    job->math.element_size = element_size_;
    job->sequence_base += kSecondStageMessages;
    job->next_stage = nullptr;
    *scratch = scratch_.data();
    return Status::Ok();
  }

 private:
  algo::Params params_;
  // mine_: this rank's send then receive counts; rows_: every rank's, as gathered.
  std::vector<uint64_t> send_counts_, send_displs_, recv_counts_, recv_displs_, matrix_, mine_,
      rows_;
  std::shared_ptr<const CompiledProgram> gather_, exchange_;
  std::vector<std::byte> scratch_;
  std::byte* input_ = nullptr;
  std::byte* output_ = nullptr;
  size_t element_size_ = 1;
};

Status prepare_collective(Communicator& comm, const CollectiveCall& call, JobBatch& batch) {
  size_t element = dtype_size(call.dtype);
  WEFT_RETURN_IF_ERROR(validate_collective(comm, call, element));
  const Communicator::PreMulSum* premul =
      is_reduction(call.collective) ? comm.premulsum(call.op) : nullptr;

  algo::Params params = collective_params(comm, call, element, premul != nullptr);
  const uint64_t input_elements = algo::input_count(params);
  WEFT_RETURN_IF_ERROR(
      check_buffers(call, input_elements > 0, algo::output_count(params) > 0, premul));
  // Every rank must choose the same algorithm: AllToAllv's counts differ per
  // rank, so it is planned at one nominal size, never by its counts. (At its
  // zero count argument the model ranked pairwise first at 0 us, so it never
  // took the direct path within a node.)
  uint64_t bytes =
      call.collective == algo::Collective::AllToAllv ? kAllToAllvPlanBytes : call.count * element;
  Plan plan = comm.tuner().plan(call.collective, bytes, element, params.in_place);
  params.algorithm = plan.algorithm;
  params.chunk = plan.chunk_elements;

  Job job;
  job.comm = &comm;
  const bool staged = call.collective == algo::Collective::AllToAllv &&
                      plan.algorithm == algo::Algorithm::Hierarchical;
  if (algo::is_direct(plan.algorithm)) {
    WEFT_RETURN_IF_ERROR(prepare_direct(comm, params, batch, &job.direct));
  } else if (!staged) {
    std::shared_ptr<const CompiledProgram> program;
    if (call.collective == algo::Collective::AllToAllv)
      WEFT_RETURN_IF_ERROR(build_program(params, &program));
    else
      WEFT_RETURN_IF_ERROR(comm.programs().get(params, &program));
    job.program = program.get();
    batch.programs.push_back(std::move(program));
  }
  describe_job(comm, call, params.root, input_elements, element, premul, &job);
  if (call.collective == algo::Collective::AllToAllv)
    keep_alltoallv_counts(comm, call, batch, &job);
  WEFT_LOG(TRACE, COLL, "%s count %llu %s algorithm %s chunk %llu in-place %d",
           name_of(call.collective), static_cast<unsigned long long>(call.count),
           dtype_name(call.dtype), algo::algorithm_name(plan.algorithm),
           static_cast<unsigned long long>(plan.chunk_elements), params.in_place);
  if (staged) {
    auto stages = std::make_shared<HierAllToAllv>();
    WEFT_RETURN_IF_ERROR(stages->begin(comm, params, &job));
    batch.stages.push_back(std::move(stages));
  }
  batch.jobs.push_back(job);
  return Status::Ok();
}

// The collectives the fast path serves: every one with a direct algorithm but AllToAllv
// (planned at a nominal size, its counts copied per call).
bool fast_path_serves(algo::Collective collective) {
  switch (collective) {
    case algo::Collective::AllReduce:
    case algo::Collective::ReduceScatter:
    case algo::Collective::AllGather:
    case algo::Collective::Broadcast:
    case algo::Collective::Reduce:
    case algo::Collective::AllToAll:
      return true;
    default:
      return false;
  }
}

// The blocking fast path: a call on no stream, outside any group, with a built-in op, at a
// size the tuner sends to a direct algorithm, runs at once: the same validation, numbering,
// announcement (mismatch detection) and waits as the general path, without its batch,
// JobRunner or program lookup, and the tuner's cached decision read without a lock. Returns
// false, having done nothing, for a call that does not qualify; otherwise *status is its outcome.
bool run_fast_path(Communicator& comm, const CollectiveCall& call, Status* status) {
  static const bool enabled = env_value("WEFT_FAST_PATH") != 0;
  if (!enabled || !fast_path_serves(call.collective) || call.op >= weftNumOps || in_group() ||
      !comm.direct()->available())
    return false;
  const size_t element = dtype_size(call.dtype);
  if (!plainly_valid(comm, call, element)) {
    *status = validate_collective(comm, call, element);
    if (!status->ok()) return true;
  }
  const bool in_place =
      algo::timed_by_placement(call.collective) && detect_in_place(call, comm.rank(), element);
  const algo::Algorithm algorithm =
      comm.tuner().algorithm(call.collective, call.count * element, element, in_place);
  if (!algo::is_direct(algorithm) || !algo::supports(algorithm, call.collective)) return false;
  // As call_params and algo::input_count / output_count would say, without building Params.
  const int root = is_rooted(call.collective) ? call.root : 0;
  const bool is_root = comm.rank() == root;
  const uint64_t input_elements =
      algo::input_count(call.collective, comm.nranks(), is_root, call.count);
  const uint64_t output_elements =
      algo::output_count(call.collective, comm.nranks(), is_root, call.count);
  *status = check_buffers(call, input_elements > 0, output_elements > 0, nullptr);
  if (!status->ok()) return true;
  DirectCall direct;
  direct.collective = call.collective;
  direct.algorithm = algorithm;
  direct.count = call.count;
  direct.root = root;
  Job job;
  job.comm = &comm;
  job.direct = &direct;
  describe_job(comm, call, root, input_elements, element, nullptr, &job);
  WEFT_LOG(TRACE, COLL, "%s count %llu %s algorithm %s: blocking fast path",
           name_of(call.collective), static_cast<unsigned long long>(call.count),
           dtype_name(call.dtype), algo::algorithm_name(algorithm));
  *status = launch_direct(job);
  return true;
}

}  // namespace

Status submit_collective(Communicator& comm, const CollectiveCall& call, Stream* stream) {
  WEFT_RETURN_IF_ERROR(comm.usable());
  if (comm.device() != nullptr || (stream != nullptr && stream->cuda.bound))
    return cuda::submit_collective(comm, call, stream);
  if (Status fast; stream == nullptr && run_fast_path(comm, call, &fast)) return fast;
  JobBatch* batch = nullptr;
  WEFT_RETURN_IF_ERROR(begin_submit(stream, &batch));
  return finish_submit(prepare_collective(comm, call, *batch));
}

Status submit_p2p(const P2PCall& call, Stream* stream) {
  if (call.comm->device() != nullptr || (stream != nullptr && stream->cuda.bound))
    return cuda::submit_p2p(call, stream);
  if (!in_group() && call.peer == call.comm->rank())
    return Error(weftInvalidUsage,
                 "peer %d is this rank: a send or receive to self outside weftGroupStart/End "
                 "would wait for itself",
                 call.peer);
  if (stream == nullptr && call.comm->direct()->pair_rings().carries(call.bytes))
    return submit_ring_message(call);
  JobBatch* batch = nullptr;
  WEFT_RETURN_IF_ERROR(begin_submit(stream, &batch));
  add_p2p_job(*batch, call);
  return finish_submit(Status::Ok());
}

}  // namespace weft
