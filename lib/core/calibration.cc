#include "core/calibration.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/env.h"

namespace weft {

namespace {

// Where each of the file's numeric keys goes (`cores` aside); *zero_ok
// when 0 is a meaningful value (a cost that is absent), not a division by 0.
double* field_of(Calibration* c, std::string_view key, bool* zero_ok) {
  *zero_ok = false;
  if (key == "call_us") return *zero_ok = true, &c->call_us;
  if (key == "link_latency_us") return *zero_ok = true, &c->link.latency_us;
  if (key == "link_bandwidth_gb_s") return &c->link.bandwidth_gb_s;
  if (key == "memory_overhead_us") return *zero_ok = true, &c->memory.latency_us;
  if (key == "memory_bandwidth_gb_s") return &c->memory.bandwidth_gb_s;
  if (key == "direct_latency_us") return *zero_ok = true, &c->direct.latency_us;
  if (key == "direct_bandwidth_gb_s") return &c->direct.bandwidth_gb_s;
  if (key == "single_copy_latency_us") return *zero_ok = true, &c->single_copy.latency_us;
  if (key == "single_copy_bandwidth_gb_s") return &c->single_copy.bandwidth_gb_s;
  if (key == "slice_latency_us") return *zero_ok = true, &c->slice_latency_us;
  if (key == "direct_slice_latency_us") return *zero_ok = true, &c->direct_slice_latency_us;
  if (key == "sliced_link_bandwidth_gb_s") return *zero_ok = true, &c->sliced_link_bandwidth_gb_s;
  if (key == "sliced_single_copy_bandwidth_gb_s")
    return *zero_ok = true, &c->sliced_single_copy_bandwidth_gb_s;
  if (key == "cache_bytes") return *zero_ok = true, &c->cache_bytes;
  if (key == "cache_bandwidth_gb_s") return *zero_ok = true, &c->cache_bandwidth_gb_s;
  if (key == "direct_cache_bandwidth_gb_s") return *zero_ok = true, &c->direct_cache_bandwidth_gb_s;
  return nullptr;
}

constexpr const char* kKeys =
    "call_us, link_latency_us, link_bandwidth_gb_s, memory_overhead_us, memory_bandwidth_gb_s, "
    "direct_latency_us, direct_bandwidth_gb_s, single_copy_latency_us, "
    "single_copy_bandwidth_gb_s, cores, slice_latency_us, "
    "direct_slice_latency_us, sliced_link_bandwidth_gb_s, sliced_single_copy_bandwidth_gb_s, "
    "cache_bytes, cache_bandwidth_gb_s, direct_cache_bandwidth_gb_s";

}  // namespace

double Calibration::share(int ranks_per_node, int cores) {
  return cores > 0 && ranks_per_node > cores ? static_cast<double>(ranks_per_node) / cores : 1.0;
}

algo::LinkTime Calibration::sliced(algo::LinkTime time, double share, double slice_us) {
  if (share <= 1) return time;
  return {time.latency_us + slice_us * (share - 1), time.bandwidth_gb_s / share};
}

double Calibration::sliced_link_bandwidth(double bandwidth_gb_s, double share, double at_two) {
  if (share <= 1) return bandwidth_gb_s;
  if (at_two <= 0) return bandwidth_gb_s / share;
  const double exponent = std::log2(bandwidth_gb_s / at_two);
  return bandwidth_gb_s / std::pow(share, exponent);
}

double Calibration::sliced_single_copy_bandwidth(double bandwidth_gb_s, double share,
                                                 double at_two) {
  if (share <= 1) return bandwidth_gb_s;
  return at_two <= 0 ? bandwidth_gb_s / share : at_two * 2 / share;
}

double Calibration::cache_speedup(double bytes, double cache_bytes, double cache_gb_s,
                                  double memory_gb_s) {
  if (cache_bytes <= 0 || cache_gb_s <= memory_gb_s || bytes <= 0) return 1;
  // The call's first cache_bytes at the cache's throughput, the rest at memory's.
  const double cached = std::min(bytes, cache_bytes);
  const double seconds_per_gb = cached / cache_gb_s + (bytes - cached) / memory_gb_s;
  return bytes / seconds_per_gb / memory_gb_s;
}

void Calibration::scale_to_speed(double speed) {
  for (double* throughput :
       {&link.bandwidth_gb_s, &memory.bandwidth_gb_s, &direct.bandwidth_gb_s,
        &single_copy.bandwidth_gb_s, &cache_bandwidth_gb_s, &direct_cache_bandwidth_gb_s,
        &sliced_link_bandwidth_gb_s, &sliced_single_copy_bandwidth_gb_s})
    *throughput *= speed;
  for (double* latency : {&call_us, &memory.latency_us, &direct.latency_us, &slice_latency_us,
                          &direct_slice_latency_us})
    *latency /= speed;
}

double probe_cache_copy_gb_s() {
  static const double measured = [] {
    // Four copies per sample, so that reading the clock weighs little against them.
    constexpr size_t kBytes = 64 << 10;
    constexpr int kWarm = 4, kTimed = 32, kCopies = 4;
    std::vector<char> a(kBytes, 1), b(kBytes, 2);
    std::array<double, kTimed> seconds{};
    for (int i = -kWarm; i < kTimed; ++i) {
      const auto start = std::chrono::steady_clock::now();
      for (int copy = 0; copy < kCopies; ++copy) {
        char* to = (copy & 1) ? a.data() : b.data();
        std::memcpy(to, (copy & 1) ? b.data() : a.data(), kBytes);
        asm volatile("" : : "r"(to) : "memory");  // the copy happens, inside the timing
      }
      const auto end = std::chrono::steady_clock::now();
      if (i >= 0) seconds[i] = std::chrono::duration<double>(end - start).count();
    }
    std::nth_element(seconds.begin(), seconds.begin() + kTimed / 2, seconds.end());
    return kCopies * kBytes / std::max(seconds[kTimed / 2], 1e-9) / 1e9;
  }();
  return measured;
}

constexpr double kSlowestHost = 1.0 / 20, kFastestHost = 20;

double local_host_speed(const Calibration& machine) {
  double speed = 1;
  if (std::optional<uint64_t> percent =
          env_value_if_set("WEFT_HOST_SPEED", env_var("WEFT_HOST_SPEED").when_bad))
    speed = static_cast<double>(*percent) / 100;
  else if (machine.cache_bandwidth_gb_s > 0)
    speed = probe_cache_copy_gb_s() / machine.cache_bandwidth_gb_s;
  return std::clamp(speed, kSlowestHost, kFastestHost);
}

bool valid_host_speed(double speed) {
  return speed >= kSlowestHost && speed <= kFastestHost;  // false for NaN too
}

double agreed_host_speed(std::vector<double> views) {
  if (views.empty()) return 1;
  const auto middle = views.begin() + (views.size() - 1) / 2;
  std::nth_element(views.begin(), middle, views.end());
  return *middle;
}

Status parse_calibration(std::string_view text, const std::string& source, Calibration* out) {
  int line_number = 0;
  bool direct_given = false, direct_cache_given = false;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    ++line_number;
    line = line.substr(0, std::min(line.find('#'), line.size()));
    std::istringstream words{std::string(line)};
    std::string key, value, extra;
    if (!(words >> key)) continue;  // blank or comment
    if (!(words >> value) || (words >> extra))
      return Error(weftInvalidArgument, "%s line %d: expected 'key value', got '%.*s'",
                   source.c_str(), line_number, static_cast<int>(line.size()), line.data());
    double number = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
    if (ec != std::errc() || ptr != value.data() + value.size() || !(number >= 0) || number > 1e9)
      return Error(weftInvalidArgument, "%s line %d: %s: '%s' is not a number in [0, 1e9]",
                   source.c_str(), line_number, key.c_str(), value.c_str());
    if (key == "cores") {
      if (number != static_cast<int>(number))
        return Error(weftInvalidArgument, "%s line %d: cores: '%s' is not a whole number",
                     source.c_str(), line_number, value.c_str());
      out->cores = static_cast<int>(number);
      continue;
    }
    bool zero_ok;
    double* field = field_of(out, key, &zero_ok);
    if (field == nullptr)
      return Error(weftInvalidArgument, "%s line %d: unknown key '%s' (valid: %s)", source.c_str(),
                   line_number, key.c_str(), kKeys);
    if (number == 0 && !zero_ok)
      return Error(weftInvalidArgument, "%s line %d: %s must be positive", source.c_str(),
                   line_number, key.c_str());
    *field = number;
    direct_given = direct_given || field == &out->direct.bandwidth_gb_s;
    direct_cache_given = direct_cache_given || field == &out->direct_cache_bandwidth_gb_s;
  }
  // The default direct_cache_bandwidth_gb_s goes with the default direct_bandwidth_gb_s
  // only: a file that measured its own direct figure but not this one (written before the
  // key, or where calibrate.py could not measure it) keeps the copies' factor.
  if (direct_given && !direct_cache_given) out->direct_cache_bandwidth_gb_s = 0;
  return Status::Ok();
}

Status load_calibration(Calibration* out) {
  *out = Calibration();
  const std::optional<std::string> path = env_string("WEFT_TUNER_FILE");
  if (!path) return Status::Ok();
  std::ifstream file(*path);
  if (!file)
    return Error(weftInvalidArgument, "WEFT_TUNER_FILE: cannot read '%s': %s", path->c_str(),
                 std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  return parse_calibration(text.str(), "WEFT_TUNER_FILE " + *path, out);
}

}  // namespace weft
