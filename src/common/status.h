// Status and Result<T>: tau's error handling. No exceptions cross a module boundary; a function
// that can fail returns Status (no value) or Result<T> (a value or the error). Library exceptions
// are caught at the edge (yaml-cpp, nlohmann::json, std::filesystem) and turned into a Status
// there.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tau {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad spec, bad request)
  kNotFound,            // a named thing does not exist
  kAlreadyExists,       // a name is taken
  kFailedPrecondition,  // the system is not in a state where this can be done
  kPermissionDenied,
  kUnauthenticated,
  kResourceExhausted,  // a limit was hit (size, count)
  kUnavailable,        // try again later (server down, busy)
  kInternal,           // a bug or an unexpected environment failure
  kIo,                 // the operating system said no
  // New codes go before this line: kIo is the last (ParseStatusCode and its test walk to it).
};

// "NotFound" for kNotFound: the name the API sends as an error's "code".
const char* StatusCodeName(StatusCode code);
// The inverse of StatusCodeName; nullopt for a name that is none of the codes'.
std::optional<StatusCode> ParseStatusCode(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NotFound: run 'x' does not exist"
  std::string ToString() const;
  // Adds context in front of the message: "reading spec: <message>".
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgument(std::string message);
Status NotFound(std::string message);
Status AlreadyExists(std::string message);
Status FailedPrecondition(std::string message);
Status PermissionDenied(std::string message);
Status Unauthenticated(std::string message);
Status ResourceExhausted(std::string message);
Status Unavailable(std::string message);
Status Internal(std::string message);
// An OS error: message plus strerror(err). kIo, except kUnavailable for a full disk or quota
// (ENOSPC, EDQUOT), which passes once space is freed.
Status IoError(const std::string& message, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace tau

#define TAU_CONCAT_INNER(a, b) a##b
#define TAU_CONCAT(a, b) TAU_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` (a Status) is not ok.
#define TAU_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::tau::Status tau_status_ = (expr);        \
    if (!tau_status_.ok()) return tau_status_; \
  } while (0)

// TAU_ASSIGN_OR_RETURN(auto x, MakeX()): binds the value or returns the error.
#define TAU_ASSIGN_OR_RETURN(lhs, expr) \
  TAU_ASSIGN_OR_RETURN_IMPL(TAU_CONCAT(tau_result_, __LINE__), lhs, expr)
#define TAU_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
