#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace strata {

const char* StatusCodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk:
      return "OK";
    case Status::Code::kInvalidArgument:
      return "invalid argument";
    case Status::Code::kNotFound:
      return "not found";
    case Status::Code::kCorruption:
      return "corruption";
    case Status::Code::kNotSupported:
      return "not supported";
    case Status::Code::kIOError:
      return "I/O error";
    case Status::Code::kOutOfRange:
      return "out of range";
    case Status::Code::kResourceExhausted:
      return "resource exhausted";
    case Status::Code::kAborted:
      return "aborted";
    case Status::Code::kInternal:
      return "internal error";
  }
  return "unknown";
}

Status Status::FromErrno(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  msg += " (errno ";
  msg += std::to_string(err);
  msg += ")";
  Code c = Code::kIOError;
  if (err == ENOSPC || err == EDQUOT) c = Code::kResourceExhausted;
  if (err == ENOENT) c = Code::kNotFound;
  return Status(c, std::move(msg));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s = StatusCodeName(code_);
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  std::string m(prefix);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

}  // namespace strata
