// Every environment variable Weft reads is documented in the README's table.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/env.h"

namespace {

TEST(EnvDocs, ReadmeListsEveryVariable) {
  std::ifstream readme(WEFT_SOURCE_DIR "/README.md");
  ASSERT_TRUE(readme.good()) << "cannot read README.md";
  std::stringstream text;
  text << readme.rdbuf();
  ASSERT_GT(weft::env_table().size(), 5u);
  for (const weft::EnvVar& var : weft::env_table())
    EXPECT_NE(text.str().find("`" + std::string(var.name) + "`"), std::string::npos)
        << var.name << " is missing from the README's environment table";
}

}  // namespace
