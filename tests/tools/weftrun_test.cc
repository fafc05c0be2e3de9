// Runs the weftrun binary as a subprocess, with /bin/sh scripts as the ranks.

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/command.h"

namespace {

using Clock = std::chrono::steady_clock;

// weftrun's grace period between SIGTERM and SIGKILL.
constexpr double kGraceSeconds = 2.0;
// Guards against a hanging weftrun; never reached when it works.
constexpr int kGuardMs = 15000;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Outcome {
  int status = 0;  // as from waitpid
  std::string out;
  std::string err;
  double seconds = 0;

  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// weftrun started as a child process with its stdout and stderr captured separately.
class Weftrun {
 public:
  // env: variables to set for weftrun; WEFT_ROOT and WEFT_SECRET are cleared otherwise.
  explicit Weftrun(const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env = {})
      : start_(Clock::now()) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      int null_fd = open("/dev/null", O_RDONLY);
      dup2(null_fd, STDIN_FILENO);
      unsetenv("WEFT_ROOT");
      unsetenv("WEFT_SECRET");
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> argv{const_cast<char*>(WEFTRUN_PATH)};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(WEFTRUN_PATH, argv.data());
      _exit(200);
    }
    close(out[1]);
    close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
  }
  ~Weftrun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  pid_t pid() const { return pid_; }

  // Reads until stdout holds `line`; false if output ended first.
  bool wait_for_line(const std::string& line) {
    while (true) {
      auto lines = split_lines(text_[0]);
      if (std::find(lines.begin(), lines.end(), line) != lines.end()) return true;
      if (!read_round()) return false;
    }
  }

  // Reads all output, then waits for weftrun to exit.
  Outcome finish() {
    while (read_round()) {
    }
    Outcome outcome;
    waitpid(pid_, &outcome.status, 0);
    reaped_ = true;
    outcome.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    outcome.out = text_[0];
    outcome.err = text_[1];
    return outcome;
  }

 private:
  // One poll over both pipes; false once both have ended (or the guard ran out).
  bool read_round() {
    pollfd pfds[2];
    int n = 0;
    int which[2];
    for (int i = 0; i < 2; ++i) {
      if (fds_[i] < 0) continue;
      pfds[n] = {fds_[i], POLLIN, 0};
      which[n++] = i;
    }
    if (n == 0) return false;
    int ready = poll(pfds, n, kGuardMs);
    if (ready == 0) {
      ADD_FAILURE() << "weftrun produced no output and did not exit within the guard time";
      kill(pid_, SIGKILL);
      return false;
    }
    for (int k = 0; k < n; ++k) {
      if (!pfds[k].revents) continue;
      int i = which[k];
      char buf[4096];
      ssize_t got = read(fds_[i], buf, sizeof(buf));
      if (got > 0) {
        text_[i].append(buf, static_cast<size_t>(got));
      } else {
        close(fds_[i]);
        fds_[i] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int fds_[2] = {-1, -1};
  std::string text_[2];
  Clock::time_point start_;
};

Outcome run_weftrun(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env = {}) {
  return Weftrun(args, env).finish();
}

// Arguments for N ranks of `sh -c script`.
std::vector<std::string> sh_ranks(int nranks, const std::string& script,
                                  std::vector<std::string> options = {}) {
  std::vector<std::string> args{"-n", std::to_string(nranks)};
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), {"--", "/bin/sh", "-c", script});
  return args;
}

// A scratch folder for pid files and fifos.
using weft::testing::TempDir;

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = -1;
  in >> pid;
  EXPECT_GT(pid, 0) << "no pid in " << path;
  return pid;
}

// Checks that pid is gone. Orphaned grandchildren are reparented to this process (a
// subreaper) and may still be dying from weftrun's signal, so wait boundedly for their exit.
void expect_gone(pid_t pid) {
  if (pid <= 0) return;
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, kGuardMs), 1) << "process " << pid << " is still running";
    close(pidfd);
    waitpid(pid, nullptr, WNOHANG);
  }
  errno = 0;
  EXPECT_EQ(kill(pid, 0), -1) << "process " << pid << " still exists";
  EXPECT_EQ(errno, ESRCH);
}

class WeftrunTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
};

class WeftrunEnvTest : public WeftrunTest, public ::testing::WithParamInterface<int> {};

TEST_P(WeftrunEnvTest, EveryRankGetsItsEnvironment) {
  const int n = GetParam();
  Outcome o = run_weftrun(
      sh_ranks(n,
               "echo \"rank=$WEFT_RANK nranks=$WEFT_NRANKS local=$WEFT_LOCAL_RANK/$WEFT_LOCAL_SIZE "
               "root=$WEFT_ROOT secret=$WEFT_SECRET\""));
  ASSERT_EQ(o.exit_code(), 0) << o.err;
  EXPECT_EQ(o.err, "");
  const std::regex line_re(
      R"(\[(\d+)\] rank=(\d+) nranks=(\d+) local=(\d+)/(\d+) root=(\S+) secret=(\S+))");
  auto lines = split_lines(o.out);
  ASSERT_EQ(lines.size(), static_cast<size_t>(n)) << o.out;
  std::set<int> ranks;
  std::set<std::string> roots, secrets;
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << line;
    int rank = std::stoi(m[2]);
    EXPECT_EQ(std::stoi(m[1]), rank);
    EXPECT_EQ(std::stoi(m[3]), n);
    EXPECT_EQ(std::stoi(m[4]), rank);
    EXPECT_EQ(std::stoi(m[5]), n);
    ranks.insert(rank);
    roots.insert(m[6]);
    secrets.insert(m[7]);
  }
  std::set<int> expected_ranks;
  for (int r = 0; r < n; ++r) expected_ranks.insert(r);
  EXPECT_EQ(ranks, expected_ranks);
  ASSERT_EQ(roots.size(), 1u);
  ASSERT_EQ(secrets.size(), 1u);
  std::smatch m;
  const std::string root = *roots.begin();
  ASSERT_TRUE(std::regex_match(root, m, std::regex(R"(127\.0\.0\.1:(\d+))"))) << root;
  int port = std::stoi(m[1]);
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  EXPECT_TRUE(std::regex_match(*secrets.begin(), std::regex("[0-9a-f]{32}"))) << *secrets.begin();
}

INSTANTIATE_TEST_SUITE_P(Ranks, WeftrunEnvTest, ::testing::Values(1, 3, 8));

// The CPUs each rank may run on, by rank, as its /proc/self/status lists them.
std::map<int, std::set<int>> rank_cpus(int nranks, std::vector<std::string> options) {
  Outcome o = run_weftrun(sh_ranks(nranks, "grep Cpus_allowed_list /proc/self/status", options));
  EXPECT_EQ(o.exit_code(), 0) << o.err;
  std::map<int, std::set<int>> cpus;
  const std::regex line_re(R"(\[(\d+)\] Cpus_allowed_list:\s*(\S+))");
  for (const std::string& line : split_lines(o.out)) {
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, line_re)) << line;
    if (m.empty()) continue;
    std::set<int>& set = cpus[std::stoi(m[1])];
    std::stringstream list(m[2].str());  // "0-3,8,10-11"
    for (std::string range; std::getline(list, range, ',');) {
      size_t dash = range.find('-');
      int first = std::stoi(range.substr(0, dash));
      int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
      for (int cpu = first; cpu <= last; ++cpu) set.insert(cpu);
    }
  }
  EXPECT_EQ(cpus.size(), static_cast<size_t>(nranks)) << o.out;
  return cpus;
}

std::set<int> own_cpus() {
  cpu_set_t set;
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  return cpus;
}

TEST_F(WeftrunTest, BindsRanksThatFitToOneCoreEach) {
  const std::set<int> all = own_cpus();
  const int ncpus = static_cast<int>(all.size());
  // Forced binding with one rank per CPU shows the cores: one distinct CPU set each.
  std::map<int, std::set<int>> per_cpu = rank_cpus(ncpus, {"--bind-to", "core"});
  std::set<std::set<int>> cores;
  for (const auto& [rank, cpus] : per_cpu) cores.insert(cpus);
  const int ncores = static_cast<int>(cores.size());
  ASSERT_GE(ncores, 1);
  std::set<int> covered;
  for (const std::set<int>& core : cores) {
    for (int cpu : core) {
      EXPECT_TRUE(all.count(cpu)) << "rank bound to CPU " << cpu << " outside weftrun's own";
      EXPECT_TRUE(covered.insert(cpu).second) << "CPU " << cpu << " on two cores";
    }
  }
  EXPECT_EQ(covered, all);
  // Ranks past the core count wrap around onto the same cores.
  for (int r = ncores; r < ncpus; ++r) EXPECT_EQ(per_cpu[r], per_cpu[r - ncores]) << r;

  if (ncores >= 2) {
    // The default binds ranks that fit, each to a different core.
    std::map<int, std::set<int>> fit = rank_cpus(ncores, {});
    std::set<std::set<int>> distinct;
    for (const auto& [rank, cpus] : fit) {
      EXPECT_TRUE(cores.count(cpus)) << "rank " << rank << " is not bound to one core";
      distinct.insert(cpus);
    }
    EXPECT_EQ(distinct.size(), static_cast<size_t>(ncores));
  }
  // More ranks than cores, one rank, or --bind-to none: nobody is bound.
  for (const auto& [n, options] : std::vector<std::pair<int, std::vector<std::string>>>{
           {ncores + 1, {}}, {1, {}}, {2, {"--bind-to", "none"}}, {2, {"--bind-to=none"}}}) {
    for (const auto& [rank, cpus] : rank_cpus(n, options))
      EXPECT_EQ(cpus, all) << n << " ranks, rank " << rank;
  }
}

TEST_F(WeftrunTest, KeepsGivenRootAndSecret) {
  const std::string root = "10.1.2.3:4567";
  const std::string secret = "00112233445566778899aabbccddeeff";
  Outcome o = run_weftrun(sh_ranks(2, "echo \"$WEFT_ROOT $WEFT_SECRET\""),
                          {{"WEFT_ROOT", root}, {"WEFT_SECRET", secret}});
  ASSERT_EQ(o.exit_code(), 0) << o.err;
  std::multiset<std::string> expected;
  for (int r = 0; r < 2; ++r) expected.insert("[" + std::to_string(r) + "] " + root + " " + secret);
  auto lines = split_lines(o.out);
  EXPECT_EQ(std::multiset<std::string>(lines.begin(), lines.end()), expected);
}

TEST_F(WeftrunTest, GeneratesFreshSecretsPerJob) {
  std::set<std::string> outputs;
  for (int i = 0; i < 2; ++i) outputs.insert(run_weftrun(sh_ranks(1, "echo $WEFT_SECRET")).out);
  EXPECT_EQ(outputs.size(), 2u);
}

// Many lines per rank from several ranks at once: each line must arrive whole, with its
// rank's prefix, on the stream it was written to, in the rank's order.
TEST_F(WeftrunTest, PrefixesLinesAndKeepsStreamsApart) {
  const int n = 3, count = 200;
  Outcome o = run_weftrun(sh_ranks(n, "i=0; while [ $i -lt " + std::to_string(count) +
                                          " ]; do echo \"out $WEFT_RANK $i\"; "
                                          "echo \"err $WEFT_RANK $i\" >&2; i=$((i+1)); done; "
                                          "printf \"tail $WEFT_RANK\""));
  ASSERT_EQ(o.exit_code(), 0) << o.err;
  const std::vector<std::pair<std::string, std::string>> streams{{o.out, "out"}, {o.err, "err"}};
  for (const auto& [text, kind] : streams) {
    std::vector<int> next(n, 0);
    std::vector<bool> tail(n, false);
    const std::regex line_re(R"(\[(\d+)\] (\w+) (\d+)(?: (\d+))?)");
    for (const std::string& line : split_lines(text)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(line, m, line_re)) << kind << ": " << line;
      int prefix = std::stoi(m[1]);
      ASSERT_EQ(std::stoi(m[3]), prefix) << line;
      ASSERT_LT(prefix, n);
      if (m[2] == "tail" && kind == "out") {
        tail[prefix] = true;
        continue;
      }
      ASSERT_EQ(m[2], kind) << line;
      ASSERT_FALSE(tail[prefix]) << "line after the partial last line: " << line;
      EXPECT_EQ(std::stoi(m[4]), next[prefix]++) << line;
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(next[r], count) << kind << " of rank " << r;
      if (kind == "out") {
        EXPECT_TRUE(tail[r]) << "partial last line of rank " << r;
      }
    }
  }
}

TEST_F(WeftrunTest, NoPrefixPassesOutputThrough) {
  Outcome o = run_weftrun(
      sh_ranks(2, "echo \"out $WEFT_RANK\"; echo \"err $WEFT_RANK\" >&2", {"--no-prefix"}));
  ASSERT_EQ(o.exit_code(), 0) << o.err;
  auto out = split_lines(o.out), err = split_lines(o.err);
  EXPECT_EQ(std::set<std::string>(out.begin(), out.end()),
            (std::set<std::string>{"out 0", "out 1"}));
  EXPECT_EQ(std::set<std::string>(err.begin(), err.end()),
            (std::set<std::string>{"err 0", "err 1"}));
}

// Ranks other than `failing` record their pid and block forever (rank 2 also has a
// background child, a grandchild of weftrun); `failing` waits until they are all up,
// records its pid and runs `failure`.
std::string blocking_job(const TempDir& dir, int nranks, int failing, const std::string& failure) {
  const std::string is_failing = "[ \"$WEFT_RANK\" = " + std::to_string(failing) + " ]";
  const std::string wait_for_others = "exec 3<>\"$d/fifo\"; n=1; while [ $n -lt " +
                                      std::to_string(nranks) +
                                      " ]; do read x <&3; n=$((n+1)); done";
  return "d='" + dir.path() + "'; echo $$ > \"$d/pid.$WEFT_RANK\"; " +  //
         "if " + is_failing + "; then " + wait_for_others + "; " + failure + "; fi; " +
         "if [ \"$WEFT_RANK\" = 2 ]; then sleep 1000 & echo $! > \"$d/child\"; fi; " +
         "echo up > \"$d/fifo\"; " +
         "if [ \"$WEFT_RANK\" = 0 ]; then read x < \"$d/never\"; else exec sleep 1000; fi";
}

void make_fifos(const TempDir& dir) {
  ASSERT_EQ(mkfifo(dir.file("fifo").c_str(), 0600), 0);
  ASSERT_EQ(mkfifo(dir.file("never").c_str(), 0600), 0);
}

void expect_job_gone(const TempDir& dir, int nranks) {
  for (int r = 0; r < nranks; ++r) expect_gone(read_pid(dir.file("pid." + std::to_string(r))));
  expect_gone(read_pid(dir.file("child")));
}

TEST_F(WeftrunTest, FailingRankEndsTheOthers) {
  TempDir dir;
  make_fifos(dir);
  const int n = 4, failing = 1;
  Outcome o = run_weftrun(sh_ranks(n, blocking_job(dir, n, failing, "exit 3")));
  EXPECT_EQ(o.exit_code(), 3);
  pid_t failed = read_pid(dir.file("pid." + std::to_string(failing)));
  EXPECT_NE(
      o.err.find("weftrun: rank 1 (pid " + std::to_string(failed) + ") exited with status 3\n"),
      std::string::npos)
      << o.err;
  // Ranks that honour SIGTERM end at once, well before the SIGKILL grace period.
  EXPECT_LT(o.seconds, kGraceSeconds * 0.9);
  expect_job_gone(dir, n);
}

// --keep-going: rank 0 outlives rank 1's failure (it waits until weftrun has reaped rank 1,
// which without the option ends the job at once) and finishes; weftrun reports rank 1's
// status.
TEST_F(WeftrunTest, KeepGoingLetsTheOthersFinish) {
  TempDir dir;
  const std::string pid1 = "'" + dir.file("pid.1") + "'";
  Outcome o = run_weftrun(sh_ranks(2,
                                   "if [ \"$WEFT_RANK\" = 1 ]; then echo $$ > " + pid1 +
                                       ".tmp; mv " + pid1 + ".tmp " + pid1 +
                                       "; exit 3; fi; "
                                       "until [ -f " +
                                       pid1 + " ]; do :; done; while kill -0 $(cat " + pid1 +
                                       ") 2>/dev/null; do :; done; echo survived",
                                   {"--keep-going"}));
  EXPECT_EQ(o.exit_code(), 3) << o.err;
  EXPECT_NE(o.out.find("[0] survived\n"), std::string::npos) << o.out << o.err;
  EXPECT_NE(o.err.find("weftrun: rank 1 (pid " + std::to_string(read_pid(dir.file("pid.1"))) +
                       ") exited with status 3\n"),
            std::string::npos)
      << o.err;
}

TEST_F(WeftrunTest, RankKilledBySignalEndsTheOthers) {
  TempDir dir;
  make_fifos(dir);
  const int n = 3, failing = 1;
  Outcome o = run_weftrun(sh_ranks(n, blocking_job(dir, n, failing, "kill -KILL $$")));
  EXPECT_EQ(o.exit_code(), 128 + SIGKILL);
  pid_t failed = read_pid(dir.file("pid." + std::to_string(failing)));
  EXPECT_NE(
      o.err.find("weftrun: rank 1 (pid " + std::to_string(failed) + ") was killed by signal " +
                 std::to_string(SIGKILL) + " (" + strsignal(SIGKILL) + ")\n"),
      std::string::npos)
      << o.err;
  expect_job_gone(dir, n);
}

// Rank 0 ignores SIGTERM, so it only ends with the SIGKILL after the grace period.
TEST_F(WeftrunTest, TimeoutEndsAllRanks) {
  TempDir dir;
  const double timeout = 0.5;
  Outcome o = run_weftrun(sh_ranks(2,
                                   "if [ \"$WEFT_RANK\" = 0 ]; then trap '' TERM; fi; "
                                   "echo $$ > '" +
                                       dir.path() + "'/pid.$WEFT_RANK; exec sleep 1000",
                                   {"--timeout", "0.5"}));
  EXPECT_EQ(o.exit_code(), 124);
  EXPECT_NE(o.err.find("weftrun: timeout after 0.5 s\n"), std::string::npos) << o.err;
  EXPECT_GE(o.seconds, timeout + kGraceSeconds);
  EXPECT_LT(o.seconds, timeout + kGraceSeconds + 3);
  for (int r = 0; r < 2; ++r) expect_gone(read_pid(dir.file("pid." + std::to_string(r))));
}

TEST_F(WeftrunTest, MissingProgramIsNamed) {
  for (std::string prog : {"/nonexistent/weftrun_test_prog", "weftrun_test_no_such_prog"}) {
    Outcome o = run_weftrun({"-n", "2", prog});
    EXPECT_EQ(o.exit_code(), 127) << prog;
    EXPECT_NE(o.err.find(prog), std::string::npos) << o.err;
    EXPECT_EQ(o.out, "");
  }
}

TEST_F(WeftrunTest, UsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c :
       std::vector<Case>{{{"/bin/true"}, "-n"},
                         {{"-n", "0", "/bin/true"}, "-n"},
                         {{"-n", "x", "/bin/true"}, "-n"},
                         {{"-n", "2"}, "no program"},
                         {{"-n", "2", "--timeout", "-1", "/bin/true"}, "timeout"},
                         {{"-n", "2", "--bogus", "/bin/true"}, "--bogus"},
                         {{"-n", "2", "--bind-to", "numa", "/bin/true"}, "core or none"},
                         {{"-n", "2", "--bind-to"}, "--bind-to needs a value"}}) {
    Outcome o = run_weftrun(c.args);
    EXPECT_EQ(o.exit_code(), 2) << c.args[0];
    EXPECT_NE(o.err.find(c.message), std::string::npos) << o.err;
  }
}

TEST_F(WeftrunTest, Help) {
  Outcome o = run_weftrun({"--help"});
  EXPECT_EQ(o.exit_code(), 0);
  EXPECT_NE(o.out.find("usage: weftrun -n N"), std::string::npos) << o.out;
}

// Waits until every rank has printed "ready".
void wait_ready(Weftrun& job, int nranks) {
  for (int r = 0; r < nranks; ++r) {
    ASSERT_TRUE(job.wait_for_line("[" + std::to_string(r) + "] ready")) << "rank " << r;
  }
}

TEST_F(WeftrunTest, ForwardsSigterm) {
  TempDir dir;
  const int n = 3;
  // `wait` returns early for a trapped signal; the sleep gets the signal through the group.
  Weftrun job(sh_ranks(n, "d='" + dir.path() + "'; echo $$ > \"$d/pid.$WEFT_RANK\"; " +
                              "trap 'echo $$ > \"$d/term.$WEFT_RANK\"; exit 0' TERM; " +
                              "echo ready; sleep 1000 & wait"));
  ASSERT_NO_FATAL_FAILURE(wait_ready(job, n));
  ASSERT_EQ(kill(job.pid(), SIGTERM), 0);
  Outcome o = job.finish();
  EXPECT_EQ(o.exit_code(), 128 + SIGTERM) << o.err;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(read_pid(dir.file("term." + std::to_string(r))),
              read_pid(dir.file("pid." + std::to_string(r))))
        << "rank " << r << " did not see SIGTERM";
  }
}

// Killing weftrun outright must not leave its ranks running.
TEST_F(WeftrunTest, RanksDieWithWeftrun) {
  TempDir dir;
  const int n = 2;
  Weftrun job(sh_ranks(n, "echo $$ > '" + dir.path() +
                              "'/pid.$WEFT_RANK; echo ready; "
                              "exec sleep 1000"));
  ASSERT_NO_FATAL_FAILURE(wait_ready(job, n));
  ASSERT_EQ(kill(job.pid(), SIGKILL), 0);
  Outcome o = job.finish();
  EXPECT_TRUE(WIFSIGNALED(o.status));
  for (int r = 0; r < n; ++r) expect_gone(read_pid(dir.file("pid." + std::to_string(r))));
}

}  // namespace
