// The mesh: groups for several orders and sizes (hand-derived members and
// the communicators themselves), the expert view, errors, placement.
#include <functional>
#include <numeric>
#include <string>

#include "parallel/support.h"

namespace weft::testing {
namespace {

using parallel::Mesh;
using parallel::MeshShape;

// The group's communicator holds exactly `members` (world ranks, in order).
void expect_group(const Mesh& mesh, weftComm_t comm, const std::vector<int>& members,
                  const std::string& what) {
  int size = 0, rank = -1;
  weft::check(weftCommCount(comm, &size));
  weft::check(weftCommUserRank(comm, &rank));
  ASSERT_EQ(size, static_cast<int>(members.size())) << what;
  ASSERT_EQ(members[rank], mesh.world_rank()) << what;
  int me = mesh.world_rank();
  std::vector<int> gathered(members.size(), -1);
  weft::check(weftAllGather(&me, gathered.data(), 1, weftInt32, comm, nullptr));
  EXPECT_EQ(gathered, members) << what;
}

struct Expectation {
  std::string dims;
  std::vector<int> members;  // of world rank 5
};

void check_mesh(const RankContext& context, const weft::Comm& world, const MeshShape& shape,
                const std::vector<Expectation>& dense, const std::vector<Expectation>& expert) {
  Mesh mesh(world, shape);
  for (const Expectation& e : dense) {
    EXPECT_EQ(mesh.group_ranks(e.dims, 5), e.members) << shape.order << " " << e.dims;
    std::vector<int> mine = mesh.group_ranks(e.dims, context.rank);
    EXPECT_EQ(mesh.size(e.dims), static_cast<int>(mine.size()));
    EXPECT_EQ(mine[mesh.coord(e.dims)], context.rank) << e.dims;
    expect_group(mesh, mesh.group(e.dims), mine, shape.order + " " + e.dims);
  }
  for (const Expectation& e : expert) {
    EXPECT_EQ(mesh.expert_group_ranks(e.dims, 5), e.members) << "expert " << e.dims;
    std::vector<int> mine = mesh.expert_group_ranks(e.dims, context.rank);
    EXPECT_EQ(mine[mesh.expert_coord(e.dims)], context.rank) << e.dims;
    expect_group(mesh, mesh.expert_group(e.dims), mine, "expert " + e.dims);
  }
  EXPECT_FALSE(mesh.tp_crosses_nodes()) << mesh.placement_report();  // one host here
}

TEST(Mesh, GroupsForSeveralOrdersAndSizes) {
  run_ranks(8, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    MeshShape shape;
    // rank = tp + 2·(dp + 2·pp): rank 5 is tp 1, dp 0, pp 1.
    shape.tp = 2;
    shape.pp = 2;
    check_mesh(context, world, shape,
               {{"tp", {4, 5}}, {"dp", {5, 7}}, {"pp", {1, 5}}, {"tp-dp", {4, 5, 6, 7}}},
               {{"etp", {4, 5}}, {"ep", {5}}, {"edp", {5, 7}}, {"pp", {1, 5}}});
    // TP outermost: rank = pp + 2·(dp + 2·tp): rank 5 is pp 1, dp 0, tp 1.
    shape.order = "pp-dp-tp";
    check_mesh(context, world, shape, {{"tp", {1, 5}}, {"dp", {5, 7}}, {"pp", {4, 5}}}, {});
    // rank = tp + 2·(cp + 2·dp): rank 5 is tp 1, cp 0, dp 1. The expert view
    // (etp 2, ep 2) folds CP into EP: ep of rank 5 = (5 / 2) % 2.
    shape = MeshShape{};
    shape.tp = 2;
    shape.cp = 2;
    shape.expert_ep = 2;
    shape.groups = {"dp-cp"};
    check_mesh(context, world, shape,
               {{"cp", {5, 7}}, {"dp", {1, 5}}, {"dp-cp", {1, 3, 5, 7}}, {"tp-cp", {4, 5, 6, 7}}},
               {{"etp", {4, 5}}, {"ep", {5, 7}}, {"edp", {1, 5}}});
    // HSDP: dp 4 = dp_shard 2 × dp_replicate 2; expert view etp 1 × ep 4 × edp 2.
    shape = MeshShape{};
    shape.tp = 2;
    shape.hsdp = 2;
    shape.expert_tp = 1;
    shape.expert_ep = 4;
    check_mesh(context, world, shape,
               {{"dp", {1, 3, 5, 7}}, {"dp_shard", {5, 7}}, {"dp_replicate", {1, 5}}},
               {{"ep", {4, 5, 6, 7}}, {"edp", {1, 5}}, {"etp", {5}}});
  });
}

TEST(Mesh, BadShapesAreNamedAndNothingHangs) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    auto with = [&](const std::function<void(MeshShape&)>& edit) {
      return [&world, edit] {
        MeshShape shape;
        edit(shape);
        Mesh mesh(world, shape);
      };
    };
    expect_error(with([](MeshShape& s) { s.tp = 3; }), "does not divide the world size 4");
    expect_error(with([](MeshShape& s) { s.tp = 3, s.dp = 1; }), "does not equal the world size 4");
    expect_error(with([](MeshShape& s) { s.tp = 0; }), "tp=0 must be positive");
    expect_error(with([](MeshShape& s) { s.pp = -2; }), "pp=-2 must be positive");
    expect_error(with([](MeshShape& s) { s.order = "tp-xp-dp"; }), "unknown dimension \"xp\"");
    expect_error(with([](MeshShape& s) { s.order = "tp-dp-tp"; }), "names dimension tp twice");
    expect_error(with([](MeshShape& s) { s.pp = 2, s.order = "tp-dp"; }),
                 "pp has size 2 but order");
    expect_error(with([](MeshShape& s) { s.hsdp = 3; }), "hsdp=3 does not divide dp=4");
    expect_error(with([](MeshShape& s) { s.expert_ep = 3; }), "does not divide the ranks");
    expect_error(with([](MeshShape& s) { s.groups = {"dp-zz"}; }), "unknown mesh dimension \"zz\"");
    MeshShape shape;
    shape.tp = 2;
    Mesh mesh(world, shape);  // still collective and healthy after the errors
    expect_error([&] { mesh.group("tq"); }, "unknown mesh dimension \"tq\"");
    expect_error([&] { mesh.expert_group("dp"); }, "unknown expert view dimension \"dp\"");
    EXPECT_EQ(mesh.size("dp"), 2);
    int one = 1, sum = 0;
    weft::check(weftAllReduce(&one, &sum, 1, weftInt32, weftSum, mesh.group("dp-tp"), nullptr));
    EXPECT_EQ(sum, 4);
  });
}

TEST(Mesh, TpGroupCrossingNodesWithRoomIsReported) {
  run_ranks(4, [](const RankContext& context) {
    weft::Comm world = world_of(context);
    MeshShape shape;
    shape.tp = 2;
    shape.hosts = {"a", "b", "a", "b"};  // round-robin placement: TP pairs split
    Mesh crossed(world, shape);
    EXPECT_TRUE(crossed.tp_crosses_nodes());
    EXPECT_NE(crossed.placement_report().find("0@a 1@b"), std::string::npos)
        << crossed.placement_report();
    shape.hosts = {"a", "a", "b", "b"};
    EXPECT_FALSE(Mesh(world, shape).tp_crosses_nodes());
    shape.hosts = {"a", "b", "c", "d"};  // no node can hold a TP pair
    EXPECT_FALSE(Mesh(world, shape).tp_crosses_nodes());
    shape.hosts = {"a", "b"};
    expect_error([&] { Mesh bad(world, shape); }, "hosts has 2 names for a world of 4");
  });
}

}  // namespace
}  // namespace weft::testing
