#include "common/file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <sstream>
#include <string>
#include <thread>

namespace strata {
namespace {

TEST(ReadTextStreamTest, ARegularFileWithinTheLimitComesBackWhole) {
  char path[] = "/tmp/strata_file_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = "a prompt\nover two lines";
  ASSERT_EQ(write(fd, text.data(), text.size()), ssize_t(text.size()));
  std::string out;
  ASSERT_TRUE(ReadTextFile(path, "prompt file", text.size(), &out).ok());
  EXPECT_EQ(out, text);
  const Status s = ReadTextFile(path, "prompt file", text.size() - 1, &out);
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("the limit is " + std::to_string(text.size() - 1)), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(out.empty());
  bool more = false;
  ASSERT_TRUE(ReadTextFile(path, "text file", 8, &out, &more).ok());
  EXPECT_TRUE(more);
  EXPECT_EQ(out, text.substr(0, 8));
  close(fd);
  unlink(path);
}

TEST(ReadTextStreamTest, AnEndlessPipeIsReadOnlyToTheLimit) {
  signal(SIGPIPE, SIG_IGN);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    const std::string chunk(4096, 'x');
    for (ssize_t w; (w = write(p[1], chunk.data(), chunk.size())) > 0;) written += uint64_t(w);
    close(p[1]);
  });
  std::string out;
  const Status s = ReadTextStream(p[0], "stdin", 1 << 20, &out);
  close(p[0]);  // the writer's next write fails: it stops
  writer.join();
  EXPECT_EQ(s.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(s.message().find("stdin holds more than 1048576 bytes"), std::string::npos)
      << s.ToString();
  EXPECT_TRUE(out.empty());
  // What was taken from the pipe: the limit and a byte, plus what sat in its buffer.
  EXPECT_LT(written.load(), uint64_t(2) << 20);
}

TEST(ReadTextStreamTest, ADirectoryOrADeviceIsNoPromptSource) {
  std::string out;
  Status s = ReadTextFile("/etc", "prompt file", 1 << 20, &out);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt file '/etc' is a directory"), std::string::npos)
      << s.ToString();
  s = ReadTextFile("/dev/zero", "prompt file", 1 << 20, &out);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("is a character device, not a regular file, a pipe or a terminal"),
            std::string::npos)
      << s.ToString();
  s = ReadTextFile("/nonexistent/prompt.txt", "prompt file", 1 << 20, &out);
  EXPECT_EQ(s.code(), Status::Code::kNotFound);
}

TEST(ReadLineBoundedTest, ALongLineIsDroppedAndTheNextOneRead) {
  std::istringstream in("short\n" + std::string(100, 'y') + "\nnext\nlast");
  std::string line;
  bool too_long = false;
  ASSERT_TRUE(ReadLineBounded(in, 10, &line, &too_long));
  EXPECT_EQ(line, "short");
  EXPECT_FALSE(too_long);
  ASSERT_TRUE(ReadLineBounded(in, 10, &line, &too_long));
  EXPECT_TRUE(too_long);
  EXPECT_EQ(line, std::string(10, 'y'));
  ASSERT_TRUE(ReadLineBounded(in, 10, &line, &too_long));
  EXPECT_EQ(line, "next");
  EXPECT_FALSE(too_long);
  ASSERT_TRUE(ReadLineBounded(in, 10, &line, &too_long));
  EXPECT_EQ(line, "last");
  EXPECT_FALSE(ReadLineBounded(in, 10, &line, &too_long));
}

}  // namespace
}  // namespace strata
