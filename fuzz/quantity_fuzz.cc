// Quantity::Parse and ToString on arbitrary bytes (the Kubernetes quantity grammar).
//
// Besides "no crash or UB" (the parser works in __int128 and must not overflow it), it checks:
//   * exactness against a slow reference: the value computed with arbitrary-precision integers,
//     rounded up to a milli-unit; a value that fits in int64 milli-units must parse to exactly
//     that, and one that does not must be refused;
//   * round trip: ToString() parses back to the same quantity and is its own canonical form;
//   * ordering: for the input's leading number N, N m <= N <= N k <= N M ..., each binary suffix at
//     least its decimal namesake, and the exponent forms equal the suffixes they stand for.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/quantity.h"
#include "fuzz_check.h"

namespace {

using tau::Quantity;

// A non-negative integer in base 1e9 limbs, least significant first; just what the reference needs.
class BigUint {
 public:
  explicit BigUint(uint32_t v = 0) {
    if (v) limbs_.push_back(v);
  }
  void MulAdd(uint32_t mul, uint32_t add) {
    uint64_t carry = add;
    for (uint32_t& limb : limbs_) {
      uint64_t x = uint64_t{limb} * mul + carry;
      limb = static_cast<uint32_t>(x % kBase);
      carry = x / kBase;
    }
    while (carry) {
      limbs_.push_back(static_cast<uint32_t>(carry % kBase));
      carry /= kBase;
    }
  }
  // Divides by `div`; returns whether there was a remainder.
  bool Div(uint32_t div) {
    uint64_t rem = 0;
    for (size_t i = limbs_.size(); i-- > 0;) {
      uint64_t x = rem * kBase + limbs_[i];
      limbs_[i] = static_cast<uint32_t>(x / div);
      rem = x % div;
    }
    while (!limbs_.empty() && limbs_.back() == 0) limbs_.pop_back();
    return rem != 0;
  }
  // The value when it fits in int64_t.
  std::optional<int64_t> ToInt64() const {
    if (limbs_.size() > 3) return std::nullopt;
    unsigned __int128 v = 0;
    for (size_t i = limbs_.size(); i-- > 0;) v = v * kBase + limbs_[i];
    if (v > static_cast<unsigned __int128>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(v);
  }

 private:
  static constexpr uint64_t kBase = 1'000'000'000;
  std::vector<uint32_t> limbs_;
};

struct Reference {
  bool fits = false;  // the value fits in int64 milli-units
  int64_t milli = 0;
};

// The grammar documented in quantity.h, evaluated exactly. nullopt for text outside the grammar
// and outside the precision the parser documents: exponents beyond +-30, more than 18 digits after
// the point, more than 20 significant digits.
std::optional<Reference> ReferenceParse(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && s[i] == '+') ++i;
  BigUint value;
  int fraction_digits = 0, digits = 0, significant = 0;
  bool dot = false;
  for (; i < s.size(); ++i) {
    if (s[i] == '.' && !dot) {
      dot = true;
    } else if (s[i] >= '0' && s[i] <= '9') {
      value.MulAdd(10, static_cast<uint32_t>(s[i] - '0'));
      ++digits;
      if (significant > 0 || s[i] != '0') ++significant;
      if (dot) ++fraction_digits;
    } else {
      break;
    }
  }
  if (digits == 0 || fraction_digits > 18 || significant > 20) return std::nullopt;
  std::string_view rest = s.substr(i);
  int pow10 = 3;  // to milli-units
  int pow1024 = 0;
  if (rest.size() > 1 && (rest[0] == 'e' || rest[0] == 'E')) {
    size_t j = 1;
    bool negative = false;
    if (rest[j] == '+' || rest[j] == '-') negative = rest[j++] == '-';
    if (j >= rest.size()) return std::nullopt;
    int exp = 0;
    for (; j < rest.size(); ++j) {
      if (rest[j] < '0' || rest[j] > '9' || exp > 30) return std::nullopt;
      exp = exp * 10 + (rest[j] - '0');
    }
    if (exp > 30) return std::nullopt;
    pow10 += negative ? -exp : exp;
  } else {
    static const struct {
      std::string_view text;
      int pow10, pow1024;
    } kSuffixes[] = {{"", 0, 0},   {"m", -3, 0}, {"k", 3, 0},  {"M", 6, 0},  {"G", 9, 0},
                     {"T", 12, 0}, {"P", 15, 0}, {"E", 18, 0}, {"Ki", 0, 1}, {"Mi", 0, 2},
                     {"Gi", 0, 3}, {"Ti", 0, 4}, {"Pi", 0, 5}, {"Ei", 0, 6}};
    bool found = false;
    for (const auto& suffix : kSuffixes) {
      if (suffix.text == rest) {
        pow10 += suffix.pow10;
        pow1024 = suffix.pow1024;
        found = true;
      }
    }
    if (!found) return std::nullopt;
  }
  for (int k = 0; k < pow1024; ++k) value.MulAdd(1024, 0);
  int shift = pow10 - fraction_digits;
  for (; shift > 0; --shift) value.MulAdd(10, 0);
  bool remainder = false;
  for (; shift < 0; ++shift) remainder |= value.Div(10);
  if (remainder) value.MulAdd(1, 1);  // round up to the next milli-unit
  Reference ref;
  if (auto v = value.ToInt64()) {
    ref.fits = true;
    ref.milli = *v;
  }
  return ref;
}

std::optional<int64_t> Milli(const std::string& text) {
  auto q = Quantity::Parse(text);
  if (!q.ok()) return std::nullopt;
  return q->milli();
}

// For the leading number of the input, the suffixes must order as their multipliers do.
void CheckOrdering(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && n < 64 &&
         ((text[n] >= '0' && text[n] <= '9') || text[n] == '.' || (n == 0 && text[n] == '+')))
    ++n;
  std::string number(text.substr(0, n));
  if (!Milli(number)) return;
  // Each at most the next; a value refused as too large only ever follows accepted ones.
  const char* chain[] = {"m", "", "k", "M", "G", "T", "P", "E"};
  std::optional<int64_t> previous;
  for (const char* suffix : chain) {
    std::optional<int64_t> v = Milli(number + suffix);
    if (!v) break;
    if (previous) TAU_FUZZ_CHECK(*previous <= *v);
    previous = v;
  }
  const char* binary[][2] = {{"k", "Ki"}, {"M", "Mi"}, {"G", "Gi"},
                             {"T", "Ti"}, {"P", "Pi"}, {"E", "Ei"}};
  for (const auto& [decimal, power] : binary) {
    std::optional<int64_t> d = Milli(number + decimal), b = Milli(number + power);
    if (d && b) TAU_FUZZ_CHECK(*d <= *b);
    if (b) TAU_FUZZ_CHECK(d.has_value());
  }
  const char* same[][2] = {{"e-3", "m"}, {"e0", ""}, {"e3", "k"}, {"E6", "M"}, {"e+9", "G"}};
  for (const auto& [exponent, suffix] : same) {
    TAU_FUZZ_CHECK(Milli(number + exponent) == Milli(number + suffix));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 512) return 0;  // quantities are short; long inputs only slow the reference down
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = Quantity::Parse(text);
  if (parsed.ok()) {
    Quantity q = *parsed;
    TAU_FUZZ_CHECK(q.milli() >= 0);
    std::string canonical = q.ToString();
    auto back = Quantity::Parse(canonical);
    TAU_FUZZ_CHECK(back.ok() && *back == q);
    TAU_FUZZ_CHECK(back->ToString() == canonical);
    // Whole units, rounded up; in 128 bits because the product may not fit int64.
    __int128 ceil_milli = static_cast<__int128>(q.CeilUnits()) * 1000;
    TAU_FUZZ_CHECK(ceil_milli >= q.milli() && ceil_milli - q.milli() < 1000);
  } else {
    TAU_FUZZ_CHECK(parsed.status().message().find("invalid quantity") != std::string::npos);
  }
  if (std::optional<Reference> ref = ReferenceParse(text)) {
    if (ref->fits) {
      TAU_FUZZ_CHECK(parsed.ok());
      TAU_FUZZ_CHECK(parsed->milli() == ref->milli);
    } else {
      TAU_FUZZ_CHECK(!parsed.ok());
    }
  }
  CheckOrdering(text);
  return 0;
}
