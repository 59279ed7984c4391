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

// Found by fuzz/quantity_fuzz.cc: a negative exponent with a long fraction overflowed __int128
// (undefined behaviour) while checking the range.
TEST(QuantityTest, TinyValuesWithLongFractionsRoundUp) {
  EXPECT_EQ(Milli("1e-30"), 1);
  EXPECT_EQ(Milli("1.000000000000000001e-30"), 1);
  EXPECT_EQ(Milli("12345678901234567.8e-30"), 1);
  EXPECT_EQ(Milli("1.23456789012345678e-24"), 1);
  EXPECT_EQ(Milli("0e-30"), 0);
  EXPECT_EQ(Milli("1.5e-3"), 2);
  EXPECT_EQ(Milli("1234.5e-3"), 1235);
  EXPECT_EQ(Milli("9223372036854775.807"), INT64_MAX);
  EXPECT_FALSE(Quantity::Parse("9223372036854775.8071").ok());
  EXPECT_FALSE(Quantity::Parse("99999999999999999999.999999999999999999Ei").ok());
  EXPECT_FALSE(Quantity::Parse("1e30").ok());
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
  EXPECT_EQ(Quantity::FromMilli(2000).CeilUnits(), 2);
  EXPECT_EQ(Quantity::FromMilli(0).CeilUnits(), 0);
  // Found by fuzz/quantity_fuzz.cc: the rounding overflowed int64 near the largest quantity.
  EXPECT_EQ(Quantity::FromMilli(INT64_MAX).CeilUnits(), INT64_MAX / 1000 + 1);
  EXPECT_EQ(Quantity::Parse("9223372036854775")->CeilUnits(), 9223372036854775);
  EXPECT_EQ(Quantity::FromMilli(1500).ToString(), "1500m");
  EXPECT_EQ(Quantity::Parse("64Gi")->ToString(), "64Gi");
  EXPECT_EQ(Quantity::Parse("3")->ToString(), "3");
}

}  // namespace
}  // namespace tau
