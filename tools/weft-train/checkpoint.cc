#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace weft::train {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 2;  // 2: the ep coordinates (MoE experts)
constexpr const char* kManifestTitle = "weft-train checkpoint 1";

std::string step_dir(const std::string& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return (fs::path(dir) / name).string();
}

std::string rank_file(const std::string& step_path, int rank) {
  return (fs::path(step_path) / ("rank-" + std::to_string(rank) + ".bin")).string();
}

// Writes bytes to path through path.tmp, synced, then renamed over path.
void write_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](const char* what) {
    throw CheckpointError("--checkpoint-dir: cannot " + std::string(what) + " " + tmp + ": " +
                          std::strerror(errno));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create");
  for (size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("write");
    }
    at += size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail("sync");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
}

void make_dirs(const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  if (error)
    throw CheckpointError("--checkpoint-dir: cannot create " + path + ": " + error.message());
}

using Values = std::map<std::string, long>;

// The manifest's mesh keys (all but dp must match to resume) and model keys (all must).
Values mesh_values(const CheckpointMesh& m) {
  return {{"dp", m.dp}, {"tp", m.tp},     {"cp", m.cp}, {"pp", m.pp},
          {"ep", m.ep}, {"zero", m.zero}, {"sp", m.sp}};
}
Values model_values(const Config& c) {
  return {{"layers", c.layers},   {"hidden", c.hidden}, {"heads", c.heads}, {"ffn", c.ffn},
          {"vocab", c.vocab},     {"seq", c.seq},       {"batch", c.batch}, {"seed", long(c.seed)},
          {"experts", c.experts}, {"topk", c.topk}};
}

std::string mesh_text(const Values& m) {
  return "dp " + std::to_string(m.at("dp")) + " x tp " + std::to_string(m.at("tp")) + " x cp " +
         std::to_string(m.at("cp")) + " x pp " + std::to_string(m.at("pp")) + " x ep " +
         std::to_string(m.at("ep")) + ", zero " + std::to_string(m.at("zero")) +
         (m.at("sp") ? ", with" : ", without") + " --sp";
}

Values read_manifest(const std::string& path) {
  std::ifstream in(path);
  std::string title;
  if (!std::getline(in, title) || title != kManifestTitle)
    throw CheckpointError("--resume: " + path + " is not a weft-train checkpoint manifest");
  Values values;
  std::string key;
  long value = 0;
  while (in >> key >> value) values[key] = value;
  return values;
}

// A little-endian-as-the-host reader over one rank file, failing with the file's name.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw CheckpointError("--resume: cannot read " + path + ": " + std::strerror(errno));
  }
  template <typename T>
  T get() {
    T value{};
    bytes(&value, sizeof value);
    return value;
  }
  std::vector<float> floats(size_t count) {
    std::vector<float> out(count);
    bytes(out.data(), count * sizeof(float));
    return out;
  }
  void bytes(void* out, size_t size) {
    if (!in_.read(static_cast<char*>(out), std::streamsize(size)))
      throw CheckpointError("--resume: " + path_ + " is truncated");
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream in_;
};

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

void save_shard(const std::string& dir, int rank, const ShardState& state) {
  const std::string path = step_dir(dir, state.step);
  make_dirs(path);
  std::string out(kMagic, sizeof kMagic);
  put<uint32_t>(out, kVersion);
  for (int field :
       {rank, state.step, state.shard.tp, state.shard.tp_rank, state.shard.ep, state.shard.ep_rank})
    put<int32_t>(out, field);
  put<uint64_t>(out, state.values.size());
  for (size_t i = 0; i < state.values.size(); ++i) {
    put<uint64_t>(out, state.values[i].size());
    for (const auto* tensor : {&state.values[i], &state.m[i], &state.v[i]})
      out.append(reinterpret_cast<const char*>(tensor->data()), tensor->size() * sizeof(float));
  }
  write_atomically(rank_file(path, rank), out);
}

void save_manifest(const std::string& dir, int step, int world, const CheckpointMesh& mesh,
                   const Config& config) {
  std::ostringstream out;
  out << kManifestTitle << "\n";
  Values values = mesh_values(mesh);
  values.merge(model_values(config));
  values["step"] = step, values["world"] = world;
  for (const auto& [key, value] : values) out << key << " " << value << "\n";
  write_atomically((fs::path(step_dir(dir, step)) / "manifest").string(), out.str());
}

std::optional<int> newest_checkpoint(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error))
    throw CheckpointError("--resume: --checkpoint-dir " + dir + " is not a directory");
  std::optional<int> newest;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    int step = -1;
    char tail = 0;
    if (std::sscanf(name.c_str(), "step-%d%c", &step, &tail) != 1 || step < 0) continue;
    if (fs::exists(entry.path() / "manifest") && (!newest || step > *newest)) newest = step;
  }
  if (error) throw CheckpointError("--resume: cannot list " + dir + ": " + error.message());
  return newest;
}

GlobalState load_checkpoint(const std::string& dir, int step, const Config& config,
                            const CheckpointMesh& mesh) {
  const std::string path = step_dir(dir, step);
  const Values saved = read_manifest((fs::path(path) / "manifest").string());
  const Values ours = mesh_values(mesh);
  for (const Values& keys : {ours, model_values(config), Values{{"world", 0}}})
    for (const auto& entry : keys)
      if (saved.count(entry.first) == 0)
        throw CheckpointError("--resume: " + path + "/manifest has no " + entry.first);
  // The mesh but dp must be this run's; dp (and so the world) may change: the state is
  // replicated over dp.
  for (const auto& [key, value] : ours)
    if (key != "dp" && saved.at(key) != value)
      throw CheckpointError("--resume: " + path + " was written on the mesh " + mesh_text(saved) +
                            "; this run's is " + mesh_text(ours) + " (all but dp must match)");
  for (const auto& [key, value] : model_values(config))
    if (saved.at(key) != value)
      throw CheckpointError("--resume: " + path + " was written with --" + key + " " +
                            std::to_string(saved.at(key)) + "; this run has --" + key + " " +
                            std::to_string(value));
  const int world = int(saved.at("world"));
  const std::vector<ParamSpec> specs = param_specs(config);
  GlobalState state;
  state.step = step;
  for (const ParamSpec& s : specs)
    for (auto* tensor : {&state.values, &state.m, &state.v})
      tensor->emplace_back(s.size(), std::numeric_limits<float>::quiet_NaN());
  for (int rank = 0; rank < world; ++rank) {
    Reader in(rank_file(path, rank));
    char magic[sizeof kMagic];
    in.bytes(magic, sizeof magic);
    if (std::memcmp(magic, kMagic, sizeof magic) != 0 || in.get<uint32_t>() != kVersion)
      throw CheckpointError("--resume: " + in.path() + " is not a weft-train shard (version " +
                            std::to_string(kVersion) + ")");
    const int file_rank = in.get<int32_t>(), file_step = in.get<int32_t>();
    Shard shard;
    shard.tp = in.get<int32_t>(), shard.tp_rank = in.get<int32_t>();
    shard.ep = in.get<int32_t>(), shard.ep_rank = in.get<int32_t>();
    if (file_rank != rank || file_step != step || shard.tp != mesh.tp || shard.tp_rank < 0 ||
        shard.tp_rank >= shard.tp || shard.ep != mesh.ep || shard.ep_rank < 0 ||
        shard.ep_rank >= shard.ep || in.get<uint64_t>() != specs.size())
      throw CheckpointError("--resume: " + in.path() + " does not belong to rank " +
                            std::to_string(rank) + " of step " + std::to_string(step));
    for (size_t i = 0; i < specs.size(); ++i) {
      const ParamSpec& s = specs[i];
      const size_t count = size_t(shard.rows(s)) * size_t(shard.cols(s));
      if (in.get<uint64_t>() != count)
        throw CheckpointError("--resume: " + in.path() + ": " + s.name + " has the wrong size");
      const std::vector<float> values = in.floats(count), m = in.floats(count),
                               v = in.floats(count);
      // The first holder of an element places it; later holders must have the same bits.
      std::vector<float> placed_values(s.size(), NAN), placed_m(s.size(), NAN),
          placed_v(s.size(), NAN);
      place_slice(s, 0, shard, values, placed_values);
      place_slice(s, 0, shard, m, placed_m);
      place_slice(s, 0, shard, v, placed_v);
      for (size_t e = 0; e < s.size(); ++e) {
        if (std::isnan(placed_values[e])) continue;
        float* slots[] = {&state.values[i][e], &state.m[i][e], &state.v[i][e]};
        const float got[] = {placed_values[e], placed_m[e], placed_v[e]};
        for (int t = 0; t < 3; ++t) {
          if (std::isnan(*slots[t])) {
            *slots[t] = got[t];
          } else if (std::memcmp(slots[t], &got[t], sizeof(float)) != 0) {
            throw CheckpointError("--resume: " + in.path() + ": " + s.name + "[" +
                                  std::to_string(e) + "] differs from another replica's copy");
          }
        }
      }
    }
  }
  for (size_t i = 0; i < specs.size(); ++i)
    for (float value : state.values[i])
      if (std::isnan(value))
        throw CheckpointError("--resume: " + path + ": no rank holds all of " + specs[i].name);
  return state;
}

}  // namespace weft::train
