#include "topo/cluster_file.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>

#include "common/env.h"
#include "topo/discover.h"
#include "topo/json.h"

namespace weft::topo {

namespace {

using json::Type;
using json::Value;

constexpr int64_t kMaxIndex = 1 << 20;  // PUs, NUMA ids, rails, ...
constexpr int64_t kMaxPerNode = 1 << 16;

// ---- reading typed fields, every error naming where it is --------------------

// `message` located at v's line and column.
Status at(const Value& v, const std::string& message) {
  return Error(weftInvalidArgument, "line %d, column %d: %s", v.line, v.column, message.c_str());
}

Status bad(const Value& v, const std::string& path, const std::string& what) {
  return at(v, path + ": " + what);
}

Status expect(const Value& v, const std::string& path, Type type) {
  if (v.type == type) return Status::Ok();
  return bad(
      v, path,
      std::string("expected ") + json::type_name(type) + ", found " + json::type_name(v.type));
}

// An object whose keys are all in `allowed`: a typo is an error, not a default.
Status expect_object(const Value& v, const std::string& path,
                     std::initializer_list<std::string_view> allowed) {
  WEFT_RETURN_IF_ERROR(expect(v, path, Type::Object));
  for (const auto& [key, value] : v.members) {
    bool known = false;
    for (std::string_view name : allowed) known = known || key == name;
    if (!known) return bad(value, path, "unknown key " + json::quote(key));
  }
  return Status::Ok();
}

Status as_int(const Value& v, const std::string& path, int64_t lo, int64_t hi, int64_t* out) {
  std::string range =
      "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v.type != Type::Number) return bad(v, path, range);
  int64_t value = 0;
  const char* end = v.text.data() + v.text.size();
  auto [ptr, ec] = std::from_chars(v.text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < lo || value > hi) return bad(v, path, range);
  *out = value;
  return Status::Ok();
}

Status as_double(const Value& v, const std::string& path, bool positive, double* out) {
  if (v.type == Type::Number) {
    double value = strtod(v.text.c_str(), nullptr);
    if (std::isfinite(value) && (positive ? value > 0 : value >= 0)) {
      *out = value;
      return Status::Ok();
    }
  }
  return bad(v, path, positive ? "expected a finite number > 0" : "expected a finite number >= 0");
}

// Optional members: absent leaves *out as it is.
template <typename T>
Status opt_int(const Value& obj, const std::string& path, const char* key, int64_t lo, int64_t hi,
               T* out) {
  const Value* v = obj.find(key);
  if (v == nullptr) return Status::Ok();
  int64_t value = 0;
  WEFT_RETURN_IF_ERROR(as_int(*v, path + "." + key, lo, hi, &value));
  *out = static_cast<T>(value);
  return Status::Ok();
}

Status opt_double(const Value& obj, const std::string& path, const char* key, bool positive,
                  double* out) {
  const Value* v = obj.find(key);
  return v == nullptr ? Status::Ok() : as_double(*v, path + "." + key, positive, out);
}

Status opt_string(const Value& obj, const std::string& path, const char* key, std::string* out) {
  const Value* v = obj.find(key);
  if (v == nullptr) return Status::Ok();
  WEFT_RETURN_IF_ERROR(expect(*v, path + "." + key, Type::String));
  *out = v->text;
  return Status::Ok();
}

Status require(const Value& obj, const std::string& path, const char* key) {
  if (obj.find(key) != nullptr) return Status::Ok();
  return bad(obj, path, std::string("missing key \"") + key + "\"");
}

Status int_list(const Value& v, const std::string& path, int64_t lo, int64_t hi,
                std::vector<int>* out) {
  WEFT_RETURN_IF_ERROR(expect(v, path, Type::Array));
  out->clear();
  for (size_t i = 0; i < v.items.size(); ++i) {
    int64_t value = 0;
    WEFT_RETURN_IF_ERROR(as_int(v.items[i], path + "[" + std::to_string(i) + "]", lo, hi, &value));
    out->push_back(static_cast<int>(value));
  }
  return Status::Ok();
}

// Calls read(item, path) for every element of the array member `key`, if present.
template <typename Read>
Status for_items(const Value& obj, const std::string& path, const char* key, Read read) {
  const Value* v = obj.find(key);
  if (v == nullptr) return Status::Ok();
  std::string base = path + "." + key;
  WEFT_RETURN_IF_ERROR(expect(*v, base, Type::Array));
  if (static_cast<int64_t>(v->items.size()) > kMaxPerNode)
    return bad(*v, base, "more than " + std::to_string(kMaxPerNode) + " entries");
  for (size_t i = 0; i < v->items.size(); ++i)
    WEFT_RETURN_IF_ERROR(read(v->items[i], base + "[" + std::to_string(i) + "]"));
  return Status::Ok();
}

// ---- the schema ---------------------------------------------------------------

Status read_links(const Value& v, Cluster* cluster) {
  WEFT_RETURN_IF_ERROR(expect(v, "links", Type::Object));
  for (const auto& [key, value] : v.members) {
    LinkClass link;
    std::string path = "links." + key;
    if (!parse_link_class(key, &link))
      return bad(value, "links", "unknown link class " + json::quote(key));
    WEFT_RETURN_IF_ERROR(expect_object(value, path, {"bandwidth_gb_s", "latency_us"}));
    LinkCost& cost = cluster->links[static_cast<int>(link)];
    WEFT_RETURN_IF_ERROR(opt_double(value, path, "bandwidth_gb_s", true, &cost.bandwidth_gb_s));
    WEFT_RETURN_IF_ERROR(opt_double(value, path, "latency_us", false, &cost.latency_us));
  }
  return Status::Ok();
}

Status read_gpus(const Value& node, const std::string& path, Machine* m) {
  const Value* v = node.find("gpus");
  if (v == nullptr) return Status::Ok();
  m->gpus.clear();
  if (v->type == Type::Number) {  // a count: plain PCIe GPUs
    int64_t count = 0;
    WEFT_RETURN_IF_ERROR(as_int(*v, path + ".gpus", 0, kMaxPerNode, &count));
    for (int64_t i = 0; i < count; ++i) m->gpus.push_back({"", "gpu" + std::to_string(i), -1, -1});
    return Status::Ok();
  }
  return for_items(node, path, "gpus", [&](const Value& item, const std::string& p) {
    WEFT_RETURN_IF_ERROR(expect_object(item, p, {"bus_id", "name", "numa", "nvlink"}));
    Gpu gpu;
    WEFT_RETURN_IF_ERROR(opt_string(item, p, "bus_id", &gpu.bus_id));
    WEFT_RETURN_IF_ERROR(opt_string(item, p, "name", &gpu.name));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "numa", -1, kMaxIndex, &gpu.numa));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "nvlink", -1, kMaxIndex, &gpu.nvlink));
    m->gpus.push_back(std::move(gpu));
    return Status::Ok();
  });
}

Status read_nics(const Value& node, const std::string& path, Machine* m) {
  const Value* v = node.find("nics");
  if (v == nullptr) return Status::Ok();
  m->nics.clear();
  if (v->type == Type::Number) {  // a count: one NIC per rail
    int64_t count = 0;
    WEFT_RETURN_IF_ERROR(as_int(*v, path + ".nics", 0, kMaxPerNode, &count));
    for (int64_t i = 0; i < count; ++i)
      m->nics.push_back({"", "nic" + std::to_string(i), -1, static_cast<int>(i), 0});
    return Status::Ok();
  }
  return for_items(node, path, "nics", [&](const Value& item, const std::string& p) {
    WEFT_RETURN_IF_ERROR(
        expect_object(item, p, {"bus_id", "name", "numa", "rail", "bandwidth_gb_s"}));
    Nic nic;
    WEFT_RETURN_IF_ERROR(opt_string(item, p, "bus_id", &nic.bus_id));
    WEFT_RETURN_IF_ERROR(opt_string(item, p, "name", &nic.name));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "numa", -1, kMaxIndex, &nic.numa));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "rail", -1, kMaxIndex, &nic.rail));
    WEFT_RETURN_IF_ERROR(opt_double(item, p, "bandwidth_gb_s", false, &nic.bandwidth_gb_s));
    m->nics.push_back(std::move(nic));
    return Status::Ok();
  });
}

Status read_cpu_topology(const Value& node, const std::string& path, Machine* m) {
  WEFT_RETURN_IF_ERROR(opt_int(node, path, "packages", 0, kMaxPerNode, &m->packages));
  WEFT_RETURN_IF_ERROR(for_items(node, path, "numa", [&](const Value& item, const std::string& p) {
    WEFT_RETURN_IF_ERROR(expect_object(item, p, {"os_index", "package", "memory_bytes"}));
    NumaNode numa{static_cast<int>(m->numa.size()), -1, 0};
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "os_index", 0, kMaxIndex, &numa.os_index));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "package", -1, kMaxIndex, &numa.package));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "memory_bytes", 0, INT64_MAX, &numa.memory_bytes));
    m->numa.push_back(numa);
    return Status::Ok();
  }));
  WEFT_RETURN_IF_ERROR(for_items(node, path, "cores", [&](const Value& item, const std::string& p) {
    WEFT_RETURN_IF_ERROR(expect_object(item, p, {"package", "numa", "pus"}));
    WEFT_RETURN_IF_ERROR(require(item, p, "pus"));
    Core core;
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "package", -1, kMaxIndex, &core.package));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "numa", -1, kMaxIndex, &core.numa));
    WEFT_RETURN_IF_ERROR(int_list(*item.find("pus"), p + ".pus", 0, kMaxIndex, &core.pus));
    m->cores.push_back(std::move(core));
    return Status::Ok();
  }));
  return for_items(node, path, "caches", [&](const Value& item, const std::string& p) {
    WEFT_RETURN_IF_ERROR(expect_object(item, p, {"level", "kind", "size_bytes", "count"}));
    WEFT_RETURN_IF_ERROR(require(item, p, "level"));
    Cache cache{0, CacheKind::Unified, 0, 1};
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "level", 1, 5, &cache.level));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "size_bytes", 0, INT64_MAX, &cache.size_bytes));
    WEFT_RETURN_IF_ERROR(opt_int(item, p, "count", 1, kMaxIndex, &cache.count));
    std::string kind = "unified";
    WEFT_RETURN_IF_ERROR(opt_string(item, p, "kind", &kind));
    bool known = false;
    for (CacheKind k : {CacheKind::Unified, CacheKind::Data, CacheKind::Instruction}) {
      if (kind == cache_kind_name(k)) {
        cache.kind = k;
        known = true;
      }
    }
    if (!known)
      return bad(*item.find("kind"), p + ".kind", "expected unified, data or instruction");
    m->caches.push_back(cache);
    return Status::Ok();
  });
}

Status read_distances(const Value& node, const std::string& path, Machine* m) {
  const Value* v = node.find("numa_distances");
  if (v == nullptr) return Status::Ok();
  m->numa_distances.clear();
  return for_items(node, path, "numa_distances", [&](const Value& row, const std::string& p) {
    std::vector<int> values;
    WEFT_RETURN_IF_ERROR(int_list(row, p, 0, kMaxIndex, &values));
    m->numa_distances.emplace_back(values.begin(), values.end());
    return Status::Ok();
  });
}

// The node's machine, from "synthetic", "xml" or the explicit keys.
Status read_machine(const Value& node, const std::string& path, const std::string& base_dir,
                    Machine* m) {
  const Value* synthetic = node.find("synthetic");
  const Value* xml = node.find("xml");
  bool explicit_cpus = false;
  for (const char* key : {"packages", "numa", "cores", "caches"})
    explicit_cpus = explicit_cpus || node.find(key) != nullptr;
  if ((synthetic != nullptr) + (xml != nullptr) + explicit_cpus > 1)
    return bad(node, path, "give one of \"synthetic\", \"xml\" or packages/numa/cores/caches");
  if (synthetic != nullptr) {
    WEFT_RETURN_IF_ERROR(expect(*synthetic, path + ".synthetic", Type::String));
    Status status = load_synthetic(synthetic->text, m);
    if (!status.ok()) return bad(*synthetic, path + ".synthetic", status.message());
  } else if (xml != nullptr) {
    WEFT_RETURN_IF_ERROR(expect(*xml, path + ".xml", Type::String));
    std::string file = xml->text;
    if (!file.empty() && file[0] != '/' && !base_dir.empty()) file = base_dir + "/" + file;
    Status status = load_xml_file(file, m);
    if (!status.ok()) return bad(*xml, path + ".xml", status.message());
  } else {
    WEFT_RETURN_IF_ERROR(read_cpu_topology(node, path, m));
  }
  WEFT_RETURN_IF_ERROR(read_distances(node, path, m));
  WEFT_RETURN_IF_ERROR(read_gpus(node, path, m));
  return read_nics(node, path, m);
}

Status read_nodes(const Value& root, const std::string& base_dir, Cluster* cluster,
                  std::vector<int>* shorthand_ranks) {
  WEFT_RETURN_IF_ERROR(require(root, "top level", "nodes"));
  const Value& nodes = *root.find("nodes");
  WEFT_RETURN_IF_ERROR(expect(nodes, "nodes", Type::Array));
  if (nodes.items.empty()) return bad(nodes, "nodes", "a cluster needs at least one node");
  std::map<std::string, int> names;
  int64_t total_ranks = 0, total_pus = 0;
  for (size_t i = 0; i < nodes.items.size(); ++i) {
    const Value& node = nodes.items[i];
    std::string path = "nodes[" + std::to_string(i) + "]";
    WEFT_RETURN_IF_ERROR(
        expect_object(node, path,
                      {"name", "count", "ranks", "synthetic", "xml", "packages", "numa", "cores",
                       "caches", "numa_distances", "gpus", "nics"}));
    Machine machine;
    WEFT_RETURN_IF_ERROR(read_machine(node, path, base_dir, &machine));
    std::string name = "node" + std::to_string(cluster->nodes.size());
    WEFT_RETURN_IF_ERROR(opt_string(node, path, "name", &name));
    int count = 1, ranks = 0;
    WEFT_RETURN_IF_ERROR(opt_int(node, path, "count", 1, kMaxNodes, &count));
    WEFT_RETURN_IF_ERROR(opt_int(node, path, "ranks", 0, kMaxPerNode, &ranks));
    Status valid = validate(machine, path);
    if (!valid.ok()) return at(node, valid.message());
    total_ranks += int64_t{count} * ranks;
    total_pus += int64_t{count} * machine.pu_count();
    if (cluster->nodes.size() + static_cast<size_t>(count) > kMaxNodes)
      return bad(node, path, "more than " + std::to_string(kMaxNodes) + " nodes");
    if (total_ranks > kMaxRanks)
      return bad(node, path, "more than " + std::to_string(kMaxRanks) + " ranks");
    if (total_pus > kMaxTotalPus)
      return bad(node, path, "more than " + std::to_string(kMaxTotalPus) + " PUs in all");
    for (int k = 0; k < count; ++k) {
      machine.name = count == 1 ? name : name + "-" + std::to_string(k);
      if (!names.emplace(machine.name, static_cast<int>(cluster->nodes.size())).second)
        return bad(node, path, "node name " + json::quote(machine.name) + " is used twice");
      shorthand_ranks->push_back(ranks);
      cluster->nodes.push_back(machine);
    }
  }
  return Status::Ok();
}

Status read_ranks(const Value& list, Cluster* cluster) {
  WEFT_RETURN_IF_ERROR(expect(list, "ranks", Type::Array));
  if (list.items.size() > kMaxRanks) return bad(list, "ranks", "too many ranks");
  for (size_t r = 0; r < list.items.size(); ++r) {
    const Value& item = list.items[r];
    std::string path = "ranks[" + std::to_string(r) + "]";
    WEFT_RETURN_IF_ERROR(expect_object(item, path, {"node", "numa", "gpu", "nic", "cpus"}));
    WEFT_RETURN_IF_ERROR(require(item, path, "node"));
    RankSpec spec;
    const Value& node = *item.find("node");
    if (node.type == Type::String) {
      spec.node = -1;
      for (size_t n = 0; n < cluster->nodes.size(); ++n)
        if (cluster->nodes[n].name == node.text) spec.node = static_cast<int>(n);
      if (spec.node < 0)
        return bad(node, path + ".node", "no node is named " + json::quote(node.text));
    } else {
      WEFT_RETURN_IF_ERROR(opt_int(item, path, "node", 0,
                                   static_cast<int64_t>(cluster->nodes.size()) - 1, &spec.node));
    }
    WEFT_RETURN_IF_ERROR(opt_int(item, path, "numa", -1, kMaxIndex, &spec.numa));
    WEFT_RETURN_IF_ERROR(opt_int(item, path, "gpu", -1, kMaxIndex, &spec.gpu));
    WEFT_RETURN_IF_ERROR(opt_int(item, path, "nic", -1, kMaxIndex, &spec.nic));
    if (const Value* cpus = item.find("cpus"))
      WEFT_RETURN_IF_ERROR(int_list(*cpus, path + ".cpus", 0, kMaxIndex, &spec.cpus));
    // A binding inside one NUMA node places the rank there.
    if (spec.numa < 0) spec.numa = locate(cluster->nodes[spec.node], spec.cpus).numa;
    cluster->ranks.push_back(std::move(spec));
    Status valid = validate_rank(*cluster, static_cast<int>(r));
    if (!valid.ok()) return at(item, valid.message());
  }
  return Status::Ok();
}

// ---- writing ------------------------------------------------------------------

std::string number(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return ec == std::errc() ? std::string(buffer, end) : "0";
}

template <typename T>
std::string int_array(const std::vector<T>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// Writes `items` one per line inside "key": [ ... ], each formatted by `line`.
template <typename T, typename Line>
void write_list(std::ostringstream& out, const char* indent, const char* key,
                const std::vector<T>& items, Line line, bool last = false) {
  out << indent << "\"" << key << "\": [";
  for (size_t i = 0; i < items.size(); ++i)
    out << (i ? ",\n" : "\n") << indent << "  " << line(items[i]);
  out << (items.empty() ? "" : std::string("\n") + indent) << "]" << (last ? "\n" : ",\n");
}

}  // namespace

Status parse_cluster(std::string_view text, const std::string& base_dir, Cluster* out) {
  Value root;
  WEFT_RETURN_IF_ERROR(json::parse(text, &root));
  WEFT_RETURN_IF_ERROR(
      expect_object(root, "top level", {"weft_topology", "links", "nodes", "ranks", "device"}));
  WEFT_RETURN_IF_ERROR(require(root, "top level", "weft_topology"));
  int version = 0;
  WEFT_RETURN_IF_ERROR(
      opt_int(root, "top level", "weft_topology", 1, kClusterFormatVersion, &version));
  Cluster cluster;
  if (const Value* links = root.find("links")) WEFT_RETURN_IF_ERROR(read_links(*links, &cluster));
  if (const Value* device = root.find("device")) {
    WEFT_RETURN_IF_ERROR(expect_object(*device, "device", {"tflops", "memory_gb", "memory_gb_s"}));
    WEFT_RETURN_IF_ERROR(opt_double(*device, "device", "tflops", false, &cluster.device.tflops));
    WEFT_RETURN_IF_ERROR(
        opt_double(*device, "device", "memory_gb", false, &cluster.device.memory_gb));
    WEFT_RETURN_IF_ERROR(
        opt_double(*device, "device", "memory_gb_s", false, &cluster.device.memory_gb_s));
  }
  std::vector<int> shorthand_ranks;
  WEFT_RETURN_IF_ERROR(read_nodes(root, base_dir, &cluster, &shorthand_ranks));
  bool shorthand = false;
  for (int count : shorthand_ranks) shorthand = shorthand || count > 0;
  if (const Value* ranks = root.find("ranks")) {
    if (shorthand) return bad(*ranks, "ranks", "give ranks per node or as a list, not both");
    WEFT_RETURN_IF_ERROR(read_ranks(*ranks, &cluster));
  }
  for (size_t n = 0; n < cluster.nodes.size(); ++n)
    place_ranks(cluster.nodes[n], static_cast<int>(n), shorthand_ranks[n], &cluster.ranks);
  WEFT_RETURN_IF_ERROR(validate(cluster));
  *out = std::move(cluster);
  return Status::Ok();
}

Status load_cluster_file(const std::string& path, Cluster* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Error(weftInvalidArgument, "cannot open topology file %s", path.c_str());
  std::string text;
  char buffer[65536];
  while (file.read(buffer, sizeof(buffer)) || file.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(file.gcount()));
    if (text.size() > json::kMaxInputBytes)
      return Error(weftInvalidArgument, "topology file %s is larger than %zu bytes", path.c_str(),
                   json::kMaxInputBytes);
  }
  size_t slash = path.rfind('/');
  std::string base_dir = slash == std::string::npos ? "" : path.substr(0, slash);
  Status status = parse_cluster(text, base_dir, out);
  if (!status.ok()) return Status(status.code(), path + ": " + status.message());
  return Status::Ok();
}

Status load_cluster_from_env(Cluster* out, bool* found) {
  std::optional<std::string> path = env_string("WEFT_TOPO_FILE");
  *found = path.has_value();
  if (!path) return Status::Ok();
  Status status = load_cluster_file(*path, out);
  if (!status.ok()) return Status(status.code(), "WEFT_TOPO_FILE: " + status.message());
  return Status::Ok();
}

std::string dump_cluster(const Cluster& cluster) {
  std::ostringstream out;
  out << "{\n  \"weft_topology\": " << kClusterFormatVersion << ",\n  \"links\": {\n";
  for (int i = 0; i < kNumLinkClasses; ++i)
    out << "    \"" << link_class_name(static_cast<LinkClass>(i))
        << "\": {\"bandwidth_gb_s\": " << number(cluster.links[i].bandwidth_gb_s)
        << ", \"latency_us\": " << number(cluster.links[i].latency_us) << "}"
        << (i + 1 < kNumLinkClasses ? ",\n" : "\n");
  out << "  },\n";
  if (cluster.device != DeviceSpec{})
    out << "  \"device\": {\"tflops\": " << number(cluster.device.tflops)
        << ", \"memory_gb\": " << number(cluster.device.memory_gb)
        << ", \"memory_gb_s\": " << number(cluster.device.memory_gb_s) << "},\n";
  out << "  \"nodes\": [";
  for (size_t n = 0; n < cluster.nodes.size(); ++n) {
    const Machine& m = cluster.nodes[n];
    const char* in = "      ";
    out << (n ? ",\n" : "\n") << "    {\n"
        << in << "\"name\": " << json::quote(m.name) << ",\n"
        << in << "\"packages\": " << m.packages << ",\n";
    write_list(out, in, "numa", m.numa, [](const NumaNode& x) {
      return "{\"os_index\": " + std::to_string(x.os_index) +
             ", \"package\": " + std::to_string(x.package) +
             ", \"memory_bytes\": " + std::to_string(x.memory_bytes) + "}";
    });
    write_list(out, in, "cores", m.cores, [](const Core& x) {
      return "{\"package\": " + std::to_string(x.package) +
             ", \"numa\": " + std::to_string(x.numa) + ", \"pus\": " + int_array(x.pus) + "}";
    });
    write_list(out, in, "caches", m.caches, [](const Cache& x) {
      return "{\"level\": " + std::to_string(x.level) + ", \"kind\": \"" + cache_kind_name(x.kind) +
             "\", \"size_bytes\": " + std::to_string(x.size_bytes) +
             ", \"count\": " + std::to_string(x.count) + "}";
    });
    write_list(out, in, "numa_distances", m.numa_distances,
               [](const std::vector<uint64_t>& row) { return int_array(row); });
    write_list(out, in, "gpus", m.gpus, [](const Gpu& x) {
      return "{\"bus_id\": " + json::quote(x.bus_id) + ", \"name\": " + json::quote(x.name) +
             ", \"numa\": " + std::to_string(x.numa) + ", \"nvlink\": " + std::to_string(x.nvlink) +
             "}";
    });
    write_list(
        out, in, "nics", m.nics,
        [](const Nic& x) {
          return "{\"bus_id\": " + json::quote(x.bus_id) + ", \"name\": " + json::quote(x.name) +
                 ", \"numa\": " + std::to_string(x.numa) + ", \"rail\": " + std::to_string(x.rail) +
                 ", \"bandwidth_gb_s\": " + number(x.bandwidth_gb_s) + "}";
        },
        true);
    out << "    }";
  }
  out << (cluster.nodes.empty() ? "" : "\n  ") << "],\n";
  write_list(
      out, "  ", "ranks", cluster.ranks,
      [](const RankSpec& x) {
        return "{\"node\": " + std::to_string(x.node) + ", \"numa\": " + std::to_string(x.numa) +
               ", \"gpu\": " + std::to_string(x.gpu) + ", \"nic\": " + std::to_string(x.nic) +
               ", \"cpus\": " + int_array(x.cpus) + "}";
      },
      true);
  out << "}\n";
  return out.str();
}

}  // namespace weft::topo
