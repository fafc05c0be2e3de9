// Runs a shell command for tests of the command-line tools: its output
// (whatever the command line redirects to stdout) and its exit status.
#pragma once

#include <sys/wait.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace weft::testing {

// The command's exit status (-1 when it could not start or did not exit);
// *out receives what it wrote to stdout.
inline int run_command(const std::string& command, std::string* out) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) out->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A stable test name for the index-th case of a command line: gtest's default for a struct
// parameter prints its bytes, pointers included, so ctest's discovered names would not match the
// next run's.
inline std::string command_case_name(size_t index, const std::string& args) {
  std::string name = "c" + std::to_string(index) + "_";
  for (char ch : args.substr(0, 48))
    name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

// A scratch folder of the test's own under the temporary directory, removed with it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "weft_test.XXXXXX").string();
    if (!mkdtemp(pattern.data())) std::abort();
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace weft::testing
