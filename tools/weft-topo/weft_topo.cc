// weft-topo: prints the topology Weft sees (this host, an injected machine or
// a cluster file), where each rank sits, the ring and tree Weft would build
// on it, and writes it in the cluster-file format for WEFT_TOPO_FILE.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "topo/cluster_file.h"
#include "topo/cluster_view.h"
#include "topo/discover.h"
#include "topo/shapes.h"

namespace weft::topo {
namespace {

constexpr const char* kUsage =
    "usage: weft-topo [--synthetic DESC | --xml FILE | --file FILE] [--ranks]\n"
    "                 [--ranks-per-node N] [--root R] [--dump FILE]\n"
    "\n"
    "Prints what Weft sees: per node its packages, NUMA nodes, cores, caches, GPUs\n"
    "and NICs. Without a source it discovers this host (and this process's binding).\n"
    "\n"
    "  --synthetic DESC     an hwloc synthetic machine, e.g. \"package:2 numa:2 core:16 pu:1\"\n"
    "  --xml FILE           an hwloc XML machine (lstopo --of xml)\n"
    "  --file FILE          a cluster file (docs/topology.md); with --ranks and no\n"
    "                       other source, WEFT_TOPO_FILE\n"
    "  --ranks              also print where each rank sits and the ring and tree\n"
    "                       Weft would build over the ranks\n"
    "  --ranks-per-node N   place N ranks on every node (replaces the file's ranks)\n"
    "  --root R             the tree's root rank (default 0)\n"
    "  --dump FILE          write the topology in the cluster-file format (- for stdout)\n"
    "  -h, --help           this text\n"
    "\n"
    "Exit status: 0 on success, 1 when the topology cannot be loaded, 2 on usage errors.\n";

struct Options {
  std::string synthetic, xml, file, dump;
  bool ranks = false;
  int ranks_per_node = -1;
  int root = 0;
};

[[noreturn]] void usage_error(const std::string& message) {
  fprintf(stderr, "weft-topo: %s\n%s", message.c_str(), kUsage);
  exit(2);
}

int parse_count(const char* text, const char* flag) {
  char* end = nullptr;
  long value = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 0 || value > kMaxRanks)
    usage_error(std::string(flag) + " needs a count, got \"" + text + "\"");
  return static_cast<int>(value);
}

Options parse_args(int argc, char** argv) {
  Options options;
  int sources = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    } else if (arg == "--synthetic") {
      options.synthetic = value();
      ++sources;
    } else if (arg == "--xml") {
      options.xml = value();
      ++sources;
    } else if (arg == "--file") {
      options.file = value();
      ++sources;
    } else if (arg == "--ranks") {
      options.ranks = true;
    } else if (arg == "--ranks-per-node") {
      options.ranks_per_node = parse_count(value(), "--ranks-per-node");
      options.ranks = true;
    } else if (arg == "--root") {
      options.root = parse_count(value(), "--root");
    } else if (arg == "--dump") {
      options.dump = value();
    } else {
      usage_error("unknown argument \"" + arg + "\"");
    }
  }
  if (sources > 1) usage_error("give at most one of --synthetic, --xml and --file");
  return options;
}

// "0-3,8,10-11"
std::string ranges(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  std::string out;
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    while (j + 1 < values.size() && values[j + 1] == values[j] + 1) ++j;
    // Appended piece by piece: GCC 12 warns falsely on "literal" + std::string at -O3.
    if (!out.empty()) out += ',';
    out += std::to_string(values[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(values[j]);
    }
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string bytes(uint64_t value) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double scaled = static_cast<double>(value);
  while (scaled >= 1024 && unit < 4) {
    scaled /= 1024;
    ++unit;
  }
  char buffer[32];
  snprintf(buffer, sizeof(buffer), scaled == static_cast<uint64_t>(scaled) ? "%.0f %s" : "%.1f %s",
           scaled, units[unit]);
  return buffer;
}

std::string index_or_dash(int index) {
  return index < 0 ? "-" : std::to_string(index);
}

void print_machine(const Machine& m) {
  printf("node %s: %d package%s, %zu NUMA node%s, %zu cores, %d PUs\n", m.name.c_str(), m.packages,
         m.packages == 1 ? "" : "s", m.numa.size(), m.numa.size() == 1 ? "" : "s", m.cores.size(),
         m.pu_count());
  for (size_t n = 0; n < m.numa.size(); ++n) {
    std::vector<int> pus;
    int cores = 0;
    for (const Core& core : m.cores)
      if (core.numa == static_cast<int>(n)) {
        ++cores;
        pus.insert(pus.end(), core.pus.begin(), core.pus.end());
      }
    printf("  numa %zu (os %d): package %s, %s, %d cores, PUs %s\n", n, m.numa[n].os_index,
           index_or_dash(m.numa[n].package).c_str(), bytes(m.numa[n].memory_bytes).c_str(), cores,
           ranges(pus).c_str());
  }
  std::vector<int> loose;
  for (const Core& core : m.cores)
    if (core.numa < 0) loose.insert(loose.end(), core.pus.begin(), core.pus.end());
  if (!loose.empty()) printf("  PUs outside any NUMA node: %s\n", ranges(loose).c_str());
  if (!m.caches.empty()) {
    printf("  caches:");
    for (const Cache& c : m.caches)
      printf(" L%d%s %s x%d", c.level,
             c.kind == CacheKind::Data          ? "d"
             : c.kind == CacheKind::Instruction ? "i"
                                                : "",
             bytes(c.size_bytes).c_str(), c.count);
    printf("\n");
  }
  if (!m.numa_distances.empty()) {
    printf("  numa distances:");
    for (size_t i = 0; i < m.numa_distances.size(); ++i) {
      printf(i ? " /" : "");
      for (uint64_t d : m.numa_distances[i]) printf(" %llu", static_cast<unsigned long long>(d));
    }
    printf("\n");
  }
  for (size_t g = 0; g < m.gpus.size(); ++g)
    printf("  gpu %zu: %s %s, numa %s, nvlink domain %s\n", g, m.gpus[g].name.c_str(),
           m.gpus[g].bus_id.empty() ? "(no bus id)" : m.gpus[g].bus_id.c_str(),
           index_or_dash(m.gpus[g].numa).c_str(), index_or_dash(m.gpus[g].nvlink).c_str());
  for (size_t k = 0; k < m.nics.size(); ++k)
    printf("  nic %zu: %s %s, numa %s, rail %s, %g GB/s\n", k, m.nics[k].name.c_str(),
           m.nics[k].bus_id.empty() ? "(no bus id)" : m.nics[k].bus_id.c_str(),
           index_or_dash(m.nics[k].numa).c_str(), index_or_dash(m.nics[k].rail).c_str(),
           m.nics[k].bandwidth_gb_s);
  if (m.gpus.empty()) printf("  no GPUs\n");
  if (m.nics.empty()) printf("  no NICs\n");
}

void print_ranks(const Cluster& cluster, int root) {
  ClusterView view(places_of(cluster));
  printf("ranks: %d on %d node%s, %d domain%s (package x NUMA node)\n", view.nranks(),
         view.nnodes(), view.nnodes() == 1 ? "" : "s", view.ndomains(),
         view.ndomains() == 1 ? "" : "s");
  for (int r = 0; r < view.nranks(); ++r) {
    const RankSpec& spec = cluster.ranks[r];
    const RankPlace& place = view.place(r);
    printf("  rank %d: node %s, package %s, numa %s, gpu %s, nic %s%s%s\n", r,
           cluster.nodes[spec.node].name.c_str(), index_or_dash(place.package).c_str(),
           index_or_dash(place.numa).c_str(), index_or_dash(spec.gpu).c_str(),
           index_or_dash(spec.nic).c_str(), spec.cpus.empty() ? "" : ", cpus ",
           spec.cpus.empty() ? "" : ranges(spec.cpus).c_str());
  }
  if (view.nranks() == 0) return;
  std::vector<int> ring = ring_order(view);
  Crossings rc = ring_crossings(view, ring);
  printf("ring (crosses nodes %d times, domains %d times):", rc.nodes, rc.domains);
  for (int r : ring) printf(" %d", r);
  printf("\n");
  if (root >= view.nranks()) {
    fprintf(stderr, "weft-topo: --root %d: there are only %d ranks\n", root, view.nranks());
    exit(2);
  }
  TreeShape tree = tree_shape(view, root);
  Crossings tc = tree_crossings(view, tree);
  printf("tree (root %d, depth %d, %d edges cross nodes, %d cross domains):\n", root, tree.depth,
         tc.nodes, tc.domains);
  for (int r = 0; r < view.nranks(); ++r) {
    printf("  rank %d: parent %s, children", r, index_or_dash(tree.parent[r]).c_str());
    if (tree.children[r].empty()) printf(" none");
    for (int child : tree.children[r]) printf(" %d", child);
    printf("\n");
  }
}

Status load(const Options& options, Cluster* cluster) {
  if (!options.file.empty()) return load_cluster_file(options.file, cluster);
  bool found = false;
  if (options.synthetic.empty() && options.xml.empty() && options.ranks) {
    WEFT_RETURN_IF_ERROR(load_cluster_from_env(cluster, &found));
    if (found) return Status::Ok();
  }
  Machine machine;
  if (!options.synthetic.empty()) {
    WEFT_RETURN_IF_ERROR(load_synthetic(options.synthetic, &machine));
    machine.name = "synthetic";
  } else if (!options.xml.empty()) {
    WEFT_RETURN_IF_ERROR(load_xml_file(options.xml, &machine));
    if (machine.name.empty()) machine.name = "xml";
  } else {
    WEFT_RETURN_IF_ERROR(discover_local(&machine));
    std::vector<int> binding;
    WEFT_RETURN_IF_ERROR(process_binding(&binding));
    Locality where = locate(machine, binding);
    printf("this process: PUs %s (package %s, numa %s)\n", ranges(binding).c_str(),
           index_or_dash(where.package).c_str(), index_or_dash(where.numa).c_str());
  }
  cluster->nodes = {machine};
  cluster->ranks.clear();
  return Status::Ok();
}

int run(int argc, char** argv) {
  Options options = parse_args(argc, argv);
  Cluster cluster;
  Status status = load(options, &cluster);
  if (!status.ok()) {
    fprintf(stderr, "weft-topo: %s\n", status.message().c_str());
    return 1;
  }
  if (options.ranks_per_node >= 0) {
    cluster.ranks.clear();
    for (size_t n = 0; n < cluster.nodes.size(); ++n)
      place_ranks(cluster.nodes[n], static_cast<int>(n), options.ranks_per_node, &cluster.ranks);
    if (cluster.ranks.size() > kMaxRanks) usage_error("too many ranks");
  }
  for (const Machine& machine : cluster.nodes) print_machine(machine);
  printf("links:");
  for (int i = 0; i < kNumLinkClasses; ++i)
    printf("%s %s %g GB/s %g us", i ? "," : "", link_class_name(static_cast<LinkClass>(i)),
           cluster.links[i].bandwidth_gb_s, cluster.links[i].latency_us);
  printf("\n");
  if (options.ranks) print_ranks(cluster, options.root);
  if (!options.dump.empty()) {
    std::string text = dump_cluster(cluster);
    if (options.dump == "-") {
      fputs(text.c_str(), stdout);
    } else {
      std::ofstream out(options.dump, std::ios::binary | std::ios::trunc);
      out << text;
      if (!out.flush()) {
        fprintf(stderr, "weft-topo: cannot write %s\n", options.dump.c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace weft::topo

int main(int argc, char** argv) {
  return weft::topo::run(argc, argv);
}
