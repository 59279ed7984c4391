// Masking of secrets in streamed text: a secret split across reads, and a pause in the middle of
// one, show no part of it; other text is not held back.
#include "controller/redact.h"

#include <gtest/gtest.h>

namespace tau::server {
namespace {

TEST(RedactorTest, MasksWholeSecretsAndHoldsBackNothingElse) {
  Redactor r({"hunter2", "ab"});  // "ab" is too short to mask
  EXPECT_EQ(r.Feed("key is hunter2, tab\n", false), "key is ***, tab\n");
  EXPECT_TRUE(r.masked_any());
  EXPECT_EQ(r.Feed("loss=0.5\n", false), "loss=0.5\n");
}

TEST(RedactorTest, APauseInTheMiddleOfASecretShowsNoPartOfIt) {
  Redactor r({"hunter2"});
  EXPECT_EQ(r.Feed("key is hun", false), "key is ");
  // The stream idles: asking again releases nothing of the secret's start.
  EXPECT_EQ(r.Feed("", false), "");
  EXPECT_EQ(r.Feed("ter2\n", false), "***\n");
}

TEST(RedactorTest, AHeldTailThatIsNotASecretAfterAllIsReleased) {
  Redactor r({"hunter2"});
  EXPECT_EQ(r.Feed("hunt", false), "");
  EXPECT_EQ(r.Feed("ing season\n", false), "hunting season\n");
  EXPECT_EQ(r.Feed("the end: hu", false), "the end: ");
  EXPECT_EQ(r.Feed("", true), "hu");  // the text ended there
}

TEST(RedactorTest, OverlappingStartsAreHeldByTheLongestMatch) {
  Redactor r({"aaab", "xyz"});
  EXPECT_EQ(r.Feed("aaaa", false), "a");
  EXPECT_EQ(r.Feed("b", false), "***");
}

}  // namespace
}  // namespace tau::server
