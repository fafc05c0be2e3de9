// The C++ API: RAII communicators and groups, typed spans, exceptions.
#include <gtest/gtest.h>

#include <vector>

#include "support/multirank.h"
#include "weft/weft.hpp"

namespace weft::testing {
namespace {

TEST(CppApi, RingSplitAndErrors) {
  run_ranks(3, [](const RankContext& context) {
    Comm comm = Comm::init(context.nranks, UniqueId::from_bytes(context.id), context.rank);
    ASSERT_EQ(comm.rank(), context.rank);
    ASSERT_EQ(comm.size(), 3);
    std::vector<double> outgoing(1000, context.rank + 0.5), incoming(1000, -1);
    int left = (context.rank + 2) % 3;
    {
      Group group;
      comm.send(std::span<const double>(outgoing), (context.rank + 1) % 3);
      comm.recv(std::span<double>(incoming), left);
      group.end();
    }
    EXPECT_EQ(incoming, std::vector<double>(1000, left + 0.5));

    Comm pair = comm.split(context.rank == 2 ? WEFT_SPLIT_NOCOLOR : 0, -context.rank);
    EXPECT_EQ(static_cast<bool>(pair), context.rank != 2);
    if (pair) {
      EXPECT_EQ(pair.size(), 2);
      EXPECT_EQ(pair.rank(), 1 - context.rank);  // keys reverse the order
      pair.barrier();
    }
    try {
      comm.send(std::span<const double>(outgoing), 9);
      ADD_FAILURE() << "sending to rank 9 of 3 did not throw";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), weftInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("peer 9"), std::string::npos) << error.what();
    }
    EXPECT_EQ(comm.async_error(), weftSuccess);
    comm.barrier();
  });
}

}  // namespace
}  // namespace weft::testing
