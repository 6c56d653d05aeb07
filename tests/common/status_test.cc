#include "common/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace strata {
namespace {

Status FailsWith(Status s) {
  STRATA_RETURN_IF_ERROR(s);
  return Status::Internal("not reached");
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK().ToString(), "OK");
  Status s = Status::InvalidArgument("kv.group_size: 0 is below the minimum 1");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "invalid argument: kv.group_size: 0 is below the minimum 1");
}

TEST(StatusTest, ReturnIfErrorPropagates) {
  Status s = FailsWith(Status::NotFound("x"));
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
  EXPECT_EQ(FailsWith(Status::OK()).code(), Status::Code::kInternal);
}

TEST(StatusTest, FromErrnoNamesTheErrno) {
  Status s = Status::FromErrno("write /tmp/x at offset 4096", ENOSPC);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("offset 4096"), std::string::npos);
  EXPECT_NE(s.message().find("errno 28"), std::string::npos);
  EXPECT_EQ(s.WithContext("kv").message().rfind("kv: ", 0), 0u);
}

}  // namespace
}  // namespace strata
