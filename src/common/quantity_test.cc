#include "common/quantity.h"

#include <gtest/gtest.h>

namespace tau {
namespace {

int64_t Milli(const char* text) {
  auto q = Quantity::Parse(text);
  EXPECT_TRUE(q.ok()) << text << ": " << q.status().ToString();
  return q.ok() ? q->milli() : -1;
}

TEST(QuantityTest, ParsesKubernetesGrammar) {
  EXPECT_EQ(Milli("500m"), 500);
  EXPECT_EQ(Milli("2"), 2000);
  EXPECT_EQ(Milli("1.5"), 1500);
  EXPECT_EQ(Milli("0.1"), 100);
  EXPECT_EQ(Milli("1Ki"), 1024 * 1000);
  EXPECT_EQ(Milli("64Gi"), int64_t{64} * 1024 * 1024 * 1024 * 1000);
  EXPECT_EQ(Milli("1k"), 1000 * 1000);
  EXPECT_EQ(Milli("1M"), int64_t{1000000} * 1000);
  EXPECT_EQ(Milli("2e3"), 2000 * 1000);
  EXPECT_EQ(Milli("1E-3"), 1);
  EXPECT_EQ(Milli("+3"), 3000);
  EXPECT_EQ(Milli(".5"), 500);
}

TEST(QuantityTest, RoundsSubMilliUp) {
  EXPECT_EQ(Milli("0.0001"), 1);
  EXPECT_EQ(Milli("1.0001m"), 2);
}

TEST(QuantityTest, RejectsBadInput) {
  for (const char* bad : {"", "abc", "1Gb", "-1", "1.2.3", "1e", "Gi", "1 Gi", "99999999Ei"}) {
    auto q = Quantity::Parse(bad);
    EXPECT_FALSE(q.ok()) << bad;
    if (!q.ok()) {
      EXPECT_NE(q.status().message().find("invalid quantity"), std::string::npos);
    }
  }
}

TEST(QuantityTest, CeilUnitsAndString) {
  EXPECT_EQ(Quantity::FromMilli(1500).CeilUnits(), 2);
  EXPECT_EQ(Quantity::FromMilli(1500).ToString(), "1500m");
  EXPECT_EQ(Quantity::Parse("64Gi")->ToString(), "64Gi");
  EXPECT_EQ(Quantity::Parse("3")->ToString(), "3");
}

}  // namespace
}  // namespace tau
