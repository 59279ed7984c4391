#include <gtest/gtest.h>
#include "spec/spec.h"
TEST(SpecTest, Placeholder) { EXPECT_TRUE(true); }
