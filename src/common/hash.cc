// SHA-256 (FIPS 180-4) and base64 (RFC 4648), written here rather than taken from OpenSSL: linking
// libcrypto costs every tau process about 6 ms of relocations at start (measured on the project's
// machines), and tau needs only these two functions from it. Tested against the standard vectors.
#include "common/hash.h"

#include "common/files.h"
#include "common/json_text.h"

#include <fcntl.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstring>

namespace tau {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

#if defined(__x86_64__)
// The x86 SHA extensions (SHA-NI) do four rounds in a few instructions: about eight times the
// portable code's speed, which matters for the evidence record (it hashes every log, checkpoint and
// output file of a run) and for every event appended to the store. Chosen at run time: the
// instructions exist on most x86 server CPUs of the last few years, not on all.
bool HasShaNi() {
  unsigned int a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool sha = b & (1u << 29);
  return ssse3 && sse41 && sha;
}

// -1 until the first hash asks: CPUID traps to the hypervisor on a VM (about 40 us of a 1 ms
// `tau version` on the project's VMs), and many tau processes never hash anything.
std::atomic<int> g_sha_ni{-1};

bool ShaNi() {
  int v = g_sha_ni.load(std::memory_order_relaxed);
  if (v < 0) {
    v = HasShaNi() ? 1 : 0;
    g_sha_ni.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// `blocks` 64-byte blocks of `p` into `state` (a..h). The registers hold the state as ABEF and
// CDGH, the layout the round instruction wants; each group of four message words is scheduled
// from the four groups before it (sha256msg1 adds sigma0 and w[t-16], the alignr the w[t-7] terms,
// sha256msg2 sigma1).
__attribute__((target("sha,ssse3,sse4.1"))) void BlocksShaNi(uint32_t state[8],
                                                             const unsigned char* p,
                                                             size_t blocks) {
  const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  __m128i badc = _mm_shuffle_epi32(dcba, 0xB1);
  __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(badc, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, badc, 0xF0);
  for (; blocks > 0; --blocks, p += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];
    for (int i = 0; i < 16; ++i) {
      __m128i& group = w[i % 4];
      if (i < 4) {
        group = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)),
                                 byteswap);
      } else {
        // w[i-4] is `group` itself, about to be replaced.
        __m128i t7 = _mm_alignr_epi8(w[(i - 1) % 4], w[(i - 2) % 4], 4);
        group = _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(group, w[(i - 3) % 4]), t7),
                                     w[(i - 1) % 4]);
      }
      __m128i wk =
          _mm_add_epi32(group, _mm_loadu_si128(reinterpret_cast<const __m128i*>(&kK[4 * i])));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), _mm_blend_epi16(feba, dchg, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), _mm_alignr_epi8(dchg, feba, 8));
}
#endif

}  // namespace

bool UseSha256Instructions(bool use) {
#if defined(__x86_64__)
  const bool before = ShaNi();
  g_sha_ni.store(use && HasShaNi() ? 1 : 0, std::memory_order_relaxed);
  return before;
#else
  (void)use;
  return false;
#endif
}

Sha256::Sha256()
    : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::Blocks(const unsigned char* p, size_t blocks) {
#if defined(__x86_64__)
  if (ShaNi()) return BlocksShaNi(state_, p, blocks);
#endif
  for (; blocks > 0; --blocks, p += 64) Block(p);
}

void Sha256::Block(const unsigned char* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
           (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3], e = state_[4], f = state_[5],
           g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 =
        h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::Update(std::string_view data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t n = data.size();
  length_ += n;
  if (buffered_ > 0) {
    size_t take = std::min(n, sizeof buffer_ - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < sizeof buffer_) return;
    Blocks(buffer_, 1);
    buffered_ = 0;
  }
  Blocks(p, n / 64);
  p += n / 64 * 64;
  n %= 64;
  std::memcpy(buffer_, p, n);
  buffered_ = n;
}

std::string Sha256::HexDigest() {
  uint64_t bits = length_ * 8;
  unsigned char pad[72] = {0x80};
  size_t pad_len = (buffered_ < 56 ? 56 : 120) - buffered_;
  for (int i = 0; i < 8; ++i) pad[pad_len + i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
  Update(std::string_view(reinterpret_cast<const char*>(pad), pad_len + 8));
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint32_t word : state_) {
    for (int shift = 28; shift >= 0; shift -= 4) out.push_back(kHex[(word >> shift) & 15]);
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.HexDigest();
}

std::string ConfigHashOf(const nlohmann::json& canonical_spec) {
  // Member by member, as dump() writes an object: no copy of the tree to erase two keys from.
  Sha256 h;
  h.Update("{");
  bool first = true;
  if (canonical_spec.is_object()) {
    for (const auto& [key, value] : canonical_spec.items()) {
      if (key == "shape" || key == "overrides") continue;
      if (!first) h.Update(",");
      first = false;
      h.Update(JsonText(nlohmann::json(key)));
      h.Update(":");
      h.Update(JsonText(value));
    }
  }
  h.Update("}");
  return h.HexDigest();
}

namespace {
// The 32 bytes a SHA-256 hex digest spells.
std::string DigestBytes(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}
}  // namespace

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  constexpr size_t kBlock = 64;
  std::string k = key.size() > kBlock ? DigestBytes(Sha256Hex(key)) : std::string(key);
  k.resize(kBlock, '\0');
  std::string inner_pad(kBlock, '\0'), outer_pad(kBlock, '\0');
  for (size_t i = 0; i < kBlock; ++i) {
    inner_pad[i] = static_cast<char>(k[i] ^ 0x36);
    outer_pad[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  Sha256 inner;
  inner.Update(inner_pad);
  inner.Update(data);
  Sha256 outer;
  outer.Update(outer_pad);
  outer.Update(DigestBytes(inner.HexDigest()));
  return outer.HexDigest();
}

Result<std::string> Sha256File(const std::string& path) {
  Sha256 h;
  TAU_RETURN_IF_ERROR(ReadFileChunks(path, [&](std::string_view c) { h.Update(c); }));
  return h.HexDigest();
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string Base64Encode(std::string_view data) {
  std::string out;
  out.reserve(4 * ((data.size() + 2) / 3));
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t i = 0;
  for (; i + 3 <= data.size(); i += 3) {
    uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (size_t rest = data.size() - i; rest > 0) {
    uint32_t v = uint32_t{p[i]} << 16;
    if (rest == 2) v |= uint32_t{p[i + 1]} << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return InvalidArgument("invalid base64: length is not a multiple of 4");
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') return InvalidArgument("invalid base64 padding");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d = k >= 4 - pad ? 0 : value(text[i + static_cast<size_t>(k)]);
      if (d < 0) return InvalidArgument("invalid base64 character");
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

}  // namespace tau
