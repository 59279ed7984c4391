// Kubernetes resource quantities ("500m", "64Gi", "1.5", "2e3"), held exactly as milli-units.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tau {

class Quantity {
 public:
  Quantity() = default;
  static Quantity FromMilli(int64_t milli) { return Quantity(milli); }
  static Quantity FromUnits(int64_t units) { return Quantity(units * 1000); }

  // Parses the Kubernetes quantity grammar: a decimal number with an optional binary suffix
  // (Ki Mi Gi Ti Pi Ei), decimal suffix (m k M G T P E) or exponent (e3, E-2). Fractions below one
  // milli-unit round up, as Kubernetes does. Negative values and values beyond about 9.2e15 units
  // are errors. Unlike Kubernetes, digits past the 18th after the point are ignored, and a number
  // written with more than 20 significant digits may be refused as too large.
  static Result<Quantity> Parse(std::string_view text);

  int64_t milli() const { return milli_; }
  // Whole units, rounded up (a request of 1500m cpu needs 2 whole cpus).
  // (milli_ + 999) / 1000 would overflow near the largest quantity.
  int64_t CeilUnits() const { return milli_ / 1000 + (milli_ % 1000 > 0 ? 1 : 0); }
  bool IsZero() const { return milli_ == 0; }

  // Canonical form: "500m", "2", "64Gi" when it is a whole number of a binary power, else units.
  std::string ToString() const;

  friend bool operator==(Quantity a, Quantity b) { return a.milli_ == b.milli_; }
  friend auto operator<=>(Quantity a, Quantity b) { return a.milli_ <=> b.milli_; }
  Quantity operator+(Quantity o) const { return Quantity(milli_ + o.milli_); }
  Quantity operator-(Quantity o) const { return Quantity(milli_ - o.milli_); }
  Quantity& operator+=(Quantity o) {
    milli_ += o.milli_;
    return *this;
  }
  Quantity& operator-=(Quantity o) {
    milli_ -= o.milli_;
    return *this;
  }

 private:
  explicit Quantity(int64_t milli) : milli_(milli) {}
  int64_t milli_ = 0;
};

}  // namespace tau
