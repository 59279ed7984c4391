#include "cli/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>

#include "evidence/evidence.h"

namespace tau::cli {

namespace {

constexpr char kGlyphs[] = "*ox+#@%&=~abcdefghijklmnopqrstuvwxyz";

std::string Trimmed(std::string line) {
  line.erase(line.find_last_not_of(' ') + 1);
  return line;
}

// Where `v` of [lo, hi] falls among `cells` cells (the middle one when the range is a point).
int Cell(double v, double lo, double hi, int cells) {
  if (hi <= lo) return cells / 2;
  return static_cast<int>(std::lround((v - lo) / (hi - lo) * (cells - 1)));
}

}  // namespace

char PlotGlyph(size_t i) { return kGlyphs[i % (sizeof kGlyphs - 1)]; }

std::vector<std::string> PlotCurves(const std::vector<PlotCurve>& curves, int width, int height) {
  std::optional<double> xmin, xmax, ymin, ymax;
  for (const PlotCurve& c : curves)
    for (const auto& [x, y] : c.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(x, xmin.value_or(x));
      xmax = std::max(x, xmax.value_or(x));
      ymin = std::min(y, ymin.value_or(y));
      ymax = std::max(y, ymax.value_or(y));
    }
  if (!xmin) return {};
  const int rows = std::max(height, 3);
  // Rows count down from the top; a flat curve lies on the middle row.
  const bool flat = *ymax <= *ymin;
  auto row_of = [&](double y) { return flat ? rows / 2 : rows - 1 - Cell(y, *ymin, *ymax, rows); };
  std::vector<std::string> ylabels(rows);
  if (flat) {
    ylabels[rows / 2] = evidence::FormatValue(*ymin);
  } else {
    ylabels[0] = evidence::FormatValue(*ymax);
    ylabels[rows - 1] = evidence::FormatValue(*ymin);
    const int mid = rows / 2;  // labelled with the value its row stands for
    if (rows >= 5) ylabels[mid] = evidence::FormatValue(*ymax - (*ymax - *ymin) * mid / (rows - 1));
  }
  size_t label_width = 0;
  for (const std::string& l : ylabels) label_width = std::max(label_width, l.size());
  const int cols = std::max(width - static_cast<int>(label_width) - 2, 10);

  std::vector<std::string> grid(rows, std::string(cols, ' '));
  for (size_t i = 0; i < curves.size(); ++i) {
    // The mean y of the points in each column, then straight lines between filled columns.
    std::map<int, std::pair<double, int>> sums;
    for (const auto& [x, y] : curves[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      auto& s = sums[Cell(x, *xmin, *xmax, cols)];
      s.first += y;
      s.second += 1;
    }
    // A drop of more than a row from one column to the next is drawn as a vertical run, its upper
    // half in the first column and its lower half in the second, so that a steep curve stays
    // one line.
    std::optional<std::pair<int, double>> prev;
    int last_row = -1;
    for (const auto& [col, s] : sums) {
      const double y = s.first / s.second;
      const int from = prev ? prev->first + 1 : col;
      for (int c = from; c <= col; ++c) {
        const double t = prev ? static_cast<double>(c - prev->first) / (col - prev->first) : 1;
        const int r = row_of(prev ? prev->second + t * (y - prev->second) : y);
        grid[r][c] = PlotGlyph(i);
        if (last_row >= 0 && c > 0) {
          const int dir = r > last_row ? 1 : -1;
          for (int k = last_row + dir; k != r && std::abs(r - last_row) > 1; k += dir)
            grid[k][std::abs(k - last_row) <= std::abs(r - last_row) / 2 ? c - 1 : c] =
                PlotGlyph(i);
        }
        last_row = r;
      }
      prev = {col, y};
    }
  }

  std::vector<std::string> out;
  for (int r = 0; r < rows; ++r) {
    std::string label = ylabels[r];
    out.push_back(Trimmed(std::string(label_width - label.size(), ' ') + label + " |" + grid[r]));
  }
  const std::string pad(label_width + 1, ' ');
  out.push_back(pad + "+" + std::string(cols, '-'));
  const std::string left = evidence::FormatValue(*xmin), right = evidence::FormatValue(*xmax);
  std::string axis = pad + " ";
  if (*xmax > *xmin) {
    axis += left;
    const size_t end = pad.size() + 1 + cols;
    axis += std::string(std::max<size_t>(end - axis.size() - right.size(), 1), ' ') + right;
  } else {
    axis += std::string(cols / 2, ' ') + left;  // under the one column drawn
  }
  out.push_back(axis);
  for (size_t i = 0; i < curves.size(); ++i)
    out.push_back(Trimmed(std::string("  ") + PlotGlyph(i) + " " + curves[i].label));
  return out;
}

}  // namespace tau::cli
