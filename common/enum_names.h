// Enums spelled as words in configs, flags and reports: one table of (value, name) pairs per
// enum gives both directions, so a name cannot be added to one and forgotten in the other,
// and every refusal lists what is accepted the same way. A value may have several names (an
// alias such as "on" for true); the first is the one printed.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace strata {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The first name of `v` in `table`, "?" when it has none.
template <typename E, size_t N>
const char* EnumToName(const EnumName<E> (&table)[N], E v) {
  for (const EnumName<E>& e : table)
    if (e.value == v) return e.name;
  return "?";
}

// `text` as one of `table`'s names; else InvalidArgument "unknown <what> '<text>' (accepted:
// a, b, c)".
template <typename E, size_t N>
Status EnumFromName(const EnumName<E> (&table)[N], const char* what, const std::string& text,
                    E* out) {
  std::string accepted;
  for (const EnumName<E>& e : table) {
    if (text == e.name) {
      *out = e.value;
      return Status::OK();
    }
    if (!accepted.empty()) accepted += ", ";
    accepted += e.name;
  }
  return Status::InvalidArgument("unknown " + std::string(what) + " '" + text +
                                 "' (accepted: " + accepted + ")");
}

}  // namespace strata
