// Whole weft-perf runs under weftrun: the table's sizes, bandwidth arithmetic, checker
// verdicts (including a deliberately corrupted run) and the JSON form.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/dtype.h"

extern char** environ;

namespace {

struct Outcome {
  int exit_code = -1;
  std::string out;
};

// Runs argv_text with stdout captured (stderr passes through, to explain failures, unless
// with_stderr). The launch variables of the test's environment are dropped so that only
// `env` and weftrun set them.
Outcome run_program(std::vector<std::string> argv_text,
                    const std::map<std::string, std::string>& env, bool with_stderr) {
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool launch = false;
    for (const char* prefix : {"WEFT_ROOT=", "WEFT_SECRET=", "WEFT_PERF_CORRUPT=", "WEFT_RANK=",
                               "WEFT_NRANKS=", "OMPI_", "PMIX_", "SLURM_", "MASTER_"})
      launch = launch || entry.starts_with(prefix);
    if (!launch) env_text.push_back(entry);
  }
  for (const auto& [name, value] : env) env_text.push_back(name + "=" + value);
  auto pointers = [](std::vector<std::string>& texts) {
    std::vector<char*> result;
    for (std::string& t : texts) result.push_back(t.data());
    result.push_back(nullptr);
    return result;
  };
  std::vector<char*> argv = pointers(argv_text);
  std::vector<char*> envp = pointers(env_text);

  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  if (with_stderr) posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  pid_t pid;
  Outcome outcome;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(spawned);
    close(pipe_fds[0]);
    return outcome;
  }
  char buffer[4096];
  for (ssize_t got; (got = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;)
    outcome.out.append(buffer, static_cast<size_t>(got));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return outcome;
}

// Runs `weftrun -n nranks weft-perf args...`; weftrun's own timeout guards against a hang.
Outcome run_perf(int nranks, const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env = {}, bool with_stderr = false) {
  std::vector<std::string> argv_text = {
      WEFTRUN_PATH, "-n", std::to_string(nranks), "--timeout", "60", "--no-prefix", WEFT_PERF_PATH};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  return run_program(argv_text, env, with_stderr);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Placement {
  double time_us, algbw, busbw;
  std::optional<long> wrong;  // nullopt for "N/A"
};

struct TableRow {
  size_t bytes, count;
  std::string type, redop;
  int root;
  Placement placement[2];
};

std::optional<long> parse_wrong(const std::string& cell) {
  if (cell == "N/A") return std::nullopt;
  return std::stol(cell);
}

std::vector<TableRow> table_rows(const std::string& out) {
  std::vector<TableRow> rows;
  for (const std::string& line : lines_of(out)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    TableRow row;
    std::string wrong[2];
    in >> row.bytes >> row.count >> row.type >> row.redop >> row.root;
    for (int p = 0; p < 2; ++p)
      in >> row.placement[p].time_us >> row.placement[p].algbw >> row.placement[p].busbw >>
          wrong[p];
    EXPECT_FALSE(in.fail()) << "not a table row: " << line;
    std::string extra;
    EXPECT_FALSE(in >> extra) << "extra cells: " << line;
    for (int p = 0; p < 2; ++p) row.placement[p].wrong = parse_wrong(wrong[p]);
    rows.push_back(row);
  }
  return rows;
}

std::vector<size_t> geometric(size_t from, size_t to, size_t factor) {
  std::vector<size_t> sizes;
  for (size_t s = from; s <= to; s *= factor) sizes.push_back(s);
  return sizes;
}

// Half a unit of the printed time's last digit, as the table formats it.
double time_rounding(double us) {
  return us >= 10000 ? 0.5 : us >= 100 ? 0.05 : 0.005;
}

// algbw is the row's bytes over its time (GB/s = bytes / us / 1e3), up to the rounding of
// both printed figures.
void expect_algbw_matches_time(const TableRow& row, const Placement& p) {
  ASSERT_GT(p.time_us, 0);
  const double computed = static_cast<double>(row.bytes) / p.time_us / 1e3;
  const double slack = 0.005 + computed * time_rounding(p.time_us) / p.time_us + 1e-9;
  EXPECT_NEAR(p.algbw, computed, slack) << "size " << row.bytes;
}

size_t count_lines_starting(const std::string& out, const std::string& prefix) {
  size_t n = 0;
  for (const std::string& line : lines_of(out)) n += line.starts_with(prefix);
  return n;
}

TEST(WeftPerfRun, SendRecvTwoRanks) {
  Outcome o =
      run_perf(2, {"sendrecv", "-b", "8", "-e", "1M", "-f", "4", "-n", "3", "-w", "1", "-c", "1"});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  EXPECT_EQ(count_lines_starting(o.out, "#  Rank "), 2u) << o.out;
  EXPECT_NE(o.out.find("minBytes 8 maxBytes 1048576 step: 4(factor) warmup iters: 1 iters: 3"),
            std::string::npos)
      << o.out;
  std::vector<TableRow> rows = table_rows(o.out);
  std::vector<size_t> sizes;
  double busbw_sum = 0;
  for (const TableRow& row : rows) {
    sizes.push_back(row.bytes);
    EXPECT_EQ(row.count, row.bytes / sizeof(float));
    EXPECT_EQ(row.type, "float");
    EXPECT_EQ(row.redop, "none");
    EXPECT_EQ(row.root, -1);
    EXPECT_EQ(row.placement[0].wrong, 0L) << "size " << row.bytes;
    // In place aliases send and receive buffers: timed, not checked (as nccl-tests).
    EXPECT_EQ(row.placement[1].wrong, std::nullopt);
    for (const Placement& p : row.placement) {
      EXPECT_EQ(p.busbw, p.algbw) << "sendrecv's bus factor is 1";
      expect_algbw_matches_time(row, p);
      busbw_sum += p.busbw;
    }
  }
  EXPECT_EQ(sizes, geometric(8, 1 << 20, 4));
  EXPECT_EQ(count_lines_starting(o.out, "# Out of bounds values : 0 OK"), 1u) << o.out;
  std::smatch avg;
  ASSERT_TRUE(std::regex_search(o.out, avg, std::regex("# Avg bus bandwidth    : ([0-9.e+-]+)")));
  EXPECT_NEAR(std::stod(avg[1]), busbw_sum / (2.0 * rows.size()), 0.005 + 1e-4 * busbw_sum);
}

TEST(WeftPerfRun, EveryDtype) {
  Outcome o = run_perf(
      2, {"sendrecv", "-d", "all", "-b", "8", "-e", "1K", "-f", "4", "-n", "2", "-w", "0"});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  std::vector<TableRow> rows = table_rows(o.out);
  const std::vector<size_t> sizes = geometric(8, 1024, 4);
  ASSERT_EQ(rows.size(), sizes.size() * weftNumTypes);
  for (int type = 0; type < weftNumTypes; ++type) {
    const auto dtype = static_cast<weftDataType_t>(type);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const TableRow& row = rows[type * sizes.size() + i];
      EXPECT_EQ(row.type, weft::dtype_name(dtype));
      EXPECT_EQ(row.bytes, sizes[i]);
      EXPECT_EQ(row.count, sizes[i] / weft::dtype_size(dtype));
      EXPECT_EQ(row.placement[0].wrong, 0L) << row.type << " size " << row.bytes;
    }
  }
  EXPECT_EQ(count_lines_starting(o.out, "# Out of bounds values : 0 OK"), 1u);
}

TEST(WeftPerfRun, ThreeRanks) {
  Outcome o = run_perf(3, {"sendrecv", "-b", "1K", "-e", "512K", "-f", "8", "-n", "2", "-w", "1",
                           "-d", "half", "-a", "3"});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  EXPECT_EQ(count_lines_starting(o.out, "#  Rank "), 3u);
  std::vector<TableRow> rows = table_rows(o.out);
  ASSERT_EQ(rows.size(), geometric(1024, 512 << 10, 8).size());
  for (const TableRow& row : rows) {
    EXPECT_EQ(row.type, "half");
    EXPECT_EQ(row.placement[0].wrong, 0L);
    expect_algbw_matches_time(row, row.placement[0]);
  }
}

// Field `key` of a flat JSON object (a number, null or a string without quotes inside).
std::string json_field(const std::string& object, const std::string& key) {
  std::smatch match;
  const std::regex pattern("\"" + key + "\":(\"[^\"]*\"|[^,}]+)");
  if (!std::regex_search(object, match, pattern)) return "<missing " + key + ">";
  return match[1];
}

std::string json_object(const std::string& line, const std::string& key) {
  const size_t start = line.find("\"" + key + "\":{");
  if (start == std::string::npos) return "";
  return line.substr(start, line.find('}', start) - start + 1);
}

TEST(WeftPerfRun, JsonRows) {
  Outcome o =
      run_perf(2, {"sendrecv", "--json", "-b", "8", "-e", "1M", "-f", "4", "-n", "3", "-w", "1"});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  std::vector<size_t> sizes;
  for (const std::string& line : lines_of(o.out)) {
    ASSERT_TRUE(line.starts_with("{") && line.ends_with("}")) << "not a JSON row: " << line;
    EXPECT_EQ(json_field(line, "collective"), "\"sendrecv\"");
    EXPECT_EQ(json_field(line, "nranks"), "2");
    EXPECT_EQ(json_field(line, "type"), "\"float\"");
    EXPECT_EQ(json_field(line, "redop"), "\"none\"");
    EXPECT_EQ(json_field(line, "root"), "-1");
    const size_t bytes = std::stoul(json_field(line, "size_bytes"));
    sizes.push_back(bytes);
    EXPECT_EQ(std::stoul(json_field(line, "count")), bytes / sizeof(float));
    const std::string out_of_place = json_object(line, "out_of_place");
    const std::string in_place = json_object(line, "in_place");
    EXPECT_EQ(json_field(out_of_place, "wrong"), "0") << line;
    EXPECT_EQ(json_field(in_place, "wrong"), "null") << line;
    for (const std::string& p : {out_of_place, in_place}) {
      const double time_us = std::stod(json_field(p, "time_us"));
      const double algbw = std::stod(json_field(p, "algbw_gbps"));
      EXPECT_EQ(json_field(p, "busbw_gbps"), json_field(p, "algbw_gbps"));
      // Six significant digits on both sides.
      EXPECT_NEAR(algbw, static_cast<double>(bytes) / time_us / 1e3, 2e-5 * algbw) << line;
    }
  }
  EXPECT_EQ(sizes, geometric(8, 1 << 20, 4));
}

// With the test hook, rank 1 flips one received element before its check: every checked
// row reports exactly that element and the run fails.
TEST(WeftPerfRun, CheckerCatchesCorruption) {
  Outcome o = run_perf(2, {"sendrecv", "-b", "8", "-e", "64K", "-f", "8", "-n", "1", "-w", "0"},
                       {{"WEFT_PERF_CORRUPT", "1"}});
  EXPECT_NE(o.exit_code, 0) << o.out;
  std::vector<TableRow> rows = table_rows(o.out);
  ASSERT_EQ(rows.size(), geometric(8, 64 << 10, 8).size()) << o.out;
  for (const TableRow& row : rows) EXPECT_EQ(row.placement[0].wrong, 1L) << "size " << row.bytes;
  EXPECT_EQ(count_lines_starting(
                o.out, "# Out of bounds values : " + std::to_string(rows.size()) + " FAILED"),
            1u)
      << o.out;
}

TEST(WeftPerfRun, NoCheckAndForcedAlgorithmAreReported) {
  Outcome o = run_perf(
      2, {"allreduce", "-b", "64", "-e", "64", "-c", "0", "-A", "rhd", "-n", "1", "-w", "0"});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("algorithm: WEFT_ALGO=allreduce:rhd"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("validation: 0"), std::string::npos) << o.out;
  std::vector<TableRow> rows = table_rows(o.out);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].placement[0].wrong, std::nullopt);
  EXPECT_EQ(rows[0].placement[1].wrong, std::nullopt);
}

// WEFT_ALGO size ranges reach the library, and every collective row is
// followed by the algorithm the communicator reports (weftCommLastAlgorithm).
TEST(WeftPerfRun, RowsNameTheAlgorithmOfTheirSizeRange) {
  Outcome o = run_perf(2, {"allreduce", "-b", "64", "-e", "64K", "-f", "32", "-n", "2", "-w", "1"},
                       {{"WEFT_ALGO", "allreduce:0-1K:rd,allreduce:1K-inf:ring"}});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  std::vector<std::string> lines = lines_of(o.out);
  std::vector<std::pair<size_t, std::string>> seen;  // row size, algorithm on the next line
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (lines[i].empty() || lines[i][0] == '#') continue;
    const std::string marker = "#  ^ algorithm ";
    ASSERT_TRUE(lines[i + 1].starts_with(marker)) << lines[i + 1];
    std::string rest = lines[i + 1].substr(marker.size());
    seen.push_back({std::stoul(lines[i]), rest.substr(0, rest.find(','))});
  }
  std::vector<std::pair<size_t, std::string>> expected;
  for (size_t bytes : geometric(64, 64 << 10, 32))
    expected.push_back({bytes, bytes < 1024 ? "rd" : "ring"});
  EXPECT_EQ(seen, expected) << o.out;
}

// -R 1: buffers from weftMemAlloc, registered; the direct path reads them in
// place from 8 KiB on. Every row is checked, in place and out of place.
TEST(WeftPerfRun, RegisteredBuffersAreCheckedLikeOthers) {
  Outcome o =
      run_perf(2, {"allreduce", "-b", "8", "-e", "1M", "-f", "16", "-n", "2", "-w", "1", "-R", "1"},
               {{"WEFT_ALGO", "allreduce:oneshot"}});
  ASSERT_EQ(o.exit_code, 0) << o.out;
  std::vector<TableRow> rows = table_rows(o.out);
  ASSERT_EQ(rows.size(), geometric(8, 1 << 20, 16).size()) << o.out;
  for (const TableRow& row : rows)
    for (const Placement& p : row.placement) EXPECT_EQ(p.wrong, 0L) << "size " << row.bytes;
  Outcome bad = run_perf(2, {"allreduce", "-b", "8", "-e", "8", "-R", "2"}, {}, true);
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
}

TEST(WeftPerfRun, InapplicableAlgorithmFailsWithTheValidNames) {
  Outcome o = run_perf(2, {"allgather", "-b", "64", "-e", "64", "-A", "binomial"}, {}, true);
  EXPECT_EQ(o.exit_code, 3) << o.out;
  EXPECT_NE(o.out.find("valid: ring"), std::string::npos) << o.out;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(WeftPerfRun, UnknownCollectiveIsAUsageError) {
  Outcome o = run_perf(1, {"nosuchcollective"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out, "");
  Outcome all = run_perf(3, {"nosuchcollective"}, {}, true);
  EXPECT_EQ(all.exit_code, 2);
  EXPECT_EQ(count_of(all.out, "unknown collective 'nosuchcollective'"), 1u) << all.out;
}

// Every rank sees the bad flag; the error and the usage come once (from rank 0).
TEST(WeftPerfRun, BadFlagPrintsTheUsageOnce) {
  Outcome o = run_perf(3, {"allreduce", "--bogus"}, {}, true);
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_EQ(count_of(o.out, "unknown flag --bogus"), 1u) << o.out;
  EXPECT_EQ(count_of(o.out, "usage: weft-perf"), 1u) << o.out;
}

// Without a launcher (or with a one-rank one and no rendezvous address), weft-perf runs
// as a single rank.
TEST(WeftPerfRun, AloneItRunsOneRank) {
  const std::vector<std::string> args = {WEFT_PERF_PATH, "allreduce", "-b", "8",
                                         "-e",           "64",        "-f", "8"};
  for (const std::map<std::string, std::string>& env :
       {std::map<std::string, std::string>{},
        std::map<std::string, std::string>{{"WEFT_RANK", "0"}, {"WEFT_NRANKS", "1"}}}) {
    Outcome o = run_program(args, env, true);
    ASSERT_EQ(o.exit_code, 0) << o.out;
    EXPECT_NE(o.out.find("nRanks 1 "), std::string::npos) << o.out;
    EXPECT_EQ(table_rows(o.out).size(), 2u) << o.out;
  }
}

// A rank that cannot join says which rank it is, and names the failed call once.
TEST(WeftPerfRun, InitFailureNamesItsRank) {
  // A port nobody listens on: bound, then released.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  close(fd);
  const std::string root = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  Outcome o = run_program(
      {WEFT_PERF_PATH, "allreduce", "-b", "8", "-e", "8"},
      {{"WEFT_RANK", "1"}, {"WEFT_NRANKS", "2"}, {"WEFT_ROOT", root}, {"WEFT_TIMEOUT_MS", "300"}},
      true);
  EXPECT_EQ(o.exit_code, 3) << o.out;
  EXPECT_NE(o.out.find("weft-perf: rank 1: weftCommInitFromEnv: "), std::string::npos) << o.out;
  EXPECT_EQ(count_of(o.out, "weftCommInitFromEnv"), 1u) << o.out;
}

}  // namespace
