// cma_thresholds: which collectives read a peer's unregistered buffer by
// cross-memory attach, and from which block size (docs/shared-memory.md, "CMA").
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>

#include "algorithms/schedule.h"
#include "core/direct.h"

namespace weft {
namespace {

using algo::Collective;

// The floors per collective: only AllGather, Broadcast, AllToAll and AllReduce read by CMA; unset,
// kAutoCmaBytes with a core per rank, and on shared cores AllToAll alone from
// kOversubscribedAllToAllCmaBytes; a set value everywhere.
TEST(CmaThresholds, FollowTheSettingAndTheCores) {
  for (bool oversubscribed : {false, true})
    for (std::optional<uint64_t> set :
         {std::optional<uint64_t>{}, std::optional<uint64_t>{4096}, std::optional<uint64_t>{0}}) {
      const CmaThresholds thresholds = cma_thresholds(set, oversubscribed);
      for (size_t c = 0; c < thresholds.size(); ++c) {
        const auto collective = static_cast<Collective>(c);
        const bool capable =
            collective == Collective::AllGather || collective == Collective::Broadcast ||
            collective == Collective::AllToAll || collective == Collective::AllReduce;
        const uint64_t shared_cores =
            collective == Collective::AllToAll ? kOversubscribedAllToAllCmaBytes : 0;
        const uint64_t expected = !capable         ? 0
                                  : set            ? *set
                                  : oversubscribed ? shared_cores
                                                   : kAutoCmaBytes;
        EXPECT_EQ(thresholds[c], expected)
            << algo::collective_name(collective) << (oversubscribed ? ", oversubscribed" : "");
      }
    }
}

}  // namespace
}  // namespace weft
