// A fixture with a one-rank communicator (no peers, no launcher needed).
#pragma once

#include <gtest/gtest.h>

#include "weft/weft.h"

namespace weft::testing {

class SingleRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    weftUniqueId id;
    ASSERT_EQ(weftGetUniqueId(&id), weftSuccess) << weftGetLastError(nullptr);
    ASSERT_EQ(weftCommInitRank(&comm_, 1, id, 0), weftSuccess) << weftGetLastError(nullptr);
  }
  void TearDown() override {
    if (comm_ != nullptr) {
      EXPECT_EQ(weftCommDestroy(comm_), weftSuccess);
    }
  }
  weftComm_t comm_ = nullptr;
};

}  // namespace weft::testing
