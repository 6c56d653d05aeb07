#include "common/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace strata {

ProgressBar::ProgressBar(std::FILE* out, bool draw, std::function<double()> now)
    : out_(out), draw_(draw), now_(std::move(now)) {
  if (!now_)
    now_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
}

ProgressBar::~ProgressBar() { Clear(); }

bool ProgressBar::IsTerminal(int fd) { return isatty(fd) == 1; }

std::string ProgressBar::Duration(double seconds) {
  const int64_t s = int64_t(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  return buf;
}

std::string ProgressBar::Render(const std::string& phase, int64_t done, int64_t total,
                                double elapsed) {
  constexpr int kWidth = 24;
  total = std::max<int64_t>(total, 1);
  done = std::clamp<int64_t>(done, 0, total);
  const int filled = int(kWidth * done / total);
  std::string bar = phase + " [" + std::string(size_t(filled), '#') +
                    std::string(size_t(kWidth - filled), '.') + "] " + std::to_string(done) + "/" +
                    std::to_string(total) + " " + Duration(elapsed);
  // The rate so far, over what is left: nothing to say before the first unit is done.
  if (done > 0 && done < total)
    bar += ", ETA " + Duration(elapsed / double(done) * double(total - done));
  else if (done == 0)
    bar += ", ETA --";
  return bar;
}

void ProgressBar::Update(const std::string& phase, int64_t done, int64_t total) {
  if (phase != phase_) {
    phase_ = phase;
    phase_start_ = now_();
  }
  done_ = done;
  total_ = total;
  // A finished phase leaves no bar behind: its log lines say what it found.
  if (done >= total)
    Clear();
  else
    Draw();
}

void ProgressBar::Log(const std::string& line) {
  Clear();
  std::fprintf(out_, "%s\n", line.c_str());
  if (!phase_.empty() && done_ < total_) Draw();
  std::fflush(out_);
}

void ProgressBar::Clear() {
  if (!draw_ || !shown_) return;
  std::fputs("\r\033[K", out_);  // back to the line's start, erase to its end
  std::fflush(out_);
  shown_ = false;
}

void ProgressBar::Draw() {
  if (!draw_) return;
  std::fprintf(out_, "\r\033[K%s", Render(phase_, done_, total_, now_() - phase_start_).c_str());
  std::fflush(out_);
  shown_ = true;
}

}  // namespace strata
