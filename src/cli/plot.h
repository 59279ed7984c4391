// Curves drawn as text, for `tau compare --metric NAME --plot`: one glyph per curve, no colour,
// so that it reads the same in a terminal, a log file or a CI page (docs/experiments.md).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace tau::cli {

struct PlotCurve {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (x, y), sorted by x
};

// The glyph of the i-th curve: "*ox+#@%&=~", then letters; past those they repeat.
char PlotGlyph(size_t i);

// The chart as lines: `height` rows of plot (at least 3; the top, middle and bottom rows labelled
// with their y), an x axis with the x range under it, all `width` columns wide (at least 10 for
// the plot itself), then one legend line per curve ("  GLYPH LABEL"). Each curve's points fall into
// the column of their x (the mean of those sharing one), and the columns between two points are
// filled in by linear interpolation; where curves meet, the later curve's glyph shows. Non-finite
// points are left out. No lines at all when no curve has a finite point. Trailing spaces are
// trimmed.
std::vector<std::string> PlotCurves(const std::vector<PlotCurve>& curves, int width, int height);

}  // namespace tau::cli
