#include "auth/auth.h"

#include <set>

#include <gtest/gtest.h>

namespace tau::auth {
namespace {

policy::Platform Sample() {
  auto outcome = policy::ParsePlatform(R"(
queues: []
access:
  admins: [root-ish, group:platform]
  viewers: [prometheus]
users:
  - name: carol
    groups: [vision-team]
workspaces:
  - name: vision
    members: [alice, group:vision-team]
    viewers: [dave]
  - name: speech
    members: [bob]
  - name: open
    members: ["*"]
)",
                                       "platform.yaml");
  EXPECT_TRUE(outcome.ok()) << outcome.ErrorText();
  return *outcome.platform;
}

Identity Token(std::string user, std::vector<std::string> groups = {}) {
  Identity id;
  id.user = std::move(user);
  id.groups = std::move(groups);
  id.via = "token";
  return id;
}

TEST(AuthTest, WorkspaceRolesFollowThePlatform) {
  policy::Platform p = Sample();
  EXPECT_EQ(WorkspaceRole(p, Token("alice"), "vision"), Role::kResearcher);
  EXPECT_EQ(WorkspaceRole(p, Token("alice"), "speech"), Role::kNone);
  EXPECT_EQ(WorkspaceRole(p, Token("dave"), "vision"), Role::kViewer);
  EXPECT_EQ(WorkspaceRole(p, Token("dave"), "speech"), Role::kNone);
  EXPECT_EQ(WorkspaceRole(p, Token("x", {"vision-team"}), "vision"), Role::kResearcher);
  EXPECT_EQ(WorkspaceRole(p, Token("prometheus"), "speech"), Role::kViewer);
  EXPECT_EQ(WorkspaceRole(p, Token("root-ish"), "speech"), Role::kAdmin);
  EXPECT_EQ(WorkspaceRole(p, Token("eve", {"platform"}), "vision"), Role::kAdmin);
  EXPECT_EQ(WorkspaceRole(p, Token("anyone"), "open"), Role::kResearcher);
  EXPECT_EQ(WorkspaceRole(p, Token("anyone"), "no-such"), Role::kNone);
}

TEST(AuthTest, AnonymousCallersHaveNoRoleEvenInOpenWorkspaces) {
  policy::Platform p = Sample();
  Identity anonymous;
  EXPECT_EQ(WorkspaceRole(p, anonymous, "open"), Role::kNone);
  EXPECT_FALSE(IsPlatformViewer(p, anonymous));
}

TEST(AuthTest, LocalAdminIsAdminWithoutThePlatformSayingSo) {
  policy::Platform p = Sample();
  Identity me;
  me.user = "whoever";
  me.via = "unix";
  EXPECT_FALSE(IsAdmin(p, me));
  me.local_admin = true;
  EXPECT_TRUE(IsAdmin(p, me));
  EXPECT_EQ(WorkspaceRole(p, me, "speech"), Role::kAdmin);
}

TEST(AuthTest, PlatformViewersReadButDoNotAdminister) {
  policy::Platform p = Sample();
  EXPECT_TRUE(IsPlatformViewer(p, Token("prometheus")));
  EXPECT_FALSE(IsAdmin(p, Token("prometheus")));
  EXPECT_FALSE(IsPlatformViewer(p, Token("alice")));
}

TEST(AuthTest, TokenUsersGetTheirDeclaredGroups) {
  policy::Platform p = Sample();
  EXPECT_EQ(GroupsOf(p, "carol", {"extra", "vision-team"}),
            (std::vector<std::string>{"extra", "vision-team"}));
  Identity carol = Token("carol", GroupsOf(p, "carol", {}));
  EXPECT_EQ(WorkspaceRole(p, carol, "vision"), Role::kResearcher);
}

TEST(AuthTest, TokensAreRandomAndOnlyDigestsAreKept) {
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    auto t = NewToken();
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->size(), 4u + 43u);
    EXPECT_EQ(t->substr(0, 4), "tau_");
    EXPECT_EQ(
        t->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", 4),
        std::string::npos);
    EXPECT_TRUE(seen.insert(*t).second);
  }
  std::string digest = TokenDigest("tau_abc");
  EXPECT_EQ(digest.size(), 64u);
  EXPECT_EQ(digest.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(TokenId(digest), digest.substr(0, 12));
}

TEST(AuthTest, PlatformRejectsBadUsersAndDigests) {
  auto outcome = policy::ParsePlatform(R"(
queues: []
users:
  - name: "bad name"
  - name: ok
    token_sha256: [abc]
workspaces: [{name: w, members: [ok], viewers: ["group:"]}]
)",
                                       "p.yaml");
  ASSERT_FALSE(outcome.ok());
  std::string text = outcome.ErrorText();
  EXPECT_NE(text.find("'bad name' is not a user name"), std::string::npos) << text;
  EXPECT_NE(text.find("64 lowercase hex"), std::string::npos) << text;
  EXPECT_NE(text.find("is not a member"), std::string::npos) << text;
}

}  // namespace
}  // namespace tau::auth
