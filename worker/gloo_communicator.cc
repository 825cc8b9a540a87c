#include "worker/gloo_communicator.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace flashcp::worker {
namespace {

// Gloo reports failures by throwing; this is the one place they become a
// Status. A Gloo IoException that says "Timed out" is a peer that did not take
// part in time; any other IoException is a broken connection (a peer died or
// closed its pairs after its own failure).
absl::Status FromException(const std::exception& e, bool io, const std::string& context) {
  const std::string msg = absl::StrCat(context, ": ", e.what());
  if (!io) return absl::InternalError(msg);
  if (absl::StrContains(e.what(), "Timed out") || absl::StrContains(e.what(), "timeout")) {
    return absl::DeadlineExceededError(msg);
  }
  return absl::UnavailableError(msg);
}

std::chrono::milliseconds ToMillis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

bool SigpipeAtDefault() {
  struct sigaction current;
  return sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL;
}

// Where each rank's block of a V-collective lies: offset[r] = the sum of
// counts before r (elements), total = the sum of all.
struct Layout {
  std::vector<int64_t> offset;
  int64_t total = 0;
};
// INVALID_ARGUMENT prefixed with `op` unless `counts` has one entry >= 0 per rank.
absl::StatusOr<Layout> CountLayout(absl::string_view op, absl::Span<const int64_t> counts,
                                   int32_t n) {
  if (static_cast<int32_t>(counts.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", counts.size(), " counts for ", n, " ranks"));
  }
  Layout layout;
  layout.offset.resize(n);
  for (int32_t r = 0; r < n; ++r) {
    if (counts[r] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": counts[", r, "] < 0"));
    }
    layout.offset[r] = layout.total;
    layout.total += counts[r];
  }
  return layout;
}

// Ends a wait on an unbound buffer at the operation's deadline by aborting
// it (abortWaitRecv / abortWaitSend) from a thread of its own. Not Gloo's own
// timeout (waitRecv's argument): on expiry that closes every pair of the
// context before it throws ("Application timeout caused pair closure"), so
// the live peers blocked on this rank fail at once on a closed connection,
// before this rank has reported the peer it lost to the rendezvous, and they
// report this rank instead. An aborted wait leaves the pairs open until the
// communicator is destroyed, which its owner does after reporting
// (WorkerDaemon::Run: AbortGroup, then the communicator goes).
class WaitDeadline {
 public:
  WaitDeadline() : thread_([this] { Run(); }) {}
  ~WaitDeadline() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.Signal();
    thread_.join();
  }
  WaitDeadline(const WaitDeadline&) = delete;
  WaitDeadline& operator=(const WaitDeadline&) = delete;

  // Calls `abort` at `deadline` unless Disarm() comes first. One wait at a time.
  void Arm(absl::Time deadline, std::function<void()> abort) {
    {
      absl::MutexLock lock(&mu_);
      deadline_ = deadline;
      abort_ = std::move(abort);
      fired_ = false;
    }
    cv_.Signal();
  }
  // Ends the arming (after the wait returned, before its buffer goes); true
  // if `abort` ran.
  bool Disarm() {
    absl::MutexLock lock(&mu_);
    abort_ = nullptr;
    return fired_;
  }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      if (abort_ == nullptr) {
        cv_.Wait(&mu_);
      } else if (absl::Now() >= deadline_) {
        abort_();  // takes only the buffer's own lock
        abort_ = nullptr;
        fired_ = true;
      } else {
        cv_.WaitWithDeadline(&mu_, deadline_);
      }
    }
  }

  absl::Mutex mu_;
  absl::CondVar cv_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  std::function<void()> abort_ ABSL_GUARDED_BY(mu_);
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context, GlooOptions options)
      : context_(std::move(context)), options_(std::move(options)) {}

  int32_t rank() const override { return context_->rank; }
  int32_t size() const override { return context_->size; }

  absl::Status AllGatherV(absl::Span<const std::byte> input, absl::Span<std::byte> output,
                          absl::Span<const int64_t> counts) override {
    const int32_t n = size(), me = rank();
    FLASHCP_ASSIGN_OR_RETURN(const Layout layout, CountLayout("allgather", counts, n));
    const std::vector<int64_t>& offset = layout.offset;
    const int64_t total = layout.total;
    if (static_cast<int64_t>(input.size()) != counts[me] ||
        static_cast<int64_t>(output.size()) != total) {
      return absl::InvalidArgumentError(
          absl::StrCat("allgather: input ", input.size(), " bytes (counts[", me, "] = ",
                       counts[me], "), output ", output.size(), " bytes (sum ", total, ")"));
    }
    if (!input.empty()) std::memcpy(output.data() + offset[me], input.data(), input.size());
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int32_t r = 0; r < n; ++r) {
      if (r == me) continue;
      sends.push_back(SendOp{r, input});
      recvs.push_back(RecvOp{r, output.subspan(offset[r], counts[r])});
    }
    return Exchange("allgather", sends, recvs);
  }

  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs) override {
    const int32_t n = size(), me = rank();
    std::vector<uint8_t> send_to(n, 0), recv_from(n, 0);
    for (const SendOp& s : sends) {
      if (s.peer < 0 || s.peer >= n || s.peer == me || send_to[s.peer]++) {
        return absl::InvalidArgumentError(
            absl::StrCat("sendrecv: bad or repeated send peer ", s.peer, " on rank ", me));
      }
    }
    for (const RecvOp& r : recvs) {
      if (r.peer < 0 || r.peer >= n || r.peer == me || recv_from[r.peer]++) {
        return absl::InvalidArgumentError(
            absl::StrCat("sendrecv: bad or repeated recv peer ", r.peer, " on rank ", me));
      }
    }
    return Exchange("sendrecv", sends, recvs);
  }

  absl::Status ReduceScatterV(absl::Span<const float> input, absl::Span<float> output,
                              absl::Span<const int64_t> counts) override {
    const int32_t n = size(), me = rank();
    FLASHCP_ASSIGN_OR_RETURN(const Layout layout, CountLayout("reduce_scatter", counts, n));
    const std::vector<int64_t>& offset = layout.offset;
    const int64_t total = layout.total;
    if (static_cast<int64_t>(input.size()) != total ||
        static_cast<int64_t>(output.size()) != counts[me]) {
      return absl::InvalidArgumentError(absl::StrCat("reduce_scatter: input ", input.size(),
                                                     " floats (sum ", total, "), output ",
                                                     output.size(), " (counts[", me,
                                                     "] = ", counts[me], ")"));
    }
    const int64_t mine = counts[me];
    std::vector<float> staged(static_cast<size_t>(mine) * n, 0.0f);  // block r from rank r
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int32_t r = 0; r < n; ++r) {
      if (r == me) continue;
      sends.push_back(SendOp{r, absl::MakeConstSpan(
                                    reinterpret_cast<const std::byte*>(input.data() + offset[r]),
                                    counts[r] * sizeof(float))});
      recvs.push_back(RecvOp{r, absl::MakeSpan(reinterpret_cast<std::byte*>(staged.data() + r * mine),
                                               mine * sizeof(float))});
    }
    if (absl::Status s = Exchange("reduce_scatter", sends, recvs); !s.ok()) return s;
    std::copy(input.begin() + offset[me], input.begin() + offset[me] + mine,
              staged.begin() + me * mine);
    std::fill(output.begin(), output.end(), 0.0f);
    for (int32_t r = 0; r < n; ++r) {  // rank order: deterministic sums
      const float* block = staged.data() + r * mine;
      for (int64_t i = 0; i < mine; ++i) output[i] += block[i];
    }
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    if (absl::Status s = CheckUsable("barrier"); !s.ok()) return s;
    try {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(ToMillis(options_.timeout));
      gloo::barrier(opts);
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      return Fail(FromException(e, true, Context("barrier")));
    } catch (const std::exception& e) {
      return Fail(FromException(e, false, Context("barrier")));
    }
  }

  CommStats stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }

 private:
  std::string Context(absl::string_view op) const {
    return absl::StrCat("gloo ", op, " on rank ", rank(), " of ", size(), " (timeout ",
                        absl::FormatDuration(options_.timeout), ")");
  }

  absl::Status CheckUsable(absl::string_view op) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "gloo ", op, " on rank ", rank(), ": communicator broken by an earlier failure: ",
        broken_.ToString()));
  }

  absl::Status Fail(absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = s;
    return s;
  }

  // Disarms a WaitDeadline when its wait's scope ends, also by an exception,
  // so the abort never outlives the buffer it touches.
  class DisarmOnExit {
   public:
    explicit DisarmOnExit(WaitDeadline& d) : d_(d) {}
    ~DisarmOnExit() { d_.Disarm(); }
    bool Disarm() { return d_.Disarm(); }

   private:
    WaitDeadline& d_;
  };

  // A wait that returned without its transfer: the deadline aborted it
  // (DeadlineExceeded), or something else did (Aborted).
  absl::Status Unfinished(absl::string_view op, absl::string_view what, bool timed_out) const {
    if (timed_out) {
      return absl::DeadlineExceededError(absl::StrCat(Context(op), ": ", what, ": timed out"));
    }
    return absl::AbortedError(absl::StrCat(Context(op), ": ", what, " aborted"));
  }

  // Posts every non-empty send and receive on one fresh slot, then waits for
  // the receives in peer order and the sends, all against one deadline
  // (WaitDeadline's, which leaves the pairs open).
  absl::Status Exchange(absl::string_view op, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs) {
    if (absl::Status s = CheckUsable(op); !s.ok()) return s;
    int64_t sent = 0, received = 0;
    std::string what = "posting";
    try {
      const uint64_t slot = static_cast<uint64_t>(context_->nextSlot());
      std::vector<std::pair<const RecvOp*, std::unique_ptr<gloo::transport::UnboundBuffer>>> rb;
      std::vector<std::pair<const SendOp*, std::unique_ptr<gloo::transport::UnboundBuffer>>> sb;
      for (const RecvOp& r : recvs) {
        if (r.data.empty()) continue;
        what = absl::StrCat("posting recv of ", r.data.size(), " bytes from rank ", r.peer);
        auto buf = context_->createUnboundBuffer(r.data.data(), r.data.size());
        buf->recv(r.peer, slot);
        rb.emplace_back(&r, std::move(buf));
      }
      for (const SendOp& s : sends) {
        if (s.data.empty()) continue;
        what = absl::StrCat("posting send of ", s.data.size(), " bytes to rank ", s.peer);
        // Gloo's buffers are mutable in type only; a send never writes.
        auto buf = context_->createUnboundBuffer(const_cast<std::byte*>(s.data.data()),
                                                 s.data.size());
        buf->send(s.peer, slot);
        sb.emplace_back(&s, std::move(buf));
      }
      const absl::Time deadline = absl::Now() + options_.timeout;
      // Gloo's own timeout only as a backstop, one timeout past ours.
      const auto backstop = [&] { return ToMillis(deadline - absl::Now() + options_.timeout); };
      for (auto& [r, buf] : rb) {
        what = absl::StrCat("recv of ", r->data.size(), " bytes from rank ", r->peer);
        gloo::transport::UnboundBuffer* b = buf.get();
        deadline_.Arm(deadline, [b] { b->abortWaitRecv(); });
        DisarmOnExit disarm(deadline_);
        if (!b->waitRecv(backstop())) return Fail(Unfinished(op, what, disarm.Disarm()));
        received += static_cast<int64_t>(r->data.size());
      }
      for (auto& [s, buf] : sb) {
        what = absl::StrCat("send of ", s->data.size(), " bytes to rank ", s->peer);
        gloo::transport::UnboundBuffer* b = buf.get();
        deadline_.Arm(deadline, [b] { b->abortWaitSend(); });
        DisarmOnExit disarm(deadline_);
        if (!b->waitSend(backstop())) return Fail(Unfinished(op, what, disarm.Disarm()));
        sent += static_cast<int64_t>(s->data.size());
      }
    } catch (const gloo::IoException& e) {
      return Fail(FromException(e, true, absl::StrCat(Context(op), ": ", what)));
    } catch (const std::exception& e) {
      return Fail(FromException(e, false, absl::StrCat(Context(op), ": ", what)));
    }
    absl::MutexLock lock(&mu_);
    stats_.bytes_sent += sent;
    stats_.bytes_received += received;
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  const GlooOptions options_;
  WaitDeadline deadline_;  // Exchange's; one Exchange at a time (the contract: one caller)
  mutable absl::Mutex mu_;
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void IgnoreSigpipe() {
  if (SigpipeAtDefault()) signal(SIGPIPE, SIG_IGN);
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(gloo::rendezvous::Store& store,
                                                          int32_t rank, int32_t size,
                                                          const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo connect: rank ", rank, " outside a group of ", size));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo connect: timeout must be positive, got ", absl::FormatDuration(options.timeout)));
  }
  if (SigpipeAtDefault()) {
    return absl::FailedPreconditionError(
        "gloo connect: SIGPIPE is at its default action, so a peer closing its socket would "
        "kill this process; main() must call IgnoreSigpipe() first");
  }
  const std::string context = absl::StrCat("gloo connect: rank ", rank, " of ", size, " via ",
                                           options.hostname, " (timeout ",
                                           absl::FormatDuration(options.timeout), ")");
  try {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(ToMillis(options.timeout));
    ctx->connectFullMesh(store, device);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(ctx), options));
  } catch (const gloo::IoException& e) {
    return FromException(e, true, context);
  } catch (const std::exception& e) {
    return FromException(e, false, context);
  }
}

}  // namespace flashcp::worker
