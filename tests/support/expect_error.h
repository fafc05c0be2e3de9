// Asserts a C API call's result and that the last error mentions `needle`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "weft/weft.h"

#define EXPECT_ERROR(call, code, needle)                                              \
  do {                                                                                \
    EXPECT_EQ((call), (code));                                                        \
    EXPECT_NE(std::string(weftGetLastError(nullptr)).find(needle), std::string::npos) \
        << "last error: " << weftGetLastError(nullptr);                               \
  } while (0)
