#include "worker/cpstep.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/file.h"
#include "core/mask.h"
#include "core/random.h"
#include "core/status_macros.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/hash_store.h"
#include "worker/attention_reference.h"
#include "worker/engine.h"
#include "worker/mask_reference.h"
#include "worker/gloo_communicator.h"
#include "worker/thread_pool.h"

namespace flashcp::worker {
namespace {

// First global row of each document.
std::vector<int64_t> DocStarts(const core::Plan& plan) {
  std::vector<int64_t> start(plan.doc_lens.size(), 0);
  for (size_t d = 1; d < plan.doc_lens.size(); ++d) start[d] = start[d - 1] + plan.doc_lens[d - 1];
  return start;
}

// Copies rank `layout`'s shards between its local rows and the global rows of
// the packed batch, `width` floats a row.
void GlobalToLocal(const core::Plan& plan, const core::RankLayout& layout,
                   const std::vector<int64_t>& doc_start, int64_t width,
                   const std::vector<float>& global, std::vector<float>& local) {
  for (size_t i = 0; i < layout.shards.size(); ++i) {
    const core::Shard& s = plan.shards[layout.shards[i]];
    const float* g = global.data() + (doc_start[s.doc] + s.start) * width;
    std::copy(g, g + s.len * width, local.data() + layout.shard_offset[i] * width);
  }
}
void LocalToGlobal(const core::Plan& plan, const core::RankLayout& layout,
                   const std::vector<int64_t>& doc_start, int64_t width,
                   const std::vector<float>& local, std::vector<float>& global) {
  for (size_t i = 0; i < layout.shards.size(); ++i) {
    const core::Shard& s = plan.shards[layout.shards[i]];
    const float* l = local.data() + layout.shard_offset[i] * width;
    std::copy(l, l + s.len * width, global.data() + (doc_start[s.doc] + s.start) * width);
  }
}

// Status of the lowest failing rank other than `skip`, all errors listed.
absl::Status Combine(const std::vector<absl::Status>& statuses, int32_t skip) {
  std::vector<std::string> parts;
  absl::Status first;
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (statuses[r].ok()) continue;
    parts.push_back(absl::StrCat("rank ", r, ": ", statuses[r].ToString()));
    if (first.ok() && static_cast<int32_t>(r) != skip) first = statuses[r];
  }
  if (parts.empty()) return absl::OkStatus();
  if (first.ok()) first = absl::InternalError("only the injected fault failed");
  return absl::Status(first.code(), absl::StrJoin(parts, "; "));
}

// --- Files shared with rank processes ---------------------------------------

std::string PlanText(const core::Plan& plan) {
  std::ostringstream out;
  out << plan.cp_size << ' ' << plan.padding << ' ' << plan.doc_lens.size() << ' '
      << plan.shards.size() << '\n';
  for (int64_t len : plan.doc_lens) out << len << ' ';
  out << '\n';
  for (const core::Shard& s : plan.shards) {
    out << s.doc << ' ' << s.start << ' ' << s.len << ' ' << s.rank << '\n';
  }
  // The mask, only where it is not the causal default (that text unchanged).
  if (core::IsBlockDiffusion(plan.mask)) out << "block_diffusion " << plan.mask.block_size << '\n';
  return out.str();
}

// What the files the parent and its rank processes exchange are, in their
// errors (core/file.h).
constexpr char kRankFile[] = "rank file";

absl::StatusOr<core::Plan> ReadPlan(const std::string& path) {
  FLASHCP_ASSIGN_OR_RETURN(const std::string text, core::ReadFile(kRankFile, path));
  std::istringstream in(text);
  core::Plan plan;
  size_t docs = 0, shards = 0;
  if (!(in >> plan.cp_size >> plan.padding >> docs >> shards) || docs > size_t{core::kMaxDocs} ||
      shards > size_t{core::kMaxDocs} * 64) {
    return absl::DataLossError(absl::StrCat(path, ": bad plan header"));
  }
  plan.doc_lens.resize(docs);
  for (int64_t& len : plan.doc_lens) in >> len;
  plan.shards.resize(shards);
  for (core::Shard& s : plan.shards) in >> s.doc >> s.start >> s.len >> s.rank;
  if (!in) return absl::DataLossError(absl::StrCat(path, ": truncated plan"));
  std::string mask;
  if (in >> mask) {
    FLASHCP_ASSIGN_OR_RETURN(plan.mask.kind, core::ParseMaskKind(mask));
    if (!(in >> plan.mask.block_size))
      return absl::DataLossError(absl::StrCat(path, ": truncated mask"));
  }
  return plan;
}

// `data` as the file at `path`, whole or not at all: written beside it, then
// renamed over it, so the parent never reads a half-written result.
absl::Status WriteFileAtomically(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  FLASHCP_RETURN_IF_ERROR(core::WriteFile(kRankFile, tmp, data));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return core::FileError(kRankFile, "rename", tmp, errno);
  }
  return absl::OkStatus();
}

template <typename T>
void Put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

std::string SerializeResult(const RankResult& r) {
  std::string out;
  for (const std::vector<float>* v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) {
    Put(out, static_cast<int64_t>(v->size()));
    out.append(reinterpret_cast<const char*>(v->data()), v->size() * sizeof(float));
  }
  Put(out, r.stats.bytes_sent);
  Put(out, r.stats.bytes_received);
  Put(out, r.seconds);
  return out;
}

absl::StatusOr<RankResult> ParseResult(const std::string& data, const std::string& path) {
  RankResult r;
  size_t at = 0;
  auto get = [&](void* dst, size_t n) {
    if (at + n > data.size()) return false;
    std::memcpy(dst, data.data() + at, n);
    at += n;
    return true;
  };
  for (std::vector<float>* v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) {
    int64_t n = 0;
    if (!get(&n, sizeof(n)) || n < 0 || static_cast<size_t>(n) > data.size() / sizeof(float)) {
      return absl::DataLossError(absl::StrCat(path, ": truncated result"));
    }
    v->resize(n);
    if (!get(v->data(), n * sizeof(float))) {
      return absl::DataLossError(absl::StrCat(path, ": truncated result"));
    }
  }
  if (!get(&r.stats.bytes_sent, 8) || !get(&r.stats.bytes_received, 8) || !get(&r.seconds, 8)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated result"));
  }
  return r;
}

std::string RankPath(const std::string& dir, int32_t rank, absl::string_view ext) {
  return absl::StrCat(dir, "/rank-", rank, ".", ext);
}

}  // namespace

StepInputs MakeInputs(int64_t tokens, const AttentionShape& shape, uint64_t seed) {
  const size_t n = static_cast<size_t>(tokens) * shape.heads * shape.head_dim;
  uint64_t state = seed;
  StepInputs in;
  for (std::vector<float>* v : {&in.q, &in.k, &in.v, &in.dout}) {
    v->resize(n);
    // 24 random bits -> [0, 1) exactly, then [-1, 1).
    for (float& f : *v) f = static_cast<float>(core::SplitMix64(state) >> 40) * 0x1p-23f - 1.0f;
  }
  return in;
}

absl::StatusOr<RankResult> RunRank(const core::Plan& plan, int32_t rank, const StepConfig& config,
                                   const StepInputs& inputs, Communicator& comm,
                                   const std::function<absl::Status()>& after_barrier) {
  FLASHCP_ASSIGN_OR_RETURN(CpAttentionStep step,
                           CpAttentionStep::Create(plan, rank, config.shape, config.scheme));
  const int64_t e = int64_t{config.shape.heads} * config.shape.head_dim;
  const int64_t rows = step.local_rows();
  const std::vector<int64_t> doc_start = DocStarts(plan);
  const core::RankLayout& layout = step.layout().ranks[rank];
  std::vector<float> q(rows * e, 0.0f), k(rows * e, 0.0f), v(rows * e, 0.0f), dout(rows * e, 0.0f);
  GlobalToLocal(plan, layout, doc_start, e, inputs.q, q);
  GlobalToLocal(plan, layout, doc_start, e, inputs.k, k);
  GlobalToLocal(plan, layout, doc_start, e, inputs.v, v);
  GlobalToLocal(plan, layout, doc_start, e, inputs.dout, dout);
  RankResult res;
  res.o.resize(rows * e);
  res.lse.resize(rows * config.shape.heads);
  res.dq.resize(rows * e);
  res.dk.resize(rows * e);
  res.dv.resize(rows * e);
  ThreadPool pool(config.threads_per_rank);
  FLASHCP_RETURN_IF_ERROR(comm.Barrier());
  if (after_barrier) FLASHCP_RETURN_IF_ERROR(after_barrier());
  const CommStats before = comm.stats();
  const absl::Time start = absl::Now();
  FLASHCP_RETURN_IF_ERROR(step.Forward(comm, pool, q, k, v, absl::MakeSpan(res.o),
                                       absl::MakeSpan(res.lse)));
  const CommStats after_forward = comm.stats();
  // The all-to-all keeps the log-sum-exps with the heads (engine.h): none to compare.
  if (config.scheme == core::CommScheme::kAllToAll) res.lse.clear();
  FLASHCP_RETURN_IF_ERROR(step.Backward(comm, pool, dout, absl::MakeSpan(res.dq),
                                        absl::MakeSpan(res.dk), absl::MakeSpan(res.dv)));
  FLASHCP_RETURN_IF_ERROR(comm.Barrier());
  res.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const CommStats after = comm.stats();
  res.stats.bytes_sent = after.bytes_sent - before.bytes_sent;
  res.stats.bytes_received = after.bytes_received - before.bytes_received;
  res.forward_stats.bytes_sent = after_forward.bytes_sent - before.bytes_sent;
  res.forward_stats.bytes_received = after_forward.bytes_received - before.bytes_received;
  return res;
}

absl::StatusOr<std::vector<RankResult>> RunThreads(const core::Plan& plan, const StepConfig& config,
                                                   const StepInputs& inputs) {
  const int32_t n = plan.cp_size;
  gloo::rendezvous::HashStore store;
  std::vector<absl::Status> statuses(n);
  std::vector<RankResult> results(n);
  absl::Mutex mu;
  int32_t finished = 0;  // ranks other than a hanging one that have returned
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          ConnectGloo(store, r, n, GlooOptions{"127.0.0.1", config.timeout});
      const bool faulty = config.fault.kind != Fault::kNone && config.fault.rank == r;
      std::function<absl::Status()> fault;
      if (faulty && config.fault.kind == Fault::kCrash) {
        fault = [&comm] {
          comm->reset();  // closes its sockets, as a dead process's would be
          return absl::AbortedError("injected crash");
        };
      } else if (faulty) {
        fault = [&mu, &finished, n] {
          struct OthersDone {
            const int32_t* finished;
            int32_t others;
            bool operator()() const { return *finished == others; }
          } others_done{&finished, n - 1};
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(&others_done));
          return absl::AbortedError("injected hang");
        };
      }
      if (!comm.ok()) {
        statuses[r] = comm.status();
      } else {
        absl::StatusOr<RankResult> res = RunRank(plan, r, config, inputs, **comm, fault);
        if (res.ok()) {
          results[r] = *std::move(res);
        } else {
          statuses[r] = res.status();
        }
      }
      if (!faulty || config.fault.kind != Fault::kHang) {
        absl::MutexLock lock(&mu);
        ++finished;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  FLASHCP_RETURN_IF_ERROR(Combine(statuses, config.fault.rank));
  return results;
}

absl::Status RankProcessMain(int32_t rank, const StepConfig& config, uint64_t seed,
                             const std::string& dir) {
  auto run = [&]() -> absl::Status {
    FLASHCP_ASSIGN_OR_RETURN(const core::Plan plan, ReadPlan(dir + "/plan.txt"));
    const StepInputs inputs =
        MakeInputs(core::TotalTokens(plan.doc_lens), config.shape, seed);
    gloo::rendezvous::FileStore store(dir + "/store");
    FLASHCP_ASSIGN_OR_RETURN(
        std::unique_ptr<Communicator> comm,
        ConnectGloo(store, rank, plan.cp_size, GlooOptions{"127.0.0.1", config.timeout}));
    std::function<absl::Status()> fault;
    if (config.fault.kind != Fault::kNone && config.fault.rank == rank) {
      fault = [&config]() -> absl::Status {
        if (config.fault.kind == Fault::kCrash) raise(SIGKILL);
        while (true) pause();  // hang until the parent kills this process
      };
    }
    FLASHCP_ASSIGN_OR_RETURN(RankResult res, RunRank(plan, rank, config, inputs, *comm, fault));
    return WriteFileAtomically(RankPath(dir, rank, "bin"), SerializeResult(res));
  };
  absl::Status s = run();
  if (!s.ok()) {
    // First line: the numeric code; then the message, for the parent.
    (void)WriteFileAtomically(RankPath(dir, rank, "err"),
                              absl::StrCat(static_cast<int>(s.code()), "\n", s.message()));
  }
  return s;
}

absl::Status ParseRankError(const std::string& text) {
  const size_t nl = text.find('\n');
  int code = 0;
  if (nl == std::string::npos || !absl::SimpleAtoi(text.substr(0, nl), &code) || code < 1 ||
      code > 16) {
    return absl::UnknownError(absl::StrCat("rank error file without a valid code: \"",
                                           absl::CEscape(text), "\""));
  }
  return absl::Status(static_cast<absl::StatusCode>(code), text.substr(nl + 1));
}

namespace {

// Starts one process per rank (argv plus its rank and the shared dir); on a
// failed fork kills and reaps those already started.
absl::StatusOr<std::vector<pid_t>> SpawnRanks(const std::vector<std::string>& argv,
                                              const std::string& dir, int32_t n) {
  std::vector<pid_t> pids(n, -1);
  for (int32_t r = 0; r < n; ++r) {
    std::vector<std::string> args = argv;
    args.insert(args.end(), {"--internal_rank", absl::StrCat(r), "--internal_dir", dir});
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) {
        if (p > 0) kill(p, SIGKILL);
      }
      for (pid_t p : pids) {
        if (p > 0) waitpid(p, nullptr, 0);
      }
      return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(errno)));
    }
    if (pid == 0) {
      execv(cargs[0], cargs.data());
      _exit(127);
    }
    pids[r] = pid;
  }
  return pids;
}

// Reaps the children, returning each one's wait status; once one has failed,
// gives the rest `timeout` to finish (their collectives fail by then), then
// kills what is left (hung ranks).
std::vector<int> ReapRanks(const std::vector<pid_t>& pids, absl::Duration timeout) {
  const int32_t n = static_cast<int32_t>(pids.size());
  std::vector<int> wstatus(n, 0);
  std::vector<bool> done(n, false);
  int32_t remaining = n;
  absl::Time kill_at = absl::InfiniteFuture();
  while (remaining > 0) {
    // Only our own children, by pid: waitpid(-1) would also reap (and lose
    // the status of) children the rest of the program started.
    bool reaped = false;
    for (int32_t r = 0; r < n; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      reaped = true;
      done[r] = true;
      wstatus[r] = st;
      --remaining;
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && kill_at == absl::InfiniteFuture()) {
        kill_at = absl::Now() + timeout;
      }
    }
    if (reaped) continue;
    if (absl::Now() >= kill_at) {
      for (int32_t r = 0; r < n; ++r) {
        if (!done[r]) kill(pids[r], SIGKILL);
      }
      kill_at = absl::InfiniteFuture();  // reaped on the next iterations
    }
    absl::SleepFor(absl::Milliseconds(5));  // polling interval of the reaper, not a wait for luck
  }
  return wstatus;
}

// Rank r's result file when it exited 0, else the error it wrote or how it died.
absl::StatusOr<RankResult> CollectRank(const std::string& dir, int32_t r, int st) {
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
    absl::StatusOr<std::string> data = core::ReadFile(kRankFile, RankPath(dir, r, "bin"));
    return data.ok() ? ParseResult(*data, RankPath(dir, r, "bin")) : data.status();
  }
  absl::StatusOr<std::string> err = core::ReadFile(kRankFile, RankPath(dir, r, "err"));
  if (err.ok()) return ParseRankError(*err);
  if (WIFSIGNALED(st)) {
    return absl::AbortedError(absl::StrCat("process killed by signal ", WTERMSIG(st)));
  }
  return absl::UnknownError(
      absl::StrCat("process exited with status ", WEXITSTATUS(st), " and no error file"));
}

}  // namespace

absl::StatusOr<std::vector<RankResult>> RunProcesses(const core::Plan& plan,
                                                     const StepConfig& config,
                                                     const std::vector<std::string>& argv) {
  const int32_t n = plan.cp_size;
  const char* tmp = getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/flashcp-cpstep-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mkdtemp ", tmpl));
  }
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  std::error_code ec;
  std::filesystem::create_directory(dir + "/store", ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("mkdir ", dir, "/store"));
  FLASHCP_RETURN_IF_ERROR(WriteFileAtomically(dir + "/plan.txt", PlanText(plan)));
  FLASHCP_ASSIGN_OR_RETURN(const std::vector<pid_t> pids, SpawnRanks(argv, dir, n));
  const std::vector<int> wstatus = ReapRanks(pids, config.timeout);
  std::vector<absl::Status> statuses(n);
  std::vector<RankResult> results(n);
  for (int32_t r = 0; r < n; ++r) {
    absl::StatusOr<RankResult> res = CollectRank(dir, r, wstatus[r]);
    if (res.ok()) {
      results[r] = *std::move(res);
    } else {
      statuses[r] = res.status();
    }
  }
  FLASHCP_RETURN_IF_ERROR(Combine(statuses, config.fault.rank));
  return results;
}

absl::StatusOr<StepErrors> CompareWithReference(const core::Plan& plan,
                                                const AttentionShape& shape,
                                                const StepInputs& inputs,
                                                const std::vector<RankResult>& results) {
  FLASHCP_ASSIGN_OR_RETURN(const core::CommLayout layout, core::BuildCommLayout(plan));
  if (static_cast<int32_t>(results.size()) != plan.cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(results.size(), " results for ", plan.cp_size, " ranks"));
  }
  const int64_t total = core::TotalTokens(plan.doc_lens);
  const int64_t e = int64_t{shape.heads} * shape.head_dim;
  const std::vector<int64_t> doc_start = DocStarts(plan);
  std::vector<float> o(total * e), lse(total * shape.heads), dq(total * e), dk(total * e),
      dv(total * e);
  const int64_t rows = core::TokensPerRank(total, plan.cp_size);
  for (int32_t r = 0; r < plan.cp_size; ++r) {
    const RankResult& res = results[r];
    if (static_cast<int64_t>(res.o.size()) != rows * e ||
        (static_cast<int64_t>(res.lse.size()) != rows * shape.heads && !res.lse.empty()) ||
        static_cast<int64_t>(res.dq.size()) != rows * e ||
        static_cast<int64_t>(res.dk.size()) != rows * e ||
        static_cast<int64_t>(res.dv.size()) != rows * e) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": result sizes do not match"));
    }
    const core::RankLayout& l = layout.ranks[r];
    LocalToGlobal(plan, l, doc_start, e, res.o, o);
    if (!res.lse.empty()) LocalToGlobal(plan, l, doc_start, shape.heads, res.lse, lse);
    LocalToGlobal(plan, l, doc_start, e, res.dq, dq);
    LocalToGlobal(plan, l, doc_start, e, res.dk, dk);
    LocalToGlobal(plan, l, doc_start, e, res.dv, dv);
  }
  std::vector<float> ro(total * e), rlse(total * shape.heads), rdq(total * e), rdk(total * e),
      rdv(total * e);
  if (core::IsBlockDiffusion(plan.mask)) {
    // The plan's 2n documents are the batch's n noisy copies, then its n
    // clean copies: in plan order they are the step's [noisy ; clean] rows.
    const std::vector<int64_t> batch(plan.doc_lens.begin(),
                                     plan.doc_lens.begin() + plan.doc_lens.size() / 2);
    const int64_t b = plan.mask.block_size;
    FLASHCP_RETURN_IF_ERROR(BlockDiffusionReferenceForward(
        shape, batch, b, inputs.q, inputs.k, inputs.v, absl::MakeSpan(ro), absl::MakeSpan(rlse)));
    FLASHCP_RETURN_IF_ERROR(BlockDiffusionReferenceBackward(
        shape, batch, b, inputs.q, inputs.k, inputs.v, inputs.dout, absl::MakeSpan(rdq),
        absl::MakeSpan(rdk), absl::MakeSpan(rdv)));
  } else {
    FLASHCP_RETURN_IF_ERROR(ReferenceForward(shape, plan.doc_lens, inputs.q, inputs.k, inputs.v,
                                             absl::MakeSpan(ro), absl::MakeSpan(rlse)));
    FLASHCP_RETURN_IF_ERROR(ReferenceBackward(shape, plan.doc_lens, inputs.q, inputs.k,
                                              inputs.v, inputs.dout, absl::MakeSpan(rdq),
                                              absl::MakeSpan(rdk), absl::MakeSpan(rdv)));
  }
  // Ranks that returned no lse (all_to_all) leave 0 in both.
  for (int32_t r = 0; r < plan.cp_size; ++r) {
    if (!results[r].lse.empty()) continue;
    const core::RankLayout& l = layout.ranks[r];
    std::vector<float> zero(rows * shape.heads, 0.0f);
    LocalToGlobal(plan, l, doc_start, shape.heads, zero, rlse);
  }
  return StepErrors{MaxRelError(o, ro), MaxRelError(lse, rlse), MaxRelError(dq, rdq),
                    MaxRelError(dk, rdk), MaxRelError(dv, rdv)};
}

}  // namespace flashcp::worker
