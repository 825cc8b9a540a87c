#include "worker/cuda/cp_check.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "core/mask.h"
#include "core/rank_groups.h"
#include "worker/attention_reference.h"
#include "worker/cuda/attention_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/cudnn_attention.h"
#include "worker/cuda/device_communicator.h"
#include "worker/mask_reference.h"
#include "worker/two_level_layout.h"

namespace flashcp::worker::cuda {
namespace {

// bf16 <-> float on the host by bits (round to nearest even; inputs finite).
uint16_t ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16Bits(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n values from N(0, 1), rounded to bf16 (returned as float, exactly representable).
std::vector<float> RandomBf16(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = FromBf16Bits(ToBf16Bits(dist(rng)));
  return v;
}

std::vector<uint16_t> ToBits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = ToBf16Bits(v[i]);
  return b;
}

absl::StatusOr<DeviceBuffer<bf16>> UploadBf16(const std::vector<float>& host, cudaStream_t s) {
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> d, DeviceBuffer<bf16>::Allocate(host.size()));
  const std::vector<uint16_t> bits = ToBits(host);
  if (!bits.empty()) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d.data(), bits.data(), bits.size() * 2,
                                                 cudaMemcpyHostToDevice, s),
                                 "upload ", bits.size() * 2, " bytes");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "upload");
  }
  return d;
}

// A device buffer filled with NaN (all bits set is a NaN in bf16 and fp32).
template <typename T>
absl::StatusOr<DeviceBuffer<T>> Poisoned(size_t n, cudaStream_t s) {
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<T> d, DeviceBuffer<T>::Allocate(n));
  if (n > 0)
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(d.data(), 0xFF, n * sizeof(T), s), "poison");
  return d;
}

absl::StatusOr<std::vector<float>> DownloadBf16(const DeviceBuffer<bf16>& d, cudaStream_t s) {
  std::vector<uint16_t> bits(d.size());
  if (!bits.empty()) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bits.data(), d.data(), bits.size() * 2,
                                                 cudaMemcpyDeviceToHost, s),
                                 "download ", bits.size() * 2, " bytes");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "download");
  }
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = FromBf16Bits(bits[i]);
  return v;
}

absl::StatusOr<std::vector<float>> DownloadF32(const DeviceBuffer<float>& d, cudaStream_t s) {
  std::vector<float> v(d.size());
  if (!v.empty()) {
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v.data(), d.data(), v.size() * 4,
                                                 cudaMemcpyDeviceToHost, s),
                                 "download ", v.size() * 4, " bytes");
    FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "download");
  }
  return v;
}

// [rows][hkv][d] -> [rows][hq][d]: each query head reads its group's KV head.
std::vector<float> ExpandHeads(const std::vector<float>& kv, int64_t rows, int hq, int hkv, int d) {
  std::vector<float> out(rows * hq * d);
  const int group = hq / hkv;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < hq; ++h)
      std::memcpy(&out[(r * hq + h) * d], &kv[(r * hkv + h / group) * d], d * sizeof(float));
  return out;
}
// [rows][hq][d] -> [rows][hkv][d]: sums each group's query heads.
std::vector<float> SumHeads(const std::vector<float>& x, int64_t rows, int hq, int hkv, int d) {
  std::vector<float> out(rows * hkv * d, 0.f);
  const int group = hq / hkv;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < hq; ++h)
      for (int e = 0; e < d; ++e) out[(r * hkv + h / group) * d + e] += x[(r * hq + h) * d + e];
  return out;
}

worker::AttentionShape RefShape(const AttentionShape& s) {
  return worker::AttentionShape{s.heads_q, s.head_dim, s.EffectiveScale()};
}

// Runs the reference over documents `docs` with GQA expanded; returns
// o, lse, dq, dk, dv (dk, dv summed back to KV heads).
struct RefOut {
  std::vector<float> o, lse, dq, dk, dv;
};
// Under block diffusion (mask.block_size > 0) `docs` are the plan's 2n
// documents [noisy copies ; clean copies] and the oracle is
// worker/mask_reference.h over the first n lengths.
absl::StatusOr<RefOut> Reference(const AttentionShape& shape, const std::vector<int64_t>& docs,
                                 const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, const std::vector<float>& dout,
                                 const core::AttentionMask& mask = {}) {
  int64_t rows = 0;
  for (int64_t d : docs) rows += d;
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  const std::vector<float> ke = ExpandHeads(k, rows, hq, hkv, d);
  const std::vector<float> ve = ExpandHeads(v, rows, hq, hkv, d);
  RefOut r;
  r.o.resize(rows * hq * d);
  r.lse.resize(rows * hq);
  r.dq.resize(rows * hq * d);
  std::vector<float> dke(rows * hq * d), dve(rows * hq * d);
  const worker::AttentionShape rs = RefShape(shape);
  if (core::IsBlockDiffusion(mask)) {
    const std::vector<int64_t> lens(docs.begin(), docs.begin() + docs.size() / 2);
    FLASHCP_RETURN_IF_ERROR(worker::BlockDiffusionReferenceForward(
        rs, lens, mask.block_size, q, ke, ve, absl::MakeSpan(r.o), absl::MakeSpan(r.lse)));
    FLASHCP_RETURN_IF_ERROR(worker::BlockDiffusionReferenceBackward(
        rs, lens, mask.block_size, q, ke, ve, dout, absl::MakeSpan(r.dq), absl::MakeSpan(dke),
        absl::MakeSpan(dve)));
    r.dk = SumHeads(dke, rows, hq, hkv, d);
    r.dv = SumHeads(dve, rows, hq, hkv, d);
    return r;
  }
  FLASHCP_RETURN_IF_ERROR(worker::ReferenceForward(rs, docs, q, ke, ve, absl::MakeSpan(r.o),
                                                   absl::MakeSpan(r.lse)));
  // The kernels store O in bf16 and compute D = dout . O from it: so does the
  // reference (worker::ReferenceBackward's o_stored), or one query over two
  // keys fails on some inputs for every kernel (device check runs 4 and 5).
  std::vector<float> o_bf16 = r.o;
  for (float& x : o_bf16) x = FromBf16Bits(ToBf16Bits(x));
  FLASHCP_RETURN_IF_ERROR(worker::ReferenceBackward(rs, docs, q, ke, ve, dout, absl::MakeSpan(r.dq),
                                                    absl::MakeSpan(dke), absl::MakeSpan(dve),
                                                    o_bf16));
  r.dk = SumHeads(dke, rows, hq, hkv, d);
  r.dv = SumHeads(dve, rows, hq, hkv, d);
  return r;
}

}  // namespace

ErrorStats Compare(const std::vector<float>& got, const std::vector<float>& want) {
  ErrorStats e;
  e.count = static_cast<int64_t>(got.size());
  if (got.size() != want.size()) {
    e.nonfinite = -1;
    e.max_rel = e.l2_rel = INFINITY;
    return e;
  }
  double max_diff = 0, max_want = 0, diff2 = 0, want2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++e.nonfinite;
      continue;
    }
    const double diff = std::fabs(double{got[i]} - want[i]);
    max_diff = std::max(max_diff, diff);
    max_want = std::max(max_want, std::fabs(double{want[i]}));
    diff2 += diff * diff;
    want2 += double{want[i]} * want[i];
  }
  e.max_rel = max_diff / std::max(max_want, worker::kRelErrFloor);
  e.l2_rel = std::sqrt(diff2) / std::max(std::sqrt(want2), worker::kRelErrFloor *
                                                               std::sqrt(static_cast<double>(e.count)));
  return e;
}

bool Within(const ErrorStats& e, const Tolerance& t) {
  // Written as !(x > t) would let NaN through; these comparisons fail on NaN.
  return e.nonfinite == 0 && e.max_rel <= t.max_rel && e.l2_rel <= t.l2_rel;
}

bool AttentionCheck::ok() const {
  return Within(out, kBf16Tolerance) && Within(lse, kLseTolerance) && Within(dq, kBf16Tolerance) &&
         Within(dk, kBf16Tolerance) && Within(dv, kBf16Tolerance);
}

std::string AttentionCheck::ToString() const {
  auto one = [](const char* name, const ErrorStats& e) {
    return absl::StrFormat("%s max_rel=%.3g l2_rel=%.3g nonfinite=%d", name, e.max_rel, e.l2_rel,
                           e.nonfinite);
  };
  return absl::StrCat(one("out", out), "; ", one("lse", lse), "; ", one("dq", dq), "; ",
                      one("dk", dk), "; ", one("dv", dv));
}

absl::StatusOr<AttentionCheck> CheckAttention(Attention& attention, const AttentionShape& shape,
                                              const std::vector<int32_t>& q_len,
                                              const std::vector<int32_t>& kv_len, uint64_t seed,
                                              bool gaps) {
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  if (q_len.size() != kv_len.size() || q_len.empty())
    return absl::InvalidArgumentError("CheckAttention: q_len and kv_len must match and be non-empty");
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  std::mt19937_64 rng(seed);
  const size_t n = q_len.size();
  // Reference documents: sequence i is a document of kv_len[i] tokens.
  std::vector<int64_t> docs(kv_len.begin(), kv_len.end());
  int64_t ref_rows = 0;
  for (int64_t x : docs) ref_rows += x;
  std::vector<float> q = RandomBf16(rng, ref_rows * hq * d);
  std::vector<float> k = RandomBf16(rng, ref_rows * hkv * d);
  std::vector<float> v = RandomBf16(rng, ref_rows * hkv * d);
  std::vector<float> dout = RandomBf16(rng, ref_rows * hq * d);
  // GPU placement: Q rows are each document's last q_len rows; with gaps,
  // 3 unused Q rows and 5 unused KV rows before every sequence.
  std::vector<int64_t> q_start(n), kv_start(n), doc_first(n);
  int64_t qa = 0, ka = 0, da = 0;
  for (size_t i = 0; i < n; ++i) {
    if (gaps) qa += 3, ka += 5;
    q_start[i] = qa, kv_start[i] = ka, doc_first[i] = da;
    qa += q_len[i], ka += kv_len[i], da += kv_len[i];
    // Queries outside the shard have no gradient: they add nothing to dK, dV.
    for (int64_t t = doc_first[i]; t < doc_first[i] + kv_len[i] - q_len[i]; ++t)
      std::fill(dout.begin() + t * hq * d, dout.begin() + (t + 1) * hq * d, 0.f);
  }
  const int64_t q_rows = qa, kv_rows = ka;
  // Device inputs (gap rows random, finite).
  std::vector<float> gq = RandomBf16(rng, q_rows * hq * d), gdo = RandomBf16(rng, q_rows * hq * d);
  std::vector<float> gk = RandomBf16(rng, kv_rows * hkv * d), gv = RandomBf16(rng, kv_rows * hkv * d);
  for (size_t i = 0; i < n; ++i) {
    const int64_t shard_first = doc_first[i] + kv_len[i] - q_len[i];
    std::memcpy(&gq[q_start[i] * hq * d], &q[shard_first * hq * d], sizeof(float) * q_len[i] * hq * d);
    std::memcpy(&gdo[q_start[i] * hq * d], &dout[shard_first * hq * d], sizeof(float) * q_len[i] * hq * d);
    std::memcpy(&gk[kv_start[i] * hkv * d], &k[doc_first[i] * hkv * d], sizeof(float) * kv_len[i] * hkv * d);
    std::memcpy(&gv[kv_start[i] * hkv * d], &v[doc_first[i] * hkv * d], sizeof(float) * kv_len[i] * hkv * d);
  }
  FLASHCP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  const cudaStream_t s = stream.get();
  FLASHCP_ASSIGN_OR_RETURN(VarlenBatch batch, VarlenBatch::Create(q_start, q_len, kv_start, kv_len, shape, s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> dq_in, UploadBf16(gq, s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> dk_in, UploadBf16(gk, s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> dv_in, UploadBf16(gv, s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> ddo, UploadBf16(gdo, s));
  FLASHCP_ASSIGN_OR_RETURN(auto o, Poisoned<bf16>(q_rows * hq * d, s));
  FLASHCP_ASSIGN_OR_RETURN(auto lse, Poisoned<float>(q_rows * hq, s));
  FLASHCP_ASSIGN_OR_RETURN(auto dq, Poisoned<bf16>(q_rows * hq * d, s));
  FLASHCP_ASSIGN_OR_RETURN(auto dk, Poisoned<bf16>(kv_rows * hkv * d, s));
  FLASHCP_ASSIGN_OR_RETURN(auto dv, Poisoned<bf16>(kv_rows * hkv * d, s));
  FLASHCP_RETURN_IF_ERROR(attention.Forward(batch, {dq_in.data(), dk_in.data(), dv_in.data(), o.data(), lse.data()}, s));
  FLASHCP_RETURN_IF_ERROR(attention.Backward(
      batch, {dq_in.data(), dk_in.data(), dv_in.data(), o.data(), ddo.data(), lse.data(), dq.data(), dk.data(), dv.data()}, s));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "attention check (", attention.name(), ")");
  FLASHCP_ASSIGN_OR_RETURN(std::vector<float> go, DownloadBf16(o, s));
  FLASHCP_ASSIGN_OR_RETURN(std::vector<float> glse, DownloadF32(lse, s));
  FLASHCP_ASSIGN_OR_RETURN(std::vector<float> gdq, DownloadBf16(dq, s));
  FLASHCP_ASSIGN_OR_RETURN(std::vector<float> gdk, DownloadBf16(dk, s));
  FLASHCP_ASSIGN_OR_RETURN(std::vector<float> gdv, DownloadBf16(dv, s));
  FLASHCP_ASSIGN_OR_RETURN(RefOut ref, Reference(shape, docs, q, k, v, dout));
  // Pick the rows the GPU computed, in the same order on both sides.
  std::vector<float> wo, wl, wdq, ro, rl, rdq, wdk, wdv, rdk, rdv;
  for (size_t i = 0; i < n; ++i) {
    const int64_t shard_first = doc_first[i] + kv_len[i] - q_len[i];
    for (int64_t t = 0; t < q_len[i]; ++t) {
      const int64_t g = (q_start[i] + t), r = shard_first + t;
      wo.insert(wo.end(), go.begin() + g * hq * d, go.begin() + (g + 1) * hq * d);
      ro.insert(ro.end(), ref.o.begin() + r * hq * d, ref.o.begin() + (r + 1) * hq * d);
      wdq.insert(wdq.end(), gdq.begin() + g * hq * d, gdq.begin() + (g + 1) * hq * d);
      rdq.insert(rdq.end(), ref.dq.begin() + r * hq * d, ref.dq.begin() + (r + 1) * hq * d);
      wl.insert(wl.end(), glse.begin() + g * hq, glse.begin() + (g + 1) * hq);
      rl.insert(rl.end(), ref.lse.begin() + r * hq, ref.lse.begin() + (r + 1) * hq);
    }
    for (int64_t t = 0; t < kv_len[i]; ++t) {
      const int64_t g = kv_start[i] + t, r = doc_first[i] + t;
      wdk.insert(wdk.end(), gdk.begin() + g * hkv * d, gdk.begin() + (g + 1) * hkv * d);
      rdk.insert(rdk.end(), ref.dk.begin() + r * hkv * d, ref.dk.begin() + (r + 1) * hkv * d);
      wdv.insert(wdv.end(), gdv.begin() + g * hkv * d, gdv.begin() + (g + 1) * hkv * d);
      rdv.insert(rdv.end(), ref.dv.begin() + r * hkv * d, ref.dv.begin() + (r + 1) * hkv * d);
    }
  }
  AttentionCheck c;
  c.out = Compare(wo, ro);
  c.lse = Compare(wl, rl);
  c.dq = Compare(wdq, rdq);
  c.dk = Compare(wdk, rdk);
  c.dv = Compare(wdv, rdv);
  return c;
}

bool CpCheck::ok() const {
  return errors.ok() && bytes_sent == predicted_sent && bytes_received == predicted_received;
}

namespace {

// The packed batch's random inputs and, per rank and local row, its global
// row (-1 for padding).
struct CpInputs {
  int64_t local = 0;  // rows per rank
  std::vector<float> q, k, v, dout;
  std::vector<std::vector<int64_t>> global;
};

CpInputs MakeCpInputs(const core::Plan& plan, const core::CommLayout& layout,
                      const AttentionShape& shape, uint64_t seed) {
  const int32_t n = plan.cp_size;
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  const int64_t total = core::TotalTokens(plan.doc_lens);
  CpInputs in;
  in.local = core::TokensPerRank(total, n);
  std::mt19937_64 rng(seed);
  in.q = RandomBf16(rng, total * hq * d);
  in.k = RandomBf16(rng, total * hkv * d);
  in.v = RandomBf16(rng, total * hkv * d);
  in.dout = RandomBf16(rng, total * hq * d);
  std::vector<int64_t> doc_first(plan.doc_lens.size(), 0);
  for (size_t i = 1; i < doc_first.size(); ++i) doc_first[i] = doc_first[i - 1] + plan.doc_lens[i - 1];
  in.global.assign(n, std::vector<int64_t>(in.local, -1));
  for (int32_t r = 0; r < n; ++r) {
    const core::RankLayout& rl = layout.ranks[r];
    for (size_t i = 0; i < rl.shards.size(); ++i) {
      const core::Shard& s = plan.shards[rl.shards[i]];
      for (int64_t t = 0; t < s.len; ++t) {
        in.global[r][rl.shard_offset[i] + t] = doc_first[s.doc] + s.start + t;
      }
    }
  }
  return in;
}

// Rank r's rows of `all` (rows of `width` values).
std::vector<float> SliceRows(const CpInputs& in, const std::vector<float>& all, int32_t r,
                             int width) {
  std::vector<float> out(in.local * width, 0.25f);  // padding rows: finite filler
  for (int64_t row = 0; row < in.local; ++row)
    if (in.global[r][row] >= 0)
      std::memcpy(&out[row * width], &all[in.global[r][row] * width], width * sizeof(float));
  return out;
}

struct RankOut {
  absl::Status status;
  std::vector<float> o, lse, dq, dk, dv;
  CommStats stats;
  CpAttentionTimes times;
  std::string fallback;
};

// One rank's forward and backward on its own stream, its outputs downloaded.
absl::Status RunCheckRank(const core::Plan& plan, const core::CommLayout& layout,
                          const CpCheckOptions& options, const CpInputs& in,
                          DeviceLocalGroup& group, int32_t r, RankOut& out) {
  const AttentionShape& shape = options.shape;
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  const int64_t local = in.local;
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), "rank ", r, ": cudaSetDevice");
  FLASHCP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create());
  const cudaStream_t s = stream.get();
  FLASHCP_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCommunicator> comm, group.Join(r));
  std::unique_ptr<Attention> attention;
  CudnnAttention* cudnn = nullptr;
  if (options.backend == AttentionBackend::kCudnn) {
    FLASHCP_ASSIGN_OR_RETURN(auto a, CudnnAttention::Create(shape));
    cudnn = a.get();
    attention = std::move(a);
  } else {
    FLASHCP_ASSIGN_OR_RETURN(attention, PlainAttention::Create(shape));
  }
  CpRankLayout rp;
  if (options.two_level_ranks_per_node > 0) {
    std::vector<int32_t> all(plan.cp_size);
    for (int32_t i = 0; i < plan.cp_size; ++i) all[i] = i;
    FLASHCP_ASSIGN_OR_RETURN(rp, BuildTwoLevelRankLayout(plan, layout, r, std::move(all),
                                                         options.two_level_ranks_per_node));
  } else {
    FLASHCP_ASSIGN_OR_RETURN(rp, BuildCpRankLayout(plan, layout, r, options.scheme));
  }
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> dq_in, UploadBf16(SliceRows(in, in.q, r, hq * d), s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> dk_in, UploadBf16(SliceRows(in, in.k, r, hkv * d), s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> dv_in, UploadBf16(SliceRows(in, in.v, r, hkv * d), s));
  FLASHCP_ASSIGN_OR_RETURN(DeviceBuffer<bf16> ddo, UploadBf16(SliceRows(in, in.dout, r, hq * d), s));
  FLASHCP_ASSIGN_OR_RETURN(auto o, Poisoned<bf16>(local * hq * d, s));
  FLASHCP_ASSIGN_OR_RETURN(auto lse, Poisoned<float>(local * hq, s));
  FLASHCP_ASSIGN_OR_RETURN(auto dq, Poisoned<bf16>(local * hq * d, s));
  FLASHCP_ASSIGN_OR_RETURN(auto dk, Poisoned<bf16>(local * hkv * d, s));
  FLASHCP_ASSIGN_OR_RETURN(auto dv, Poisoned<bf16>(local * hkv * d, s));
  // all_to_all attends this position's heads: an attention of the same kind.
  const AttentionFactory heads = [&options](const AttentionShape& local)
      -> absl::StatusOr<std::unique_ptr<Attention>> {
    if (options.backend == AttentionBackend::kCudnn) {
      FLASHCP_ASSIGN_OR_RETURN(auto a, CudnnAttention::Create(local));
      return std::unique_ptr<Attention>(std::move(a));
    }
    FLASHCP_ASSIGN_OR_RETURN(auto a, PlainAttention::Create(local));
    return std::unique_ptr<Attention>(std::move(a));
  };
  FLASHCP_ASSIGN_OR_RETURN(auto step,
                           GpuCpRank::Create(std::move(rp), shape, *attention, *comm, s, heads));
  FLASHCP_RETURN_IF_ERROR(step->Forward(dq_in.data(), dk_in.data(), dv_in.data(), o.data(), lse.data()));
  FLASHCP_RETURN_IF_ERROR(step->Backward(ddo.data(), dq.data(), dk.data(), dv.data()));
  FLASHCP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s), "rank ", r, ": CP step");
  FLASHCP_ASSIGN_OR_RETURN(out.times, step->Times());
  FLASHCP_ASSIGN_OR_RETURN(out.o, DownloadBf16(o, s));
  FLASHCP_ASSIGN_OR_RETURN(out.lse, DownloadF32(lse, s));
  FLASHCP_ASSIGN_OR_RETURN(out.dq, DownloadBf16(dq, s));
  FLASHCP_ASSIGN_OR_RETURN(out.dk, DownloadBf16(dk, s));
  FLASHCP_ASSIGN_OR_RETURN(out.dv, DownloadBf16(dv, s));
  out.stats = comm->stats();
  if (cudnn != nullptr) out.fallback = cudnn->fallback_reason();
  return absl::OkStatus();
}

// All ranks as threads; the root cause of a failure: a rank's own failure
// before the peers' "group broken" echoes of it.
absl::Status RunCheckRanks(const core::Plan& plan, const core::CommLayout& layout,
                           const CpCheckOptions& options, const CpInputs& in,
                           std::vector<RankOut>& outs) {
  const int32_t n = plan.cp_size;
  FLASHCP_ASSIGN_OR_RETURN(std::shared_ptr<DeviceLocalGroup> group,
                           DeviceLocalGroup::Create(n, options.device, options.timeout));
  {
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        outs[r].status = RunCheckRank(plan, layout, options, in, *group, r, outs[r]);
        // Peers waiting for this rank in a collective fail now, not at the timeout.
        if (!outs[r].status.ok())
          group->Abort(absl::Status(outs[r].status.code(),
                                    absl::StrCat("rank ", r, " failed: ", outs[r].status.message())));
      });
    for (std::thread& t : threads) t.join();
  }
  for (int pass = 0; pass < 2; ++pass)
    for (int32_t r = 0; r < n; ++r) {
      const absl::Status& st = outs[r].status;
      if (st.ok() || (pass == 0 && absl::StrContains(st.message(), "group broken"))) continue;
      return absl::Status(st.code(), absl::StrCat("CP check rank ", r, ": ", st.message()));
    }
  return absl::OkStatus();
}

// The reference over the packed batch under plan.mask, from
// options.reference_cache where it holds this (documents, mask, seed, shape),
// else computed (and cached).
absl::StatusOr<RefOut> CachedReference(const core::Plan& plan, const CpCheckOptions& options,
                                       const CpInputs& in) {
  const AttentionShape& shape = options.shape;
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  CpReferenceCache* cache = options.reference_cache;
  if (cache != nullptr && cache->docs == plan.doc_lens && cache->mask == plan.mask &&
      cache->seed == options.seed && cache->heads_q == hq && cache->heads_kv == hkv &&
      cache->head_dim == d) {
    return RefOut{cache->o, cache->lse, cache->dq, cache->dk, cache->dv};
  }
  FLASHCP_ASSIGN_OR_RETURN(RefOut ref,
                           Reference(shape, plan.doc_lens, in.q, in.k, in.v, in.dout, plan.mask));
  if (cache != nullptr)
    *cache = CpReferenceCache{plan.doc_lens, plan.mask, options.seed, hq, hkv, d,
                              ref.o, ref.lse, ref.dq, ref.dk, ref.dv};
  return ref;
}

// One output gathered from all ranks in global order against the
// reference; padding rows must hold exact zeros.
ErrorStats CompareGathered(const std::vector<RankOut>& outs, std::vector<float> RankOut::*member,
                           int width, const std::vector<float>& want_all, const CpInputs& in) {
  std::vector<float> got, want;
  for (size_t r = 0; r < outs.size(); ++r)
    for (int64_t row = 0; row < in.local; ++row) {
      const std::vector<float>& src = outs[r].*member;
      const int64_t g = in.global[r][row];
      for (int e = 0; e < width; ++e) {
        got.push_back(src[row * width + e]);
        want.push_back(g >= 0 ? want_all[g * width + e] : 0.f);
      }
    }
  return Compare(got, want);
}

}  // namespace

absl::StatusOr<CpCheck> RunCpCheck(const core::Plan& plan, const CpCheckOptions& options) {
  const AttentionShape& shape = options.shape;
  FLASHCP_RETURN_IF_ERROR(ValidateAttentionShape(shape));
  FLASHCP_ASSIGN_OR_RETURN(const core::CommLayout layout, core::BuildCommLayout(plan));
  const core::ModelShape model{shape.heads_kv, shape.head_dim, 2, shape.heads_q};
  FLASHCP_ASSIGN_OR_RETURN(const core::PlanMetrics metrics, core::AnalyzePlan(plan, model));
  const int32_t n = plan.cp_size;
  const int hq = shape.heads_q, hkv = shape.heads_kv, d = shape.head_dim;
  const CpInputs in = MakeCpInputs(plan, layout, shape, options.seed);
  std::vector<RankOut> outs(n);
  FLASHCP_RETURN_IF_ERROR(RunCheckRanks(plan, layout, options, in, outs));
  FLASHCP_ASSIGN_OR_RETURN(const RefOut ref, CachedReference(plan, options, in));
  CpCheck c;
  c.errors.out = CompareGathered(outs, &RankOut::o, hq * d, ref.o, in);
  // all_to_all keeps the log-sum-exps with the heads (lse is zeros): not compared.
  if (options.scheme != core::CommScheme::kAllToAll)
    c.errors.lse = CompareGathered(outs, &RankOut::lse, hq, ref.lse, in);
  c.errors.dq = CompareGathered(outs, &RankOut::dq, hq * d, ref.dq, in);
  c.errors.dk = CompareGathered(outs, &RankOut::dk, hkv * d, ref.dk, in);
  c.errors.dv = CompareGathered(outs, &RankOut::dv, hkv * d, ref.dv, in);
  core::SchemeBytes predicted = metrics.bytes[static_cast<int>(options.scheme)];
  if (const int32_t per_node = options.two_level_ranks_per_node; per_node > 0) {
    if (options.scheme != core::CommScheme::kAllToAll)
      return absl::InvalidArgumentError("two_level_ranks_per_node: needs scheme all_to_all");
    core::RankGroup all{{}, core::CommScheme::kAllToAll, true};
    for (int32_t i = 0; i < n; ++i) all.ranks.push_back(i);
    FLASHCP_ASSIGN_OR_RETURN(const core::PlanMetrics m, core::AnalyzePlan(plan, model, per_node));
    FLASHCP_ASSIGN_OR_RETURN(predicted,
                             core::GroupedSchemeBytes(plan, m, {all}, model, per_node));
  }
  for (int32_t r = 0; r < n; ++r) {
    c.bytes_sent.push_back(outs[r].stats.bytes_sent);
    c.bytes_received.push_back(outs[r].stats.bytes_received);
    c.times.push_back(outs[r].times);
    if (!outs[r].fallback.empty()) c.fallback = outs[r].fallback;
  }
  c.predicted_sent = predicted.sent;
  c.predicted_received = predicted.received;
  return c;
}

}  // namespace flashcp::worker::cuda
