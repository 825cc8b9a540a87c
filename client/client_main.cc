// flashcp-client: plans batches through a flashcp-planner server and prints
// what flashcp-plan prints for them: one JSON plan per line, in input order
// (core::PlanToJson: the PlanResponse in JSON, batch_id the 0-based batch
// index, planning_seconds 0 as flashcp-plan's), or with --summary the quality
// table.
// Batches go over one PlanStream with --inflight in flight.
//
// A bad input line or a per-item server error is reported on stderr, naming
// the line, and the rest go on; the exit status is then 1. A broken stream or
// an unreachable server: 1. A bad flag: 2.
#include <cstdint>
#include <deque>
#include <cerrno>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "client/internal/tool_args.h"
#include "client/internal/tool_flags.h"
#include "client/pipelined_planner.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/file.h"
#include "core/flags.h"
#include "core/plan_json.h"
#include "core/status_macros.h"
#include "core/strategies.h"
#include "proto/convert.h"

namespace fc = flashcp::client;
namespace core = flashcp::core;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr char kPrefix[] = "flashcp-client: ";

constexpr char kUsage[] = R"(Usage: flashcp-client --server HOST:PORT [--flag=value ...] < batches

Plans batches through a flashcp-planner server and prints one JSON plan per
line in input order, in flashcp-plan's form, or with --summary its table.

Batches come from one of:
  (none), --input -    stdin: one batch per line, lengths separated by commas
                       or spaces; blank and # lines skipped
  --input FILE         the same from a file
  --dataset NAME       sampled batches (--context, --batches, --seed)

Exit status: 0 success; 1 a bad line, a failed item, a broken stream, an
unreachable server (a failed TLS handshake included) or an unreadable file
(the other items are still planned and printed); 2 a bad flag.)";

}  // namespace

ABSL_FLAG(double, target_imbalance, 0,
          absl::StrCat("target imbalance for flashcp* in [1, 1e6]; 0: the server's, ",
                       flashcp::core::PlanOptions{}.target_imbalance));
ABSL_FLAG(std::optional<int64_t>, min_shard_tokens, std::nullopt,
          absl::StrCat("flashcp's minimum cut shard, tokens, as flashcp-plan's flag (0 turns the "
                       "rule off); empty: the server's, ",
                       flashcp::core::PlanOptions{}.min_shard_tokens));
ABSL_FLAG(int32_t, heads, flashcp::core::ModelShape{}.heads, "KV heads, for byte counts");
ABSL_FLAG(int32_t, head_dim, flashcp::core::ModelShape{}.head_dim, "head dimension");
ABSL_FLAG(int32_t, dtype_bytes, flashcp::core::ModelShape{}.dtype_bytes,
          "bytes per element: 1, 2 or 4");
ABSL_FLAG(std::string, input, "-", "batches, one per line (\"-\" is stdin)");
ABSL_FLAG(std::string, dataset, "", "sampled batches: wlbllm, pile or redpajama");
ABSL_FLAG(int64_t, batches, 64, "sampled batches (with --dataset)");
ABSL_FLAG(int64_t, inflight, 16, "batches in flight on the stream");
ABSL_FLAG(double, timeout, 3600, "deadline of the whole stream, seconds");
ABSL_FLAG(bool, summary, false, "print the quality table instead of JSON lines");

namespace {

struct Options {
  fc::internal::ToolFlags tool;
  double target_imbalance = 0;
  int64_t min_shard_tokens = 0;  // PlanRequest.min_shard_tokens: 0 default, -1 off
  core::ModelShape shape;
  std::string input = "-";
  std::optional<core::Dataset> dataset;
  int64_t batches = 64;
  int inflight = 16;
  absl::Duration timeout = absl::Hours(1);
  bool summary = false;
};

absl::StatusOr<Options> ParseOptions(const core::CommandLine& line) {
  Options o;
  FLASHCP_ASSIGN_OR_RETURN(o.tool, fc::internal::ToolFlagsFromCommandLine(line));
  o.target_imbalance = absl::GetFlag(FLAGS_target_imbalance);
  if (o.target_imbalance != 0) {
    FLASHCP_ASSIGN_OR_RETURN(o.target_imbalance,
                             core::DoubleFlagIn("target_imbalance", o.target_imbalance, 1, 1e6));
  }
  FLASHCP_ASSIGN_OR_RETURN(
      o.min_shard_tokens, fc::internal::MinShardTokensField(absl::GetFlag(FLAGS_min_shard_tokens)));
  FLASHCP_ASSIGN_OR_RETURN(o.shape, core::ModelShapeFromFlags(absl::GetFlag(FLAGS_heads),
                                                             absl::GetFlag(FLAGS_head_dim),
                                                             absl::GetFlag(FLAGS_dtype_bytes)));
  o.input = absl::GetFlag(FLAGS_input);
  if (o.input.empty()) return absl::InvalidArgumentError("--input: missing file name");
  if (line.given.count("dataset") > 0) {
    if (line.given.count("input") > 0) {
      return absl::InvalidArgumentError("--dataset and --input exclude each other");
    }
    FLASHCP_ASSIGN_OR_RETURN(o.dataset, core::DatasetFromFlag(absl::GetFlag(FLAGS_dataset)));
  }
  FLASHCP_ASSIGN_OR_RETURN(o.batches,
                           core::IntFlagIn("batches", absl::GetFlag(FLAGS_batches), 1, 1'000'000));
  FLASHCP_ASSIGN_OR_RETURN(const int64_t inflight,
                           core::IntFlagIn("inflight", absl::GetFlag(FLAGS_inflight), 1, 4096));
  o.inflight = static_cast<int>(inflight);
  FLASHCP_ASSIGN_OR_RETURN(const double timeout,
                           core::DoubleFlagIn("timeout", absl::GetFlag(FLAGS_timeout), 0.001, 1e7));
  o.timeout = absl::Seconds(timeout);
  o.summary = absl::GetFlag(FLAGS_summary);
  return o;
}

// Reads batch lines or samples batches; a bad line is reported and skipped.
class Batches {
 public:
  Batches(const Options& o, std::istream& in, std::ostream& err) : o_(o), in_(&in), err_(err) {}

  absl::Status Open() {
    if (!o_.dataset.has_value() && o_.input != "-") {
      file_.open(o_.input);
      if (!file_.is_open()) return core::FileError("--input", "open", o_.input, errno);
      in_ = &file_;
      name_ = o_.input;
    }
    return absl::OkStatus();
  }

  // The next good batch and where it came from; nullopt at the end.
  std::optional<std::pair<std::vector<int64_t>, std::string>> Next() {
    if (o_.dataset.has_value()) {
      while (next_ < o_.batches) {
        const int64_t k = next_++;
        std::string where = absl::StrCat("batch ", k, " (", core::DatasetName(*o_.dataset),
                                         ", seed ", o_.tool.seed, ")");
        auto b = core::SampleBatch(*o_.dataset, o_.tool.context, o_.tool.seed, k);
        if (b.ok()) return std::make_pair(*std::move(b), std::move(where));
        Fail(where, b.status());
      }
      return std::nullopt;
    }
    std::string line;
    while (!stopped_) {
      const core::LineRead r = core::ReadInputLine(*in_, line);
      if (r == core::LineRead::kEof) break;
      ++line_no_;
      std::string where = absl::StrCat(name_, " line ", line_no_);
      if (r == core::LineRead::kTooLong) {  // its end may never come (/dev/zero)
        Fail(where, absl::InvalidArgumentError(absl::StrCat(
                        "longer than ", core::kMaxLineBytes,
                        " bytes; the input after it is not read")));
        stopped_ = true;
        break;
      }
      if (core::IsBlankOrComment(line)) continue;
      auto b = core::ParseBatchLine(line);
      if (b.ok()) return std::make_pair(*std::move(b), std::move(where));
      Fail(where, b.status());
    }
    if (in_->bad() && !stopped_) {
      Fail(name_, absl::DataLossError("read error"));
      stopped_ = true;
    }
    return std::nullopt;
  }

  void Fail(absl::string_view where, const absl::Status& status) {
    err_ << kPrefix << where << ": " << absl::StatusCodeToString(status.code()) << ": "
         << status.message() << "\n";
    ++failures_;
  }
  int64_t failures() const { return failures_; }

 private:
  const Options& o_;
  std::istream* in_;
  std::ifstream file_;
  std::ostream& err_;
  std::string name_ = "stdin";
  int64_t next_ = 0;
  int64_t line_no_ = 0;
  int64_t failures_ = 0;
  bool stopped_ = false;  // a line too long or a read error: nothing more is read
};

int Run(const Options& o, std::istream& in, std::ostream& out, std::ostream& err) {
  Batches batches(o, in, err);
  if (absl::Status s = batches.Open(); !s.ok()) {
    err << kPrefix << s.message() << "\n";
    return kExitFailed;
  }
  absl::StatusOr<fc::ChannelOptions> channel_options = fc::ChannelOptions();
  if (o.tool.tls.has_value()) channel_options = fc::WithTls(fc::ChannelOptions(), *o.tool.tls);
  if (!channel_options.ok()) {
    err << kPrefix << channel_options.status().message() << "\n";
    return kExitFailed;
  }
  auto grpc_client =
      std::make_shared<fc::GrpcPlannerClient>(fc::MakeChannel(o.tool.server, *channel_options));
  // Wait for the server (it may still be starting) before opening the stream:
  // wait_for_ready lets gRPC connect as soon as it listens.
  if (auto info = fc::WaitForServer(*grpc_client, o.tool.connect_timeout); !info.ok()) {
    err << kPrefix << "cannot reach " << o.tool.server << " within "
        << absl::FormatDuration(o.tool.connect_timeout) << ": "
        << absl::StatusCodeToString(info.status().code()) << ": " << info.status().message()
        << "\n";
    return kExitFailed;
  }

  std::vector<core::SummaryAccumulator> acc;
  for (size_t id = 0; id < core::StrategyIdBound(); ++id) {
    acc.emplace_back(static_cast<core::Strategy>(id));
  }
  std::vector<bool> seen(core::StrategyIdBound(), false);

  std::deque<std::string> pending_where;  // of requests sent, not yet answered
  int64_t item_failures = 0;
  auto source = [&]() -> std::optional<fc::v1::PlanRequest> {
    auto next = batches.Next();
    if (!next.has_value()) return std::nullopt;
    fc::v1::PlanRequest r;
    for (int64_t len : next->first) r.add_doc_lens(len);
    r.set_cp_size(o.tool.cp_size);
    r.set_strategy(o.tool.strategy);
    r.set_target_imbalance(o.target_imbalance);
    r.set_min_shard_tokens(o.min_shard_tokens);
    r.set_heads(o.shape.heads);
    r.set_head_dim(o.shape.head_dim);
    r.set_dtype_bytes(o.shape.dtype_bytes);
    pending_where.push_back(std::move(next->second));
    return r;
  };
  auto sink = [&](int64_t index, fc::PlanResult result) {
    const std::string where = std::move(pending_where.front());
    pending_where.pop_front();
    absl::StatusOr<flashcp::proto::PlanResult> plan =
        result.ok() ? flashcp::proto::ResponseFromProto(*result)
                    : absl::StatusOr<flashcp::proto::PlanResult>(result.status());
    if (!plan.ok()) {
      err << kPrefix << where << ": " << absl::StatusCodeToString(plan.status().code()) << ": "
          << plan.status().message() << "\n";
      ++item_failures;
      return;
    }
    if (o.summary) {
      if (auto s = core::ParseStrategy(plan->strategy); s.ok()) {
        acc[static_cast<size_t>(*s)].Add(plan->metrics, plan->planning_seconds * 1e3);
        seen[static_cast<size_t>(*s)] = true;
      }
      return;
    }
    // A server before the cost model sends no cost report: none is written.
    const bool has_cost = !plan->cost.prediction.rank_cost.empty();
    out << core::PlanToJson(plan->plan, plan->metrics,
                            {.batch_id = static_cast<uint64_t>(index),
                             .strategy = plan->strategy,
                             .cost = has_cost ? &plan->cost : nullptr,
                             .planner_version = &plan->planner_version})
        << "\n";
  };
  const absl::Status status =
      fc::PlanPipelined(*grpc_client, {.inflight = o.inflight, .call = {.timeout = o.timeout}},
                        std::ref(source), std::ref(sink));
  if (!status.ok()) {
    err << kPrefix << "stream to " << o.tool.server
        << " failed: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
        << "\n";
  }
  if (o.summary) {
    std::vector<core::StrategySummary> rows;
    for (core::Strategy s : core::AllStrategies()) {
      if (seen[static_cast<size_t>(s)]) rows.push_back(acc[static_cast<size_t>(s)].Finish());
    }
    out << "# flashcp-client via " << o.tool.server << ": cp " << o.tool.cp_size
        << "; plan ms are the server's planning times\n"
        << core::FormatSummaryTable(rows);
  }
  out.flush();
  if (!out) err << kPrefix << "error writing the output\n";
  const int64_t failures = batches.failures() + item_failures;
  if (failures > 0) err << kPrefix << failures << " item(s) failed\n";
  return status.ok() && failures == 0 && out ? kExitOk : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  core::CommandLine line;
  if (std::optional<int> rc = core::ParseMain(argc, argv, kUsage, line, std::cout, std::cerr)) {
    return *rc;
  }
  absl::StatusOr<Options> options = ParseOptions(line);
  if (!options.ok()) return core::UsageError("flashcp-client", options.status(), std::cerr);
  return Run(*options, std::cin, std::cout, std::cerr);
}
