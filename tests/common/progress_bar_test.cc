#include "common/progress_bar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace strata {
namespace {

std::string Contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

TEST(ProgressBarTest, RenderShowsDoneTotalAndTheEtaFromTheRateSoFar) {
  EXPECT_EQ(ProgressBar::Render("quality", 0, 8, 0),
            "quality [........................] 0/8 0s, ETA --");
  // 2 of 8 in 30 s: 6 left at 15 s each.
  EXPECT_EQ(ProgressBar::Render("quality", 2, 8, 30),
            "quality [######..................] 2/8 30s, ETA 1m30s");
  EXPECT_EQ(ProgressBar::Render("quality", 8, 8, 100),
            "quality [########################] 8/8 1m40s");
  // Out of range counts are clamped, not drawn past the bar.
  EXPECT_EQ(ProgressBar::Render("x", 12, 8, 1), "x [########################] 8/8 1s");
  EXPECT_EQ(ProgressBar::Duration(3725), "1h02m");
  EXPECT_EQ(ProgressBar::Duration(59.4), "59s");
}

TEST(ProgressBarTest, OffATerminalOnlyTheLogLinesAreWritten) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(f, /*draw=*/false);
    bar.Update("profiling", 1, 4);
    bar.Log("read 4 KiB at depth 1");
    bar.Update("profiling", 4, 4);
  }
  EXPECT_EQ(Contents(f), "read 4 KiB at depth 1\n");
  std::fclose(f);
}

TEST(ProgressBarTest, OnATerminalTheBarStaysBelowTheLogAndIsClearedAtTheEnd) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  double t = 100;
  {
    ProgressBar bar(f, /*draw=*/true, [&] { return t; });
    bar.Update("profiling", 0, 4);
    t = 110;
    bar.Update("profiling", 1, 4);
    bar.Log("line");
    t = 200;
    bar.Update("quality", 0, 2);  // a new phase restarts the clock
    bar.Update("quality", 2, 2);  // done: cleared, and log lines no longer bring it back
    bar.Log("after");
  }
  const std::string s = Contents(f);
  EXPECT_NE(s.find("profiling [......"), std::string::npos) << s;
  EXPECT_NE(s.find("1/4 10s, ETA 30s"), std::string::npos) << s;
  // The log line is printed on a cleared line, then the bar comes back under it.
  EXPECT_NE(s.find("\r\033[Kline\n\r\033[Kprofiling"), std::string::npos) << s;
  EXPECT_NE(s.find("quality [........................] 0/2 0s"), std::string::npos) << s;
  const std::string tail = "ETA --\r\033[Kafter\n";
  ASSERT_GE(s.size(), tail.size());
  EXPECT_EQ(s.substr(s.size() - tail.size()), tail);
  std::fclose(f);
}

}  // namespace
}  // namespace strata
