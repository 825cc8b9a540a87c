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
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/grpc_planner_client.h"
#include "client/internal/tool_args.h"
#include "client/pipelined_planner.h"
#include "core/cli.h"
#include "core/datasets.h"
#include "core/plan_json.h"
#include "core/strategies.h"
#include "proto/convert.h"

namespace fc = flashcp::client;
namespace core = flashcp::core;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr char kPrefix[] = "flashcp-client: ";

constexpr char kUsage[] = R"(Usage: flashcp-client --server HOST:PORT [flags] < batches

Plans batches through a flashcp-planner server and prints one JSON plan per
line in input order, in flashcp-plan's form, or with --summary its table.

Batches come from one of:
  (none), --input -    stdin: one batch per line, lengths separated by commas
                       or spaces; blank and # lines skipped
  --input FILE         the same from a file
  --dataset NAME       sampled batches: wlbllm, pile or redpajama
                       (--context C, default 131072; --batches K, default 64;
                       --seed S, default 1)

Flags:
  --server HOST:PORT   the planner (required)
  --cp N               ranks in the CP group (default 8)
  --strategy NAME      a strategy the server lists (default: the server's, flashcp)
  --target-imbalance R target imbalance for flashcp* (default: the server's, 1.02)
  --min-shard-tokens M flashcp's minimum cut shard, tokens, as flashcp-plan's flag
                       (default: the server's, 128; 0 turns the rule off)
  --heads H, --head-dim D, --dtype-bytes B
                       attention shape for byte counts (default 32, 128, 2)
  --inflight K         batches in flight on the stream (default 16)
  --timeout S          deadline of the whole stream, seconds (default 3600)
  --connect-timeout S  how long to retry while the server is unreachable (default 10)
  --tls_ca FILE        TLS: PEM CA bundle the server's certificate must chain to;
                       plaintext without it
  --tls_cert FILE, --tls_key FILE
                       mTLS: PEM client certificate and key (for a planner run
                       with --tls_client_ca); need --tls_ca
  --tls_server_name N  TLS: the name the server's certificate must carry, when
                       it is not the host of --server
  --summary            print the quality table instead of JSON lines
  --help               this text

Exit status: 0 success; 1 a bad line, a failed item, a broken stream, an
unreachable server (a failed TLS handshake included) or an unreadable file
(the other items are still planned and printed); 2 a bad flag.
)";

struct Options {
  std::string server;
  int32_t cp_size = 8;
  std::string strategy;
  double target_imbalance = 0;
  int64_t min_shard_tokens = 0;  // PlanRequest.min_shard_tokens: 0 default, -1 off
  core::ModelShape shape;
  std::string input = "-";
  std::optional<core::Dataset> dataset;
  int64_t context = 131072;
  int64_t batches = 64;
  uint64_t seed = 1;
  int inflight = 16;
  absl::Duration timeout = absl::Hours(1);
  absl::Duration connect_timeout = absl::Seconds(10);
  std::optional<fc::TlsOptions> tls;  // nullopt: plaintext
  bool summary = false;
  bool help = false;
};

absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  absl::StatusOr<fc::internal::ToolArgs> a = fc::internal::ToolArgs::Parse(
      args,
      {"server", "cp", "strategy", "target-imbalance", "min-shard-tokens", "heads", "head-dim",
       "dtype-bytes", "input", "dataset", "context", "batches", "seed", "inflight", "timeout",
       "connect-timeout", "tls_ca", "tls_cert", "tls_key", "tls_server_name"},
      {"summary", "help"});
  if (!a.ok()) return a.status();
  Options o;
  o.help = a->Has("help");
  if (o.help) return o;
  o.server = a->String("server", "");
  if (o.server.empty()) return absl::InvalidArgumentError("--server HOST:PORT is required");
  auto cp = a->Int("cp", 8, 1, core::kMaxCpSize);
  auto imbalance = a->Double("target-imbalance", 0, 0, 1e6);
  auto min_shard = fc::internal::MinShardTokensField(*a);
  auto heads = a->Int("heads", 32, 1, 1024);
  auto head_dim = a->Int("head-dim", 128, 1, 1024);
  auto dtype = a->Int("dtype-bytes", 2, 1, 4);
  auto context = a->Int("context", 131072, 1, core::kMaxTokens);
  auto batches = a->Int("batches", 64, 0, 1'000'000);
  auto seed = a->Int("seed", 1, 0, INT64_MAX);
  auto inflight = a->Int("inflight", 16, 1, 4096);
  auto timeout = a->Double("timeout", 3600, 0.001, 1e7);
  auto connect = a->Double("connect-timeout", 10, 0, 1e7);
  auto tls = fc::internal::TlsOptionsFromArgs(*a);
  for (const absl::Status& s :
       {cp.status(), imbalance.status(), min_shard.status(), heads.status(), head_dim.status(),
        dtype.status(), context.status(), batches.status(), seed.status(), inflight.status(),
        timeout.status(), connect.status(), tls.status()}) {
    if (!s.ok()) return s;
  }
  o.cp_size = static_cast<int32_t>(*cp);
  o.strategy = a->String("strategy", "");
  o.target_imbalance = *imbalance;
  o.min_shard_tokens = *min_shard;
  o.shape = {static_cast<int32_t>(*heads), static_cast<int32_t>(*head_dim),
             static_cast<int32_t>(*dtype)};
  o.input = a->String("input", "-");
  if (a->Has("dataset")) {
    if (a->Has("input")) return absl::InvalidArgumentError("--dataset and --input exclude each other");
    auto d = core::ParseDataset(a->String("dataset", ""));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dataset: ", d.status().message()));
    o.dataset = *d;
  }
  o.context = *context;
  o.batches = *batches;
  o.seed = static_cast<uint64_t>(*seed);
  o.inflight = static_cast<int>(*inflight);
  o.timeout = absl::Seconds(*timeout);
  o.connect_timeout = absl::Seconds(*connect);
  o.tls = *std::move(tls);
  o.summary = a->Has("summary");
  return o;
}

// Reads batch lines or samples batches; a bad line is reported and skipped.
class Batches {
 public:
  Batches(const Options& o, std::istream& in, std::ostream& err) : o_(o), in_(&in), err_(err) {}

  absl::Status Open() {
    if (!o_.dataset.has_value() && o_.input != "-") {
      file_.open(o_.input);
      if (!file_.is_open()) return absl::NotFoundError(absl::StrCat("--input: cannot open \"", o_.input, "\""));
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
                                         ", seed ", o_.seed, ")");
        auto b = core::SampleBatch(*o_.dataset, o_.context, o_.seed, k);
        if (b.ok()) return std::make_pair(*std::move(b), std::move(where));
        Fail(where, b.status());
      }
      return std::nullopt;
    }
    std::string line;
    while (std::getline(*in_, line)) {
      ++line_no_;
      if (IsBlankOrComment(line)) continue;
      std::string where = absl::StrCat(name_, " line ", line_no_);
      auto b = core::ParseBatchLine(line);
      if (b.ok()) return std::make_pair(*std::move(b), std::move(where));
      Fail(where, b.status());
    }
    if (in_->bad()) Fail(name_, absl::DataLossError("read error"));
    return std::nullopt;
  }

  void Fail(absl::string_view where, const absl::Status& status) {
    err_ << kPrefix << where << ": " << absl::StatusCodeToString(status.code()) << ": "
         << status.message() << "\n";
    ++failures_;
  }
  int64_t failures() const { return failures_; }

 private:
  static bool IsBlankOrComment(absl::string_view line) {
    for (char c : line) {
      if (c == '#') return true;
      if (c != ' ' && c != '\t' && c != '\r') return false;
    }
    return true;
  }

  const Options& o_;
  std::istream* in_;
  std::ifstream file_;
  std::ostream& err_;
  std::string name_ = "stdin";
  int64_t next_ = 0;
  int64_t line_no_ = 0;
  int64_t failures_ = 0;
};

int Run(const Options& o, std::istream& in, std::ostream& out, std::ostream& err) {
  Batches batches(o, in, err);
  if (absl::Status s = batches.Open(); !s.ok()) {
    err << kPrefix << s.message() << "\n";
    return kExitFailed;
  }
  absl::StatusOr<fc::ChannelOptions> channel_options = fc::ChannelOptions();
  if (o.tls.has_value()) channel_options = fc::WithTls(fc::ChannelOptions(), *o.tls);
  if (!channel_options.ok()) {
    err << kPrefix << channel_options.status().message() << "\n";
    return kExitFailed;
  }
  auto grpc_client =
      std::make_shared<fc::GrpcPlannerClient>(fc::MakeChannel(o.server, *channel_options));
  // Wait for the server (it may still be starting) before opening the stream:
  // wait_for_ready lets gRPC connect as soon as it listens.
  if (auto info = fc::WaitForServer(*grpc_client, o.connect_timeout); !info.ok()) {
    err << kPrefix << "cannot reach " << o.server << " within "
        << absl::FormatDuration(o.connect_timeout) << ": "
        << absl::StatusCodeToString(info.status().code()) << ": " << info.status().message()
        << "\n";
    return kExitFailed;
  }

  std::vector<core::SummaryAccumulator> acc;
  for (core::Strategy s : core::AllStrategies()) acc.emplace_back(s);
  std::vector<bool> seen(core::AllStrategies().size(), false);

  std::deque<std::string> pending_where;  // of requests sent, not yet answered
  int64_t item_failures = 0;
  auto source = [&]() -> std::optional<fc::v1::PlanRequest> {
    auto next = batches.Next();
    if (!next.has_value()) return std::nullopt;
    fc::v1::PlanRequest r;
    for (int64_t len : next->first) r.add_doc_lens(len);
    r.set_cp_size(o.cp_size);
    r.set_strategy(o.strategy);
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
                             .cost = has_cost ? &plan->cost : nullptr})
        << "\n";
  };
  const absl::Status status =
      fc::PlanPipelined(*grpc_client, {.inflight = o.inflight, .call = {.timeout = o.timeout}},
                        std::ref(source), std::ref(sink));
  if (!status.ok()) {
    err << kPrefix << "stream to " << o.server << " failed: "
        << absl::StatusCodeToString(status.code()) << ": " << status.message() << "\n";
  }
  if (o.summary) {
    std::vector<core::StrategySummary> rows;
    for (core::Strategy s : core::AllStrategies()) {
      if (seen[static_cast<size_t>(s)]) rows.push_back(acc[static_cast<size_t>(s)].Finish());
    }
    out << "# flashcp-client via " << o.server << ": cp " << o.cp_size
        << "; plan ms are the server's planning times\n"
        << core::FormatSummaryTable(rows);
  }
  out.flush();
  const int64_t failures = batches.failures() + item_failures;
  if (failures > 0) err << kPrefix << failures << " item(s) failed\n";
  return status.ok() && failures == 0 && out ? kExitOk : kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<Options> options = ParseOptions(args);
  if (!options.ok()) {
    std::cerr << kPrefix << options.status().message() << "\n" << "try --help\n";
    return kExitUsage;
  }
  if (options->help) {
    std::cout << kUsage;
    return kExitOk;
  }
  return Run(*options, std::cin, std::cout, std::cerr);
}
