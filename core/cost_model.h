// A rank cost model: predicted attention time of one rank from its plan's
// features, and a robust least-squares fit of its coefficients to measured
// times (docs/planner.md, "Cost model"). Pure functions over plain structs; no
// clock, no I/O.
//
//   time = a * whole_pairs + b * prefixed_pairs + c * sequences + d * tokens
//
// whole_pairs: SPEC Eq. 3 pairs of the rank's shards that start at token 0 (a
// shard starting at 0 runs as a whole document); prefixed_pairs: those of its
// shards with a prefix; sequences: its shards (attention segments); tokens:
// its real tokens. The `pairs` profile (a = b = 1, c = d = 0) is SPEC's
// workload, so its imbalance is AnalyzePlan's, exactly.
#ifndef FLASHCP_CORE_COST_MODEL_H_
#define FLASHCP_CORE_COST_MODEL_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/types.h"

namespace flashcp::core {

// One rank's features (the cost model's inputs), all counts.
struct RankFeatures {
  double whole_pairs = 0;     // Eq. 3 pairs of shards with prefix 0
  double prefixed_pairs = 0;  // Eq. 3 pairs of shards with prefix > 0
  double sequences = 0;       // shards
  double tokens = 0;          // real tokens

  friend bool operator==(const RankFeatures&, const RankFeatures&) = default;
};
inline constexpr int kNumCostFeatures = 4;
// "whole_pairs", "prefixed_pairs", "sequences", "tokens": the order of
// CostCoefficients' fields and of FeatureVector.
absl::string_view CostFeatureName(int feature);
std::array<double, kNumCostFeatures> FeatureVector(const RankFeatures& f);

// Time per unit of each feature. Seconds for measured profiles; the `pairs`
// profile counts in pairs (imbalance is unit-free).
struct CostCoefficients {
  double whole_pair = 1;     // a
  double prefixed_pair = 1;  // b
  double sequence = 0;       // c
  double token = 0;          // d

  friend bool operator==(const CostCoefficients&, const CostCoefficients&) = default;
};

// Bound on every coefficient (units per feature unit): a fit or a caller
// above it is refused. 1e3 is far above any real device (H200: 1.25e-10 s per
// pair, 7.6e-6 s per sequence).
inline constexpr double kMaxCostCoefficient = 1e3;

// InvalidArgument naming the field unless every coefficient is finite and in
// [0, kMaxCostCoefficient] and whole_pair and prefixed_pair are both > 0 (a
// model where pairs are free cannot balance attention).
absl::Status ValidateCostCoefficients(const CostCoefficients& c);

// True for the pairs model itself (a = b = 1, c = d = 0): planning with it is
// today's planning, byte for byte.
bool IsPairsModel(const CostCoefficients& c);

// The named profiles shipped with the planner:
//   "pairs": SPEC Eq. 3 (1, 1, 0, 0); the default;
//   "h200-cudnn": the H200 fit of docs/gpu.md run 3 (H = 32, D = 128, bf16,
//     forward + backward; tests/gpu/fit_rank_cost.py), seconds;
//   "cpu-fp32": the CPU engine (worker/attention_cpu, fp32, one kernel thread,
//     H = 2, D = 32, forward + backward), seconds, fitted by
//     bench/rank_cost_fit (docs/planner.md).
inline constexpr absl::string_view kPairsProfile = "pairs";
std::vector<std::string> CostProfileNames();
// NotFound naming the profile and the known ones for an unknown name.
absl::StatusOr<CostCoefficients> CostProfile(absl::string_view name);

// How far an online fit may move from its profile's shipped coefficients
// (docs/planner.md, "Calibration"). Plans depend only on the ratios of the
// coefficients, so the rule bounds the shape: prefixed_pair / whole_pair
// within kMaxFitPairRatio times the shipped ratio either way (the term plans
// are most sensitive to: a quarter of it took Pile 64K at N = 8 to a pairs
// imbalance of 2.37; honest CPU fits under load read 0.84x to 1.11x),
// sequence / whole_pair and token / whole_pair at most
// kMaxFitShape times the shipped ratios (they may fit to 0; noisy: an honest
// CPU fit of 64 samples read 4.3x); and the scale loosely (another device or
// a loaded host): whole_pair within kMaxFitScale times either way.
inline constexpr double kMaxFitPairRatio = 1.5;
inline constexpr double kMaxFitShape = 10.0;
inline constexpr double kMaxFitScale = 100.0;
// OK, or FailedPrecondition saying why `fit` may not replace `shipped`: it
// is the pairs model up to scale (sequence = token = 0 and whole_pair =
// prefixed_pair within 1e-9: it plans as pairs, which nothing re-cuts for,
// and rank speeds are refused on it), or it breaks the rule above (the
// message names the term, both ratios and the bound).
absl::Status CheckFitNearProfile(const CostCoefficients& fit, const CostCoefficients& shipped);

// Per-rank features of a valid plan (ValidatePlan; not checked).
std::vector<RankFeatures> PlanRankFeatures(const Plan& plan);

double PredictRankCost(const CostCoefficients& c, const RankFeatures& f);

// max / mean of per-rank values (times or costs): an imbalance ratio; 1 when
// the mean is 0 or `v` is empty.
double MaxOverMean(absl::Span<const double> v);

struct CostPrediction {
  std::vector<double> rank_cost;  // per rank, the profile's units (times rank_speed)
  double imbalance = 1.0;         // max / mean; 1 when the mean is 0
  // The rank speeds applied (ValidateRankSpeeds); empty: all 1.
  std::vector<double> rank_speed;
};
// With `rank_speed` (ValidateRankSpeeds, not checked; empty: all 1), rank
// r's cost is rank_speed[r] times the model's.
CostPrediction PredictPlanCost(const CostCoefficients& c, const Plan& plan,
                               absl::Span<const double> rank_speed = {});
CostPrediction PredictCost(const CostCoefficients& c, absl::Span<const RankFeatures> ranks,
                           absl::Span<const double> rank_speed = {});

// Rank speeds: rank r of a group takes rank_speed[r] times the model's time
// for its features (a per-process factor no plan feature explains: the
// workers measure it, docs/workers.md "Calibration"); relative, so only
// their ratios matter. Bounds on each one.
inline constexpr double kMinRankSpeed = 0.5;
inline constexpr double kMaxRankSpeed = 2.0;
// InvalidArgument naming rank_speed (or rank_speed[r]) unless `rank_speed`
// is empty, or has exactly `cp_size` entries, each finite and in
// [kMinRankSpeed, kMaxRankSpeed], and `cost` is not the pairs model (which
// nothing re-cuts for).
absl::Status ValidateRankSpeeds(absl::Span<const double> rank_speed, int32_t cp_size,
                                const CostCoefficients& cost);

// Per-rank speeds from a window of measured steps: rank r's measured
// seconds summed over `steps` over its predicted cost summed over the same
// steps, divided by the mean of that ratio over the ranks, each clamped to
// [kMinRankSpeed, kMaxRankSpeed]. `measured[t][r]` and `predicted[t][r]`
// (the model's cost without speeds, in seconds) are per step and rank; steps
// whose rank count differs from the first's are skipped. Empty when no step
// has every rank's cost > 0.
std::vector<double> FitRankSpeeds(absl::Span<const std::vector<double>> measured,
                                  absl::Span<const std::vector<double>> predicted);

// One measured rank-step: the rank's features and its attention time.
struct CostSample {
  RankFeatures features;
  double seconds = 0;
};

// InvalidArgument naming the field unless seconds is finite and > 0 and every
// feature finite and >= 0 with at least one pair (a rank with no attention
// says nothing about pair costs).
absl::Status ValidateCostSample(const CostSample& s);

struct CostFitOptions {
  // Fewer samples (after outlier rejection): FailedPrecondition.
  int64_t min_samples = 32;
  // Largest accepted condition number of the design, columns scaled to unit
  // norm (so it measures collinearity, not units): above it the fit says
  // which features cannot be told apart and is refused.
  double max_condition = 1e5;
  // A sample whose relative residual lies more than this many scaled MADs
  // (1.4826 MAD, the normal's sigma) from the median is an outlier.
  double outlier_sigmas = 4.0;
  // Relative residual scale below which nothing is an outlier (exact data).
  double min_residual_scale = 1e-3;
  int32_t max_rounds = 5;  // refits after rejection
};

struct CostFit {
  CostCoefficients coefficients;
  int64_t samples = 0;   // given
  int64_t inliers = 0;   // used by the final fit
  double condition = 0;  // of the final design (unit-norm columns)
  double mean_abs_rel_error = 0;  // over inliers: mean |predicted - measured| / measured
};

// Non-negative least squares of seconds on the four features (exact over the
// 15 subsets of features; coefficients >= 0) with iterated MAD outlier
// rejection. InvalidArgument naming samples[i] for a bad sample;
// FailedPrecondition when fewer than min_samples remain, when a feature is
// zero in every sample, when the design's condition number exceeds
// max_condition (the message gives it), or when a coefficient exceeds
// kMaxCostCoefficient. O(samples) memory.
absl::StatusOr<CostFit> FitCostModel(absl::Span<const CostSample> samples,
                                     const CostFitOptions& options = {});

// A bounded window of samples for one profile: the newest `capacity` kept.
class CostSampleWindow {
 public:
  explicit CostSampleWindow(int64_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  void Add(const CostSample& s);
  int64_t size() const { return static_cast<int64_t>(samples_.size()); }
  int64_t total_added() const { return total_added_; }
  absl::StatusOr<CostFit> Fit(const CostFitOptions& options) const;

 private:
  int64_t capacity_;
  int64_t total_added_ = 0;
  std::deque<CostSample> samples_;
};

// A profile that can be calibrated: InvalidArgument for "pairs" (a count,
// not a time), NotFound for an unknown one.
absl::Status ValidateCalibrationProfile(absl::string_view profile);

// What a plan reports about the cost it balanced.
struct PlanCostReport {
  std::string profile;            // "" for explicit coefficients
  CostCoefficients coefficients;  // those used
  bool calibrated = false;        // the online fit of `profile`
  CostPrediction prediction;      // of the plan, under `coefficients`
};

// The online calibration of the named profiles (CostProfileNames, except
// pairs, a count): per profile a CostSampleWindow, refitted after every
// report; once a fit is accepted (FitCostModel) the profile is planned with
// it, and a later refit that is refused keeps the last accepted fit (its
// status says why). Memory: at most `window` samples per profile. Not
// thread-safe; the service guards it.
class CostCalibrator {
 public:
  struct State {
    int64_t samples = 0;      // in the window
    int64_t total = 0;        // ever added
    int64_t fits = 0;         // accepted fits
    bool calibrated = false;  // an accepted fit exists
    CostFit fit;              // the last accepted one
    std::string status;       // the last refit's refusal; "" when it was accepted
  };

  explicit CostCalibrator(int64_t window = 4096, CostFitOptions options = {})
      : window_(window), options_(options) {}

  // InvalidArgument for "pairs", NotFound for an unknown profile, and
  // InvalidArgument naming samples[i] for a bad sample (ValidateCostSample):
  // then nothing is added. Else adds them all and refits.
  absl::StatusOr<State> Add(absl::string_view profile, absl::Span<const CostSample> samples);

  // The coefficients to plan `profile` with, and whether they are its fit.
  // NotFound for an unknown profile.
  absl::StatusOr<std::pair<CostCoefficients, bool>> Resolve(absl::string_view profile) const;

  // Every profile that has had a report, by name.
  std::vector<std::pair<std::string, State>> States() const;

 private:
  struct Entry {
    CostSampleWindow window;
    State state;
  };
  int64_t window_;
  CostFitOptions options_;
  std::vector<std::pair<std::string, Entry>> profiles_;  // few: linear lookup
};

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_COST_MODEL_H_
