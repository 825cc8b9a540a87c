// flashcp-plan --pipeline (core/cli.h): what RunCli does with each batch in
// pipeline mode (core/pipeline.h). One JSON line per batch and strategy
// (PipelinePlanToJson, planning_seconds 0 so the output is deterministic), or
// with --summary a table of each strategy's means: simulated iteration time,
// bubble share, recompute time, worst-stage peak memory, plans that fit, plan
// time. --svg draws the first batch's first strategy's replay.
#ifndef FLASHCP_CORE_CLI_PIPELINE_H_
#define FLASHCP_CORE_CLI_PIPELINE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/cli.h"

namespace flashcp::core {

class PipelineCliRun {
 public:
  PipelineCliRun(const CliOptions& options, std::ostream& out, std::ostream& err)
      : options_(options), out_(out), err_(err), rows_(options.pipeline_strategies.size()) {}
  // Plans one batch with every strategy: kExitOk, or kExitBadInput after
  // writing why (a bad batch; a plan that fails, except a batch that fits no
  // plan in --summary, which the table counts).
  int Batch(std::vector<int64_t> docs, const std::string& where);
  // The summary and the SVG, if asked for; the exit code.
  int Finish();

 private:
  struct Row {
    int64_t batches = 0, fits = 0;
    double iteration_s = 0, bubble = 0, recompute_s = 0, peak_bytes = 0, plan_ms = 0;
  };
  const CliOptions& options_;
  std::ostream& out_;
  std::ostream& err_;
  std::vector<Row> rows_;
  int64_t done_ = 0;
  std::string svg_;
};

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_CLI_PIPELINE_H_
