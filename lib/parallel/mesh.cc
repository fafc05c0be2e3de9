// The device mesh: named dimensions over the world communicator, groups
// split once and cached, the expert view, the placement check; and Axis.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "parallel/internal.h"

namespace weft::parallel {

namespace {

using detail::fail;
using detail::require;

std::vector<std::string> split_names(std::string_view text, std::string_view what) {
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    size_t end = text.find('-', start);
    std::string_view name = text.substr(start, end == std::string_view::npos ? end : end - start);
    require(!name.empty(), std::string(what) + " \"" + std::string(text) + "\" has an empty name");
    names.emplace_back(name);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return names;
}

struct Group {
  weftComm_t comm = nullptr;
  weftStream_t stream = nullptr;
};

// One factorisation of the world: names inner to outer and every rank's coords.
struct View {
  std::string label;  // for messages: "mesh" or "expert view"
  std::vector<std::string> names;
  std::vector<int> sizes;
  std::vector<std::vector<int>> coords;  // [world rank][dim]
  std::map<std::string, std::string> aliases;

  int index_of(const std::string& name) const {
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      for (const auto& [alias, target] : aliases) known += ", " + alias;
      fail("unknown " + label + " dimension \"" + name + "\" (known: " + known + ")");
    }
    return static_cast<int>(it - names.begin());
  }

  // The dims as a mask over `names`, aliases expanded; a name twice is an error.
  std::vector<bool> mask_of(std::string_view dims) const {
    std::vector<bool> mask(names.size(), false);
    for (const std::string& name : split_names(dims, "dims")) {
      auto alias = aliases.find(name);
      std::vector<std::string> parts =
          alias == aliases.end() ? std::vector<std::string>{name} : split_names(alias->second, "");
      for (const std::string& part : parts) {
        int i = index_of(part);
        require(!mask[i], "dims \"" + std::string(dims) + "\" name " + part + " twice");
        mask[i] = true;
      }
    }
    return mask;
  }

  // Mixed-radix index of rank's coords over the masked dims (inner first).
  int index(int rank, const std::vector<bool>& mask, bool selected) const {
    int value = 0, stride = 1;
    for (size_t i = 0; i < names.size(); ++i) {
      if (mask[i] != selected) continue;
      value += coords[rank][i] * stride;
      stride *= sizes[i];
    }
    return value;
  }

  int size(std::string_view dims) const {
    std::vector<bool> mask = mask_of(dims);
    int product = 1;
    for (size_t i = 0; i < names.size(); ++i)
      if (mask[i]) product *= sizes[i];
    return product;
  }

  std::vector<int> ranks(std::string_view dims, int rank) const {
    std::vector<bool> mask = mask_of(dims);
    require(rank >= 0 && rank < static_cast<int>(coords.size()),
            "rank " + std::to_string(rank) + " is not a world rank");
    int color = index(rank, mask, false);
    std::vector<std::pair<int, int>> members;  // (key, world rank)
    for (int r = 0; r < static_cast<int>(coords.size()); ++r)
      if (index(r, mask, false) == color) members.emplace_back(index(r, mask, true), r);
    std::sort(members.begin(), members.end());
    std::vector<int> result;
    for (const auto& member : members) result.push_back(member.second);
    return result;
  }

  // Every rank's (group, position) under dims, groups numbered in order of
  // first appearance: equal for two dims sets exactly when they give the
  // same communicators, on every rank alike.
  std::vector<int> partition(std::string_view dims) const {
    std::vector<bool> mask = mask_of(dims);
    std::map<int, int> labels;
    std::vector<int> signature;
    for (int r = 0; r < static_cast<int>(coords.size()); ++r) {
      auto label = labels.emplace(index(r, mask, false), static_cast<int>(labels.size())).first;
      signature.push_back(label->second);
      signature.push_back(index(r, mask, true));
    }
    return signature;
  }
};

void fill_coords(View& view, int world_size) {
  view.coords.assign(world_size, std::vector<int>(view.names.size()));
  for (int r = 0; r < world_size; ++r) {
    int rest = r;
    for (size_t i = 0; i < view.names.size(); ++i) {
      view.coords[r][i] = rest % view.sizes[i];
      rest /= view.sizes[i];
    }
  }
}

bool info_enabled() {
  const char* level = getenv("WEFT_DEBUG");
  return level != nullptr && (strcasecmp(level, "INFO") == 0 || strcasecmp(level, "TRACE") == 0);
}

}  // namespace

struct Mesh::State {
  weftComm_t world = nullptr;
  int rank = 0;
  int size = 0;
  std::string order;
  View dense, expert;
  std::vector<std::string> hosts;
  std::string placement;
  // Communicators by partition: dims (of either view) that group the ranks
  // identically share one; every one-rank group shares one made locally.
  std::map<std::vector<int>, Group> groups;

  ~State() {
    for (auto& [partition, group] : groups) {
      weftStreamDestroy(group.stream);  // drains first
      weftCommDestroy(group.comm);
    }
  }

  // A split of the world (collective) the first time a partition is asked
  // for, except one-rank groups, which are initialised locally.
  const Group& group(const View& view, std::string_view dims) {
    bool alone = view.size(dims) == 1;
    std::vector<int> key = alone ? std::vector<int>{-1} : view.partition(dims);
    auto it = groups.find(key);
    if (it != groups.end()) return it->second;
    Group group;
    if (alone) {
      weftUniqueId id;
      check(weftGetUniqueId(&id));
      check(weftCommInitRank(&group.comm, 1, id, 0));
    } else {
      std::vector<bool> mask = view.mask_of(dims);
      check(weftCommSplit(world, view.index(rank, mask, false), view.index(rank, mask, true),
                          &group.comm, nullptr));
    }
    weftResult_t result = weftStreamCreate(&group.stream);
    if (result != weftSuccess) {
      weftCommDestroy(group.comm);
      check(result);
    }
    return groups.emplace(key, group).first->second;
  }
};

Mesh::Mesh(weftComm_t world, const MeshShape& shape) : state_(std::make_unique<State>()) {
  State& s = *state_;
  require(world != nullptr, "world is NULL");
  s.world = world;
  check(weftCommUserRank(world, &s.rank));
  check(weftCommCount(world, &s.size));
  s.order = shape.order;

  const std::map<std::string, int> given = {
      {"tp", shape.tp}, {"cp", shape.cp}, {"ep", shape.ep}, {"pp", shape.pp}, {"dp", shape.dp}};
  for (const auto& [name, size] : given)
    require(size > 0 || (name == "dp" && size == 0),
            "mesh size " + name + "=" + std::to_string(size) + " must be positive");
  require(shape.hsdp > 0, "mesh size hsdp=" + std::to_string(shape.hsdp) + " must be positive");
  require(shape.expert_tp >= 0, "expert_tp=" + std::to_string(shape.expert_tp) + " is negative");
  require(shape.expert_ep >= 0, "expert_ep=" + std::to_string(shape.expert_ep) + " is negative");

  std::vector<std::string> order = split_names(shape.order, "order");
  std::set<std::string> seen;
  for (const std::string& name : order) {
    require(given.count(name) == 1, "order \"" + shape.order + "\" names unknown dimension \"" +
                                        name + "\" (known: tp, cp, ep, dp, pp)");
    require(seen.insert(name).second,
            "order \"" + shape.order + "\" names dimension " + name + " twice");
  }
  std::map<std::string, int> sizes = given;
  int others = shape.tp * shape.cp * shape.ep * shape.pp;
  if (shape.dp == 0) {
    require(s.size % others == 0, "mesh tp·cp·ep·pp = " + std::to_string(others) +
                                      " does not divide the world size " + std::to_string(s.size));
    sizes["dp"] = s.size / others;
  }
  require(others * sizes["dp"] == s.size,
          "mesh tp·cp·ep·dp·pp = " + std::to_string(others * sizes["dp"]) +
              " does not equal the world size " + std::to_string(s.size));
  for (const auto& [name, size] : sizes)
    require(size == 1 || seen.count(name) == 1, "mesh dimension " + name + " has size " +
                                                    std::to_string(size) + " but order \"" +
                                                    shape.order + "\" does not name it");
  require(sizes["dp"] % shape.hsdp == 0, "hsdp=" + std::to_string(shape.hsdp) +
                                             " does not divide dp=" + std::to_string(sizes["dp"]));

  // dp is stored as dp_shard (inner) × dp_replicate; "dp" is their alias.
  s.dense.label = "mesh";
  for (const std::string& name : order) {
    if (name == "dp") {
      s.dense.names.insert(s.dense.names.end(), {"dp_shard", "dp_replicate"});
      s.dense.sizes.insert(s.dense.sizes.end(), {sizes["dp"] / shape.hsdp, shape.hsdp});
    } else {
      s.dense.names.push_back(name);
      s.dense.sizes.push_back(sizes[name]);
    }
  }
  for (const auto& [name, size] : sizes)
    if (seen.count(name) == 0) {  // size 1, outermost
      s.dense.names.push_back(name == "dp" ? "dp_shard" : name);
      s.dense.sizes.push_back(1);
      if (name == "dp") {
        s.dense.names.push_back("dp_replicate");
        s.dense.sizes.push_back(1);
      }
    }
  s.dense.aliases["dp"] = "dp_shard-dp_replicate";
  fill_coords(s.dense, s.size);

  // Expert view: each pipeline stage's ranks, by their index over the
  // non-pp dims, re-factored as etp (fastest) × ep × edp.
  int etp = shape.expert_tp == 0 ? shape.tp : shape.expert_tp;
  int eep = shape.expert_ep == 0 ? shape.ep : shape.expert_ep;
  int stage = s.size / shape.pp;
  require(stage % (etp * eep) == 0, "expert_tp·expert_ep = " + std::to_string(etp * eep) +
                                        " does not divide the ranks of a pipeline stage (" +
                                        std::to_string(stage) + ")");
  s.expert.label = "expert view";
  s.expert.names = {"etp", "ep", "edp", "pp"};
  s.expert.sizes = {etp, eep, stage / (etp * eep), shape.pp};
  s.expert.coords.assign(s.size, std::vector<int>(4));
  std::vector<bool> pp_mask = s.dense.mask_of("pp");
  for (int r = 0; r < s.size; ++r) {
    int m = s.dense.index(r, pp_mask, false);
    s.expert.coords[r] = {m % etp, (m / etp) % eep, m / (etp * eep),
                          s.dense.index(r, pp_mask, true)};
  }

  s.hosts = shape.hosts.empty() ? detail::exchange_hosts(world, s.size, nullptr) : shape.hosts;
  require(static_cast<int>(s.hosts.size()) == s.size,
          "hosts has " + std::to_string(s.hosts.size()) + " names for a world of " +
              std::to_string(s.size));
  std::map<std::string, int> per_host;
  for (const std::string& host : s.hosts) ++per_host[host];
  for (int r = 0; r < s.size && s.placement.empty(); ++r) {
    std::vector<int> members = s.dense.ranks("tp", r);
    std::set<std::string> spanned;
    int room = 0;
    for (int member : members) {
      spanned.insert(s.hosts[member]);
      room = std::max(room, per_host[s.hosts[member]]);
    }
    if (spanned.size() > 1 && shape.tp <= room) {
      std::string list;
      for (int member : members)
        list += (list.empty() ? "" : " ") + std::to_string(member) + "@" + s.hosts[member];
      s.placement = "TP group of world rank " + std::to_string(r) + " (ranks " + list +
                    ") crosses " + std::to_string(spanned.size()) + " nodes although a node has " +
                    std::to_string(room) + " ranks, room for tp=" + std::to_string(shape.tp) +
                    ": put tp innermost in the order and ranks of a node consecutively";
    }
  }
  if (!s.placement.empty() && s.rank == 0 && info_enabled())
    fprintf(stderr, "%s:%d:%d WEFT INFO PARALLEL %s\n", s.hosts[0].c_str(), getpid(), s.rank,
            s.placement.c_str());

  // Every single-dimension group of both views of more than one rank, then
  // the requested products: the same splits in the same order on every rank.
  for (const std::string& name : s.dense.names)
    if (s.dense.size(name) > 1) s.group(s.dense, name);
  for (const std::string& name : s.expert.names)
    if (s.expert.size(name) > 1) s.group(s.expert, name);
  for (const std::string& dims : shape.groups) s.group(s.dense, dims);
}

Mesh::~Mesh() = default;
Mesh::Mesh(Mesh&&) noexcept = default;
Mesh& Mesh::operator=(Mesh&&) noexcept = default;

weftComm_t Mesh::world() const {
  return state_->world;
}
int Mesh::world_rank() const {
  return state_->rank;
}
int Mesh::world_size() const {
  return state_->size;
}
const std::string& Mesh::order() const {
  return state_->order;
}

int Mesh::size(std::string_view dims) const {
  return state_->dense.size(dims);
}
int Mesh::coord(std::string_view dims) const {
  return state_->dense.index(state_->rank, state_->dense.mask_of(dims), true);
}
weftComm_t Mesh::group(std::string_view dims) const {
  return state_->group(state_->dense, dims).comm;
}
weftStream_t Mesh::stream(std::string_view dims) const {
  return state_->group(state_->dense, dims).stream;
}
std::vector<int> Mesh::group_ranks(std::string_view dims, int rank) const {
  return state_->dense.ranks(dims, rank);
}

int Mesh::expert_size(std::string_view dims) const {
  return state_->expert.size(dims);
}
int Mesh::expert_coord(std::string_view dims) const {
  return state_->expert.index(state_->rank, state_->expert.mask_of(dims), true);
}
weftComm_t Mesh::expert_group(std::string_view dims) const {
  return state_->group(state_->expert, dims).comm;
}
weftStream_t Mesh::expert_stream(std::string_view dims) const {
  return state_->group(state_->expert, dims).stream;
}
std::vector<int> Mesh::expert_group_ranks(std::string_view dims, int rank) const {
  return state_->expert.ranks(dims, rank);
}

bool Mesh::tp_crosses_nodes() const {
  return !state_->placement.empty();
}
const std::string& Mesh::placement_report() const {
  return state_->placement;
}
const std::vector<std::string>& Mesh::hosts() const {
  return state_->hosts;
}

// ---------------------------------------------------------------------------

struct Axis::State {
  weftComm_t comm = nullptr;
  weftStream_t stream = nullptr;
  bool owns_stream = false;
  int size = 1;
  int rank = 0;
  std::string name;
  Ledger* ledger = nullptr;

  State(weftComm_t c, weftStream_t s, std::string n, Ledger* l)
      : comm(c), stream(s), name(std::move(n)), ledger(l) {
    require(comm != nullptr, "the communicator of axis " + name + " is NULL");
    check(weftCommCount(comm, &size));
    check(weftCommUserRank(comm, &rank));
    if (stream == nullptr) {
      check(weftStreamCreate(&stream));
      owns_stream = true;
    }
  }
  ~State() {
    if (owns_stream) weftStreamDestroy(stream);
  }
};

Axis::Axis(const Mesh& mesh, std::string_view dims, Ledger* ledger)
    : state_(std::make_unique<State>(mesh.group(dims), mesh.stream(dims), std::string(dims),
                                     ledger)) {}

Axis::Axis(std::unique_ptr<State> state) : state_(std::move(state)) {}

Axis Axis::expert(const Mesh& mesh, std::string_view dims, Ledger* ledger) {
  return Axis(std::make_unique<State>(mesh.expert_group(dims), mesh.expert_stream(dims),
                                      "expert:" + std::string(dims), ledger));
}

Axis::Axis(weftComm_t comm, std::string name, Ledger* ledger)
    : state_(std::make_unique<State>(comm, nullptr, std::move(name), ledger)) {}

Axis::~Axis() = default;
Axis::Axis(Axis&&) noexcept = default;
Axis& Axis::operator=(Axis&&) noexcept = default;

weftComm_t Axis::comm() const {
  return state_->comm;
}
int Axis::size() const {
  return state_->size;
}
int Axis::rank() const {
  return state_->rank;
}
const std::string& Axis::name() const {
  return state_->name;
}
Ledger* Axis::ledger() const {
  return state_->ledger;
}
weftStream_t Axis::stream() const {
  return state_->stream;
}

}  // namespace weft::parallel
