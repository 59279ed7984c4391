#include <gtest/gtest.h>
TEST(RuntimeTest, Placeholder) { EXPECT_TRUE(true); }
