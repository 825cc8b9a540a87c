#include "core/flags.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int32_t, test_count, 3, "a count");
ABSL_FLAG(bool, test_switch, false, "a switch");
ABSL_FLAG(std::string, test_name, "x", "a name");
ABSL_FLAG(flashcp::core::RepeatedFlag, test_item, {}, "an item; repeat for more");

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Each test starts from the flags' defaults (absl::FlagSaver would too, but
// logs every flag it restores).
class FlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { ResetFlagsToDefaults(); }
};
using ParseCommandLineTest = FlagsTest;
using ResetFlagsToDefaultsTest = FlagsTest;
using ParseMainTest = FlagsTest;

TEST_F(ParseCommandLineTest, BothSyntaxesBoolsPositionalAndDoubleDash) {
  absl::StatusOr<CommandLine> line = ParseCommandLine(
      {"--test_count", "7", "a", "-test_name=y", "--test_switch", "--", "--test_count=9"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "y");
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_THAT(line->positional, ElementsAre("a", "--test_count=9"));
  EXPECT_THAT(line->given, ElementsAre("test_count", "test_name", "test_switch"));
  EXPECT_THAT(line->warnings, IsEmpty());
  EXPECT_FALSE(line->help);

  ASSERT_TRUE(ParseCommandLine({"--notest_switch"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  ASSERT_TRUE(ParseCommandLine({"--test_switch=true"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_switch));
}

TEST_F(ParseCommandLineTest, RepeatedFlagKeepsEveryOccurrenceInOrder) {
  ASSERT_TRUE(ParseCommandLine({"--test_item", "5,3", "--test_item=8 8", "--test_item="}).ok());
  EXPECT_THAT(absl::GetFlag(FLAGS_test_item).items, ElementsAre("5,3", "8 8", ""));
  ASSERT_TRUE(ParseCommandLine({"--test_item="}).ok());
  EXPECT_THAT(absl::GetFlag(FLAGS_test_item).items, ElementsAre(""));
}

TEST_F(ParseCommandLineTest, DashedSpellingWorksWithOneWarningNamingTheNewOne) {
  absl::StatusOr<CommandLine> line = ParseCommandLine({"--test-count=4", "--notest-switch"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 4);
  EXPECT_THAT(line->warnings,
              ElementsAre("warning: --test-count is deprecated; use --test_count (the dashed "
                          "spelling goes in the next release)",
                          "warning: --notest-switch is deprecated; use --notest_switch (the "
                          "dashed spelling goes in the next release)"));
}

TEST_F(ParseCommandLineTest, HelpWinsOverEverythingBeforeDoubleDash) {
  absl::StatusOr<CommandLine> line = ParseCommandLine({"--test_count=x", "-h"});
  ASSERT_TRUE(line.ok());
  EXPECT_TRUE(line->help);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 3);
  line = ParseCommandLine({"--", "--help"});
  ASSERT_TRUE(line.ok());
  EXPECT_FALSE(line->help);
}

TEST_F(ParseCommandLineTest, ErrorsNameTheFlag) {
  EXPECT_THAT(ParseCommandLine({"--test_count=abc"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--test_count: Illegal value 'abc' specified for flag 'test_count'"));
  EXPECT_THAT(
      ParseCommandLine({"--test-count", "1.5"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--test_count: Illegal value '1.5'")));
  EXPECT_THAT(ParseCommandLine({"--test_count"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--test_count: missing value"));
  EXPECT_THAT(ParseCommandLine({"--test_switch=maybe"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--test_switch: ")));
  EXPECT_THAT(ParseCommandLine({"--notest_switch=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "--notest_switch takes no value"));
  EXPECT_THAT(ParseCommandLine({"--bogus=1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag \"--bogus=1\""));
  EXPECT_THAT(ParseCommandLine({"--notest_name"}),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag \"--notest_name\""));
  // absl's own flags are not this parser's.
  EXPECT_THAT(
      ParseCommandLine({"--flagfile=/dev/null"}),
      StatusIs(absl::StatusCode::kInvalidArgument, "unknown flag \"--flagfile=/dev/null\""));
}

TEST_F(ResetFlagsToDefaultsTest, EveryProgramFlagBack) {
  ASSERT_TRUE(ParseCommandLine({"--test_count=9", "--test_switch", "--test_name=z", "--test_item=a",
                                "--test_item=b"})
                  .ok());
  ResetFlagsToDefaults();
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 3);
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_switch));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_name), "x");
  EXPECT_THAT(absl::GetFlag(FLAGS_test_item).items, IsEmpty());
}

TEST(FlagsHelpTest, ListsTheProgramsFlagsSortedWithDefaults) {
  const std::string help = FlagsHelp("Usage: t [flags]");
  EXPECT_THAT(help, HasSubstr("Usage: t [flags]\n\nFlags"));
  EXPECT_THAT(help, HasSubstr("  --test_count=3\n      a count\n"));
  EXPECT_THAT(help, HasSubstr("  --test_item=\n      an item; repeat for more\n"));
  EXPECT_LT(help.find("--test_count"), help.find("--test_item"));
  EXPECT_EQ(help.find("--flagfile"), std::string::npos);
}

TEST_F(ParseMainTest, ExitStatusesAndMessages) {
  const char* usage = "Usage: prog [--flag=value ...]";
  auto run = [&](std::vector<std::string> args, std::string& out, std::string& err) {
    args.insert(args.begin(), "prog");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::ostringstream o, e;
    CommandLine line;
    std::optional<int> rc =
        ParseMain(static_cast<int>(argv.size()), argv.data(), usage, line, o, e);
    out = o.str();
    err = e.str();
    return rc;
  };
  std::string out, err;
  EXPECT_EQ(run({"--help"}, out, err), 0);
  EXPECT_EQ(out, FlagsHelp(usage));
  EXPECT_EQ(run({"--test_count=x"}, out, err), 2);
  EXPECT_EQ(err,
            "prog: --test_count: Illegal value 'x' specified for flag 'test_count'\n"
            "Run 'prog --help' for the flags.\n");
  EXPECT_EQ(run({"stray"}, out, err), 2);
  EXPECT_EQ(err, "prog: unexpected argument \"stray\"; every option is a --flag\n");
  EXPECT_EQ(run({"--test-count=5"}, out, err), std::nullopt);
  EXPECT_EQ(err,
            "prog: warning: --test-count is deprecated; use --test_count (the dashed spelling "
            "goes in the next release)\n");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 5);
}

TEST(AsFlagErrorTest, PrefixesTheFieldKeepsTheCode) {
  EXPECT_THAT(AsFlagError(absl::OutOfRangeError("n: too big")),
              StatusIs(absl::StatusCode::kOutOfRange, "--n: too big"));
  EXPECT_THAT(AsFlagError(absl::OkStatus()), StatusIs(absl::StatusCode::kOk));
}

TEST(ModelShapeFromFlagsTest, ValidateModelShapesBoundsAsFlagErrors) {
  const absl::StatusOr<ModelShape> ok = ModelShapeFromFlags(1024, 1, 4);
  ASSERT_THAT(ok.status(), StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(ok->heads, 1024);
  EXPECT_EQ(ok->head_dim, 1);
  EXPECT_EQ(ok->dtype_bytes, 4);
  EXPECT_THAT(ModelShapeFromFlags(0, 1, 2),
              StatusIs(absl::StatusCode::kInvalidArgument, "--heads: must be in [1, 1024], got 0"));
  EXPECT_THAT(ModelShapeFromFlags(1, 1025, 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--head_dim: must be in [1, 1024], got 1025"));
  EXPECT_THAT(ModelShapeFromFlags(1, 1, 3),
              StatusIs(absl::StatusCode::kInvalidArgument, "--dtype_bytes: must be 1, 2 or 4, got 3"));
}

TEST(DatasetFromFlagTest, NamesTheFlagOnce) {
  EXPECT_THAT(DatasetFromFlag("redpajama").status(), StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(*DatasetFromFlag("redpajama"), Dataset::kRedPajama);
  EXPECT_THAT(DatasetFromFlag("foo"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--dataset: unknown data set \"foo\" (wlbllm, pile, redpajama)"));
}

}  // namespace
}  // namespace flashcp::core
