// flashcp-plan: plans context-parallel sharding of packed batches from the
// command line, a file, stdin or a named data set (core/cli.h has the logic;
// --help lists the flags). main only wires argv and the standard streams.
#include <iostream>
#include <string>
#include <vector>

#include "core/cli.h"
#ifdef FLASHCP_HAVE_ILP  // FLASHCP_BUILD_ILP (CMake): --strategy ilp
#include "core/ilp/ilp.h"
#include "core/ilp/pipeline_ckpt.h"
#endif

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<flashcp::core::CliOptions> options = flashcp::core::ParseCliArgs(args);
  if (!options.ok()) return flashcp::core::UsageError("flashcp-plan", options.status(), std::cerr);
  for (const std::string& w : options->warnings) std::cerr << "flashcp-plan: " << w << "\n";
  if (options->help) {
    std::cout << flashcp::core::CliUsage();
    return flashcp::core::kExitOk;
  }
#ifdef FLASHCP_HAVE_ILP
  options->plan.ilp.solver = flashcp::core::ilp::Solve;
  options->pipeline_options.ckpt_solver = flashcp::core::ilp::SolvePipelineCkpt;
#endif
  return flashcp::core::RunCli(*options, std::cin, std::cout, std::cerr);
}
