#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <list>

#include "common/log.h"
#include "core/wire.h"

namespace weft {

namespace {

constexpr uint32_t kUniqueIdMagic = 0x57464944;  // "WFID"
constexpr uint32_t kProtocolVersion = 1;
// Before a connection has proven it knows the secret it may send this much.
constexpr uint64_t kMaxHelloPayload = 64 << 10;
// Unauthenticated connections get this long to say hello.
constexpr int64_t kHelloGraceMs = 10000;

enum MessageType : uint32_t {
  kHello = 1,            // rank -> root: version, secret, rank, nranks, info
  kTable = 2,            // root -> rank: every rank's info
  kAllGather = 3,        // rank -> root: sequence number, contribution
  kAllGatherResult = 4,  // root -> rank: every contribution
  kGoodbye = 5,          // rank -> root: leaving on purpose, with what it had launched
  kAborting = 6,         // rank -> root: this rank aborts its communicator
  kPeerFailed = 7,       // root -> rank: another rank died or aborted
  kRootError = 8,        // root -> rank: the root gives up (e.g. join deadline)
  kPeerLeft = 9,         // root -> rank: another rank left on purpose, and its goodbye
};

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

 private:
  struct Connection {
    Fd fd;
    std::vector<uint8_t> input;
    std::string label;  // "host:pid" the rank gave
    int rank = -1;      // -1 until a valid hello
    Deadline hello_deadline;
    bool left = false;
  };
  using ConnectionIt = std::list<Connection>::iterator;

  void accept_connections();
  // Returns false when the connection must be dropped.
  bool read_from(Connection& connection);
  bool handle_frame(Connection& connection, uint32_t type, const std::vector<uint8_t>& payload);
  bool handle_hello(Connection& connection, const std::vector<uint8_t>& payload);
  void drop(ConnectionIt it, const char* why);
  void send_to_rank(int rank, uint32_t type, const std::vector<uint8_t>& payload);
  void broadcast_failure(int failed_rank, const std::string& message);
  void send_table();

  Fd listener_;
  void wake() {
    char byte = 1;
    (void)!write(wake_write_.get(), &byte, 1);
  }
  bool only_local_ranks_left() const;

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
    int received = 0;
  };
  std::vector<std::pair<uint64_t, Gathering>> gatherings_;
  std::atomic<bool> finished_{false};
};

void Root::run() {
  while (true) {
    if (running_ && (connections_.empty() || (host_exiting_ && only_local_ranks_left()))) break;
    if (!running_ && Clock::now() >= join_deadline_) {
      std::string message = "bootstrap root: only " + std::to_string(joined_) + " of " +
                            std::to_string(nranks_) + " ranks joined within " +
                            std::to_string(timeout_ms_) + " ms";
      WEFT_LOG(WARN, BOOTSTRAP, "%s", message.c_str());
      WireWriter writer;
      writer.put_string(message);
      for (Connection& connection : connections_)
        if (connection.rank >= 0)
          (void)send_frame(connection.fd.get(), kRootError, writer.data().data(),
                           writer.data().size(), deadline_after_ms(1000));
      break;
    }
    std::vector<pollfd> fds;
    fds.push_back({wake_read_.get(), POLLIN, 0});
    if (listener_.valid()) fds.push_back({listener_.get(), POLLIN, 0});
    size_t first_connection = fds.size();
    Deadline next_deadline = running_ ? Clock::now() + std::chrono::hours(24) : join_deadline_;
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
    size_t index = first_connection;
    for (auto it = connections_.begin(); it != connections_.end() && index < fds.size(); ++index) {
      auto current = it++;  // connections accepted this round have no entry yet
      if (fds[index].revents != 0 && !read_from(*current)) {
        drop(current, "connection closed or invalid");
      } else if (current->rank < 0 && Clock::now() >= current->hello_deadline) {
        drop(current, "no valid hello in time");
      }
    }
  }
  WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root finished (%d ranks)", nranks_);
  while (!connections_.empty()) drop(connections_.begin(), "its process exited");
  listener_.reset();
  finished_ = true;
}

bool Root::only_local_ranks_left() const {
  for (const Connection& connection : connections_)
    if (connection.rank >= 0 && connection.label != own_label_) return false;
  return true;
}

void Root::accept_connections() {
  while (true) {
    int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
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
    connection.input.insert(connection.input.end(), buffer, buffer + got);
    uint64_t limit = connection.rank < 0 ? kMaxHelloPayload : kMaxFramePayload;
    while (connection.input.size() >= sizeof(FrameHeader)) {
      FrameHeader header;
      memcpy(&header, connection.input.data(), sizeof(header));
      if (header.magic != kFrameMagic || header.length > limit) return false;
      if (connection.input.size() < sizeof(header) + header.length) break;
      std::vector<uint8_t> payload(connection.input.begin() + sizeof(header),
                                   connection.input.begin() + sizeof(header) + header.length);
      connection.input.erase(connection.input.begin(),
                             connection.input.begin() + sizeof(header) + header.length);
      if (!handle_frame(connection, header.type, payload)) return false;
    }
  }
  return true;
}

bool Root::handle_hello(Connection& connection, const std::vector<uint8_t>& payload) {
  WireReader reader(payload);
  uint32_t version = 0;
  uint8_t secret[sizeof(Secret)];
  int32_t rank = -1, nranks = -1;
  Blob info;
  std::string label;
  if (!reader.get(&version) || version != kProtocolVersion) return false;
  for (uint8_t& byte : secret)
    if (!reader.get(&byte)) return false;
  if (!secrets_equal(secret, secret_.data())) {
    WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: dropped a connection with a wrong secret");
    return false;
  }
  if (!reader.get(&rank) || !reader.get(&nranks) || !reader.get_string(&label) ||
      !reader.get_blob(&info))
    return false;
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
  infos_[rank] = std::move(info);
  labels_[rank] = "rank " + std::to_string(rank) + " (" + label + ")";
  connection.label = label;
  if (++joined_ == nranks_) send_table();
  return true;
}

void Root::send_table() {
  WireWriter writer;
  for (const Blob& info : infos_) writer.put_blob(info);
  for (int rank = 0; rank < nranks_; ++rank) send_to_rank(rank, kTable, writer.data());
  running_ = true;
  listener_.reset();  // nobody else may join once the table is out
  infos_.clear();
  WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root: all %d ranks joined", nranks_);
}

bool Root::handle_frame(Connection& connection, uint32_t type,
                        const std::vector<uint8_t>& payload) {
  if (connection.rank < 0) return type == kHello && handle_hello(connection, payload);
  switch (type) {
    case kAllGather: {
      WireReader reader(payload);
      uint64_t sequence = 0;
      Blob part;
      if (!reader.get(&sequence) || !reader.get_blob(&part)) return false;
      auto it = std::find_if(gatherings_.begin(), gatherings_.end(),
                             [&](const auto& entry) { return entry.first == sequence; });
      if (it == gatherings_.end()) {
        gatherings_.push_back({sequence, Gathering{std::vector<Blob>(nranks_), 0}});
        it = gatherings_.end() - 1;
      }
      it->second.parts[connection.rank] = std::move(part);
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
    case kAborting:
      connection.left = true;
      broadcast_failure(connection.rank, labels_[connection.rank] + " aborted its communicator");
      return true;
    default:
      return false;
  }
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

void Root::broadcast_failure(int failed_rank, const std::string& message) {
  WEFT_LOG(WARN, BOOTSTRAP, "bootstrap root: %s", message.c_str());
  WireWriter writer;
  writer.put<int32_t>(failed_rank);
  writer.put_string(message);
  for (int rank = 0; rank < nranks_; ++rank)
    if (rank != failed_rank) send_to_rank(rank, kPeerFailed, writer.data());
}

void Root::drop(ConnectionIt it, const char* why) {
  int rank = it->rank;
  if (rank < 0) {
    WEFT_LOG(INFO, BOOTSTRAP, "bootstrap root: dropped an unjoined connection: %s", why);
  } else {
    by_rank_[rank] = nullptr;
    if (!it->left)
      broadcast_failure(rank, labels_[rank] + " died or lost its connection (" + why + ")");
  }
  connections_.erase(it);
}

// Roots outlive the communicators of their process; they are waited for at exit.
class RootRegistry {
 public:
  static RootRegistry& instance() {
    static RootRegistry registry;
    return registry;
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
  WEFT_RETURN_IF_ERROR(connect_to(root.address, deadline, &bootstrap->socket_));

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  WireWriter hello;
  hello.put(kProtocolVersion);
  for (uint8_t byte : root.secret) hello.put(byte);
  hello.put<int32_t>(rank);
  hello.put<int32_t>(nranks);
  hello.put_string(std::string(host) + ":" + std::to_string(getpid()));
  hello.put_blob(info);
  WEFT_RETURN_IF_ERROR(send_frame(bootstrap->socket_.get(), kHello, hello.data().data(),
                                  hello.data().size(), deadline));
  uint32_t type = 0;
  std::vector<uint8_t> payload;
  Status status = recv_frame(bootstrap->socket_.get(), &type, &payload, deadline);
  if (!status.ok())
    return Error(status.code(),
                 "rank %d: no peer table from the bootstrap root at %s within the timeout (%s); "
                 "did all %d ranks start, with the same unique id?",
                 rank, root.address.to_string().c_str(), status.message().c_str(), nranks);
  WireReader reader(payload);
  if (type == kRootError) {
    std::string message;
    reader.get_string(&message);
    return Error(weftTimeout, "%s", message.c_str());
  }
  if (type != kTable) return Error(weftRemoteError, "unexpected bootstrap message %u", type);
  table->assign(nranks, Blob());
  for (Blob& entry : *table)
    if (!reader.get_blob(&entry)) return Error(weftRemoteError, "truncated bootstrap peer table");

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
    uint32_t type = 0;
    std::vector<uint8_t> payload;
    Status status = recv_frame(socket_.get(), &type, &payload, deadline_after_ms(60000));
    std::unique_lock<std::mutex> lock(mutex_);
    if (leaving_) return;
    if (!status.ok()) {
      lost_ = true;
      ready_.notify_all();
      lock.unlock();
      on_failure_(weftRemoteError,
                  "lost the connection to the bootstrap root (the process hosting it, usually "
                  "rank 0, died or left): " +
                      status.message());
      return;
    }
    WireReader reader(payload);
    if (type == kAllGatherResult) {
      results_.push_back(std::move(payload));
      ready_.notify_all();
    } else if (type == kPeerFailed || type == kRootError) {
      int32_t failed_rank = -1;
      std::string message;
      if (type == kPeerFailed) reader.get(&failed_rank);
      reader.get_string(&message);
      lock.unlock();
      on_failure_(weftRemoteError, message);
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

Status Bootstrap::allgather(const Blob& data, std::vector<Blob>* out, Deadline deadline) {
  WireWriter writer;
  writer.put(next_allgather_++);
  writer.put_blob(data);
  WEFT_RETURN_IF_ERROR(
      send_frame(socket_.get(), kAllGather, writer.data().data(), writer.data().size(), deadline));
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_until(lock, deadline, [&] { return !results_.empty() || lost_; }))
    return Error(weftTimeout, "rank %d: bootstrap allgather timed out (a peer is not taking part)",
                 rank_);
  if (results_.empty())
    return Error(weftRemoteError, "rank %d: lost the bootstrap root during an allgather", rank_);
  Blob result = std::move(results_.front());
  results_.pop_front();
  lock.unlock();
  WireReader reader(result);
  out->clear();
  Blob part;
  while (reader.left() > 0) {
    if (!reader.get_blob(&part)) return Error(weftRemoteError, "truncated allgather result");
    out->push_back(std::move(part));
  }
  return Status::Ok();
}

void Bootstrap::leave(bool clean, const Blob& goodbye) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (leaving_) return;
    leaving_ = true;
  }
  if (socket_.valid())
    (void)send_frame(socket_.get(), clean ? kGoodbye : kAborting, goodbye.data(),
                     clean ? goodbye.size() : 0, deadline_after_ms(clean ? 1000 : 100));
  if (control_thread_.joinable()) {
    char byte = 1;
    (void)!write(wake_write_.get(), &byte, 1);
    control_thread_.join();
  }
  socket_.reset();
}

}  // namespace weft
