#include "core/datasets.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/echo.h"
#include "core/random.h"
#include "core/types.h"

namespace flashcp::core {
namespace {

// ---- The distributions, compiled in -----------------------------------------
// Sources and assumptions: ../shared/datasets/README.md and its CSV files,
// copied here verbatim. Every figure computed from these batches inherits the
// assumptions stated beside each table.

// WLB-LLM (wlbllm_quantiles.csv): quantiles of the 99,519-length
// reconstruction of the WLB-LLM paper's Fig. 3 (OSDI'25) published as
// distca/simulator/data/dist_wlbllm.json in hao-ai-lab/distca; not Meta's raw
// data. Sampled by inverse CDF with log-linear interpolation between adjacent
// quantiles (ASSUMPTION): L(u) = exp(ln L_i + t (ln L_{i+1} - ln L_i)),
// t = (u - q_i) / (q_{i+1} - q_i). The interpolated distribution's mean is
// sum_i (q_{i+1} - q_i) (L_{i+1} - L_i) / ln(L_{i+1} / L_i) = 3,966 tokens
// (the reconstruction's own mean: 3,962).
struct Quantile {
  double q;       // cumulative probability
  double length;  // tokens
};
constexpr std::array<Quantile, 20> kWlbLlmQuantiles = {{
    {0.000, 1},      {0.010, 63},     {0.050, 324},    {0.100, 646},    {0.200, 1283},
    {0.300, 1932},   {0.400, 2582},   {0.500, 3227},   {0.600, 3861},   {0.700, 4514},
    {0.800, 5156},   {0.900, 5784},   {0.950, 6110},   {0.970, 6236},   {0.980, 10078},
    {0.990, 26058},  {0.995, 69098},  {0.998, 99303},  {0.999, 119794}, {1.000, 124913},
}};

// A mixture component: picked with probability weight / sum(weights), then a
// lognormal length with mean `mean_tokens` and sigma kSigma.
struct Component {
  const char* name;
  double weight;       // relative share of documents
  double mean_tokens;  // mean document length, tokens
};

// The Pile (pile_components.csv; Gao et al. 2020, arXiv 2101.00027, Table 1):
// share of documents after epoch weighting, and mean document size converted at
// 3.5 bytes per token (ASSUMPTION). The shape within a component is not
// published: lognormal, sigma 1.0 (ASSUMPTION). Shares sum to 1.0001 (rounding
// in the source); they are used as relative weights. Mixture mean: 1,720 tokens.
constexpr std::array<Component, 22> kPileComponents = {{
    {"Pile-CC", 0.2470, 1267},         {"PubMedCentral", 0.0278, 8938},
    {"Books3", 0.0013, 157509},        {"OpenWebText2", 0.1535, 1126},
    {"ArXiv", 0.0114, 13637},          {"Github", 0.0853, 1536},
    {"FreeLaw", 0.0240, 4406},         {"StackExchange", 0.1404, 632},
    {"USPTO", 0.0529, 1194},           {"PubMedAbstracts", 0.1396, 380},
    {"Gutenberg", 0.0003, 116656},     {"OpenSubtitles", 0.0030, 8918},
    {"Wikipedia", 0.0811, 325},        {"DMMathematics", 0.0091, 2341},
    {"UbuntuIRC", 0.0001, 159590},     {"BookCorpus2", 0.0001, 108212},
    {"EuroParl", 0.0006, 20149},       {"HackerNews", 0.0075, 1439},
    {"YoutubeSubtitles", 0.0016, 6597}, {"PhilPapers", 0.0003, 21466},
    {"NIHExPorter", 0.0085, 617},      {"EnronEmails", 0.0047, 521},
}};

// RedPajama-V1 (redpajama_sources.csv; dataset card of
// togethercomputer/RedPajama-Data-1T): tokens per source, in billions, and a
// proxy mean document length per source (ASSUMPTION; C4 from its 365M
// documents, CommonCrawl from RedPajama-V2, the rest from the same sources in
// the Pile). Document share = tokens / mean length, so the weight below is
// tokens_billion / mean_tokens. Lognormal within a source, sigma 1.0
// (ASSUMPTION). Mixture mean: 1,230e9 tokens / 1.18e9 documents = 1,025 tokens.
constexpr std::array<Component, 7> kRedPajamaSources = {{
    {"CommonCrawl", 878.0 / 1400, 1400},
    {"C4", 175.0 / 430, 430},
    {"GitHub", 59.0 / 1536, 1536},
    {"Books", 26.0 / 120000, 120000},
    {"ArXiv", 28.0 / 13637, 13637},
    {"Wikipedia", 24.0 / 325, 325},
    {"StackExchange", 20.0 / 632, 632},
}};

// Lognormal shape within a component (ASSUMPTION, see above). For mean m:
// mu = ln(m) - sigma^2 / 2, so that E[exp(mu + sigma Z)] = m.
constexpr double kSigma = 1.0;

constexpr int64_t kMaxCount = 1'000'000;

// ---- Deterministic randomness ------------------------------------------------
// Everything below uses only integer arithmetic and IEEE-754 +, -, *, / and
// sqrt (each correctly rounded, so identical on every conforming machine), plus
// frexp/ldexp (exact). No std:: distributions (their algorithms differ between
// standard libraries) and no libm exp/log (not correctly rounded, so they may
// differ by an ulp between libm versions). This assumes the compiler does not
// contract a*b+c into a fused multiply-add (x86-64 builds without -mfma never do).

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256** (Blackman and Vigna 2018), seeded from splitmix64 as its
// authors recommend.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& word : s_) word = SplitMix64(sm);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  std::array<uint64_t, 4> s_;
};

// The stream of batch `index`: a hash of (seed, index), so that batch k does
// not depend on how many batches are drawn or in which order.
uint64_t BatchStreamSeed(uint64_t seed, int64_t index) {
  uint64_t a = seed;
  uint64_t b = static_cast<uint64_t>(index) ^ 0xD1B54A32D192ED03ULL;
  return SplitMix64(a) ^ Rotl(SplitMix64(b), 32);
}

constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2, upper bits (exact times small ints)
constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi

// Natural log for x > 0, to within a few ulp: x = m 2^e with m in
// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172,
// whose odd series reaches 1e-17 by s^23.
double DetLog(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2;
    --e;
  }
  const double s = (m - 1) / (m + 1);
  const double s2 = s * s;
  double sum = 0;
  for (int k = 23; k >= 3; k -= 2) sum = (sum + 1.0 / k) * s2;
  const double ln_m = 2 * s + 2 * s * sum;
  return e * kLn2Hi + (ln_m + e * kLn2Lo);
}

// e^x for |x| < 700, to within a few ulp: x = k ln2 + r, |r| <= ln2 / 2,
// e^r by its Taylor series to r^17 (remainder below 1e-19).
double DetExp(double x) {
  const double kf = std::floor(x / 0.69314718055994530942 + 0.5);
  const double r = (x - kf * kLn2Hi) - kf * kLn2Lo;
  double p = 1;
  for (int k = 17; k >= 1; --k) p = 1 + p * r / k;
  return std::ldexp(p, static_cast<int>(kf));
}

// Standard normal by Marsaglia's polar method (rejection; only log, sqrt and
// division). The second variate of the pair is discarded for simplicity.
double Normal(Xoshiro256& rng) {
  while (true) {
    const double u = 2 * rng.Uniform() - 1;
    const double v = 2 * rng.Uniform() - 1;
    const double s = u * u + v * v;
    if (s <= 0 || s >= 1) continue;
    return u * std::sqrt(-2 * DetLog(s) / s);
  }
}

// A real length in tokens to an integer one: rounded to nearest, at least 1,
// at most `cap` (documents longer than the context are truncated to it).
int64_t ToTokens(double length, int64_t cap) {
  if (!(length < static_cast<double>(cap))) return cap;  // also catches +inf
  const int64_t rounded = static_cast<int64_t>(std::floor(length + 0.5));
  return std::clamp<int64_t>(rounded, 1, cap);
}

double SampleWlbLlm(Xoshiro256& rng) {
  const double u = rng.Uniform();  // [0, 1): the last segment ends at q = 1
  size_t i = 0;
  while (i + 2 < kWlbLlmQuantiles.size() && u >= kWlbLlmQuantiles[i + 1].q) ++i;
  const Quantile& lo = kWlbLlmQuantiles[i];
  const Quantile& hi = kWlbLlmQuantiles[i + 1];
  const double t = (u - lo.q) / (hi.q - lo.q);
  const double ln_lo = DetLog(lo.length);
  const double ln_hi = DetLog(hi.length);
  return DetExp(ln_lo + t * (ln_hi - ln_lo));
}

template <size_t K>
double SampleMixture(const std::array<Component, K>& components, Xoshiro256& rng) {
  double total = 0;
  for (const Component& c : components) total += c.weight;
  double pick = rng.Uniform() * total;
  size_t i = 0;
  while (i + 1 < K && pick >= components[i].weight) {
    pick -= components[i].weight;
    ++i;
  }
  const double mu = DetLog(components[i].mean_tokens) - kSigma * kSigma / 2;
  return DetExp(mu + kSigma * Normal(rng));
}

double SampleLength(Dataset dataset, Xoshiro256& rng) {
  switch (dataset) {
    case Dataset::kWlbLlm:
      return SampleWlbLlm(rng);
    case Dataset::kPile:
      return SampleMixture(kPileComponents, rng);
    case Dataset::kRedPajama:
      return SampleMixture(kRedPajamaSources, rng);
  }
  return 1;
}

absl::Status CheckContext(int64_t context) {
  if (context < 1 || context > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("context: must be in [1, 2^40] tokens, got ", context));
  }
  return absl::OkStatus();
}

// Draws one batch; the caller has checked the arguments.
absl::StatusOr<std::vector<int64_t>> DrawBatch(Dataset dataset, int64_t context, uint64_t seed,
                                               int64_t index) {
  Xoshiro256 rng(BatchStreamSeed(seed, index));
  std::vector<int64_t> docs;
  int64_t remaining = context;
  while (remaining > 0) {
    if (static_cast<int64_t>(docs.size()) == kMaxDocs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "context: batch ", index, " of ", context, " tokens would hold more than ", kMaxDocs,
          " documents of ", DatasetName(dataset)));
    }
    // Each document is at most the remaining context: the last one is truncated.
    const int64_t len = ToTokens(SampleLength(dataset, rng), remaining);
    docs.push_back(len);
    remaining -= len;
  }
  return docs;
}

}  // namespace

absl::string_view DatasetName(Dataset dataset) {
  switch (dataset) {
    case Dataset::kWlbLlm:
      return "wlbllm";
    case Dataset::kPile:
      return "pile";
    case Dataset::kRedPajama:
      return "redpajama";
  }
  return "unknown";
}

absl::StatusOr<Dataset> ParseDataset(absl::string_view name) {
  for (Dataset d : kAllDatasets) {
    if (DatasetName(d) == name) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dataset: unknown data set ", Echo(name), " (wlbllm, pile, redpajama)"));
}

absl::StatusOr<std::vector<int64_t>> SampleBatch(Dataset dataset, int64_t context, uint64_t seed,
                                                 int64_t index) {
  if (absl::Status s = CheckContext(context); !s.ok()) return s;
  if (index < 0 || index >= kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("index: must be in [0, ", kMaxCount, "), got ", index));
  }
  return DrawBatch(dataset, context, seed, index);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> SampleBatches(Dataset dataset, int64_t context,
                                                                int64_t count, uint64_t seed) {
  if (absl::Status s = CheckContext(context); !s.ok()) return s;
  if (count < 0 || count > kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("count: must be in [0, ", kMaxCount, "], got ", count));
  }
  std::vector<std::vector<int64_t>> batches;
  batches.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    absl::StatusOr<std::vector<int64_t>> batch = DrawBatch(dataset, context, seed, k);
    if (!batch.ok()) return batch.status();
    batches.push_back(*std::move(batch));
  }
  return batches;
}

}  // namespace flashcp::core
