// Shrink's agreement when the communicator's bootstrap root cannot take part: its process is
// among the excluded ranks (dead or stalled). The survivors still reach each other through
// their UCX workers, whose addresses every rank has had since init: each sends its exclusion
// list to the first survivor, which compares them as the root would and answers every one
// with the shrunk communicator's unique id, or with the error.
#include <poll.h>

#include <algorithm>

#include "common/log.h"
#include "common/wire.h"
#include "core/bootstrap_protocol.h"
#include "core/communicator.h"

namespace weft {

namespace {

// Tags of the agreement: a sequence no collective reaches (2^36 - 1 calls), and the attempt
// number as the salt, so a later shrink never matches an earlier, abandoned one's messages.
constexpr uint64_t kAgreementSequence = (uint64_t{1} << kTagSequenceBits) - 1;

// The longest message: an exclusion list of every other rank, or an answer with an error
// and a unique id.
size_t message_bytes(int nranks) {
  return 4096 + sizeof(int32_t) * static_cast<size_t>(nranks);
}

}  // namespace

bool Communicator::root_excluded(const std::vector<int32_t>& excluded) const {
  bool hosts_a_rank = false;
  for (int peer = 0; peer < nranks_; ++peer) {
    const PeerInfo& info = peers_[peer];
    if (info.host + ":" + std::to_string(info.pid) != bootstrap_->root_process()) continue;
    hosts_a_rank = true;
    if (!std::binary_search(excluded.begin(), excluded.end(), peer)) return false;
  }
  return hosts_a_rank;
}

Status Communicator::Transfers::post(Communicator* comm, int peer, bool send, uint64_t salt,
                                     void* data, size_t bytes) {
  ops.emplace_back();
  const Status status = send ? comm->post_send(peer, TagKind::Collective, kAgreementSequence, salt,
                                               data, bytes, &ops.back())
                             : comm->post_recv(peer, TagKind::Collective, kAgreementSequence, salt,
                                               data, bytes, &ops.back());
  if (status.ok()) done.push_back(false);
  return status;
}

Status Communicator::Transfers::await(Communicator* comm, Deadline deadline) {
  size_t left = std::count(done.begin(), done.end(), false);
  while (left > 0) {
    comm->progress();
    for (size_t i = 0; i < done.size(); ++i) {
      if (done[i] || !ops[i].request->done.load(std::memory_order_acquire)) continue;
      done[i] = true;
      --left;
      WEFT_RETURN_IF_ERROR(comm->request_result(*ops[i].request, ops[i].peer));
    }
    if (left == 0 || remaining_ms(deadline) <= 0) break;
    // Sleep on the worker's events (a bounded slice: a missed event costs latency, not a hang).
    if (!comm->arm()) continue;
    pollfd readable{comm->event_fd(), POLLIN, 0};
    (void)poll(&readable, 1, std::min(remaining_ms(deadline), 10));
  }
  return Status::Ok();
}

void Communicator::Transfers::finish(Communicator* comm) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].request == nullptr) continue;
    // Completed, or never posted (its post failed): back to the free list; else given up on.
    if (i >= done.size() || done[i])
      comm->release(ops[i].request);
    else
      comm->abandon(ops[i].request);
  }
  ops.clear();
  done.clear();
}

Status Communicator::agree_without_root(const std::vector<int32_t>& excluded,
                                        const std::vector<int>& survivors, const Blob& id_blob,
                                        Blob* leader_id, Deadline deadline) {
  const int leader = survivors.front();
  const uint64_t attempt = rootless_shrinks_++;
  const int64_t timeout_ms = config_.timeout_ms;
  WEFT_LOG(INFO, INIT,
           "rank %d: shrink without the bootstrap root (hosted by %s, excluded): the survivors "
           "agree through rank %d",
           rank_, bootstrap_->root_host().c_str(), leader);
  const size_t capacity = message_bytes(nranks_);
  Transfers transfers;
  if (rank_ != leader) {
    Blob request = encode_shrink_request({attempt, excluded, {}});
    Blob answer(capacity);
    Status status = transfers.post(this, leader, true, attempt, request.data(), request.size());
    if (status.ok())
      status = transfers.post(this, leader, false, attempt, answer.data(), answer.size());
    // The leader answers at its own deadline at the latest (naming a survivor that never
    // called): wait a grace longer, so that its answer, not this rank's timeout, is the error.
    if (status.ok())
      status =
          transfers.await(this, deadline + std::chrono::milliseconds(Bootstrap::kVerdictGraceMs));
    const bool answered = transfers.done.size() == 2 && transfers.done[1];
    if (answered) answer.resize(transfers.ops[1].request->info.length);
    transfers.finish(this);
    WEFT_RETURN_IF_ERROR(status);
    if (!answered)
      return Error(weftTimeout,
                   "rank %d: shrink: timed out after %lld ms waiting for rank %d (the first "
                   "survivor, which hosts the new communicator's root) to answer: is it stalled "
                   "or dead? exclude it too",
                   rank_, static_cast<long long>(timeout_ms), leader);
    WireReader reader(answer);
    int32_t code = weftSuccess;
    std::string error;
    if (!reader.get(&code) || !reader.get_string(&error) || !reader.get_blob(leader_id))
      return Error(weftRemoteError, "shrink: malformed answer from rank %d", leader);
    if (!error.empty()) return Status(static_cast<weftResult_t>(code), error);
    return Status::Ok();
  }

  // The leader: every other survivor's list, then one answer for all who sent theirs.
  const size_t others = survivors.size() - 1;
  std::vector<Blob> lists(others, Blob(capacity));
  Status status;
  for (size_t i = 0; i < others && status.ok(); ++i)
    status =
        transfers.post(this, survivors[i + 1], false, attempt, lists[i].data(), lists[i].size());
  if (status.ok()) status = transfers.await(this, deadline);
  std::vector<bool> heard(others, false);
  for (size_t i = 0; i < transfers.done.size(); ++i)
    if (transfers.done[i]) {
      heard[i] = true;
      lists[i].resize(transfers.ops[i].request->info.length);
    }
  transfers.finish(this);
  WEFT_RETURN_IF_ERROR(status);
  int32_t code = weftSuccess;
  std::string error;
  for (size_t i = 0; i < others && error.empty(); ++i) {
    const std::string who = "rank " + std::to_string(survivors[i + 1]);
    ShrinkRequest request;
    if (!heard[i]) {
      code = weftTimeout;
      error = "shrink: " + who + " (outside excludeRanks) did not call weftCommShrink within " +
              std::to_string(timeout_ms) + " ms: is it stalled or dead? exclude it too";
    } else if (!decode_shrink_request(lists[i], nranks_, &request)) {
      code = weftRemoteError;
      error = "shrink: malformed request from " + who;
    } else if (request.excluded != excluded) {
      code = weftInvalidUsage;
      error = "shrink: " + who + " excludes ranks " + rank_list(request.excluded) + " while rank " +
              std::to_string(rank_) + " excludes " + rank_list(excluded);
    }
  }
  WireWriter answer;
  answer.put(code);
  answer.put_string(error);
  answer.put_blob(id_blob);
  for (size_t i = 0; i < others && status.ok(); ++i)
    if (heard[i])
      status = transfers.post(this, survivors[i + 1], true, attempt, answer.data().data(),
                              answer.data().size());
  if (status.ok()) status = transfers.await(this, deadline);
  transfers.finish(this);
  WEFT_RETURN_IF_ERROR(status);
  if (!error.empty()) return Status(static_cast<weftResult_t>(code), error);
  *leader_id = id_blob;
  return Status::Ok();
}

}  // namespace weft
