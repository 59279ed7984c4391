#include "cli/plot.h"

#include <cmath>

#include <gtest/gtest.h>

namespace tau::cli {
namespace {

TEST(PlotTest, TwoCurvesCrossingGiveTheseExactRows) {
  std::vector<PlotCurve> curves = {{"A", {{0, 4}, {1, 3}, {2, 2}, {3, 1}, {4, 0}}},
                                   {"B", {{0, 0}, {4, 4}}}};
  // 20 columns: "4 |" then 17 of plot; 5 rows labelled 4, 2 and 0; B, drawn later, shows where
  // they meet. The columns between B's two points are filled in along a straight line.
  std::vector<std::string> want = {
      "4 |***           ooo",  //
      "  |   ****   oooo",     //
      "2 |      oooo*",        //
      "  |  oooo     ****",    //
      "0 |oo             **",  //
      "  +-----------------",  //
      "   0               4",  //
      "  * A",                 //
      "  o B",
  };
  EXPECT_EQ(PlotCurves(curves, 20, 5), want);
}

TEST(PlotTest, AFlatCurveLiesOnTheMiddleRowAndNonFinitePointsAreLeftOut) {
  std::vector<PlotCurve> curves = {{"flat", {{0, 1}, {5, std::nan("")}, {10, 1}}}};
  std::vector<std::string> want = {
      "  |", "1 |***********", "  |", "  +-----------", "   0        10", "  * flat",
  };
  EXPECT_EQ(PlotCurves(curves, 14, 3), want);
}

TEST(PlotTest, PointsSharingAColumnAreAveraged) {
  // Steps 0 and 1 fall into column 0 of a 10-column plot spanning 0..90: their mean (2) is drawn.
  std::vector<PlotCurve> curves = {{"c", {{0, 0}, {1, 4}, {90, 2}}}};
  std::vector<std::string> rows = PlotCurves(curves, 13, 3);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0], "4 |");  // no column holds a 4 of its own
  EXPECT_EQ(rows[1], "  |**********");
  EXPECT_EQ(rows[2], "0 |");
}

TEST(PlotTest, ASteepDropIsOneUnbrokenLine) {
  // 10 columns, 9 rows: the first column to the second falls 8 rows, half drawn in each.
  std::vector<PlotCurve> curves = {{"s", {{0, 8}, {1, 0}, {9, 0}}}};
  std::vector<std::string> want = {
      "8 |*",   //
      "  |*",   //
      "  |*",   //
      "  |*",   //
      "4 |*",   //
      "  | *",  //
      "  | *",  //
      "  | *",  //
      "0 | *********",
  };
  std::vector<std::string> rows = PlotCurves(curves, 13, 9);
  rows.resize(9);  // the plot, without the axis and the legend
  EXPECT_EQ(rows, want);
}

TEST(PlotTest, NothingToDrawIsNoLines) {
  EXPECT_TRUE(PlotCurves({}, 80, 10).empty());
  EXPECT_TRUE(PlotCurves({{"x", {{0, std::nan("")}}}}, 80, 10).empty());
}

TEST(PlotTest, GlyphsDifferThenRepeat) {
  EXPECT_EQ(PlotGlyph(0), '*');
  EXPECT_EQ(PlotGlyph(1), 'o');
  EXPECT_NE(PlotGlyph(10), PlotGlyph(0));
  EXPECT_EQ(PlotGlyph(36), PlotGlyph(0));
}

}  // namespace
}  // namespace tau::cli
