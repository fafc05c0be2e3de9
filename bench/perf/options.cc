#include "options.h"

#include <charconv>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>

#include "common/dtype.h"

namespace weft::perf {

const char* const kUsage =
    "usage: weft-perf <collective> [flags]     (under weftrun -n N, mpirun or srun; alone: 1 "
    "rank)\n"
    "\n"
    "  -b, --minbytes SIZE       smallest size (default 32M; K/M/G suffixes are binary)\n"
    "  -e, --maxbytes SIZE       largest size (default 32M)\n"
    "  -f, --stepfactor N        multiply the size by N per row (default 1: use -i)\n"
    "  -i, --stepbytes SIZE      add SIZE per row while -f is 1 (default 1M)\n"
    "  -n, --iters N             timed iterations per row (default 20)\n"
    "  -w, --warmup_iters N      warmup iterations at the largest and smallest size (default 5)\n"
    "  -c, --check 0|1           check every result (default 1)\n"
    "  -o, --op OP               sum prod max min avg all (default sum)\n"
    "  -d, --datatype TYPE       int8 uint8 int32 uint32 int64 uint64 half float double\n"
    "                            bfloat16 f8e4m3 f8e5m2 all (default float)\n"
    "  -r, --root N              root of rooted collectives (default 0)\n"
    "  -a, --average 0|1|2|3     time reported: rank 0's, mean, min or max (default 1)\n"
    "  -z, --blocking 0|1        accepted for compatibility (calls block without a stream)\n"
    "  -T, --timeout S           bound every wait to S seconds (default: WEFT_TIMEOUT_MS)\n"
    "  -A, --algo ALGO           force an algorithm: sets WEFT_ALGO=<collective>:ALGO\n"
    "  -R, --local_register 0|1  1: buffers from weftMemAlloc, registered with the\n"
    "                            communicator (direct algorithms read them in place)\n"
    "  -G, --gpu 0|1             1: device memory on a GPU communicator, calls on a CUDA\n"
    "                            stream (default when a CUDA driver and GPU are present); 0: host\n"
    "  -t, -g, -m 1              nccl-tests' threads, GPUs and aggregation; only 1 is supported\n"
    "      --json                one JSON object per row instead of the table\n"
    "  -h, --help                this text\n";

namespace {

const weftRedOp_t kAllOps[] = {weftSum, weftProd, weftMax, weftMin, weftAvg};

std::optional<long long> parse_int(std::string_view text) {
  long long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<int> parse_int_in(std::string_view text, long long low, long long high) {
  std::optional<long long> value = parse_int(text);
  if (!value || *value < low || *value > high) return std::nullopt;
  return static_cast<int>(*value);
}

std::optional<std::vector<weftRedOp_t>> parse_ops(std::string_view text) {
  if (text == "all") return std::vector<weftRedOp_t>(std::begin(kAllOps), std::end(kAllOps));
  for (weftRedOp_t op : kAllOps) {
    if (text == op_name(op)) return std::vector<weftRedOp_t>{op};
  }
  return std::nullopt;
}

std::optional<std::vector<weftDataType_t>> parse_dtypes(std::string_view text) {
  std::vector<weftDataType_t> all;
  for (int type = 0; type < weftNumTypes; ++type) {
    auto dtype = static_cast<weftDataType_t>(type);
    if (text == dtype_name(dtype)) return std::vector<weftDataType_t>{dtype};
    all.push_back(dtype);
  }
  if (text == "all") return all;
  return std::nullopt;
}

// One flag: its names and what it does with its value (false: the value is invalid).
struct Flag {
  char short_name;
  const char* long_name;
  bool takes_value;
  std::function<bool(Options*, const std::string&)> apply;
};

template <typename T>
bool store(std::optional<T> parsed, T* target) {
  if (!parsed) return false;
  *target = *parsed;
  return true;
}

bool only_one(const std::string& value) {
  return value == "1";
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> kFlags = {
      {'b', "minbytes", true,
       [](Options* o, const std::string& v) { return store(parse_size(v), &o->min_bytes); }},
      {'e', "maxbytes", true,
       [](Options* o, const std::string& v) { return store(parse_size(v), &o->max_bytes); }},
      {'i', "stepbytes", true,
       [](Options* o, const std::string& v) { return store(parse_size(v), &o->step_bytes); }},
      {'f', "stepfactor", true,
       [](Options* o, const std::string& v) {
         std::optional<int> factor = parse_int_in(v, 1, 1 << 20);
         if (factor) o->step_factor = static_cast<size_t>(*factor);
         return factor.has_value();
       }},
      {'n', "iters", true,
       [](Options* o, const std::string& v) {
         return store(parse_int_in(v, 1, std::numeric_limits<int>::max()), &o->iters);
       }},
      {'w', "warmup_iters", true,
       [](Options* o, const std::string& v) {
         return store(parse_int_in(v, 0, std::numeric_limits<int>::max()), &o->warmup_iters);
       }},
      {'c', "check", true,
       [](Options* o, const std::string& v) {
         std::optional<int> check = parse_int_in(v, 0, 1);
         if (check) o->check = *check == 1;
         return check.has_value();
       }},
      {'o', "op", true,
       [](Options* o, const std::string& v) { return store(parse_ops(v), &o->ops); }},
      {'d', "datatype", true,
       [](Options* o, const std::string& v) { return store(parse_dtypes(v), &o->dtypes); }},
      {'r', "root", true,
       [](Options* o, const std::string& v) {
         return store(parse_int_in(v, 0, std::numeric_limits<int>::max()), &o->root);
       }},
      {'a', "average", true,
       [](Options* o, const std::string& v) {
         std::optional<int> mode = parse_int_in(v, 0, 3);
         if (mode) o->average = static_cast<AverageMode>(*mode);
         return mode.has_value();
       }},
      {'z', "blocking", true,
       [](Options* o, const std::string& v) { return store(parse_int_in(v, 0, 1), &o->blocking); }},
      {'T', "timeout", true,
       [](Options* o, const std::string& v) {
         // The communicator takes milliseconds in an int.
         return store(parse_int_in(v, 0, std::numeric_limits<int>::max() / 1000), &o->timeout_s);
       }},
      {'A', "algo", true,
       [](Options* o, const std::string& v) {
         o->algorithm = v;
         return !v.empty();
       }},
      {'R', "local_register", true,
       [](Options* o, const std::string& v) {
         std::optional<int> mode = parse_int_in(v, 0, 1);
         if (mode) o->register_buffers = *mode == 1;
         return mode.has_value();
       }},
      {'G', "gpu", true,
       [](Options* o, const std::string& v) { return store(parse_int_in(v, 0, 1), &o->gpu); }},
      {'t', "nthreads", true, [](Options*, const std::string& v) { return only_one(v); }},
      {'g', "ngpus", true, [](Options*, const std::string& v) { return only_one(v); }},
      {'m', "agg_iters", true, [](Options*, const std::string& v) { return only_one(v); }},
      {'\0', "json", false,
       [](Options* o, const std::string&) {
         o->json = true;
         return true;
       }},
      {'h', "help", false,
       [](Options* o, const std::string&) {
         o->help = true;
         return true;
       }},
  };
  return kFlags;
}

// The flag that argument names, and any value attached to it ("-b8", "--minbytes=8").
const Flag* match_flag(std::string_view argument, std::optional<std::string>* attached) {
  for (const Flag& flag : flags()) {
    if (argument.starts_with("--")) {
      std::string_view name = argument.substr(2);
      size_t equals = name.find('=');
      if (name.substr(0, equals) != flag.long_name) continue;
      if (equals != std::string_view::npos) *attached = std::string(name.substr(equals + 1));
      return &flag;
    }
    if (flag.short_name != '\0' && argument.size() >= 2 && argument[0] == '-' &&
        argument[1] == flag.short_name) {
      if (argument.size() > 2) *attached = std::string(argument.substr(2));
      return &flag;
    }
  }
  return nullptr;
}

}  // namespace

std::optional<size_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t multiplier = 1;
  std::string_view digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      multiplier = size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      multiplier = size_t{1} << 20;
      break;
    case 'G':
    case 'g':
      multiplier = size_t{1} << 30;
      break;
    default:
      break;
  }
  if (multiplier != 1) digits.remove_suffix(1);
  std::optional<long long> value = parse_int(digits);
  if (!value || *value < 0 ||
      static_cast<unsigned long long>(*value) > std::numeric_limits<size_t>::max() / multiplier)
    return std::nullopt;
  return static_cast<size_t>(*value) * multiplier;
}

std::optional<std::string> parse_options(int argc, const char* const* argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    std::string_view argument = argv[i];
    if (argument.size() < 2 || argument[0] != '-') {
      if (!options->collective.empty())
        return "unexpected argument '" + std::string(argument) + "' (one collective only)";
      options->collective = argument;
      continue;
    }
    std::optional<std::string> value;
    const Flag* flag = match_flag(argument, &value);
    if (flag == nullptr) return "unknown flag " + std::string(argument);
    if (flag->takes_value && !value) {
      if (i + 1 >= argc) return std::string(argument) + " needs a value";
      value = argv[++i];
    }
    if (!flag->takes_value && value) return std::string(argument) + " takes no value";
    if (!flag->apply(options, value.value_or("")))
      return "invalid value '" + *value + "' for " + std::string(argument);
  }
  if (options->help) return std::nullopt;
  if (options->collective.empty()) return std::string("no collective given");
  if (options->min_bytes > options->max_bytes)
    return std::string("minbytes (-b) is larger than maxbytes (-e)");
  if (options->step_factor == 1 && options->step_bytes == 0 &&
      options->min_bytes < options->max_bytes)
    return std::string("stepbytes (-i) must be positive when stepfactor (-f) is 1");
  return std::nullopt;
}

std::vector<size_t> benchmark_sizes(const Options& options) {
  std::vector<size_t> sizes;
  for (size_t size = options.min_bytes; size <= options.max_bytes;) {
    sizes.push_back(size);
    const size_t next =
        options.step_factor > 1 ? size * options.step_factor : size + options.step_bytes;
    // Stop on a step of zero (min == max) and on overflow.
    if (next <= size || (options.step_factor > 1 && next / options.step_factor != size)) break;
    size = next;
  }
  return sizes;
}

std::string forced_algorithm(const Options& options) {
  if (options.algorithm.empty() || options.algorithm.find(':') != std::string::npos)
    return options.algorithm;
  return options.collective + ":" + options.algorithm;
}

const char* op_name(weftRedOp_t op) {
  switch (op) {
    case weftSum:
      return "sum";
    case weftProd:
      return "prod";
    case weftMax:
      return "max";
    case weftMin:
      return "min";
    case weftAvg:
      return "avg";
    default:
      return "?";
  }
}

}  // namespace weft::perf
