// Walks every flag of every `strata` subcommand: each belongs to a declared mode, and each flag
// of a mode that does not always apply is refused by the real command (a child process) when
// its mode is off, with a message naming the flag and what it needs, and gets past that check
// when it is on.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace strata::cli {
namespace {

struct Result {
  int code = -1;
  std::string err;
};

Result RunStrata(const std::vector<std::string>& args) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    const int out = open("/dev/null", O_WRONLY);
    dup2(out, STDOUT_FILENO);
    std::vector<char*> argv;
    static std::string bin = STRATA_CLI;
    argv.push_back(bin.data());
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  Result r;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;) r.err.append(buf, size_t(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// For each mode that does not always apply: arguments that turn it on, and arguments that
// keep it off (beside the flag alone). A mode missing here fails the test, so a new mode
// comes with both.
struct ModeArgs {
  std::vector<std::string> on, off;
};
const std::map<std::string, ModeArgs>& KnownModes() {
  static const std::map<std::string, ModeArgs> m = {
      {"GPU (--device cuda)", {{"--device", "cuda"}, {}}},
      {"CPU (without --device cuda)", {{}, {"--device", "cuda"}}},
      {"Disk KV (--kv disk)", {{"--kv", "disk"}, {}}},
      {"Chat (--chat)", {{"--chat"}, {}}},
      {"Generation (without --beams)", {{}, {"--beams", "2"}}},
      {"Beam search (--beams)", {{"--beams", "2"}, {}}},
      {"Beam search's slow tier (--beam-budget)", {{"--beams", "2", "--beam-budget", "1M"}, {}}},
      {"Beam search's slow tier on a GPU",
       {{"--beams", "2", "--beam-budget", "1M", "--device", "cuda"}, {"--beams", "2"}}},
      {"Beam search with a scorer in the budget",
       {{"--beams", "2", "--beam-budget", "1M", "--scorer-model", "/nonexistent/s.gguf"},
        {"--beams", "2", "--beam-budget", "1M"}}},
  };
  return m;
}

// The flag with a value its type accepts ("1" parses as a number, a size and a path).
std::vector<std::string> FlagArgs(const CLI::Option* o) {
  std::vector<std::string> a = {o->get_name()};
  if (o->get_expected_min() > 0) a.push_back("1");
  return a;
}

class FlagModesTest : public ::testing::Test {
 protected:
  void SetUp() override { AddCommands(&app_); }
  CLI::App app_;
};

TEST_F(FlagModesTest, EveryFlagOfEverySubcommandIsInADeclaredMode) {
  const auto subs = app_.get_subcommands({});
  ASSERT_GE(subs.size(), 7u);
  for (const CLI::App* sub : subs) {
    const FlagModes* modes = FlagModes::Find(sub);
    ASSERT_NE(modes, nullptr) << sub->get_name() << " declares no modes";
    for (const CLI::Option* o : sub->get_options()) {
      if (o == sub->get_help_ptr()) continue;
      const FlagModes::Mode* m = modes->ModeOf(o);
      ASSERT_NE(m, nullptr) << "strata " << sub->get_name() << " " << o->get_name()
                            << " is in no declared mode (group '" << o->get_group() << "')";
      if (m->group != FlagModes::kGeneral) {
        EXPECT_TRUE(KnownModes().count(m->group))
            << "mode '" << m->group << "' has no entry in KnownModes()";
      }
    }
  }
}

TEST_F(FlagModesTest, AFlagOutsideItsModeIsRefusedAndInsideItIsNot) {
  int walked = 0;
  for (const CLI::App* sub : app_.get_subcommands({})) {
    const FlagModes* modes = FlagModes::Find(sub);
    ASSERT_NE(modes, nullptr);
    // What every run of the subcommand needs, and a model that is never reached.
    std::vector<std::string> base = {sub->get_name()};
    for (const CLI::Option* o : sub->get_options())
      if (o->get_required()) base.insert(base.end(), {o->get_name(), "/nonexistent/text.txt"});
    if (sub->get_option_no_throw("--model")) base.insert(base.end(), {"-m", "/nonexistent/m.gguf"});
    for (const CLI::Option* o : sub->get_options()) {
      const FlagModes::Mode* m = modes->ModeOf(o);
      if (o == sub->get_help_ptr() || !m || m->group == FlagModes::kGeneral) continue;
      const auto known = KnownModes().find(m->group);
      ASSERT_NE(known, KnownModes().end()) << m->group;
      const std::vector<std::string> flag = FlagArgs(o);
      const std::string what = "strata " + sub->get_name() + " " + o->get_name();

      std::vector<std::string> off = base;
      off.insert(off.end(), known->second.off.begin(), known->second.off.end());
      off.insert(off.end(), flag.begin(), flag.end());
      const Result r = RunStrata(off);
      EXPECT_EQ(r.code, 2) << what << " outside its mode: " << r.err;
      EXPECT_NE(r.err.find(o->get_name() + " applies only " + m->needs), std::string::npos)
          << what << ": " << r.err;

      std::vector<std::string> on = base;
      on.insert(on.end(), known->second.on.begin(), known->second.on.end());
      // The flag may be one of those that turn its mode on.
      if (std::find(on.begin(), on.end(), o->get_name()) == on.end())
        on.insert(on.end(), flag.begin(), flag.end());
      const Result ok = RunStrata(on);
      EXPECT_EQ(ok.err.find("applies only"), std::string::npos)
          << what << " in its mode: " << ok.err;
      // It fails further on (the missing model, or "1" as a value the flag does not take).
      EXPECT_NE(ok.code, 0) << what;
      ++walked;
    }
  }
  // run's chat, beam and generation flags, and the common GPU, CPU and disk flags of run,
  // perplexity and bench.
  EXPECT_GE(walked, 20);
}

}  // namespace
}  // namespace strata::cli
