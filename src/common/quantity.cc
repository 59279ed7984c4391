#include "common/quantity.h"

#include <fmt/format.h>

#include <cctype>

namespace tau {
namespace {

constexpr __int128 kMaxMilli = static_cast<__int128>(INT64_MAX);
constexpr __int128 kMaxInt128 = static_cast<__int128>(~static_cast<unsigned __int128>(0) >> 1);

struct Suffix {
  std::string_view text;
  __int128 numerator;  // multiplier in milli-units, as numerator / denominator
  __int128 denominator;
};

__int128 Pow(__int128 base, int exp) {
  __int128 r = 1;
  for (int i = 0; i < exp; ++i) r *= base;
  return r;
}

bool LookupSuffix(std::string_view s, __int128* num, __int128* den) {
  static const Suffix kSuffixes[] = {
      {"Ki", Pow(1024, 1) * 1000, 1},
      {"Mi", Pow(1024, 2) * 1000, 1},
      {"Gi", Pow(1024, 3) * 1000, 1},
      {"Ti", Pow(1024, 4) * 1000, 1},
      {"Pi", Pow(1024, 5) * 1000, 1},
      {"Ei", Pow(1024, 6) * 1000, 1},
      {"m", 1, 1},
      {"", 1000, 1},
      {"k", Pow(10, 6), 1},
      {"M", Pow(10, 9), 1},
      {"G", Pow(10, 12), 1},
      {"T", Pow(10, 15), 1},
      {"P", Pow(10, 18), 1},
      {"E", Pow(10, 21), 1},
  };
  for (const Suffix& suffix : kSuffixes) {
    if (suffix.text == s) {
      *num = suffix.numerator;
      *den = suffix.denominator;
      return true;
    }
  }
  return false;
}

}  // namespace

Result<Quantity> Quantity::Parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument(
        fmt::format("invalid quantity '{}': {} (examples: 500m, 2, 1.5, 64Gi)", text, why));
  };
  if (text.empty()) return bad("empty");
  size_t i = 0;
  if (text[i] == '+') ++i;
  if (i < text.size() && text[i] == '-') return bad("must not be negative");
  // Mantissa: digits with an optional fraction, kept as an exact integer and a power-of-ten scale.
  __int128 mantissa = 0;
  int fraction_digits = 0;
  bool any_digit = false;
  bool in_fraction = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c == '.' && !in_fraction) {
      in_fraction = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    any_digit = true;
    if (mantissa > kMaxMilli * 10) return bad("too large");
    if (in_fraction) {
      if (fraction_digits >= 18) continue;  // beyond any precision we keep
      ++fraction_digits;
    }
    mantissa = mantissa * 10 + (c - '0');
  }
  if (!any_digit) return bad("expected a number");
  std::string_view rest = text.substr(i);
  __int128 num = 0, den = 1;
  int scale = fraction_digits;  // the value is mantissa * num / 10^scale milli-units
  if (!rest.empty() && (rest[0] == 'e' || rest[0] == 'E') && rest.size() > 1 &&
      (std::isdigit(static_cast<unsigned char>(rest[1])) || rest[1] == '-' || rest[1] == '+')) {
    size_t j = 1;
    bool negative = false;
    if (rest[j] == '+' || rest[j] == '-') negative = rest[j++] == '-';
    int exp = 0;
    if (j >= rest.size()) return bad("exponent has no digits");
    for (; j < rest.size(); ++j) {
      if (!std::isdigit(static_cast<unsigned char>(rest[j]))) return bad("bad exponent");
      exp = exp * 10 + (rest[j] - '0');
      if (exp > 30) return bad("exponent out of range");
    }
    if (negative) {
      num = 1000;
      scale += exp;
    } else {
      num = 1000 * Pow(10, exp);
    }
  } else if (!LookupSuffix(rest, &num, &den)) {
    return bad(fmt::format("unknown suffix '{}'", rest));
  }
  // milli = ceil(mantissa * num / 10^scale), without overflowing __int128 (mantissa < 10^21,
  // num <= 10^33). 10^scale reaches 10^48 for a negative exponent with a long fraction; num is then
  // 1000, so past 10^24 the value is a positive fraction of a milli-unit, which rounds up to one.
  if (mantissa == 0) return Quantity(0);
  if (scale > 24) return Quantity(1);
  // An overflowing product is too large: num > 1000 means scale <= 18, so the value would exceed
  // 10^20 milli-units.
  if (num > kMaxInt128 / mantissa) return bad("too large");
  __int128 product = mantissa * num;
  den *= Pow(10, scale);
  __int128 milli = product / den + (product % den != 0 ? 1 : 0);
  if (milli > kMaxMilli) return bad("too large");
  return Quantity(static_cast<int64_t>(milli));
}

std::string Quantity::ToString() const {
  if (milli_ % 1000 != 0) return fmt::format("{}m", milli_);
  int64_t units = milli_ / 1000;
  static const char* kBinary[] = {"Ei", "Pi", "Ti", "Gi", "Mi", "Ki"};
  if (units != 0) {
    for (int k = 0; k < 6; ++k) {
      int64_t factor = int64_t{1} << (10 * (6 - k));
      if (units % factor == 0) return fmt::format("{}{}", units / factor, kBinary[k]);
    }
  }
  return fmt::format("{}", units);
}

}  // namespace tau
