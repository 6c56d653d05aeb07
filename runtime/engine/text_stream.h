// TextStream: turns generated tokens' bytes into text a caller can print at once.
//
// Emits whole UTF-8 characters only, and holds back any tail that could be the start of
// a stop string until the next bytes decide it; when a stop string appears, everything
// before it is emitted and the stream reports the stop. Not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/model/tokenizer.h"

namespace strata {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop);
  // Adds a token's bytes; `emit` gets the text that is now safe to show. Returns true when
  // a stop string has been found (emit then ends right before it).
  bool Push(std::string_view bytes, std::string* emit);
  // The text still held back (no stop string came): call once generation ends.
  std::string Flush();

 private:
  std::vector<std::string> stop_;
  Utf8Stream utf8_;
  std::string pending_;
};

}  // namespace strata
