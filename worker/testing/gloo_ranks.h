// Test support for code over a real Gloo group on loopback: including this
// header makes the test binary ignore SIGPIPE before any test (ConnectGloo
// refuses to run while SIGPIPE is at its default action, and flashcp-worker's
// main ignores it too), and RunRanks runs ranks on threads.
#ifndef FLASHCP_WORKER_TESTING_GLOO_RANKS_H_
#define FLASHCP_WORKER_TESTING_GLOO_RANKS_H_

#include <barrier>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "worker/communicator.h"
#include "worker/gloo_communicator.h"

namespace flashcp::worker::testing {

class IgnoreSigpipeEnvironment final : public ::testing::Environment {
 public:
  void SetUp() override { IgnoreSigpipe(); }
};
// One registration per test binary, whichever of its files include this.
[[maybe_unused]] inline ::testing::Environment* const kIgnoreSigpipe =
    ::testing::AddGlobalTestEnvironment(new IgnoreSigpipeEnvironment);

// Runs fn(rank, communicator) on `n` threads, each connected through one
// HashStore; fails the test if a rank cannot connect. No rank starts before
// every rank's connect returned, and none closes before every rank is done: a
// rank whose fn needs no peer (argument checks) would otherwise close its
// sockets while a peer's connect is still reading the handshake, and that
// peer fails with "Connection closed by peer".
inline void RunRanks(int32_t n, absl::Duration timeout,
                     const std::function<void(int32_t, Communicator&)>& fn) {
  gloo::rendezvous::HashStore store;
  std::barrier connected(n), done(n);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Communicator>> comm =
          ConnectGloo(store, r, n, GlooOptions{"127.0.0.1", timeout});
      connected.arrive_and_wait();
      EXPECT_TRUE(comm.ok()) << comm.status();
      if (comm.ok()) fn(r, **comm);
      done.arrive_and_wait();
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace flashcp::worker::testing

#endif  // FLASHCP_WORKER_TESTING_GLOO_RANKS_H_
