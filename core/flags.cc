#include "core/flags.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string_view>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/echo.h"

namespace flashcp::core {
namespace {

// The program's flag `name`; nullptr for none, a retired one, or absl's own
// (--flagfile, --fromenv, ...: this parser does not implement them).
absl::CommandLineFlag* ProgramFlag(absl::string_view name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr || flag->IsRetired()) return nullptr;
  if (absl::StrContains(flag->Filename(), "absl/")) return nullptr;
  return flag;
}

bool IsHelp(absl::string_view arg) { return arg == "--help" || arg == "-help" || arg == "-h"; }

struct Resolved {
  absl::CommandLineFlag* flag = nullptr;
  bool negated = false;  // --noNAME of a bool flag
};

// `written` (the name as given, without dashes or value) as a flag, noting a
// dashed spelling in `line.warnings`.
Resolved Resolve(const std::string& written, CommandLine& line) {
  const std::string underscored = absl::StrReplaceAll(written, {{"-", "_"}});
  auto find = [&](const std::string& name) -> Resolved {
    if (absl::CommandLineFlag* f = ProgramFlag(name)) return {f, false};
    if (absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* f = ProgramFlag(name.substr(2));
      if (f != nullptr && f->IsOfType<bool>()) return {f, true};
    }
    return {};
  };
  Resolved r = find(written);
  if (r.flag == nullptr && underscored != written) {
    r = find(underscored);
    if (r.flag != nullptr) {
      line.warnings.push_back(absl::StrCat("warning: --", written, " is deprecated; use --",
                                           underscored,
                                           " (the dashed spelling goes in the "
                                           "next release)"));
    }
  }
  return r;
}

}  // namespace

bool AbslParseFlag(absl::string_view text, RepeatedFlag* flag, std::string* error) {
  flag->items.clear();
  if (text.empty()) return true;
  if (text.front() != '\0') {
    *error = "not a RepeatedFlag's encoding (each item after a NUL byte)";
    return false;
  }
  text.remove_prefix(1);
  for (absl::string_view item : absl::StrSplit(text, '\0')) flag->items.emplace_back(item);
  return true;
}

std::string AbslUnparseFlag(const RepeatedFlag& flag) {
  std::string out;
  for (const std::string& item : flag.items)
    absl::StrAppend(&out, absl::string_view("\0", 1), item);
  return out;
}

absl::StatusOr<CommandLine> ParseCommandLine(const std::vector<std::string>& args) {
  CommandLine line;
  for (const std::string& arg : args) {
    if (arg == "--") break;
    if (IsHelp(arg)) {
      line.help = true;
      return line;
    }
  }
  // A RepeatedFlag's occurrences so far, by flag name.
  std::map<std::string, RepeatedFlag> repeated;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      line.positional.insert(line.positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      line.positional.push_back(arg);
      continue;
    }
    const size_t dashes = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    const std::string written =
        arg.substr(dashes, eq == std::string::npos ? std::string::npos : eq - dashes);
    const Resolved r = Resolve(written, line);
    if (r.flag == nullptr || written.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", Echo(arg)));
    }
    const std::string name(r.flag->Name());
    const bool is_bool = r.flag->IsOfType<bool>();
    std::string value;
    if (eq != std::string::npos) {
      if (r.negated)
        return absl::InvalidArgumentError(absl::StrCat("--no", name, " takes no value"));
      value = arg.substr(eq + 1);
    } else if (is_bool) {
      value = r.negated ? "false" : "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
    }
    if (r.flag->IsOfType<RepeatedFlag>()) {
      RepeatedFlag& items = repeated[name];
      items.items.push_back(value);
      value = AbslUnparseFlag(items);
    }
    std::string error;
    if (!r.flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", error));
    }
    line.given.insert(name);
  }
  return line;
}

void ResetFlagsToDefaults() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (ProgramFlag(name) == nullptr) continue;
    std::string error;
    // A default is its type's own unparsed value: it parses back.
    flag->ParseFrom(flag->DefaultValue(), &error);
  }
}

std::string FlagsHelp(absl::string_view usage) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (ProgramFlag(name) != nullptr) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out(usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  absl::StrAppend(&out, "\nFlags (--name=value or --name value; --name alone for a bool):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::string default_value = flag->DefaultValue();
    if (flag->IsOfType<RepeatedFlag>()) {
      default_value = "";  // items are joined by '\0'
    }
    absl::StrAppend(&out, "  --", flag->Name(), "=", default_value, "\n      ", flag->Help(), "\n");
  }
  return out;
}

absl::Status FlagValueError(absl::string_view flag, absl::string_view what,
                            absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": must be ", what, ", got ", Echo(value)));
}

absl::StatusOr<int64_t> IntFlagIn(absl::string_view flag, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return FlagValueError(flag, absl::StrCat("an integer in [", lo, ", ", hi, "]"),
                          absl::StrCat(value));
  }
  return value;
}

absl::StatusOr<double> DoubleFlagIn(absl::string_view flag, double value, double lo, double hi) {
  if (!std::isfinite(value) || value < lo || value > hi) {
    return FlagValueError(flag, absl::StrFormat("a number in [%g, %g]", lo, hi),
                          absl::StrCat(value));
  }
  return value;
}

absl::StatusOr<absl::Duration> DurationFlagIn(absl::string_view flag, absl::Duration value,
                                              absl::Duration lo, absl::Duration hi) {
  if (value < lo || value > hi) {
    return FlagValueError(flag,
                          absl::StrCat("a duration in [", absl::FormatDuration(lo), ", ",
                                       absl::FormatDuration(hi), "]"),
                          absl::FormatDuration(value));
  }
  return value;
}

absl::Status AsFlagError(const absl::Status& field_error) {
  if (field_error.ok()) return field_error;
  return absl::Status(field_error.code(), absl::StrCat("--", field_error.message()));
}

absl::StatusOr<ModelShape> ModelShapeFromFlags(int32_t heads, int32_t head_dim,
                                               int32_t dtype_bytes) {
  const ModelShape shape{heads, head_dim, dtype_bytes};
  if (absl::Status s = ValidateModelShape(shape); !s.ok()) return AsFlagError(s);
  return shape;
}

absl::StatusOr<Dataset> DatasetFromFlag(absl::string_view value) {
  absl::StatusOr<Dataset> d = ParseDataset(value);
  if (!d.ok()) return AsFlagError(d.status());
  return d;
}

int UsageError(absl::string_view program, const absl::Status& status, std::ostream& err) {
  err << program << ": " << status.message() << "\nRun '" << program
      << " --help' for the flags.\n";
  err.flush();
  return kExitUsage;
}

std::optional<int> ParseMain(int argc, char** argv, absl::string_view usage, CommandLine& line,
                             std::ostream& out, std::ostream& err, bool allow_positional) {
  absl::string_view program = usage;
  absl::ConsumePrefix(&program, "Usage: ");
  program = program.substr(0, program.find_first_of(" \n"));
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<CommandLine> parsed = ParseCommandLine(args);
  if (parsed.ok()) {
    for (const std::string& w : parsed->warnings) err << program << ": " << w << "\n";
  }
  if (parsed.ok() && parsed->help) {
    out << FlagsHelp(usage);
    out.flush();
    return 0;
  }
  if (!parsed.ok()) return UsageError(program, parsed.status(), err);
  if (!allow_positional && !parsed->positional.empty()) {
    // A stray word (a command a container runtime appended) would otherwise
    // be ignored and the program run on defaults.
    err << program << ": unexpected argument " << Echo(parsed->positional.front())
        << "; every option is a --flag\n";
    err.flush();
    return kExitUsage;
  }
  line = *std::move(parsed);
  return std::nullopt;
}

}  // namespace flashcp::core
