#include "runtime/engine/text_stream.h"

#include <algorithm>

namespace strata {

TextStream::TextStream(std::vector<std::string> stop) : stop_(std::move(stop)) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

bool TextStream::Push(std::string_view bytes, std::string* emit) {
  emit->clear();
  pending_ += utf8_.Push(bytes);
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    emit->assign(pending_, 0, first);
    pending_.clear();
    return true;
  }
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  emit->assign(pending_, 0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return false;
}

std::string TextStream::Flush() {
  std::string out = std::move(pending_);
  pending_.clear();
  out += utf8_.Flush();
  return out;
}

}  // namespace strata
