// The one command-line mechanism of every FlashCP program: flags are absl
// flags (ABSL_FLAG, snake_case names, spelled --name=value or --name value on
// the command line) read by ParseCommandLine below, not by absl's parser, so
// that a bad flag comes back as an absl::Status naming it instead of ending
// the process, and --help is generated from the program's own flags.
//
// Old spellings: a flag written with dashes (--min-shard-tokens) is taken as
// its underscore name (--min_shard_tokens) with a warning naming that
// spelling.
#ifndef FLASHCP_CORE_FLAGS_H_
#define FLASHCP_CORE_FLAGS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/analysis.h"
#include "core/datasets.h"

namespace flashcp::core {

// The type of a flag that may be given more than once (ABSL_FLAG(
// flashcp::core::RepeatedFlag, docs, {}, "...")): each occurrence is one item,
// in command-line order; a value may hold commas and spaces.
struct RepeatedFlag {
  std::vector<std::string> items;
};
// absl's marshalling of RepeatedFlag: each item after a '\0', a byte no
// command-line argument can hold ("" is no item, "\0" one empty item).
bool AbslParseFlag(absl::string_view text, RepeatedFlag* flag, std::string* error);
std::string AbslUnparseFlag(const RepeatedFlag& flag);

struct CommandLine {
  bool help = false;                    // --help, -help or -h was given
  std::vector<std::string> positional;  // non-flag arguments and all after "--", in order
  std::set<std::string> given;          // the flags set, by their underscore names
  std::vector<std::string> warnings;    // one line per deprecated spelling used
};

// Parses `args` (argv[1..]) into the program's absl flags: "--name=value",
// "--name value", a bare "--name" or "--noname" for a bool flag, "--" ending
// the flags; one dash works as two. With --help anywhere before "--", parses
// nothing else and returns help = true. InvalidArgument naming the flag for
// an unknown flag (absl's own, such as --flagfile, included), a missing value
// or a value the flag's type refuses; flags set before the error keep their
// values. Range checks are the program's (FlagValueError, IntFlagIn).
absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args);

// Sets every program flag (those FlagsHelp lists) back to its default, for a
// parser run more than once in one process (tests). absl::FlagSaver does
// this too but logs each flag it restores.
void ResetFlagsToDefaults();

// `usage`, then every flag defined outside absl's own sources, sorted by
// name: "  --name=DEFAULT" and its help on the next line.
std::string FlagsHelp(absl::string_view usage);

// InvalidArgument "--FLAG: must be WHAT, got VALUE", the message every range
// or choice check of a parsed flag gives.
absl::Status FlagValueError(absl::string_view flag, absl::string_view what,
                            absl::string_view value);

// `value` of flag `flag` unless outside [lo, hi] (or not finite): then
// FlagValueError "an integer in [lo, hi]" / "a number in [lo, hi]".
absl::StatusOr<int64_t> IntFlagIn(absl::string_view flag, int64_t value, int64_t lo, int64_t hi);
absl::StatusOr<double> DoubleFlagIn(absl::string_view flag, double value, double lo, double hi);
// The same for an absl::Duration flag: "a duration in [lo, hi]".
absl::StatusOr<absl::Duration> DurationFlagIn(absl::string_view flag, absl::Duration value,
                                              absl::Duration lo, absl::Duration hi);

// A core error naming its field ("heads: must be ...") as the error of the
// flag of that name ("--heads: must be ..."), same code; OK stays OK.
absl::Status AsFlagError(const absl::Status& field_error);

// --heads, --head_dim and --dtype_bytes (int32_t flags, as ModelShape's
// fields) as a ModelShape, checked by core::ValidateModelShape:
// InvalidArgument "--heads: must be in [1, 1024], got 0" and so on.
absl::StatusOr<ModelShape> ModelShapeFromFlags(int32_t heads, int32_t head_dim,
                                               int32_t dtype_bytes);

// --dataset's value as a Dataset: InvalidArgument "--dataset: unknown data
// set "foo" (wlbllm, pile, redpajama)".
absl::StatusOr<Dataset> DatasetFromFlag(absl::string_view value);

// Every program's exit status for a usage error: a bad flag, a bad flag
// value, flags that exclude each other, a stray word.
inline constexpr int kExitUsage = 2;

// For main(), a usage error found after ParseMain (a flag value out of range,
// flags that exclude each other): writes "PROGRAM: MESSAGE" and "Run 'PROGRAM
// --help' for the flags." to `err`; returns kExitUsage.
int UsageError(absl::string_view program, const absl::Status& status, std::ostream& err);

// For main(): ParseCommandLine(argv[1..]), writing the warnings to `err`.
// Returns the status main returns at once: 0 after writing FlagsHelp(usage)
// to `out` for --help; kExitUsage after UsageError (PROGRAM the first word
// after "Usage: " in `usage`) for a bad flag, or after "PROGRAM: unexpected
// argument "WORD"; every option is a --flag" for a positional argument unless
// `allow_positional`. nullopt otherwise, `line` then holding the result.
std::optional<int> ParseMain(int argc, char** argv, absl::string_view usage, CommandLine& line,
                             std::ostream& out, std::ostream& err, bool allow_positional = false);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_FLAGS_H_
