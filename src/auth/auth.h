// Identity and authorization: who a caller is and what they may do, decided from the platform's
// roles. Pure code apart from NewToken's random bytes; the server does the I/O (finding the caller,
// looking tokens up in the store, auditing) and asks this module for the decision.
//
// What it offers:
//   * Identity: a user and their groups, and how they proved it (the Unix socket's peer
//     credentials, or an API token);
//   * Role, WorkspaceRole, IsAdmin, IsPlatformViewer: the roles of docs/security.md —
//     viewer (read a workspace's runs), researcher (also submit and cancel), admin (platform
//     policy, queues, any run);
//   * NewToken, TokenDigest: API tokens are 256 random bits, shown once, stored only as digests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "policy/policy.h"

namespace tau::auth {

struct Identity {
  std::string user;                 // "" for an anonymous caller
  std::vector<std::string> groups;  // matched against "group:NAME" entries
  std::string via;                  // "unix", "token" or "" (anonymous)
  std::string token_id;             // the token's id when via == "token"
  // The server's own user (on the Unix socket or with a token) or root on the socket: always an
  // admin, so that a fresh machine with no platform file can be administered at all.
  bool local_admin = false;

  bool signed_in() const { return !via.empty(); }
  policy::Caller AsCaller() const { return {user, groups}; }
};

// Ordered: each role may do everything the ones before it may.
enum class Role { kNone = 0, kViewer = 1, kResearcher = 2, kAdmin = 3 };
const char* RoleName(Role role);

// Whether `who` is named by a member list ("*", a user name, or "group:NAME").
bool Matches(const std::vector<std::string>& members, const Identity& who);

bool IsAdmin(const policy::Platform& platform, const Identity& who);
// Admins and platform-wide viewers read everything.
bool IsPlatformViewer(const policy::Platform& platform, const Identity& who);
// The caller's role in `workspace` (platform-wide roles included). Anonymous callers have none.
Role WorkspaceRole(const policy::Platform& platform, const Identity& who,
                   std::string_view workspace);

// A token user's groups: those the token was issued with plus those the platform declares.
std::vector<std::string> GroupsOf(const policy::Platform& platform, std::string_view user,
                                  std::vector<std::string> token_groups);

// A new API token: "tau_" and 43 base64url characters (256 bits from the kernel's CSPRNG).
Result<std::string> NewToken();
// What the store keeps: SHA-256, hex. The token's 256 random bits make a salt or a slow hash
// pointless: there is nothing to guess.
std::string TokenDigest(std::string_view token);
// The id shown in listings and audit records: the digest's first 12 characters.
std::string TokenId(std::string_view digest);

}  // namespace tau::auth
