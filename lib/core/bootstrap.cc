#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <list>

#include "common/log.h"
#include "common/wire.h"

namespace weft {

namespace {

constexpr uint32_t kUniqueIdMagic = 0x57464944;  // "WFID"
// Unauthenticated connections get this long to say hello.
constexpr int64_t kHelloGraceMs = 10000;
// Beyond kMaxUnjoinedConnections the oldest is closed. A rank sends its hello as soon as it
// connects, and the root reads it in the round after its accept, while at most kAcceptBatch
// more are accepted per round: the oldest silent ones are strangers.
constexpr size_t kMaxUnjoined = kMaxUnjoinedConnections;
constexpr int kAcceptBatch = 64;
static_assert(kMaxUnjoined >= 2 * kAcceptBatch);
// A rank whose own wait ends gives the root Bootstrap::kVerdictGraceMs longer for its verdict,
// which names the ranks missing (the root's deadline is the first waiter's: it comes about then).
constexpr int64_t kVerdictGraceMs = Bootstrap::kVerdictGraceMs;
// How long the root collects timeout reports before its verdict (well within the grace).
constexpr int64_t kVerdictWindowMs = 200;
// After a first disagreement of the ranks' calls, the root waits this long for the reports of
// ranks that have not reported (they wait too, and report within kCallReportMs), so that the
// message names rank 0's call, or the lowest rank's, as the one the others made.
constexpr int64_t kMismatchWindowMs = 100;

struct UniqueIdData {
  uint32_t magic;
  uint32_t version;
  uint16_t family;
  uint16_t port;
  uint8_t address[16];
  uint8_t secret[16];
};
static_assert(sizeof(UniqueIdData) <= WEFT_UNIQUE_ID_BYTES);

bool secrets_equal(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;  // constant time: the secret's bytes leak nothing by timing
  for (size_t i = 0; i < sizeof(Secret); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

// ---------------------------------------------------------------- the root

class Root {
 public:
  Root(Fd listener, Secret secret, int64_t timeout_ms)
      : listener_(std::move(listener)), secret_(secret), timeout_ms_(timeout_ms) {
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) == 0) {
      wake_read_.reset(pipe_fds[0]);
      wake_write_.reset(pipe_fds[1]);
    }
    join_deadline_ = deadline_after_ms(timeout_ms);
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    own_label_ = std::string(host) + ":" + std::to_string(getpid());
  }

  void run();
  bool finished() const { return finished_.load(); }
  // All ranks joined: then ranks depend on this root until they leave.
  bool serving_ranks() const { return running_.load(); }
  void stop() {
    stopping_ = true;
    wake();
  }
  // The hosting process is exiting: its own ranks are leaving with it, so
  // serve only until no rank of another process remains.
  void host_exiting() {
    host_exiting_ = true;
    wake();
  }
  int64_t timeout_ms() const { return timeout_ms_; }
  // In a child after fork, where the thread serving this root did not follow:
  // the child's copies of its sockets are closed (the parent's stay open).
  void close_in_child() {
    listener_.reset();
    wake_read_.reset();
    wake_write_.reset();
    for (Connection& connection : connections_) connection.fd.reset();
  }

 private:
  struct Connection {
    Fd fd;
    FrameReader frames;
    std::string label;  // "host:pid" the rank gave
    int rank = -1;      // -1 until a valid hello
    Deadline hello_deadline;
    bool left = false;
    const char* closed = nullptr;  // why the root closed it early; forgotten after the round
  };
  using ConnectionIt = std::list<Connection>::iterator;

  void accept_connections();
  // Returns false when the connection must be dropped.
  bool read_from(Connection& connection);
  bool handle_frame(Connection& connection, uint32_t type, const std::vector<uint8_t>& payload);
  bool handle_hello(Connection& connection, const std::vector<uint8_t>& payload);
  void drop(ConnectionIt it, const char* why);
  void send_to_rank(int rank, uint32_t type, const std::vector<uint8_t>& payload);
  // The joined ranks, those of other processes first: a rank of this process may exit on
  // the news the root sends, and the root with it, before the others have theirs (they
  // would only learn that the root is gone).
  std::vector<int> joined_ranks_others_first() const;
  // Tells every rank (but the failed one, unless `to_it_too`) that `failed_rank` failed.
  // To every joined rank (but failed_rank, unless to_it_too), those in `last` after the others.
  void broadcast_failure(int failed_rank, const std::string& message, bool to_it_too = false,
                         const std::vector<int>& last = {});
  void send_table();
  bool handle_shrink(Connection& connection, const std::vector<uint8_t>& payload);

  Fd listener_;
  void wake() {
    std::lock_guard<std::mutex> lock(wake_mutex_);
    char byte = 1;
    if (wake_write_.valid()) (void)!write(wake_write_.get(), &byte, 1);
  }
  bool only_local_ranks_left() const;
  // "rank 1 (host:pid), rank 2" for the ranks the test is true of.
  std::string ranks_where(const std::function<bool(int)>& test) const;
  // Fails the ranks waiting in allgathers that missed their deadline, naming who is missing.
  void expire_gatherings();
  // "rank R (host:pid)" of the rank in this process, else this process's "host:pid".
  std::string own_description() const;

  std::mutex wake_mutex_;  // wake() may come from another thread as run() ends
  Fd wake_read_, wake_write_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> host_exiting_{false};
  std::string own_label_;  // "host:pid" of this process, as ranks label themselves
  Secret secret_;
  int64_t timeout_ms_;
  Deadline join_deadline_;
  std::list<Connection> connections_;
  std::vector<Connection*> by_rank_;
  std::vector<Blob> infos_;
  std::vector<std::string> labels_;  // "rank R (host:pid)" for messages
  int nranks_ = -1;
  int joined_ = 0;
  std::atomic<bool> running_{false};  // all ranks joined and got the table
  // Allgather contributions by sequence number.
  struct Gathering {
    std::vector<Blob> parts;
    std::vector<bool> present;
    int received = 0;
    Deadline deadline;  // the first contributor's
    int64_t timeout_ms = 0;
  };
  std::vector<std::pair<uint64_t, Gathering>> gatherings_;
  // Shrinks by sequence number: only the ranks outside `excluded` take part,
  // so the dead need not (and the first mismatched list fails it for all).
  struct Shrinking {
    std::vector<int32_t> excluded;  // sorted
    std::vector<Blob> parts;        // by old rank
    std::vector<int> contributors;
    std::string error;  // why it failed, with `code`
    int32_t code = weftSuccess;
  };
  std::vector<std::pair<uint64_t, Shrinking>> shrinkings_;
  void answer_shrink(std::vector<std::pair<uint64_t, Shrinking>>::iterator it);
  std::atomic<bool> finished_{false};
  // Timeout reports: ranks waiting for each other time out together, so the root collects
  // them for a moment and blames the report that waits for a rank which reported nothing.
  struct TimeoutReport {
    int rank;
    std::string message;
    std::vector<int32_t> waited;  // the ranks the reporter waited for
  };
  std::vector<TimeoutReport> timeout_reports_;
  Deadline verdict_deadline_;
  bool verdict_sent_ = false;
  void send_timeout_verdict();
  // Each rank's latest collectives (kCalls), compared whenever one arrives.
  CallComparison calls_;
  std::vector<bool> reported_calls_;
  int ranks_reporting_calls_ = 0;
  bool mismatch_found_ = false, mismatch_sent_ = false;
  Deadline mismatch_deadline_;
  bool handle_calls(Connection& connection, const std::vector<uint8_t>& payload);
  void send_mismatch();
};

void Root::run() {
  while (true) {
    if (running_ && (connections_.empty() || (host_exiting_ && only_local_ranks_left()))) break;
    if (!running_ && Clock::now() >= join_deadline_) {
      // The rank count is learnt from the first rank that joins.
      std::string message =
          "bootstrap root: " +
          (nranks_ < 0
               ? std::string("no rank")
               : "only " + std::to_string(joined_) + " of " + std::to_string(nranks_) + " ranks") +
          " joined within " + std::to_string(timeout_ms_) + " ms" +
          (nranks_ < 0 ? std::string() : " (missing: " + ranks_where([this](int rank) {
                                           return by_rank_[rank] == nullptr;
                                         }) + ")");
      WEFT_LOG(WARN, BOOTSTRAP, "%s", message.c_str());
      WireWriter writer;
      writer.put_string(message);
      for (int rank : joined_ranks_others_first())
        (void)send_frame(by_rank_[rank]->fd.get(), kRootError, writer.data().data(),
                         writer.data().size(), deadline_after_ms(1000));
      break;
    }
    std::vector<pollfd> fds;
    fds.push_back({wake_read_.get(), POLLIN, 0});
    if (listener_.valid()) fds.push_back({listener_.get(), POLLIN, 0});
    size_t first_connection = fds.size();
    Deadline next_deadline = running_ ? Clock::now() + std::chrono::hours(24) : join_deadline_;
    for (const auto& entry : gatherings_)
      next_deadline = std::min(next_deadline, entry.second.deadline);
    if (!timeout_reports_.empty()) next_deadline = std::min(next_deadline, verdict_deadline_);
    if (mismatch_found_ && !mismatch_sent_)
      next_deadline = std::min(next_deadline, mismatch_deadline_);
    for (Connection& connection : connections_) {
      fds.push_back({connection.fd.get(), POLLIN, 0});
      if (connection.rank < 0) next_deadline = std::min(next_deadline, connection.hello_deadline);
    }
    int ready = poll(fds.data(), fds.size(), remaining_ms(next_deadline, 60000));
    if (ready < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char drain[64];
      (void)!read(wake_read_.get(), drain, sizeof(drain));
      if (stopping_) break;
      continue;  // re-evaluate the exit condition
    }
    if (listener_.valid() && (fds[1].revents & POLLIN)) accept_connections();
    expire_gatherings();
    if (!timeout_reports_.empty() && Clock::now() >= verdict_deadline_) send_timeout_verdict();
    if (mismatch_found_ && !mismatch_sent_ && Clock::now() >= mismatch_deadline_) send_mismatch();
    size_t index = first_connection;
    for (auto it = connections_.begin(); it != connections_.end() && index < fds.size(); ++index) {
      auto current = it++;  // connections accepted this round have no entry yet
      if (current->closed != nullptr) continue;
      if (fds[index].revents != 0 && !read_from(*current)) {
        drop(current, "connection closed or invalid");
      } else if (current->rank < 0 && Clock::now() >= current->hello_deadline) {
        drop(current, "no valid hello in time");
      }
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto current = it++;
      if (current->closed != nullptr) drop(current, current->closed);
    }
  }
  WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root finished (%d ranks)", nranks_);
  // Ranks of this process end with it: their goodbye may still be unread, and there is nobody
  // in this process left to tell. Ranks elsewhere still hear of the others.
  for (Connection& connection : connections_)
    if (connection.rank >= 0 && connection.label == own_label_) connection.left = true;
  while (!connections_.empty()) drop(connections_.begin(), "its process exited");
  listener_.reset();
  {
    // A finished root holds no descriptors while it waits to be reaped (at the next root's start).
    std::lock_guard<std::mutex> lock(wake_mutex_);
    wake_read_.reset();
    wake_write_.reset();
  }
  finished_ = true;
}

bool Root::only_local_ranks_left() const {
  for (const Connection& connection : connections_)
    if (connection.rank >= 0 && connection.label != own_label_) return false;
  return true;
}

void Root::accept_connections() {
  size_t unjoined = 0;
  for (const Connection& connection : connections_)
    unjoined += connection.rank < 0 && connection.closed == nullptr;
  for (int accepted = 0; accepted < kAcceptBatch; ++accepted) {
    int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    if (unjoined++ == kMaxUnjoined) {
      // Closed now, erased after the round (the poll entries follow the list's order).
      for (Connection& oldest : connections_) {
        if (oldest.rank >= 0 || oldest.closed != nullptr) continue;
        oldest.fd.reset();
        oldest.closed = "too many connections without a hello: the oldest is closed";
        --unjoined;
        break;
      }
    }
    set_nodelay(fd);
    Connection connection;
    connection.fd.reset(fd);
    connection.hello_deadline = deadline_after_ms(std::min(timeout_ms_, kHelloGraceMs));
    connections_.push_back(std::move(connection));
  }
}

bool Root::read_from(Connection& connection) {
  uint8_t buffer[65536];
  while (true) {
    ssize_t got = recv(connection.fd.get(), buffer, sizeof(buffer), MSG_DONTWAIT);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return false;
    }
    connection.frames.append(buffer, static_cast<size_t>(got));
    uint32_t type = 0;
    Blob payload;
    while (true) {
      const uint64_t limit = connection.rank < 0 ? kMaxHelloPayload : kMaxFramePayload;
      FrameReader::Next next = connection.frames.next(limit, &type, &payload);
      if (next == FrameReader::Next::kInvalid) return false;
      if (next == FrameReader::Next::kIncomplete) break;
      if (!handle_frame(connection, type, payload)) return false;
    }
  }
  return true;
}

bool Root::handle_hello(Connection& connection, const std::vector<uint8_t>& payload) {
  Hello hello;
  if (!decode_hello(payload, &hello) || hello.version != kProtocolVersion) return false;
  if (!secrets_equal(hello.secret.data(), secret_.data())) {
    WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: dropped a connection with a wrong secret");
    return false;
  }
  const int32_t rank = hello.rank, nranks = hello.nranks;
  if (nranks <= 0 || rank < 0 || rank >= nranks || (nranks_ > 0 && nranks != nranks_)) {
    WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: rejected rank %d of %d (expected %d ranks)", rank,
             nranks, nranks_);
    return false;
  }
  if (nranks_ < 0) {
    nranks_ = nranks;
    by_rank_.assign(nranks, nullptr);
    infos_.resize(nranks);
    labels_.resize(nranks);
  }
  if (by_rank_[rank] != nullptr) {
    WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: rank %d joined twice; dropped the second", rank);
    return false;
  }
  connection.rank = rank;
  by_rank_[rank] = &connection;
  infos_[rank] = std::move(hello.info);
  labels_[rank] = "rank " + std::to_string(rank) + " (" + hello.label + ")";
  connection.label = std::move(hello.label);
  if (++joined_ == nranks_) send_table();
  return true;
}

void Root::send_table() {
  // Nobody else may join once the table is out: connections still without a valid hello
  // (half-open, slow or hostile) could only hold file descriptors. Their sockets close before
  // the table leaves, so a rank holding it knows the root keeps nothing but the ranks'.
  listener_.reset();
  for (Connection& connection : connections_) {
    if (connection.rank >= 0) continue;
    connection.fd.reset();
    connection.closed = "all ranks joined before its hello";
  }
  WireWriter writer;
  for (const Blob& info : infos_) writer.put_blob(info);
  writer.put_string(own_description());  // whom the ranks' messages blame when the root stalls
  writer.put_string(own_label_);         // whose death shrink cannot agree through
  for (int rank = 0; rank < nranks_; ++rank) send_to_rank(rank, kTable, writer.data());
  running_ = true;
  infos_.clear();
  WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root: all %d ranks joined", nranks_);
}

bool Root::handle_frame(Connection& connection, uint32_t type,
                        const std::vector<uint8_t>& payload) {
  if (connection.rank < 0) return type == kHello && handle_hello(connection, payload);
  switch (type) {
    case kAllGather: {
      AllGatherPart part;
      if (!decode_allgather(payload, &part)) return false;
      auto it = std::find_if(gatherings_.begin(), gatherings_.end(),
                             [&](const auto& entry) { return entry.first == part.sequence; });
      if (it == gatherings_.end()) {
        Gathering gathering{std::vector<Blob>(nranks_), std::vector<bool>(nranks_, false), 0,
                            deadline_after_ms(part.timeout_ms), part.timeout_ms};
        gatherings_.push_back({part.sequence, std::move(gathering)});
        it = gatherings_.end() - 1;
      }
      it->second.parts[connection.rank] = std::move(part.part);
      it->second.present[connection.rank] = true;
      if (++it->second.received == nranks_) {
        WireWriter writer;
        for (const Blob& blob : it->second.parts) writer.put_blob(blob);
        gatherings_.erase(it);
        for (int rank = 0; rank < nranks_; ++rank)
          send_to_rank(rank, kAllGatherResult, writer.data());
      }
      return true;
    }
    case kGoodbye: {
      connection.left = true;
      // The others learn what the leaver had launched, so that work it never joined fails
      // at once instead of at the timeout.
      WireWriter writer;
      writer.put<int32_t>(connection.rank);
      writer.put_string(labels_[connection.rank]);
      writer.put_blob(payload);
      for (int rank = 0; rank < nranks_; ++rank)
        if (rank != connection.rank) send_to_rank(rank, kPeerLeft, writer.data());
      return true;
    }
    case kShrink:
      return handle_shrink(connection, payload);
    case kCalls:
      return handle_calls(connection, payload);
    case kFailed: {
      FailureReport failure;
      if (!decode_failure_report(payload, nranks_, &failure)) return false;
      TimeoutReport report{connection.rank, std::move(failure.message), std::move(failure.waited)};
      if (report.waited.empty()) {  // a revoke: nobody to blame but the reporter
        broadcast_failure(connection.rank, report.message);
        return true;
      }
      if (verdict_sent_) return true;
      if (timeout_reports_.empty()) verdict_deadline_ = deadline_after_ms(kVerdictWindowMs);
      timeout_reports_.push_back(std::move(report));
      return true;
    }
    case kAborting:
      connection.left = true;
      broadcast_failure(connection.rank, labels_[connection.rank] + " aborted its communicator");
      return true;
    default:
      return false;
  }
}

bool Root::handle_calls(Connection& connection, const std::vector<uint8_t>& payload) {
  std::vector<CallRecord> calls;
  if (!decode_calls(payload, &calls)) return false;
  if (mismatch_sent_) return true;
  calls_.add(connection.rank, calls);
  reported_calls_.resize(nranks_);
  if (!reported_calls_[connection.rank])
    reported_calls_[connection.rank] = true, ++ranks_reporting_calls_;
  if (!mismatch_found_ && !calls_.mismatch().empty()) {
    mismatch_found_ = true;
    mismatch_deadline_ = deadline_after_ms(kMismatchWindowMs);
  }
  if (mismatch_found_ && ranks_reporting_calls_ == nranks_) send_mismatch();
  return true;
}

void Root::send_mismatch() {
  const std::string mismatch = calls_.mismatch();
  WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: %s", mismatch.c_str());
  WireWriter writer;
  writer.put_string(mismatch);
  for (int rank : joined_ranks_others_first()) send_to_rank(rank, kMismatch, writer.data());
  mismatch_sent_ = true;
}

bool Root::handle_shrink(Connection& connection, const std::vector<uint8_t>& payload) {
  ShrinkRequest request;
  if (!decode_shrink_request(payload, nranks_, &request)) return false;
  const uint64_t sequence = request.sequence;
  const std::vector<int32_t>& excluded = request.excluded;
  auto it = std::find_if(shrinkings_.begin(), shrinkings_.end(),
                         [&](const auto& entry) { return entry.first == sequence; });
  if (it == shrinkings_.end()) {
    shrinkings_.push_back(
        {sequence, Shrinking{excluded, std::vector<Blob>(nranks_), {}, "", weftRemoteError}});
    it = shrinkings_.end() - 1;
    for (int rank = 0; rank < nranks_ && it->second.error.empty(); ++rank)
      if (by_rank_[rank] == nullptr && !std::binary_search(excluded.begin(), excluded.end(), rank))
        it->second.error = "shrink: " + labels_[rank] + " is gone; exclude it too";
  }
  Shrinking& shrinking = it->second;
  if (shrinking.error.empty() && excluded != shrinking.excluded) {
    shrinking.code = weftInvalidUsage;
    shrinking.error = "shrink: rank " + std::to_string(connection.rank) + " excludes ranks " +
                      rank_list(excluded) + " while rank " +
                      std::to_string(shrinking.contributors.front()) + " excludes " +
                      rank_list(shrinking.excluded);
  }
  shrinking.parts[connection.rank] = std::move(request.part);
  shrinking.contributors.push_back(connection.rank);
  const bool complete =
      static_cast<int>(shrinking.contributors.size() + shrinking.excluded.size()) == nranks_;
  if (shrinking.error.empty() && !complete) return true;
  answer_shrink(it);
  return true;
}

void Root::answer_shrink(std::vector<std::pair<uint64_t, Shrinking>>::iterator it) {
  Shrinking& shrinking = it->second;
  WireWriter writer;
  writer.put(it->first);
  writer.put(shrinking.code);
  writer.put_string(shrinking.error);
  if (shrinking.error.empty()) {
    for (int rank = 0; rank < nranks_; ++rank)
      if (!std::binary_search(shrinking.excluded.begin(), shrinking.excluded.end(), rank))
        writer.put_blob(shrinking.parts[rank]);
  }
  // A failed shrink answers every rank that came and, kept, every rank that comes later.
  for (int rank : shrinking.contributors) send_to_rank(rank, kShrinkResult, writer.data());
  if (shrinking.error.empty())
    shrinkings_.erase(it);
  else
    shrinking.contributors.clear();
}

std::string Root::ranks_where(const std::function<bool(int)>& test) const {
  std::string text;
  for (int rank = 0; rank < nranks_; ++rank) {
    if (!test(rank)) continue;
    if (!text.empty()) text += ", ";
    text += labels_[rank].empty() ? "rank " + std::to_string(rank) : labels_[rank];
  }
  return text;
}

std::string Root::own_description() const {
  const std::string suffix = "(" + own_label_ + ")";
  std::string ranks = ranks_where([&](int rank) {
    const std::string& label = labels_[rank];
    return label.size() >= suffix.size() &&
           label.compare(label.size() - suffix.size(), suffix.size(), suffix) == 0;
  });
  return ranks.empty() ? own_label_ : ranks;
}

void Root::expire_gatherings() {
  const Clock::time_point now = Clock::now();
  for (auto it = gatherings_.begin(); it != gatherings_.end();) {
    const Gathering& gathering = it->second;
    if (now < gathering.deadline) {
      ++it;
      continue;
    }
    int first_missing = 0;
    while (gathering.present[first_missing]) ++first_missing;
    std::string message = ranks_where([&](int rank) { return !gathering.present[rank]; }) +
                          " did not take part in bootstrap allgather " + std::to_string(it->first) +
                          " (of init or split) within " + std::to_string(gathering.timeout_ms) +
                          " ms of the first rank";
    it = gatherings_.erase(it);
    broadcast_failure(first_missing, message);
  }
}

void Root::send_timeout_verdict() {
  auto reported = [&](int rank) {
    return std::any_of(timeout_reports_.begin(), timeout_reports_.end(),
                       [rank](const TimeoutReport& report) { return report.rank == rank; });
  };
  auto blamed = std::find_if(timeout_reports_.begin(), timeout_reports_.end(),
                             [&](const TimeoutReport& report) {
                               return std::any_of(report.waited.begin(), report.waited.end(),
                                                  [&](int32_t rank) { return !reported(rank); });
                             });
  if (blamed == timeout_reports_.end()) blamed = timeout_reports_.begin();
  // To every rank, the reporters too (it is their verdict), and to them last: a reporter
  // releases its GPU queue on reading it, and what that queue then signals must not complete
  // a peer's call before the verdict has reached that peer.
  std::vector<int> reporters;
  for (const TimeoutReport& report : timeout_reports_) reporters.push_back(report.rank);
  broadcast_failure(blamed->rank, blamed->message, true, reporters);
  verdict_sent_ = true;
  timeout_reports_.clear();
}

void Root::send_to_rank(int rank, uint32_t type, const std::vector<uint8_t>& payload) {
  Connection* connection = by_rank_[rank];
  if (connection == nullptr || connection->left) return;
  Status status = send_frame(connection->fd.get(), type, payload.data(), payload.size(),
                             deadline_after_ms(timeout_ms_));
  if (!status.ok())
    WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root: cannot reach rank %d: %s", rank,
             status.message().c_str());
}

void Root::broadcast_failure(int failed_rank, const std::string& message, bool to_it_too,
                             const std::vector<int>& last) {
  WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: %s", message.c_str());
  WireWriter writer;
  writer.put<int32_t>(failed_rank);
  writer.put_string(message);
  for (bool lasting : {false, true})
    for (int rank : joined_ranks_others_first())
      if ((rank != failed_rank || to_it_too) &&
          (std::find(last.begin(), last.end(), rank) != last.end()) == lasting)
        send_to_rank(rank, kPeerFailed, writer.data());
}

std::vector<int> Root::joined_ranks_others_first() const {
  std::vector<int> ranks;
  for (bool local : {false, true})
    for (int rank = 0; rank < static_cast<int>(by_rank_.size()); ++rank)
      if (by_rank_[rank] != nullptr && (by_rank_[rank]->label == own_label_) == local)
        ranks.push_back(rank);
  return ranks;
}

void Root::drop(ConnectionIt it, const char* why) {
  int rank = it->rank;
  if (rank < 0) {
    WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root: dropped an unjoined connection: %s", why);
  } else {
    by_rank_[rank] = nullptr;
    if (!running_) --joined_;  // no table without it (the others are told it failed)
    if (!it->left)
      broadcast_failure(rank, labels_[rank] + " died or lost its connection (" + why + ")");
    // A shrink waiting for this rank would wait for its timeout: it fails now, naming it.
    for (auto shrink = shrinkings_.begin(); shrink != shrinkings_.end(); ++shrink) {
      Shrinking& shrinking = shrink->second;
      if (!shrinking.error.empty() ||
          std::binary_search(shrinking.excluded.begin(), shrinking.excluded.end(), rank) ||
          std::find(shrinking.contributors.begin(), shrinking.contributors.end(), rank) !=
              shrinking.contributors.end())
        continue;
      shrinking.error = "shrink: " + labels_[rank] +
                        " left or died before it took part; exclude it too (" + why + ")";
      answer_shrink(shrink);
    }
  }
  connections_.erase(it);
}

// Roots outlive the communicators of their process; they are waited for at exit.
// A child forked while roots run owns none of them: their threads stayed in the
// parent, so the child neither serves nor waits for (nor joins) them.
class RootRegistry {
 public:
  static RootRegistry& instance() {
    static RootRegistry registry;
    return registry;
  }
  RootRegistry() {
    pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                   [] { instance().forget_in_child(); });
  }
  void add(std::unique_ptr<Root> root) {
    std::lock_guard<std::mutex> lock(mutex_);
    reap_locked();
    Root* raw = root.get();
    std::promise<void> finished;
    std::future<void> done = finished.get_future();
    std::thread thread([raw, finished = std::move(finished)]() mutable {
      raw->run();
      finished.set_value();
    });
    entries_.push_back({std::move(root), std::move(thread), std::move(done)});
  }
  ~RootRegistry() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& entry : entries_) {
      // Give ranks that joined their timeout to leave, then stop. A root
      // nobody joined has no one depending on it.
      Deadline deadline = deadline_after_ms(entry.root->timeout_ms());
      entry.root->host_exiting();
      if (entry.root->serving_ranks()) entry.done.wait_until(deadline);
      entry.root->stop();
      entry.thread.join();
    }
  }

 private:
  struct Entry {
    std::unique_ptr<Root> root;
    std::thread thread;
    std::future<void> done;
  };
  void forget_in_child() {
    for (Entry& entry : entries_) entry.root->close_in_child();
    // Without their threads the entries can be neither joined nor destroyed:
    // they are kept, unused, until the child ends.
    if (orphans_ == nullptr) orphans_ = new std::list<Entry>();
    orphans_->splice(orphans_->end(), entries_);
    mutex_.unlock();
  }
  void reap_locked() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->root->finished()) {
        it->thread.join();
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::mutex mutex_;
  std::list<Entry> entries_;
  std::list<Entry>* orphans_ = nullptr;  // a forked child's inherited entries, never freed
};

}  // namespace

Status encode_unique_id(const RootAddress& root, weftUniqueId* id) {
  UniqueIdData data{};
  data.magic = kUniqueIdMagic;
  data.version = kProtocolVersion;
  data.family = root.address.storage.ss_family;
  data.port = root.address.port();
  if (data.family == AF_INET)
    memcpy(data.address, &reinterpret_cast<const sockaddr_in*>(&root.address.storage)->sin_addr, 4);
  else
    memcpy(data.address, &reinterpret_cast<const sockaddr_in6*>(&root.address.storage)->sin6_addr,
           16);
  memcpy(data.secret, root.secret.data(), sizeof(data.secret));
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, &data, sizeof(data));
  return Status::Ok();
}

Status decode_unique_id(const weftUniqueId& id, RootAddress* root) {
  UniqueIdData data;
  memcpy(&data, id.internal, sizeof(data));
  if (data.magic != kUniqueIdMagic || data.version != kProtocolVersion ||
      (data.family != AF_INET && data.family != AF_INET6) || data.port == 0)
    return Error(weftInvalidArgument,
                 "commId is not a unique id made by weftGetUniqueId (bad magic, version, family "
                 "or port)");
  root->address = SocketAddress{};
  root->address.storage.ss_family = data.family;
  if (data.family == AF_INET) {
    memcpy(&reinterpret_cast<sockaddr_in*>(&root->address.storage)->sin_addr, data.address, 4);
    root->address.length = sizeof(sockaddr_in);
  } else {
    memcpy(&reinterpret_cast<sockaddr_in6*>(&root->address.storage)->sin6_addr, data.address, 16);
    root->address.length = sizeof(sockaddr_in6);
  }
  root->address.set_port(data.port);
  memcpy(root->secret.data(), data.secret, sizeof(data.secret));
  return Status::Ok();
}

Status start_root(RootAddress* root, int64_t timeout_ms) {
  Fd listener;
  WEFT_RETURN_IF_ERROR(listen_on(&root->address, &listener));
  fcntl(listener.get(), F_SETFL, fcntl(listener.get(), F_GETFL) | O_NONBLOCK);
  WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root listening on %s", root->address.to_string().c_str());
  RootRegistry::instance().add(
      std::make_unique<Root>(std::move(listener), root->secret, timeout_ms));
  return Status::Ok();
}

// ---------------------------------------------------------------- the rank

Status Bootstrap::join(const RootAddress& root, int rank, int nranks, const Blob& info,
                       int64_t timeout_ms, FailureHandler on_failure, DepartureHandler on_departure,
                       std::unique_ptr<Bootstrap>* out, std::vector<Blob>* table) {
  Deadline deadline = deadline_after_ms(timeout_ms);
  std::unique_ptr<Bootstrap> bootstrap(new Bootstrap());
  bootstrap->rank_ = rank;
  bootstrap->on_failure_ = std::move(on_failure);
  bootstrap->on_departure_ = std::move(on_departure);
  Status connected = connect_to(root.address, deadline, &bootstrap->socket_);
  if (!connected.ok())
    return Error(connected.code(),
                 "rank %d: %s, for the %lld ms of the timeout: the process hosting it (the one "
                 "that made the unique id, usually rank 0) is gone or failed to listen",
                 rank, connected.message().c_str(), static_cast<long long>(timeout_ms));

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const Blob hello = encode_hello({kProtocolVersion, root.secret, rank, nranks,
                                   std::string(host) + ":" + std::to_string(getpid()), info});
  WEFT_RETURN_IF_ERROR(
      send_frame(bootstrap->socket_.get(), kHello, hello.data(), hello.size(), deadline));
  uint32_t type = 0;
  std::vector<uint8_t> payload;
  Status status = recv_frame(bootstrap->socket_.get(), &type, &payload,
                             deadline + std::chrono::milliseconds(kVerdictGraceMs));
  if (!status.ok())
    return Error(status.code(),
                 "rank %d: no peer table from the bootstrap root at %s within %lld ms (%s): the "
                 "process hosting it (the one that made the unique id, usually rank 0) is stalled "
                 "or dead, or not all %d ranks started with this unique id",
                 rank, root.address.to_string().c_str(), static_cast<long long>(timeout_ms),
                 status.message().c_str(), nranks);
  WireReader reader(payload);
  if (type == kRootError || type == kPeerFailed) {  // the root gave up, or a joined rank died
    int32_t failed_rank = -1;
    std::string message;
    if (type == kPeerFailed) reader.get(&failed_rank);
    reader.get_string(&message);
    return Error(type == kRootError ? weftTimeout : weftRemoteError, "rank %d: init failed: %s",
                 rank, message.c_str());
  }
  if (type != kTable) return Error(weftRemoteError, "unexpected bootstrap message %u", type);
  table->assign(nranks, Blob());
  for (Blob& entry : *table)
    if (!reader.get_blob(&entry)) return Error(weftRemoteError, "truncated bootstrap peer table");
  if (!reader.get_string(&bootstrap->root_host_) || !reader.get_string(&bootstrap->root_process_))
    return Error(weftRemoteError, "truncated bootstrap peer table");

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0)
    return Error(weftSystemError, "pipe failed: %s", strerror(errno));
  bootstrap->wake_read_.reset(pipe_fds[0]);
  bootstrap->wake_write_.reset(pipe_fds[1]);
  Bootstrap* raw = bootstrap.get();
  bootstrap->control_thread_ = std::thread([raw] { raw->control_loop(); });
  *out = std::move(bootstrap);
  return Status::Ok();
}

Bootstrap::~Bootstrap() {
  leave(true, {});
}

void Bootstrap::control_loop() {
  set_log_rank(rank_);
  while (true) {
    pollfd fds[2] = {{socket_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    int ready = poll(fds, 2, -1);
    if (ready < 0 && errno == EINTR) continue;
    if (fds[1].revents != 0) return;  // leaving
    // Marked before the frame leaves the socket, so that settle_notices never sees neither.
    struct Handling {
      Bootstrap* self;
      explicit Handling(Bootstrap* bootstrap) : self(bootstrap) {
        std::lock_guard<std::mutex> lock(self->mutex_);
        self->handling_ = true;
      }
      ~Handling() {
        {
          std::lock_guard<std::mutex> lock(self->mutex_);
          self->handling_ = false;
        }
        self->ready_.notify_all();
      }
    } handling(this);
    uint32_t type = 0;
    std::vector<uint8_t> payload;
    Status status = recv_frame(socket_.get(), &type, &payload, deadline_after_ms(60000));
    std::unique_lock<std::mutex> lock(mutex_);
    if (leaving_) return;
    if (!status.ok()) {
      lost_ = true;
      // A verdict the root sent before it went (who failed an allgather, who died) names
      // the cause; the lost connection that follows it must not replace it for a waiter
      // that has yet to read it.
      if (failure_.empty())
        failure_ = "rank " + std::to_string(rank_) +
                   ": lost the connection to the bootstrap root (its host, " + root_host_ +
                   ", died or left): " + status.message();
      ready_.notify_all();
      lock.unlock();
      on_failure_(weftRemoteError, failure_);
      return;
    }
    WireReader reader(payload);
    if (type == kAllGatherResult || type == kShrinkResult) {
      (type == kAllGatherResult ? results_ : shrink_results_).push_back(std::move(payload));
      ready_.notify_all();
    } else if (type == kPeerFailed || type == kRootError) {
      int32_t failed_rank = -1;
      std::string message;
      if (type == kPeerFailed) reader.get(&failed_rank);
      reader.get_string(&message);
      if (failure_.empty()) failure_ = message;
      ready_.notify_all();  // an allgather waiting for the failed rank ends with its message
      lock.unlock();
      on_failure_(weftRemoteError, message);
    } else if (type == kMismatch) {
      std::string message;
      if (!reader.get_string(&message)) continue;
      if (failure_.empty()) failure_ = message;
      ready_.notify_all();
      lock.unlock();
      on_failure_(weftInvalidUsage, message);
    } else if (type == kPeerLeft) {
      int32_t peer = -1;
      std::string label;
      Blob goodbye;
      if (!reader.get(&peer) || !reader.get_string(&label) || !reader.get_blob(&goodbye)) continue;
      lock.unlock();
      on_departure_(peer, label, goodbye);
    }
  }
}

void Bootstrap::settle_notices(Deadline deadline) {
  auto settled = [&] {
    if (lost_ || leaving_ || !control_thread_.joinable()) return true;
    // Unread bytes first, then the mark: a frame taken off in between is still marked.
    pollfd unread{socket_.get(), POLLIN, 0};
    return poll(&unread, 1, 0) == 0 && !handling_;
  };
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait_until(lock, deadline, settled);
}

Status Bootstrap::send(uint32_t type, const Blob& payload, Deadline deadline) {
  std::lock_guard<std::mutex> sending(send_mutex_);
  return send_frame(socket_.get(), type, payload.data(), payload.size(), deadline);
}

Status Bootstrap::await(std::deque<Blob>* queue, Deadline deadline, const char* what,
                        const char* missing, Blob* out) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_until(lock, deadline, [&] { return !queue->empty() || lost_; }))
    return Error(weftTimeout, "rank %d: bootstrap %s timed out (%s)", rank_, what, missing);
  if (queue->empty())
    return Error(weftRemoteError, "rank %d: lost the bootstrap root during the %s", rank_, what);
  *out = std::move(queue->front());
  queue->pop_front();
  return Status::Ok();
}

namespace {
Status read_parts(WireReader* reader, std::vector<Blob>* out) {
  out->clear();
  Blob part;
  while (reader->left() > 0) {
    if (!reader->get_blob(&part)) return Error(weftRemoteError, "truncated bootstrap result");
    out->push_back(std::move(part));
  }
  return Status::Ok();
}
}  // namespace

Status Bootstrap::allgather(const Blob& data, std::vector<Blob>* out, Deadline deadline) {
  const uint64_t sequence = next_allgather_++;
  // The root fails the gathering at the first contributor's deadline, naming who is missing.
  const int64_t timeout_ms = std::max(remaining_ms(deadline), 1);
  WEFT_RETURN_IF_ERROR(send(kAllGather, encode_allgather({sequence, data, timeout_ms}), deadline));
  std::unique_lock<std::mutex> lock(mutex_);
  auto ended = [&] { return !results_.empty() || !failure_.empty(); };
  if (!ready_.wait_until(lock, deadline + std::chrono::milliseconds(kVerdictGraceMs), ended))
    return Error(weftTimeout,
                 "rank %d: timed out after %lld ms in bootstrap allgather %llu (of init or split) "
                 "waiting for the bootstrap root, hosted by %s, which sent neither every rank's "
                 "part nor a verdict: that process is stalled",
                 rank_, static_cast<long long>(timeout_ms),
                 static_cast<unsigned long long>(sequence), root_host_.c_str());
  if (results_.empty()) return Error(weftRemoteError, "%s", failure_.c_str());
  Blob result = std::move(results_.front());
  results_.pop_front();
  lock.unlock();
  WireReader reader(result);
  return read_parts(&reader, out);
}

Status Bootstrap::shrink(const std::vector<int32_t>& excluded, const Blob& data,
                         std::vector<Blob>* out, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lost_)
      return Error(weftRemoteError,
                   "rank %d: cannot shrink: the bootstrap root, hosted by %s, is gone, and a "
                   "shrink that keeps that process's ranks agrees through it: exclude them too, "
                   "or make a new communicator over the survivors",
                   rank_, root_host_.c_str());
  }
  WEFT_RETURN_IF_ERROR(
      send(kShrink, encode_shrink_request({next_shrink_++, excluded, data}), deadline));
  // A result for an earlier shrink this rank gave up on (timed out) is skipped.
  Blob result;
  uint64_t sequence = 0;
  int32_t code = weftSuccess;
  std::string error;
  WireReader reader(result);
  do {
    WEFT_RETURN_IF_ERROR(await(&shrink_results_, deadline, "shrink",
                               "a rank outside excludeRanks did not call weftCommShrink: is it "
                               "stalled? exclude it",
                               &result));
    reader = WireReader(result);
    if (!reader.get(&sequence) || !reader.get(&code) || !reader.get_string(&error))
      return Error(weftRemoteError, "truncated shrink result");
  } while (sequence + 1 != next_shrink_);
  if (!error.empty()) return Status(static_cast<weftResult_t>(code), error);
  return read_parts(&reader, out);
}

bool Bootstrap::report(uint32_t type, const Blob& payload) {
  std::lock_guard<std::mutex> sending(send_mutex_);  // leave() closes the socket under it
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (leaving_ || lost_ || !socket_.valid()) return false;
  }
  // Short: a root that cannot take it will not answer either.
  return send_frame(socket_.get(), type, payload.data(), payload.size(), deadline_after_ms(100))
      .ok();
}

bool Bootstrap::report_failure(const std::string& message, const std::vector<int32_t>& waited) {
  return report(kFailed, encode_failure_report({message, waited}));
}

bool Bootstrap::report_calls(const std::vector<CallRecord>& calls) {
  return report(kCalls, encode_calls(calls));
}

void Bootstrap::leave(bool clean, const Blob& goodbye) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (leaving_) return;
    leaving_ = true;
  }
  const Deadline deadline = deadline_after_ms(clean ? 1000 : 100);
  if (socket_.valid()) {
    std::lock_guard<std::mutex> sending(send_mutex_);
    (void)send_frame(socket_.get(), clean ? kGoodbye : kAborting, goodbye.data(),
                     clean ? goodbye.size() : 0, deadline);
  }
  if (control_thread_.joinable()) {
    char byte = 1;
    (void)!write(wake_write_.get(), &byte, 1);
    control_thread_.join();
  }
  std::lock_guard<std::mutex> sending(send_mutex_);
  if (socket_.valid()) {
    // Closing a socket with unread data resets it, and a reset throws away what is still
    // queued to send: the goodbye, when the link to the root had just come back from an
    // outage and was retransmitting, and the root then took the leaver for dead. So: end the
    // sending side, and close once the root has closed its side (it does so on reading the
    // goodbye's end) or the goodbye's deadline has passed.
    (void)shutdown(socket_.get(), SHUT_WR);
    uint8_t unread[4096];
    pollfd readable{socket_.get(), POLLIN, 0};
    while (poll(&readable, 1, remaining_ms(deadline, 1000)) > 0 &&
           recv(socket_.get(), unread, sizeof(unread), MSG_DONTWAIT) > 0) {
    }
  }
  socket_.reset();
}

}  // namespace weft
