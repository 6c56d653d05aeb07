#include "tuner/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace strata {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

struct Point {
  double x, y;
  const char* color;
  bool ring;  // drawn as a ring (the chosen plan)
  std::string title;
};

// One panel: axes with ticks, the points, and optional guide lines, in a box at (left, top).
class Panel {
 public:
  Panel(double left, double top, double width, double height, bool log_x)
      : left_(left), top_(top), w_(width), h_(height), log_x_(log_x) {}

  void Fit(const std::vector<Point>& pts, double min_y_span) {
    x0_ = y0_ = INFINITY;
    x1_ = y1_ = -INFINITY;
    for (const Point& p : pts) {
      x0_ = std::min(x0_, X(p.x));
      x1_ = std::max(x1_, X(p.x));
      y0_ = std::min(y0_, p.y);
      y1_ = std::max(y1_, p.y);
    }
    if (pts.empty()) x0_ = y0_ = 0, x1_ = y1_ = 1;
    Pad(&x0_, &x1_, 1e-9);
    Pad(&y0_, &y1_, min_y_span);
  }
  void IncludeY(double y) {
    y0_ = std::min(y0_, y);
    y1_ = std::max(y1_, y);
    Pad(&y0_, &y1_, 0);
  }
  void Square() {  // one range on both axes (for a linear x)
    const double lo = std::min(x0_, y0_), hi = std::max(x1_, y1_);
    x0_ = y0_ = lo;
    x1_ = y1_ = hi;
  }

  double Sx(double x) const { return left_ + (X(x) - x0_) / (x1_ - x0_) * w_; }
  double Sy(double y) const { return top_ + h_ - (y - y0_) / (y1_ - y0_) * h_; }
  double XMin() const { return log_x_ ? std::pow(10.0, x0_) : x0_; }
  double XMax() const { return log_x_ ? std::pow(10.0, x1_) : x1_; }

  std::string Axes(const std::string& title, const std::string& xlabel,
                   const std::string& ylabel) const {
    std::string s;
    s += "<rect x='" + Num(left_) + "' y='" + Num(top_) + "' width='" + Num(w_) + "' height='" +
         Num(h_) + "' fill='none' stroke='#444'/>\n";
    s += "<text x='" + Num(left_ + w_ / 2) + "' y='" + Num(top_ - 12) +
         "' text-anchor='middle' font-weight='bold'>" + Escape(title) + "</text>\n";
    s += "<text x='" + Num(left_ + w_ / 2) + "' y='" + Num(top_ + h_ + 36) +
         "' text-anchor='middle'>" + Escape(xlabel) + "</text>\n";
    s += "<text transform='translate(" + Num(left_ - 48) + "," + Num(top_ + h_ / 2) +
         ") rotate(-90)' text-anchor='middle'>" + Escape(ylabel) + "</text>\n";
    for (int i = 0; i <= 4; ++i) {
      const double fx = x0_ + (x1_ - x0_) * i / 4, fy = y0_ + (y1_ - y0_) * i / 4;
      const double vx = log_x_ ? std::pow(10.0, fx) : fx;
      const double px = left_ + w_ * i / 4, py = top_ + h_ - h_ * i / 4;
      s += "<line x1='" + Num(px) + "' y1='" + Num(top_ + h_) + "' x2='" + Num(px) + "' y2='" +
           Num(top_ + h_ + 5) + "' stroke='#444'/>";
      s += "<text x='" + Num(px) + "' y='" + Num(top_ + h_ + 18) + "' text-anchor='middle'>" +
           Num(vx) + "</text>\n";
      s += "<line x1='" + Num(left_ - 5) + "' y1='" + Num(py) + "' x2='" + Num(left_) + "' y2='" +
           Num(py) + "' stroke='#444'/>";
      s += "<text x='" + Num(left_ - 8) + "' y='" + Num(py + 4) + "' text-anchor='end'>" + Num(fy) +
           "</text>\n";
    }
    return s;
  }

  std::string Line(double xa, double ya, double xb, double yb, const char* color,
                   bool dashed) const {
    return "<line x1='" + Num(Sx(xa)) + "' y1='" + Num(Sy(ya)) + "' x2='" + Num(Sx(xb)) + "' y2='" +
           Num(Sy(yb)) + "' stroke='" + color + "'" + (dashed ? " stroke-dasharray='5,4'" : "") +
           "/>\n";
  }

  std::string Points(const std::vector<Point>& pts) const {
    std::string s;
    for (const Point& p : pts)
      s += "<circle cx='" + Num(Sx(p.x)) + "' cy='" + Num(Sy(p.y)) + "' r='" +
           (p.ring ? "7" : "4") + "' " +
           (p.ring ? std::string("fill='none' stroke='") + p.color + "' stroke-width='2'"
                   : std::string("fill='") + p.color + "' fill-opacity='0.75'") +
           "><title>" + Escape(p.title) + "</title></circle>\n";
    return s;
  }

 private:
  double X(double x) const { return log_x_ ? std::log10(std::max(x, 1e-12)) : x; }
  static void Pad(double* lo, double* hi, double min_span) {
    double span = *hi - *lo;
    if (span < min_span) {
      const double mid = (*lo + *hi) / 2;
      *lo = mid - min_span / 2;
      *hi = mid + min_span / 2;
      span = min_span;
    }
    if (span <= 0) span = std::max(std::fabs(*lo), 1.0);
    *lo -= span * 0.08;
    *hi += span * 0.08;
  }

  double left_, top_, w_, h_;
  bool log_x_;
  double x0_ = 0, x1_ = 1, y0_ = 0, y1_ = 1;
};

}  // namespace

std::string TunePlotSvg(const TuneReport& r, double max_ppl_loss) {
  constexpr const char* kChosen = "#1f77b4";
  constexpr const char* kCheck = "#ff7f0e";
  constexpr const char* kWithin = "#2ca02c";
  constexpr const char* kOutside = "#d62728";
  // Predicted and measured step time (ms) of every plan that ran.
  std::vector<Point> speed;
  for (const TunedChoice& c : r.choices) {
    const std::string where =
        "batch " + std::to_string(c.batch) + ", context " + std::to_string(c.context) + ": ";
    auto ms = [&](double tps) { return tps > 0 ? 1e3 * c.batch / tps : 0; };
    if (c.measured_tokens_per_second > 0)
      speed.push_back({ms(c.predicted.tokens_per_second), ms(c.measured_tokens_per_second), kChosen,
                       false, where + "chosen: " + c.description});
    for (const TunedCandidate& k : c.candidates)
      if (k.measured_tokens_per_second > 0 && k.key != c.key)  // the chosen one is above
        speed.push_back({ms(k.predicted_tokens_per_second), ms(k.measured_tokens_per_second),
                         kCheck, false, where + k.key});
  }
  // Perplexity loss (%) of every measured plan by its budget (KiB a sequence).
  std::vector<Point> quality;
  for (const TunedChoice& c : r.choices)
    for (const TunedCandidate& k : c.candidates) {
      const bool chosen = c.disk && k.key == c.key;
      quality.push_back({double(k.options.budget_bytes) / 1024.0, k.ppl_loss * 100,
                         k.within_bound ? kWithin : kOutside, false,
                         "batch " + std::to_string(c.batch) + ", context " +
                             std::to_string(c.context) + ": " + k.key});
      if (chosen)
        quality.push_back(
            {double(k.options.budget_bytes) / 1024.0, k.ppl_loss * 100, kChosen, true, "chosen"});
    }

  constexpr double kW = 1000, kH = 460;
  std::string s = "<svg xmlns='http://www.w3.org/2000/svg' width='" + Num(kW) + "' height='" +
                  Num(kH) + "' font-family='sans-serif' font-size='12'>\n";
  s += "<rect width='100%' height='100%' fill='white'/>\n";

  Panel a(80, 50, 360, 330, false);
  a.Fit(speed, 0.1);
  a.Square();
  s += a.Axes("Decode step: predicted vs measured", "predicted step (ms)", "measured step (ms)");
  // y = x and the +-25% band.
  const double lo = a.XMin(), hi = a.XMax();
  s += a.Line(lo, lo, hi, hi, "#888", false);
  s += a.Line(lo, lo * 1.25, hi / 1.25, hi, "#bbb", true);
  s += a.Line(lo * 1.25, lo, hi, hi / 1.25, "#bbb", true);
  s += a.Points(speed);
  if (speed.empty()) s += "<text x='260' y='215' text-anchor='middle'>no plan ran</text>\n";
  s += "<circle cx='90' cy='420' r='4' fill='" + std::string(kChosen) +
       "'/><text x='100' y='424'>chosen plan</text>";
  s += "<circle cx='200' cy='420' r='4' fill='" + std::string(kCheck) +
       "'/><text x='210' y='424'>check runs (--validate)</text>";
  s += "<text x='90' y='444'>dashed: 25% off</text>\n";

  Panel b(590, 50, 360, 330, true);
  b.Fit(quality, 0.5);
  b.IncludeY(max_ppl_loss * 100);
  b.IncludeY(0);
  s += b.Axes("Quality by KV budget", "budget a sequence (KiB, log scale)",
              "perplexity loss vs full KV (%)");
  s += b.Line(b.XMin(), max_ppl_loss * 100, b.XMax(), max_ppl_loss * 100, kOutside, true);
  s += b.Points(quality);
  if (quality.empty())
    s += "<text x='770' y='215' text-anchor='middle'>no disk plan measured</text>\n";
  s += "<circle cx='600' cy='420' r='4' fill='" + std::string(kWithin) +
       "'/><text x='610' y='424'>within the bound</text>";
  s += "<circle cx='730' cy='420' r='4' fill='" + std::string(kOutside) +
       "'/><text x='740' y='424'>outside</text>";
  s += "<circle cx='810' cy='420' r='7' fill='none' stroke='" + std::string(kChosen) +
       "' stroke-width='2'/><text x='822' y='424'>chosen</text>";
  s += "<text x='600' y='444'>dashed: --max-ppl-loss</text>\n";
  s += "</svg>\n";
  return s;
}

}  // namespace strata
