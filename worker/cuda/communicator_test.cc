// The GPU communicators verify their data and byte counts: the device-local
// group (any one GPU) and NCCL (one rank per GPU; the multi-rank case runs
// only where the machine has two or more GPUs). A rank that never arrives
// makes the others fail with DeadlineExceeded, never hang.
#include <cstddef>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "core/testing/status_matchers.h"
#include "gloo/rendezvous/hash_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/cuda/device_communicator.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/gpu_test_util.h"

namespace flashcp::worker::cuda {
namespace {

using core::testing::IsOk;
using core::testing::StatusIs;

absl::Span<const std::byte> CBytes(const DeviceBuffer<float>& b, int64_t first, int64_t n) {
  return {reinterpret_cast<const std::byte*>(b.data() + first), static_cast<size_t>(n) * 4};
}
absl::Span<std::byte> Bytes(DeviceBuffer<float>& b, int64_t first, int64_t n) {
  return {reinterpret_cast<std::byte*>(b.data() + first), static_cast<size_t>(n) * 4};
}

// Rank r's all-gather block is counts[r] floats of value 100 r + i; the
// reduce-scatter input's block j is (r + 1) * (j + 1) + i; every rank sends
// rank (r + 1) % n a message of r + 3 floats.
absl::Status Exercise(DeviceCommunicator& c, int32_t n) {
  const int32_t r = c.rank();
  std::vector<int64_t> counts(n);
  for (int32_t j = 0; j < n; ++j) counts[j] = 16 * (j + 1);
  std::vector<int64_t> bytes(n);
  for (int32_t j = 0; j < n; ++j) bytes[j] = counts[j] * 4;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  auto in = DeviceBuffer<float>::Allocate(counts[r]);
  auto out = DeviceBuffer<float>::Allocate(total);
  if (!in.ok() || !out.ok()) return absl::InternalError("alloc");
  std::vector<float> h(counts[r]);
  for (int64_t i = 0; i < counts[r]; ++i) h[i] = 100.f * r + i;
  if (cudaMemcpy(in->data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
    return absl::InternalError("copy");
  if (absl::Status s = c.AllGatherV(CBytes(*in, 0, counts[r]), Bytes(*out, 0, total), bytes); !s.ok())
    return s;
  std::vector<float> got(total);
  if (cudaMemcpy(got.data(), out->data(), total * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return absl::InternalError("copy back");
  int64_t at = 0;
  for (int32_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < counts[j]; ++i, ++at)
      if (got[at] != 100.f * j + i)
        return absl::InternalError(absl::StrCat("allgather: block ", j, " element ", i, " is ", got[at]));
  // Reduce-scatter.
  std::vector<float> rs(total);
  at = 0;
  for (int32_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < counts[j]; ++i) rs[at++] = (r + 1.f) * (j + 1) + i;
  auto rs_in = DeviceBuffer<float>::Allocate(total);
  auto rs_out = DeviceBuffer<float>::Allocate(counts[r]);
  if (!rs_in.ok() || !rs_out.ok()) return absl::InternalError("alloc");
  if (cudaMemcpy(rs_in->data(), rs.data(), total * 4, cudaMemcpyHostToDevice) != cudaSuccess)
    return absl::InternalError("copy");
  if (absl::Status s = c.ReduceScatterV(absl::Span<const float>(rs_in->data(), total),
                                        absl::Span<float>(rs_out->data(), counts[r]), counts);
      !s.ok())
    return s;
  std::vector<float> red(counts[r]);
  if (cudaMemcpy(red.data(), rs_out->data(), counts[r] * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
    return absl::InternalError("copy back");
  const float ranks_sum = n * (n + 1) / 2.f;
  for (int64_t i = 0; i < counts[r]; ++i)
    if (red[i] != ranks_sum * (r + 1) + n * static_cast<float>(i))
      return absl::InternalError(absl::StrCat("reduce-scatter element ", i, " is ", red[i]));
  // Send/recv around the ring.
  if (n > 1) {
    const int32_t to = (r + 1) % n, from = (r + n - 1) % n;
    auto sbuf = DeviceBuffer<float>::Allocate(r + 3);
    auto rbuf = DeviceBuffer<float>::Allocate(from + 3);
    if (!sbuf.ok() || !rbuf.ok()) return absl::InternalError("alloc");
    std::vector<float> hs(r + 3, static_cast<float>(r));
    if (cudaMemcpy(sbuf->data(), hs.data(), hs.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess)
      return absl::InternalError("copy");
    std::vector<SendOp> sends = {{to, CBytes(*sbuf, 0, r + 3)}};
    std::vector<RecvOp> recvs = {{from, Bytes(*rbuf, 0, from + 3)}};
    if (absl::Status s = c.SendRecv(sends, recvs); !s.ok()) return s;
    std::vector<float> hr(from + 3);
    if (cudaMemcpy(hr.data(), rbuf->data(), hr.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      return absl::InternalError("copy back");
    for (float x : hr)
      if (x != from) return absl::InternalError(absl::StrCat("sendrecv got ", x, " from ", from));
  }
  // Byte accounting (worker/communicator.h).
  int64_t want_sent = counts[r] * 4 * (n - 1), want_recv = (total - counts[r]) * 4;
  for (int32_t j = 0; j < n; ++j)
    if (j != r) want_sent += counts[j] * 4;
  want_recv += counts[r] * 4 * (n - 1);
  if (n > 1) {
    want_sent += (r + 3) * 4;
    want_recv += ((r + n - 1) % n + 3) * 4;
  }
  const CommStats st = c.stats();
  if (st.bytes_sent != want_sent || st.bytes_received != want_recv)
    return absl::InternalError(absl::StrCat("stats: sent ", st.bytes_sent, " (want ", want_sent,
                                            "), received ", st.bytes_received, " (want ", want_recv, ")"));
  return c.Barrier();
}

TEST(DeviceLocalGroupTest, CollectivesCarryTheRightData) {
  FLASHCP_SKIP_WITHOUT_GPU();
  for (int32_t n : {1, 2, 3, 4}) {
    auto group = DeviceLocalGroup::Create(n, 0, absl::Seconds(60));
    ASSERT_THAT(group, IsOk());
    std::vector<absl::Status> status(n);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        auto c = (*group)->Join(r);
        status[r] = c.ok() ? Exercise(**c, n) : c.status();
      });
    for (auto& t : threads) t.join();
    for (int32_t r = 0; r < n; ++r) EXPECT_THAT(status[r], IsOk()) << "n=" << n << " rank " << r;
  }
}

TEST(DeviceLocalGroupTest, MissingRankGivesDeadlineExceeded) {
  FLASHCP_SKIP_WITHOUT_GPU();
  auto group = DeviceLocalGroup::Create(2, 0, absl::Milliseconds(300));
  ASSERT_THAT(group, IsOk());
  auto c = (*group)->Join(0);
  ASSERT_THAT(c, IsOk());
  // Rank 1 never calls: rank 0 must return, naming it.
  EXPECT_THAT((*c)->Barrier(), StatusIs(absl::StatusCode::kDeadlineExceeded, testing::HasSubstr("ranks 1")));
  EXPECT_THAT((*c)->Barrier(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(NcclCommunicatorTest, CollectivesOnePerGpu) {
  FLASHCP_SKIP_WITHOUT_GPU();
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  for (int32_t n = 1; n <= std::min(devices, 4); ++n) {
    gloo::rendezvous::HashStore store;
    std::vector<absl::Status> status(n);
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        NcclOptions options;
        options.device = r;
        options.timeout = absl::Seconds(60);
        options.id_key = absl::StrCat("nccl_test_", n);
        auto c = ConnectNccl(store, r, n, options);
        status[r] = c.ok() ? Exercise(**c, n) : c.status();
      });
    for (auto& t : threads) t.join();
    for (int32_t r = 0; r < n; ++r) EXPECT_THAT(status[r], IsOk()) << "n=" << n << " rank " << r;
  }
}

TEST(NcclCommunicatorTest, AbsentPeerTimesOutAndAborts) {
  FLASHCP_SKIP_WITHOUT_GPU();
  gloo::rendezvous::HashStore store;
  NcclOptions options;
  options.timeout = absl::Seconds(3);
  // Rank 1 of 2 alone: rank 0 never publishes the id.
  EXPECT_THAT(ConnectNccl(store, 1, 2, options), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(NcclCommunicatorTest, RejectsBadRank) {
  gloo::rendezvous::HashStore store;
  EXPECT_THAT(ConnectNccl(store, 2, 2), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace flashcp::worker::cuda
