// weftrun: launches N local ranks of a program with the WEFT_* bootstrap environment,
// prefixes their output by rank, and ends the whole job when one rank fails.
// Self-contained on purpose (libc, C++ std and header-only lib/common/free_port.h): it must
// not depend on the Weft library.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/free_port.h"

namespace weft::run {
namespace {

using Clock = std::chrono::steady_clock;

// Exit codes as shells use them: 2 for a usage error, 127 for a program that cannot be
// found or executed.
constexpr int kUsageExit = 2;
constexpr int kNotFoundExit = 127;
constexpr int kTimeoutExit = 124;
// How long ranks get to end after SIGTERM (or a forwarded signal) before SIGKILL.
constexpr auto kGrace = std::chrono::seconds(2);
// A partial line longer than this is emitted as a line of its own, so a rank that never
// writes a newline cannot grow the buffer without bound.
constexpr size_t kMaxLine = 64 * 1024;

constexpr const char* kUsage =
    "usage: weftrun -n N [--bind-to core|none] [--timeout S] [--no-prefix] [--keep-going]\n"
    "               [--] prog [args...]\n"
    "\n"
    "Starts N local ranks of prog, each with WEFT_RANK, WEFT_NRANKS, WEFT_LOCAL_RANK,\n"
    "WEFT_LOCAL_SIZE, WEFT_ROOT (127.0.0.1:<free port> unless already set) and WEFT_SECRET\n"
    "(random unless already set).\n"
    "\n"
    "  -n N          number of ranks (>= 1)\n"
    "  --bind-to B   core: rank R runs only on core R (hyperthreads of a core together;\n"
    "                cores in package order; wraps around when ranks outnumber cores);\n"
    "                none: the ranks are not bound. Default: core when 2 or more ranks\n"
    "                fit on the cores weftrun may use, none otherwise\n"
    "  --timeout S   end all ranks after S seconds and exit 124\n"
    "  --no-prefix   do not prefix output lines with \"[rank] \"\n"
    "  --keep-going  a rank that fails does not end the others (for programs whose\n"
    "                survivors recover, e.g. by weftCommShrink); weftrun still exits with\n"
    "                the first failed rank's status once every rank has ended\n"
    "  -h, --help    this text\n"
    "\n"
    "Each output line of rank R is written as \"[R] line\" (stdout to stdout, stderr to\n"
    "stderr). When a rank exits non-zero or is killed, the others get SIGTERM and, 2 s\n"
    "later, SIGKILL; weftrun then exits with that rank's status (128+signal if killed).\n"
    "A usage error exits 2, a program that cannot be found or executed 127.\n"
    "SIGINT, SIGTERM and SIGHUP are forwarded to all ranks. Rank 0 reads weftrun's stdin\n"
    "unless it is a terminal; the other ranks read /dev/null.\n";

// Writes all of data, retrying short writes. Errors (a closed reader) drop the output:
// the ranks must keep running even when nobody reads their output.
void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void say(const std::string& message) {
  write_all(STDERR_FILENO, "weftrun: " + message + "\n");
}

[[noreturn]] void usage_error(const std::string& message, int code = kUsageExit) {
  say(message);
  write_all(STDERR_FILENO, "Try 'weftrun --help'.\n");
  std::exit(code);
}

enum class Binding { Auto, Core, None };

struct Options {
  int nranks = 0;
  Binding binding = Binding::Auto;
  std::optional<double> timeout_s;
  std::string timeout_text;  // as given, for the timeout message
  bool prefix = true;
  bool keep_going = false;  // a failed rank does not end the others
  std::vector<char*> argv;  // program and its arguments, null-terminated
};

int parse_nranks(const char* text) {
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || n < 1 || n > 65536) {
    usage_error(std::string("-n needs a rank count from 1 to 65536, got '") + text + "'");
  }
  return static_cast<int>(n);
}

Options parse_options(int argc, char** argv) {
  Options options;
  int i = 1;
  auto value_of = [&](std::string_view flag) -> const char* {
    if (i + 1 >= argc) usage_error(std::string(flag) + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    if (arg == "-h" || arg == "--help") {
      write_all(STDOUT_FILENO, kUsage);
      std::exit(0);
    } else if (arg == "-n" || arg == "--np") {
      options.nranks = parse_nranks(value_of(arg));
    } else if (arg.starts_with("-n")) {
      options.nranks = parse_nranks(argv[i] + 2);
    } else if (arg == "--timeout" || arg.starts_with("--timeout=")) {
      const char* text = arg == "--timeout" ? value_of(arg) : argv[i] + strlen("--timeout=");
      char* end = nullptr;
      double s = std::strtod(text, &end);
      if (end == text || *end != '\0' || !std::isfinite(s) || s <= 0) {
        usage_error(std::string("--timeout needs a positive number of seconds, got '") + text +
                    "'");
      }
      options.timeout_s = s;
      options.timeout_text = text;
    } else if (arg == "--bind-to" || arg.starts_with("--bind-to=")) {
      std::string_view text = arg == "--bind-to" ? value_of(arg) : arg.substr(strlen("--bind-to="));
      if (text == "core") {
        options.binding = Binding::Core;
      } else if (text == "none") {
        options.binding = Binding::None;
      } else {
        usage_error("--bind-to needs core or none, got '" + std::string(text) + "'");
      }
    } else if (arg == "--no-prefix") {
      options.prefix = false;
    } else if (arg == "--keep-going") {
      options.keep_going = true;
    } else {
      usage_error("unknown option '" + std::string(arg) + "'");
    }
  }
  if (options.nranks < 1) usage_error("missing -n N (the number of ranks)");
  if (i >= argc) usage_error("no program given");
  options.argv.assign(argv + i, argv + argc);
  options.argv.push_back(nullptr);
  return options;
}

// A number from /sys/devices/system/cpu/cpuN/topology/<name>, or -1.
int cpu_topology_value(int cpu, const char* name) {
  std::ifstream file("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + name);
  int value = -1;
  return file >> value ? value : -1;
}

// The cores weftrun may run on (its own affinity mask), each as its CPUs, in package order:
// consecutive ranks then share a package, as Weft's rings expect.
std::vector<cpu_set_t> usable_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  struct Core {
    int package, core_id;
    cpu_set_t cpus;
  };
  std::vector<Core> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    int package = cpu_topology_value(cpu, "physical_package_id");
    int core_id = cpu_topology_value(cpu, "core_id");
    auto same = std::find_if(cores.begin(), cores.end(), [&](const Core& c) {
      return core_id >= 0 && c.package == package && c.core_id == core_id;
    });
    if (same == cores.end()) {
      same = cores.insert(cores.end(), Core{package, core_id, {}});
      CPU_ZERO(&same->cpus);
    }
    CPU_SET(cpu, &same->cpus);
  }
  std::stable_sort(cores.begin(), cores.end(),
                   [](const Core& a, const Core& b) { return a.package < b.package; });
  std::vector<cpu_set_t> sets;
  for (const Core& c : cores) sets.push_back(c.cpus);
  return sets;
}

bool is_executable_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// The same lookup execvp does, done up front so that a typo gives one clear message
// instead of N failing ranks.
bool program_exists(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return is_executable_file(prog);
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "/bin:/usr/bin";
  size_t start = 0;
  while (true) {
    size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon - start);
    if (is_executable_file((dir.empty() ? "." : dir) + "/" + prog)) return true;
    if (colon == std::string::npos) return false;
    start = colon + 1;
  }
}

// A port that was free a moment ago, below the ephemeral range; rank 0 binds it soon after.
// The small race with other programs binding it is accepted: the alternative (holding the
// socket) would need the library's help.
std::string free_local_root() {
  int port = weft::free_port_pair();
  if (port == 0) {
    say("cannot find a free TCP port pair on 127.0.0.1 below " +
        std::to_string(weft::ephemeral_port_low()));
    std::exit(1);
  }
  return "127.0.0.1:" + std::to_string(port);
}

std::string random_secret() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      say(std::string("getrandom failed: ") + strerror(errno));
      std::exit(1);
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

void set_env(const char* name, const std::string& value) {
  if (setenv(name, value.c_str(), 1) != 0) {
    say(std::string("setenv ") + name + ": " + strerror(errno));
    std::exit(1);
  }
}

// One output pipe of one rank, copied to dest line by line with the rank's prefix.
class OutputStream {
 public:
  OutputStream(int fd, int dest, std::string prefix)
      : fd_(fd), dest_(dest), prefix_(std::move(prefix)) {}
  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;
  ~OutputStream() { close_pipe(); }

  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // Reads once without blocking; at end of file flushes the partial line and closes the
  // pipe. Returns whether more may be waiting.
  bool read_some() {
    if (fd_ < 0) return false;
    char chunk[16384];
    ssize_t n = read(fd_, chunk, sizeof(chunk));
    if (n > 0) {
      emit_lines(std::string_view(chunk, static_cast<size_t>(n)));
      return true;
    }
    if (n < 0 && errno == EINTR) return true;
    if (n < 0 && errno == EAGAIN) return false;
    close_pipe();
    return false;
  }

  // Reads everything that is in the pipe now.
  void drain() {
    while (read_some()) {
    }
  }

 private:
  // Each batch of complete lines goes out in one write so that lines of different ranks
  // never interleave mid-line.
  void emit_lines(std::string_view data) {
    std::string out;
    size_t newline;
    while ((newline = data.find('\n')) != std::string_view::npos) {
      out += prefix_;
      out += partial_;
      out.append(data.substr(0, newline + 1));
      partial_.clear();
      data.remove_prefix(newline + 1);
    }
    partial_.append(data);
    if (partial_.size() >= kMaxLine) {
      out += prefix_ + partial_ + "\n";
      partial_.clear();
    }
    write_all(dest_, out);
  }

  void close_pipe() {
    if (fd_ < 0) return;
    close(fd_);
    fd_ = -1;
    if (partial_.empty()) return;
    // Unprefixed output passes through byte for byte; prefixed output keeps whole lines.
    write_all(dest_, prefix_ + partial_ + (prefix_.empty() ? "" : "\n"));
    partial_.clear();
  }

  int fd_;
  int dest_;
  std::string prefix_;
  std::string partial_;
};

struct Rank {
  Rank(int rank, int out_fd, int err_fd, const std::string& prefix)
      : rank(rank), out(out_fd, STDOUT_FILENO, prefix), err(err_fd, STDERR_FILENO, prefix) {}

  // The leader's pid doubles as the group id. Once the leader is reaped, an open pipe is
  // the sign that group members remain; without one the id may belong to someone else.
  bool group_may_live() const { return !reaped || out.open() || err.open(); }

  int rank;
  pid_t pid = -1;
  bool reaped = false;
  OutputStream out;
  OutputStream err;
};

std::string signal_text(int sig) {
  const char* name = strsignal(sig);
  return std::to_string(sig) + " (" + (name ? name : "unknown") + ")";
}

class Launcher {
 public:
  explicit Launcher(Options options) : options_(std::move(options)) {}

  int run() {
    setup_signals();
    prepare_environment();
    choose_cores();
    launcher_pid_ = getpid();
    for (int r = 0; r < options_.nranks && !ending_; ++r) start_rank(r);
    if (options_.timeout_s) {
      timeout_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(*options_.timeout_s));
    }
    while (live_ranks_ > 0) wait_for_events();
    // Whatever the ranks left behind (background processes holding the pipes) goes too,
    // and the output that is already in the pipes is still written out.
    signal_groups(SIGKILL);
    for (Rank& r : ranks_) {
      r.out.drain();
      r.err.drain();
    }
    return exit_code_;
  }

 private:
  void setup_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, sig);
    if (sigprocmask(SIG_BLOCK, &set, &original_mask_) != 0 ||
        (signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
      say(std::string("cannot set up signal handling: ") + strerror(errno));
      std::exit(1);
    }
    // A closed stdout must not kill the launcher while ranks are still running; an inherited
    // SIG_IGN for SIGCHLD would reap the ranks before waitpid sees their status.
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    // Two pipes per rank: use the hard file limit rather than the (often 1024) soft one.
    rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      setrlimit(RLIMIT_NOFILE, &lim);
    }
  }

  void prepare_environment() {
    const char* root = getenv("WEFT_ROOT");
    if (!root || !*root) set_env("WEFT_ROOT", free_local_root());
    const char* secret = getenv("WEFT_SECRET");
    if (!secret || !*secret) set_env("WEFT_SECRET", random_secret());
    set_env("WEFT_NRANKS", std::to_string(options_.nranks));
    set_env("WEFT_LOCAL_SIZE", std::to_string(options_.nranks));
  }

  // Two ranks left to the scheduler may share one core while another idles (seen on a
  // loaded machine: every wait then costs a context switch, 8x slower small collectives),
  // so ranks that fit get a core each, as mpirun does.
  void choose_cores() {
    if (options_.binding == Binding::None) return;
    std::vector<cpu_set_t> cores = usable_cores();
    if (cores.empty()) return;
    // A single rank shares no core with a peer; binding it would only pin concurrent jobs
    // onto the same first core.
    bool fits = options_.nranks > 1 && static_cast<size_t>(options_.nranks) <= cores.size();
    if (options_.binding == Binding::Auto && !fits) return;
    cores_ = std::move(cores);
  }

  void start_rank(int r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return launch_failed("pipe");
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return launch_failed("pipe");
    }
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    std::string prefix;
    if (options_.prefix) {  // appended piece by piece: GCC 12 warns falsely on "[" + string
      prefix += '[';
      prefix += std::to_string(r);
      prefix += "] ";
    }
    Rank& rank = ranks_.emplace_back(r, out[0], err[0], prefix);
    pid_t pid = fork();
    if (pid == 0) exec_rank(r, out[1], err[1]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      ranks_.pop_back();
      return launch_failed("fork");
    }
    // Set here as well as in the child so that the group exists before any kill.
    setpgid(pid, pid);
    rank.pid = pid;
    ++live_ranks_;
  }

  void launch_failed(const char* what) {
    say("cannot start rank " + std::to_string(ranks_.size()) + ": " + what + ": " +
        strerror(errno));
    begin_ending(1, SIGTERM);
  }

  [[noreturn]] void exec_rank(int r, int out_fd, int err_fd) {
    setpgid(0, 0);
    // Die with the launcher; the check closes the window in which it died before prctl.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid_) _exit(kNotFoundExit);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    // Rank 0 may read piped input; a terminal would stop it (it is not in the foreground
    // group), so then it gets /dev/null like the other ranks.
    if (r != 0 || isatty(STDIN_FILENO)) {
      int null_fd = ::open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    }
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    if (!cores_.empty()) {
      const cpu_set_t& core = cores_[static_cast<size_t>(r) % cores_.size()];
      if (sched_setaffinity(0, sizeof(core), &core) != 0)
        say("rank " + std::to_string(r) + ": cannot bind to its core: " + strerror(errno));
    }
    set_env("WEFT_RANK", std::to_string(r));
    set_env("WEFT_LOCAL_RANK", std::to_string(r));
    execvp(options_.argv[0], options_.argv.data());
    say(std::string("cannot execute ") + options_.argv[0] + ": " + strerror(errno));
    _exit(kNotFoundExit);
  }

  void wait_for_events() {
    std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
    std::vector<OutputStream*> streams;
    for (Rank& r : ranks_) {
      for (OutputStream* s : {&r.out, &r.err}) {
        if (!s->open()) continue;
        fds.push_back({s->fd(), POLLIN, 0});
        streams.push_back(s);
      }
    }
    if (poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) {
      say(std::string("poll failed: ") + strerror(errno));
      std::exit(1);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      // One read per stream and round, so a chatty rank cannot starve the others.
      if (fds[i].revents) streams[i - 1]->read_some();
    }
    if (fds[0].revents) handle_signals();
    check_deadlines();
  }

  int poll_timeout_ms() const {
    std::optional<Clock::time_point> next;
    if (timeout_at_ && !ending_) next = timeout_at_;
    if (kill_at_) next = next ? std::min(*next, *kill_at_) : kill_at_;
    if (!next) return -1;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now());
    return static_cast<int>(std::max<std::chrono::milliseconds::rep>(left.count(), 0));
  }

  void check_deadlines() {
    auto now = Clock::now();
    if (!ending_ && timeout_at_ && now >= *timeout_at_) {
      say("timeout after " + options_.timeout_text + " s");
      begin_ending(kTimeoutExit, SIGTERM);
    }
    if (kill_at_ && now >= *kill_at_) {
      signal_groups(SIGKILL);
      kill_at_.reset();
    }
  }

  void handle_signals() {
    signalfd_siginfo info;
    while (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        reap_children();
      } else if (ending_) {
        signal_groups(sig);
      } else {
        say("received signal " + signal_text(sig) + ", forwarding it to all ranks");
        begin_ending(128 + sig, sig);
      }
    }
  }

  void reap_children() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](Rank& r) { return r.pid == pid; });
      if (it == ranks_.end()) continue;
      it->reaped = true;
      --live_ranks_;
      // The rank's last words come before weftrun's verdict on it.
      it->out.drain();
      it->err.drain();
      if (!ending_) judge_exit(*it, status);
    }
  }

  void judge_exit(const Rank& r, int status) {
    std::string who = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ")";
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      say(who + " exited with status " + std::to_string(WEXITSTATUS(status)));
      failed(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      say(who + " was killed by signal " + signal_text(WTERMSIG(status)));
      failed(128 + WTERMSIG(status));
    }
  }

  // A rank failed with exit_code: the job ends, unless --keep-going (the first one counts).
  void failed(int exit_code) {
    if (!options_.keep_going) return begin_ending(exit_code, SIGTERM);
    if (exit_code_ == 0) exit_code_ = exit_code;
  }

  void begin_ending(int exit_code, int sig) {
    ending_ = true;
    exit_code_ = exit_code;
    kill_at_ = Clock::now() + kGrace;
    signal_groups(sig);
  }

  void signal_groups(int sig) {
    for (const Rank& r : ranks_) {
      if (r.group_may_live()) kill(-r.pid, sig);
    }
  }

  Options options_;
  std::vector<cpu_set_t> cores_;  // rank r runs on cores_[r % size]; empty: not bound
  std::deque<Rank> ranks_;        // deque: ranks stay in place, their pipes are not movable
  int live_ranks_ = 0;
  int signal_fd_ = -1;
  sigset_t original_mask_;
  pid_t launcher_pid_ = -1;
  bool ending_ = false;
  int exit_code_ = 0;
  std::optional<Clock::time_point> timeout_at_;
  std::optional<Clock::time_point> kill_at_;
};

}  // namespace
}  // namespace weft::run

int main(int argc, char** argv) {
  weft::run::Options options = weft::run::parse_options(argc, argv);
  if (!weft::run::program_exists(options.argv[0])) {
    weft::run::usage_error(std::string("program not found or not executable: ") + options.argv[0],
                           weft::run::kNotFoundExit);
  }
  return weft::run::Launcher(std::move(options)).run();
}
