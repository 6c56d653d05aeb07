// A one-line progress bar with the phase's ETA, drawn on a terminal below the log lines a
// long command prints. Off a terminal (a pipe, a CI log) it draws nothing and only passes
// the log lines through, so captured output stays plain text.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace strata {

class ProgressBar {
 public:
  // now: seconds on a steady clock (tests give their own).
  ProgressBar(std::FILE* out, bool draw, std::function<double()> now = nullptr);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Whether `fd` is a terminal: the usual choice for `draw`.
  static bool IsTerminal(int fd);

  // `done` of `total` units of `phase`; a new phase name restarts the ETA's clock, and a
  // phase that reaches its total clears the bar.
  void Update(const std::string& phase, int64_t done, int64_t total);
  // A log line, printed above the bar.
  void Log(const std::string& line);
  // Clears the bar (the log lines stay).
  void Clear();

  // The bar's text for a phase `elapsed` seconds in: "phase [####....] 3/8 12s, ETA 20s".
  static std::string Render(const std::string& phase, int64_t done, int64_t total, double elapsed);
  // "45s", "3m05s", "1h02m".
  static std::string Duration(double seconds);

 private:
  void Draw();

  std::FILE* out_;
  bool draw_;
  std::function<double()> now_;
  std::string phase_;
  int64_t done_ = 0, total_ = 0;
  double phase_start_ = 0;
  bool shown_ = false;
};

}  // namespace strata
