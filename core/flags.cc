#include "core/flags.h"

#include <algorithm>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace flashcp::core {

std::string FlagsHelp(absl::string_view usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    // absl's own (--flagfile, --fromenv, ...) are the same in every program.
    const std::string file = flag->Filename();
    if (absl::StrContains(file, "absl/")) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out(usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  absl::StrAppend(&out, "\nFlags (--name=value or --name value):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&out, "  --", flag->Name(), "=", flag->DefaultValue(), "\n      ",
                    flag->Help(), "\n");
  }
  return out;
}

std::optional<std::vector<char*>> ParseFlags(int argc, char** argv, absl::string_view usage,
                                             std::ostream& out) {
  absl::SetProgramUsageMessage(usage);
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      out << FlagsHelp(usage);
      out.flush();
      return std::nullopt;
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace flashcp::core
