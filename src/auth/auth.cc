#include "auth/auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/hash.h"
#include "common/strings.h"

namespace tau::auth {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kNone:
      return "none";
    case Role::kViewer:
      return "viewer";
    case Role::kResearcher:
      return "researcher";
    case Role::kAdmin:
      return "admin";
  }
  return "none";
}

bool Matches(const std::vector<std::string>& members, const Identity& who) {
  if (!who.signed_in()) return false;
  for (const std::string& m : members) {
    if (m == policy::kEveryone || (!who.user.empty() && m == who.user)) return true;
    if (StartsWith(m, "group:") &&
        std::find(who.groups.begin(), who.groups.end(), m.substr(6)) != who.groups.end())
      return true;
  }
  return false;
}

bool IsAdmin(const policy::Platform& platform, const Identity& who) {
  return who.signed_in() && (who.local_admin || Matches(platform.access.admins, who));
}

bool IsPlatformViewer(const policy::Platform& platform, const Identity& who) {
  return IsAdmin(platform, who) || Matches(platform.access.viewers, who);
}

Role WorkspaceRole(const policy::Platform& platform, const Identity& who,
                   std::string_view workspace) {
  if (!who.signed_in()) return Role::kNone;
  if (IsAdmin(platform, who)) return Role::kAdmin;
  const policy::Workspace* w = platform.FindWorkspace(workspace);
  if (w != nullptr && Matches(w->members, who)) return Role::kResearcher;
  if (Matches(platform.access.viewers, who)) return Role::kViewer;
  if (w != nullptr && Matches(w->viewers, who)) return Role::kViewer;
  return Role::kNone;
}

std::vector<std::string> GroupsOf(const policy::Platform& platform, std::string_view user,
                                  std::vector<std::string> token_groups) {
  if (const policy::User* u = platform.FindUser(user))
    token_groups.insert(token_groups.end(), u->groups.begin(), u->groups.end());
  std::sort(token_groups.begin(), token_groups.end());
  token_groups.erase(std::unique(token_groups.begin(), token_groups.end()), token_groups.end());
  return token_groups;
}

Result<std::string> NewToken() {
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string token = "tau_";
  // 32 bytes = 256 bits -> 43 six-bit characters (the last one carries 4 bits).
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      token += kAlphabet[(acc >> bits) & 63];
    }
  }
  if (bits > 0) token += kAlphabet[(acc << (6 - bits)) & 63];
  return token;
}

std::string TokenDigest(std::string_view token) { return Sha256Hex(token); }

std::string TokenId(std::string_view digest) { return std::string(digest.substr(0, 12)); }

}  // namespace tau::auth
