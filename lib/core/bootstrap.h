// Bootstrap: the rendezvous that turns N processes into a communicator.
//
// One process (the caller of weftGetUniqueId, or rank 0 under
// weftCommInitFromEnv) runs a root: a thread with a TCP listener. Every rank
// connects, presents the 128-bit secret from the unique id and its peer info,
// and receives the table of all peers. The connection then stays open as the
// communicator's control plane: the root serves allgathers (used by split) and,
// when a rank's connection drops without a goodbye, tells every other rank,
// so a dead peer becomes an error everywhere instead of a hang.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "core/bootstrap_protocol.h"
#include "core/socket.h"
#include "weft/weft.h"

namespace weft {

// What a weftUniqueId carries.
struct RootAddress {
  SocketAddress address;
  Secret secret{};
};

Status encode_unique_id(const RootAddress& root, weftUniqueId* id);
Status decode_unique_id(const weftUniqueId& id, RootAddress* root);

// Connections without a valid hello a root keeps at once: beyond it the oldest is closed, so a
// flood cannot take the file descriptors the ranks in the root's process need.
inline constexpr size_t kMaxUnjoinedConnections = 256;

// Starts a root listening on `address` (port 0 picks one; the chosen port is
// written back). It serves until every rank that joined has left, or the
// join deadline passes. Roots still serving at process exit are waited for,
// up to their timeout, so the last ranks can finish.
Status start_root(RootAddress* root, int64_t timeout_ms);

// The rank's side of the control plane.
class Bootstrap {
 public:
  using FailureHandler = std::function<void(weftResult_t code, const std::string& message)>;
  // A peer left on purpose: its rank, "rank R (host:pid)", and the goodbye it sent.
  using DepartureHandler =
      std::function<void(int peer, const std::string& label, const Blob& goodbye)>;

  // Joins the root as `rank` of `nranks` presenting `info`; fills `table`
  // with every rank's info. `on_failure` is called (from the control thread)
  // when a peer dies or aborts, or the root is lost; `on_departure` when a
  // peer leaves on purpose.
  static Status join(const RootAddress& root, int rank, int nranks, const Blob& info,
                     int64_t timeout_ms, FailureHandler on_failure, DepartureHandler on_departure,
                     std::unique_ptr<Bootstrap>* out, std::vector<Blob>* table);
  ~Bootstrap();

  // Every rank contributes `data`; all receive all contributions, in rank order.
  Status allgather(const Blob& data, std::vector<Blob>* out, Deadline deadline);

  // Only the ranks outside `excluded` (sorted, the same on all of them) take
  // part: each contributes `data`; all receive the survivors' contributions,
  // in rank order. Needs the root; a mismatched `excluded` fails it for all.
  Status shrink(const std::vector<int32_t>& excluded, const Blob& data, std::vector<Blob>* out,
                Deadline deadline);

  // Tells every peer (through the root) that this rank's communicator timed
  // out or was revoked, and why; they fail theirs with weftRemoteError and that message.
  // A timeout names the ranks it `waited` for: peers waiting for each other time out
  // together, so the root's verdict is the report that waits for a rank that did not
  // report (the stalled one), and it comes back to this rank too. A revoke (nothing
  // waited for) is passed on at once. False if the report could not be sent.
  bool report_failure(const std::string& message, const std::vector<int32_t>& waited = {});

  // Sends the root this rank's latest collectives (a communicator without shared segments,
  // while a call waits): it compares them with the other ranks' and, at the first
  // disagreement, fails every rank with weftInvalidUsage and a message naming both calls.
  // False if the report could not be sent.
  bool report_calls(const std::vector<CallRecord>& calls);

  // "rank R (host:pid)" of the process hosting the root.
  const std::string& root_host() const { return root_host_; }
  // "host:pid" of the process hosting the root, as a rank's host and pid make it.
  const std::string& root_process() const { return root_process_; }

  // How long to wait for the root's verdict after a wait of this rank ends.
  static constexpr int64_t kVerdictGraceMs = 500;

  // Returns once the control thread has handled every notice that had reached this rank when
  // called (a peer's failure, the root's verdict), or at `deadline`.
  void settle_notices(Deadline deadline);

  // Leaves the control plane: a goodbye carrying `goodbye` (clean), passed on
  // to every peer, or an abort notice; then closes.
  void leave(bool clean, const Blob& goodbye);

 private:
  Bootstrap() = default;
  void control_loop();
  Status send(uint32_t type, const Blob& payload, Deadline deadline);
  // A report to the root, sent at once with a short deadline (unless the plane is gone).
  bool report(uint32_t type, const Blob& payload);
  // Waits for the control thread to queue a result there; `missing` says what a timeout means.
  Status await(std::deque<Blob>* queue, Deadline deadline, const char* what, const char* missing,
               Blob* out);

  Fd socket_;
  Fd wake_read_, wake_write_;
  std::thread control_thread_;
  FailureHandler on_failure_;
  DepartureHandler on_departure_;
  int rank_ = -1;
  uint64_t next_allgather_ = 0;
  uint64_t next_shrink_ = 0;
  std::mutex mutex_;
  std::mutex send_mutex_;  // frames from different threads must not interleave
  std::condition_variable ready_;
  std::deque<Blob> results_;
  std::deque<Blob> shrink_results_;
  bool lost_ = false;
  bool leaving_ = false;
  // The control thread has taken a frame off the socket and not yet handled it.
  bool handling_ = false;
  // Why the control plane failed (a peer, the root, the connection): what allgathers return.
  std::string failure_;
  // Who hosts the root, "rank R (host:pid)" (from the peer table), for messages blaming it.
  std::string root_host_;
  std::string root_process_;
};

}  // namespace weft
