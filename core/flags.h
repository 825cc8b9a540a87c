// How a FlashCP program built on absl flags (ABSL_FLAG, snake_case names)
// reads its command line: a --help generated from the program's own flags
// (name, default, help; stdout, exit status 0) and absl's parsing, which
// refuses a bad value naming the flag (exit status 1).
#ifndef FLASHCP_CORE_FLAGS_H_
#define FLASHCP_CORE_FLAGS_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace flashcp::core {

// `usage`, then every flag defined outside absl's own sources, sorted by
// name: "  --name=DEFAULT" and its help on the next line.
std::string FlagsHelp(absl::string_view usage);

// With --help or -h among the arguments (before a "--"): writes FlagsHelp to
// `out` and returns nullopt (main then returns 0). Otherwise
// absl::ParseCommandLine's result: argv[0] and the positional arguments.
std::optional<std::vector<char*>> ParseFlags(int argc, char** argv, absl::string_view usage,
                                             std::ostream& out);

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_FLAGS_H_
