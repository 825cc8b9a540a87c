#include "tests/testing/metrics_text.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace flashcp::tests::testing {
namespace {

absl::Status Malformed(absl::string_view line) {
  return absl::DataLossError(absl::StrCat("malformed sample line: \"", line, "\""));
}

// Parses `{k="v",...}` at the front of `rest`, consuming it.
absl::StatusOr<Labels> ParseLabels(absl::string_view line, absl::string_view& rest) {
  Labels labels;
  rest.remove_prefix(1);  // '{'
  for (;;) {
    if (!rest.empty() && rest.front() == '}') {
      rest.remove_prefix(1);
      return labels;
    }
    const size_t eq = rest.find("=\"");
    if (eq == absl::string_view::npos) return Malformed(line);
    const std::string key(rest.substr(0, eq));
    rest.remove_prefix(eq + 2);
    std::string value;
    for (;;) {
      if (rest.empty()) return Malformed(line);
      const char c = rest.front();
      rest.remove_prefix(1);
      if (c == '"') break;
      if (c == '\\' && !rest.empty()) {
        const char e = rest.front();
        rest.remove_prefix(1);
        value.push_back(e == 'n' ? '\n' : e);
      } else {
        value.push_back(c);
      }
    }
    labels[key] = value;
    if (!rest.empty() && rest.front() == ',') rest.remove_prefix(1);
  }
}

}  // namespace

absl::StatusOr<double> FindSample(absl::string_view exposition, absl::string_view name,
                                  const Labels& labels) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == absl::string_view::npos) return Malformed(line);
    if (line.substr(0, end) != name) continue;
    absl::string_view rest = line.substr(end);
    Labels got;
    if (rest.front() == '{') {
      absl::StatusOr<Labels> parsed = ParseLabels(line, rest);
      if (!parsed.ok()) return parsed.status();
      got = *std::move(parsed);
    }
    if (got != labels) continue;
    rest = absl::StripAsciiWhitespace(rest);
    const absl::string_view value_text = rest.substr(0, rest.find(' '));  // drop a timestamp
    double value = 0;
    if (value_text == "Nan" || value_text == "NaN") return std::nan("");
    if (!absl::SimpleAtod(value_text, &value)) return Malformed(line);
    return value;
  }
  std::string want = absl::StrCat(name, "{");
  for (const auto& [k, v] : labels) absl::StrAppend(&want, k, "=\"", v, "\",");
  return absl::NotFoundError(absl::StrCat("no sample ", want, "}"));
}

}  // namespace flashcp::tests::testing
