// The topology files' JSON reader: values, escapes, numbers, errors with
// line and column, limits, and random damage that must never crash it.
#include "topo/json.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "topo/damage.h"

namespace weft::topo::json {
namespace {

Value parse_ok(const std::string& text) {
  Value value;
  Status status = parse(text, &value);
  EXPECT_TRUE(status.ok()) << text << ": " << status.message();
  return value;
}

std::string parse_error(const std::string& text) {
  Value value;
  Status status = parse(text, &value);
  EXPECT_FALSE(status.ok()) << "accepted: " << text;
  EXPECT_EQ(status.code(), weftInvalidArgument);
  return status.message();
}

TEST(Json, ParsesEveryKindOfValue) {
  Value v = parse_ok(R"( {"a": [1, -2.5e3, 0, true, false, null], "b": {"c": "d"}, "e": []} )");
  ASSERT_EQ(v.type, Type::Object);
  ASSERT_EQ(v.members.size(), 3u);
  const Value* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), 6u);
  EXPECT_EQ(a->items[0].text, "1");
  EXPECT_EQ(a->items[1].text, "-2.5e3");
  EXPECT_EQ(a->items[3].type, Type::Bool);
  EXPECT_TRUE(a->items[3].boolean);
  EXPECT_FALSE(a->items[4].boolean);
  EXPECT_EQ(a->items[5].type, Type::Null);
  EXPECT_EQ(v.find("b")->find("c")->text, "d");
  EXPECT_EQ(v.find("e")->type, Type::Array);
  EXPECT_EQ(v.find("missing"), nullptr);
}

TEST(Json, DecodesEscapesAndUnicode) {
  Value v = parse_ok(R"("q\" b\\ s\/ \b\f\n\r\t \u00e9 \u20ac \ud83d\ude00")");
  EXPECT_EQ(v.text, "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(Json, QuoteRoundTripsAnyBytes) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(random() % 40, '\0');
    for (char& c : text) c = static_cast<char>(random() % 128);
    Value v = parse_ok(quote(text));
    EXPECT_EQ(v.text, text);
  }
}

TEST(Json, ErrorsNameLineAndColumn) {
  EXPECT_NE(parse_error("{\n  \"a\": 1,\n  \"b\" 2\n}").find("line 3, column 7"),
            std::string::npos);
  EXPECT_NE(parse_error("[1, 2").find("expected ',' or ']'"), std::string::npos);
  EXPECT_NE(parse_error("{\"a\": 1, \"a\": 2}").find("duplicate key \"a\""), std::string::npos);
  EXPECT_NE(parse_error("{} x").find("after the document"), std::string::npos);
  EXPECT_NE(parse_error("").find("unexpected end of input"), std::string::npos);
}

TEST(Json, RejectsMalformedValues) {
  for (const char* text :
       {"01",      "1.",        ".5",          "-",           "1e",       "+1",  "0x10",    "\"abc",
        "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"", "\"a\nb\"", "tru", "nul",     "[1,]",
        "{\"a\"}", "{\"a\":}",  "{,}",         "{'a': 1}",    "[1 2]",    "NaN", "Infinity"}) {
    SCOPED_TRACE(text);
    parse_error(text);
  }
}

TEST(Json, LimitsNesting) {
  std::string shallow = std::string(kMaxDepth - 1, '[') + std::string(kMaxDepth - 1, ']');
  parse_ok(shallow);
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(parse_error(deep).find("nesting is too deep"), std::string::npos);
}

// Random damage to a valid document: parse either succeeds or fails with a
// message; it never crashes, hangs or reads out of bounds (the sanitizer
// build checks the last two).
TEST(Json, SurvivesRandomDamage) {
  const std::string valid =
      R"({"nodes": [{"name": "n\u00e9", "count": 2, "gpus": [{"numa": -1}]}], "x": [1.5e-3, true, null]})";
  const std::string tokens[] = {"{",  "}",   "[", "]", ",", ":",    "\"",
                                "\\", "\\u", "-", "e", "0", "null", " "};
  std::mt19937 random(2024);
  int failures = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = damage(valid, random, tokens, 4);
    Value value;
    Status status = parse(text, &value);
    if (!status.ok()) {
      ++failures;
      EXPECT_NE(status.message().find("line "), std::string::npos) << status.message();
    }
  }
  EXPECT_GT(failures, 1000);  // the damage really produced malformed input
}

}  // namespace
}  // namespace weft::topo::json
