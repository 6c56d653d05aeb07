// Status: the error value every module of Strata returns instead of throwing.
//
// An error carries a code and a message that says what went wrong and where (file, field,
// value, limit). Nothing throws across a module boundary; callers check and return early
// with STRATA_RETURN_IF_ERROR. Thread-compatible: a Status is a plain value.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace strata {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,    // the caller's input is wrong (config value, prompt, parameter)
    kNotFound,           // a file, key or tensor does not exist
    kCorruption,         // a file's content is damaged or inconsistent
    kNotSupported,       // valid input we do not handle (architecture, tensor type)
    kIOError,            // the OS refused an operation (errno in the message)
    kOutOfRange,         // a value or request past a limit (context, file end)
    kResourceExhausted,  // a memory budget or disk is full
    kAborted,            // stopped on purpose (callback asked to stop, cancelled I/O)
    kInternal,           // a bug: an invariant of ours does not hold
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {Code::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) { return {Code::kNotFound, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {Code::kCorruption, std::move(msg)}; }
  static Status NotSupported(std::string msg) { return {Code::kNotSupported, std::move(msg)}; }
  static Status IOError(std::string msg) { return {Code::kIOError, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {Code::kOutOfRange, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) {
    return {Code::kResourceExhausted, std::move(msg)};
  }
  static Status Aborted(std::string msg) { return {Code::kAborted, std::move(msg)}; }
  static Status Internal(std::string msg) { return {Code::kInternal, std::move(msg)}; }
  // An I/O error from errno: "<what>: <strerror(err)> (errno N)".
  static Status FromErrno(std::string_view what, int err);

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<code name>: <message>".
  std::string ToString() const;
  // Prepends context: "<prefix>: <message>". No effect on OK.
  Status WithContext(std::string_view prefix) const;

 private:
  Status(Code c, std::string m) : code_(c), message_(std::move(m)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

const char* StatusCodeName(Status::Code code);

}  // namespace strata

#define STRATA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::strata::Status strata_status_ = (expr);        \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)
