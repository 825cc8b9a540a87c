#include "core/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/analysis.h"
#include "core/datasets.h"
#include "core/random.h"
#include "core/strategies.h"
#include "core/testing/plans.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace flashcp::core {
namespace {

using ::flashcp::core::testing::HeadTailPlan;
using ::flashcp::core::testing::IsOk;
using ::flashcp::core::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PlanRankFeaturesTest, HandWorkedHeadTail) {
  // Rank 0: [2, 6) has prefix 2: (4 + 4 + 1) * 4 / 2 = 18 prefixed pairs.
  // Rank 1: [0, 2) and doc 1's [0, 2): 3 + 3 whole pairs, two sequences.
  EXPECT_THAT(PlanRankFeatures(HeadTailPlan()),
              ElementsAre(RankFeatures{0, 18, 1, 4}, RankFeatures{6, 0, 2, 4}));
}

TEST(PredictPlanCostTest, HandWorkedHeadTail) {
  // a = 1, b = 2, c = 10, d = 0.5: rank 0 36 + 10 + 2 = 48; rank 1 6 + 20 + 2 = 28.
  const CostPrediction p = PredictPlanCost({1, 2, 10, 0.5}, HeadTailPlan());
  EXPECT_THAT(p.rank_cost, ElementsAre(48.0, 28.0));
  EXPECT_DOUBLE_EQ(p.imbalance, 48.0 / 38.0);
}

TEST(PredictPlanCostTest, PairsProfileIsAnalyzePlansImbalanceExactly) {
  const absl::StatusOr<CostCoefficients> pairs = CostProfile("pairs");
  ASSERT_THAT(pairs, IsOk());
  EXPECT_TRUE(IsPairsModel(*pairs));
  for (Strategy s : {Strategy::kLlama3, Strategy::kPerDoc, Strategy::kFlashCp}) {
    const Batch batch{{3000, 17, 900, 4000, 120, 2100, 64, 5}, 4};
    absl::StatusOr<Plan> plan = MakePlan(s, batch);
    ASSERT_THAT(plan, IsOk());
    absl::StatusOr<PlanMetrics> m = AnalyzePlan(*plan, ModelShape{});
    ASSERT_THAT(m, IsOk());
    const CostPrediction p = PredictPlanCost(*pairs, *plan);
    EXPECT_EQ(p.imbalance, m->imbalance) << StrategyName(s);
    EXPECT_EQ(p.rank_cost, m->rank_workload) << StrategyName(s);
  }
}

TEST(CostProfileTest, NamedProfiles) {
  EXPECT_THAT(CostProfileNames(), ElementsAre("pairs", "h200-cudnn", "cpu-fp32"));
  absl::StatusOr<CostCoefficients> h200 = CostProfile("h200-cudnn");
  ASSERT_THAT(h200, IsOk());
  EXPECT_EQ(*h200, (CostCoefficients{1.05e-10, 1.25e-10, 7.6e-6, 4.6e-8}));
  for (const std::string& name : CostProfileNames()) {
    absl::StatusOr<CostCoefficients> c = CostProfile(name);
    ASSERT_THAT(c, IsOk());
    EXPECT_THAT(ValidateCostCoefficients(*c), IsOk()) << name;
  }
  EXPECT_THAT(CostProfile("h100"),
              StatusIs(absl::StatusCode::kNotFound,
                       "cost profile \"h100\" is unknown; known: pairs, h200-cudnn, cpu-fp32"));
}

TEST(ValidateCostCoefficientsTest, NamesTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    CostCoefficients c;
    const char* message;
  };
  const Case cases[] = {
      {{nan, 1, 0, 0}, "whole_pair: must be finite and in [0, 1000], got nan"},
      {{1, -1, 0, 0}, "prefixed_pair: must be finite and in [0, 1000], got -1"},
      {{1, 1, 2000, 0}, "sequence: must be finite and in [0, 1000], got 2000"},
      {{1, 1, 0, std::numeric_limits<double>::infinity()},
       "token: must be finite and in [0, 1000], got inf"},
      {{0, 1, 0, 0}, "whole_pair: must be > 0"},
      {{1, 0, 1, 0}, "prefixed_pair: must be > 0"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ValidateCostCoefficients(c.c),
                StatusIs(absl::StatusCode::kInvalidArgument, c.message));
  }
  EXPECT_THAT(ValidateCostCoefficients({1e-10, 2e-10, 1e-5, 0}), IsOk());
}

// Deterministic features spread over a CPU-sized range: the first draw of
// the splitmix64 stream seeded with `seed`.
double Uniform(uint64_t seed) { return SplitMix64Rng(seed).Uniform(); }

std::vector<CostSample> Synthetic(const CostCoefficients& c, int n, uint64_t seed) {
  std::vector<CostSample> v;
  for (int i = 0; i < n; ++i) {
    const uint64_t k = seed * 1000 + static_cast<uint64_t>(i) * 4;
    RankFeatures f{1e5 + 4e5 * Uniform(k), 1e5 + 6e5 * Uniform(k + 1),
                   std::floor(1 + 12 * Uniform(k + 2)), 1000 + std::floor(24 * Uniform(k + 3))};
    v.push_back({f, PredictRankCost(c, f)});
  }
  return v;
}

constexpr CostCoefficients kTruth{2.0e-9, 3.1e-9, 4.0e-5, 2.5e-7};

void ExpectRecovered(const CostCoefficients& got, const CostCoefficients& want) {
  EXPECT_NEAR(got.whole_pair, want.whole_pair, 1e-9 * want.whole_pair);
  EXPECT_NEAR(got.prefixed_pair, want.prefixed_pair, 1e-9 * want.prefixed_pair);
  EXPECT_NEAR(got.sequence, want.sequence, 1e-9 * want.sequence);
  EXPECT_NEAR(got.token, want.token, 1e-9 * want.token);
}

TEST(FitCostModelTest, RecoversKnownCoefficientsFromExactTimes) {
  const std::vector<CostSample> s = Synthetic(kTruth, 64, 1);
  absl::StatusOr<CostFit> fit = FitCostModel(s);
  ASSERT_THAT(fit, IsOk());
  ExpectRecovered(fit->coefficients, kTruth);
  EXPECT_EQ(fit->samples, 64);
  EXPECT_EQ(fit->inliers, 64);
  EXPECT_LT(fit->mean_abs_rel_error, 1e-12);
  EXPECT_GT(fit->condition, 1.0);
  EXPECT_LE(fit->condition, 1e5);
}

TEST(FitCostModelTest, RejectsOutliersAndStillRecoversExactly) {
  std::vector<CostSample> s = Synthetic(kTruth, 64, 2);
  // A descheduled rank (3x), a spike (10x) and a fast glitch (0.2x).
  s[5].seconds *= 3;
  s[17].seconds *= 10;
  s[40].seconds *= 0.2;
  absl::StatusOr<CostFit> fit = FitCostModel(s);
  ASSERT_THAT(fit, IsOk());
  ExpectRecovered(fit->coefficients, kTruth);
  EXPECT_EQ(fit->samples, 64);
  EXPECT_EQ(fit->inliers, 61);
}

TEST(FitCostModelTest, CoefficientsStayNonNegative) {
  // Times whose exact least-squares fit has a negative per-token cost
  // (-1e-8 s): the fit keeps d at 0 (NNLS) instead.
  std::vector<CostSample> s = Synthetic(kTruth, 64, 3);
  for (CostSample& x : s) x.seconds = PredictRankCost({2e-9, 3e-9, 4e-5, 0}, x.features) -
                                      1e-8 * x.features.tokens;
  absl::StatusOr<CostFit> fit = FitCostModel(s);
  ASSERT_THAT(fit, IsOk());
  EXPECT_EQ(fit->coefficients.token, 0.0);
  EXPECT_GT(fit->coefficients.whole_pair, 0.0);
  EXPECT_GT(fit->coefficients.prefixed_pair, 0.0);
}

TEST(FitCostModelTest, TooFewSamplesAreRefused) {
  EXPECT_THAT(FitCostModel(Synthetic(kTruth, 31, 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "31 usable samples (0 of 31 rejected as outliers), need at least 32"));
}

TEST(FitCostModelTest, AFeatureZeroEverywhereIsRefused) {
  std::vector<CostSample> s = Synthetic(kTruth, 40, 5);
  for (CostSample& x : s) {
    x.features.whole_pairs += x.features.prefixed_pairs;
    x.features.prefixed_pairs = 0;
    x.seconds = PredictRankCost(kTruth, x.features);
  }
  EXPECT_THAT(FitCostModel(s),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "feature prefixed_pairs is 0 in all 40 samples: its coefficient cannot "
                       "be fitted"));
}

TEST(FitCostModelTest, IllConditionedSetIsRefusedAndSaysWhy) {
  // Every rank holds the same tokens and as many sequences: tokens and
  // sequences are proportional, so c and d cannot be told apart.
  std::vector<CostSample> s = Synthetic(kTruth, 40, 6);
  for (CostSample& x : s) {
    x.features.sequences = 4;
    x.features.tokens = 1024;
    x.seconds = PredictRankCost(kTruth, x.features);
  }
  const absl::StatusOr<CostFit> fit = FitCostModel(s);
  EXPECT_THAT(fit, StatusIs(absl::StatusCode::kFailedPrecondition,
                            HasSubstr("ill-conditioned: condition number")));
  EXPECT_THAT(fit, StatusIs(absl::StatusCode::kFailedPrecondition,
                            HasSubstr("these features move together: sequences, tokens")));
}

TEST(FitCostModelTest, BadSamplesNameTheIndex) {
  std::vector<CostSample> s = Synthetic(kTruth, 40, 7);
  s[3].seconds = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(FitCostModel(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "samples[3].seconds: must be finite and > 0, got nan"));
  s[3].seconds = 1;
  s[9].features.sequences = -1;
  EXPECT_THAT(FitCostModel(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                        "samples[9].sequences: must be finite and >= 0, got -1"));
  s[9].features = RankFeatures{0, 0, 1, 10};
  EXPECT_THAT(FitCostModel(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "samples[9].whole_pairs + prefixed_pairs: must be > 0"));
}

TEST(CostSampleWindowTest, KeepsTheNewestCapacitySamples) {
  CostSampleWindow w(40);
  for (const CostSample& s : Synthetic({9e-9, 9e-9, 1e-3, 1e-6}, 25, 8)) w.Add(s);
  for (const CostSample& s : Synthetic(kTruth, 40, 9)) w.Add(s);
  EXPECT_EQ(w.size(), 40);
  EXPECT_EQ(w.total_added(), 65);
  absl::StatusOr<CostFit> fit = w.Fit({});
  ASSERT_THAT(fit, IsOk());
  ExpectRecovered(fit->coefficients, kTruth);  // the old model's samples are gone
}

}  // namespace
}  // namespace flashcp::core

namespace flashcp::core {
namespace {

double MaxCost(const CostCoefficients& c, const Plan& plan) {
  const CostPrediction p = PredictPlanCost(c, plan);
  return *std::max_element(p.rank_cost.begin(), p.rank_cost.end());
}

// Plans batches at C = 4096, N = 4 (the README main job's shape) with and
// without `cost`; counts the plans the cost re-cut changed and checks that
// none got heavier under the model.
int ChangedPlans(Strategy strategy, const CostCoefficients& cost, Dataset dataset) {
  int changed = 0;
  for (int64_t b = 0; b < 16; ++b) {
    absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(dataset, 4096, 1, b);
    EXPECT_THAT(docs, IsOk());
    const Batch batch{*docs, 4};
    absl::StatusOr<Plan> pairs = MakePlan(strategy, batch);
    PlanOptions options;
    options.cost = cost;
    absl::StatusOr<Plan> costed = MakePlan(strategy, batch, options);
    EXPECT_THAT(pairs, IsOk());
    EXPECT_THAT(costed, IsOk());
    EXPECT_THAT(ValidatePlan(*costed), IsOk());
    EXPECT_LE(MaxCost(cost, *costed), MaxCost(cost, *pairs)) << "batch " << b;
    if (costed->shards != pairs->shards) {
      EXPECT_LT(MaxCost(cost, *costed), MaxCost(cost, *pairs)) << "batch " << b;
      ++changed;
    }
  }
  return changed;
}

TEST(MakePlanOnCostTest, ReCutLowersTheModelsHeaviestRankNeverRaisesIt) {
  // A model where a sequence costs 20,000 pairs and a prefixed pair 1.5
  // whole ones: far from pairs, so the re-cut has work to do.
  const CostCoefficients skewed{1e-9, 1.5e-9, 2e-5, 0};
  // Exact counts of 16 batches; the others' re-cut did not lower the model's
  // maximum (or the program had no feasible point).
  EXPECT_EQ(ChangedPlans(Strategy::kFlashCp, skewed, Dataset::kPile), 15);
  absl::StatusOr<CostCoefficients> cpu = CostProfile("cpu-fp32");
  ASSERT_THAT(cpu, IsOk());
  EXPECT_EQ(ChangedPlans(Strategy::kFlashCp, *cpu, Dataset::kPile), 13);
  EXPECT_EQ(ChangedPlans(Strategy::kFlashCpPaper, skewed, Dataset::kPile), 14);
  // whole_doc's heaviest rank holds a document too long to balance, whole:
  // no cut point moves its cost.
  EXPECT_EQ(ChangedPlans(Strategy::kWholeDoc, skewed, Dataset::kPile), 0);
  // Zigzags and equal chunks are the strategies' definition: never re-cut.
  EXPECT_EQ(ChangedPlans(Strategy::kPerDoc, skewed, Dataset::kPile), 0);
  EXPECT_EQ(ChangedPlans(Strategy::kLlama3, skewed, Dataset::kPile), 0);
}

TEST(MakePlanOnCostTest, BadCoefficientsNameTheField) {
  PlanOptions options;
  options.cost = {1, 0, 0, 0};
  EXPECT_THAT(MakePlan(Strategy::kFlashCp, Batch{{10, 20}, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument, "cost.prefixed_pair: must be > 0"));
}

TEST(PredictPlanCostTest, RankSpeedsScaleEachRanksCost) {
  // HandWorkedHeadTail's 48 and 28, rank 1 1.5x slow: 48 and 42.
  const CostPrediction p = PredictPlanCost({1, 2, 10, 0.5}, HeadTailPlan(), {1.0, 1.5});
  EXPECT_THAT(p.rank_cost, ElementsAre(48.0, 42.0));
  EXPECT_DOUBLE_EQ(p.imbalance, 48.0 / 45.0);
  EXPECT_THAT(p.rank_speed, ElementsAre(1.0, 1.5));
}

TEST(ValidateRankSpeedsTest, NamesTheEntry) {
  const CostCoefficients cpu{5e-8, 5e-8, 1e-4, 1e-6};
  EXPECT_THAT(ValidateRankSpeeds({}, 4, CostCoefficients{}), IsOk());
  EXPECT_THAT(ValidateRankSpeeds({0.5, 2.0}, 2, cpu), IsOk());
  EXPECT_THAT(ValidateRankSpeeds({1.0, 1.0, 1.0}, 2, cpu),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_speed: 3 entries for 2 ranks (give none or one per rank)"));
  EXPECT_THAT(ValidateRankSpeeds({1.0, 0.49}, 2, cpu),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_speed[1]: must be finite and in [0.5, 2], got 0.49"));
  EXPECT_THAT(ValidateRankSpeeds({std::numeric_limits<double>::quiet_NaN(), 1.0}, 2, cpu),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_speed[0]: must be finite and in [0.5, 2], got nan"));
  EXPECT_THAT(ValidateRankSpeeds({1.0, 1.0}, 2, CostCoefficients{}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_speed: needs a cost model other than pairs (cost_profile or cost)"));
  PlanOptions options;
  options.rank_speed = {1.0, 2.5};
  options.cost = cpu;
  EXPECT_THAT(MakePlan(Strategy::kFlashCp, Batch{{10, 20}, 2}, options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank_speed[1]: must be finite and in [0.5, 2], got 2.5"));
}

TEST(FitRankSpeedsTest, MeasuredOverPredictedPerRankNormalizedToMeanOne) {
  // Rank 1 takes 1.2x its prediction, rank 0 0.9x, rank 2 exactly it, over
  // two steps of different costs: ratios 0.9, 1.2, 1.0, mean 31/30.
  const std::vector<std::vector<double>> predicted = {{1, 2, 3}, {3, 2, 1}};
  const std::vector<std::vector<double>> measured = {{0.9, 2.4, 3}, {2.7, 2.4, 1}};
  const std::vector<double> s = FitRankSpeeds(measured, predicted);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0], 0.9 * 30 / 31);
  EXPECT_DOUBLE_EQ(s[1], 1.2 * 30 / 31);
  EXPECT_DOUBLE_EQ(s[2], 1.0 * 30 / 31);
  // Clamped to the bounds; a step with a rank of cost 0 or another rank
  // count is skipped; nothing usable: empty.
  EXPECT_THAT(FitRankSpeeds({{1, 1, 100}, {5, 5}, {1, 1, 1}}, {{1, 1, 1}, {1, 1}, {0, 1, 1}}),
              ElementsAre(kMinRankSpeed, kMinRankSpeed, kMaxRankSpeed));
  EXPECT_TRUE(FitRankSpeeds({{1, 1}}, {{0, 1}}).empty());
  EXPECT_TRUE(FitRankSpeeds({}, {}).empty());
}

TEST(MakePlanOnCostTest, ReCutBalancesRankSpeedsOnTheMainJobsBatches) {
  // The measured rank speeds of one main-job run (docs/workers.md): the
  // re-cut moves pairs off the slow rank, so that by the model with the
  // speeds the plan is never heavier than the plan made without them, and
  // lighter on the batches it re-cut (an exact count).
  absl::StatusOr<CostCoefficients> cpu = CostProfile("cpu-fp32");
  ASSERT_THAT(cpu, IsOk());
  const std::vector<double> speeds = {0.976, 1.002, 1.013, 1.009};
  int lighter = 0;
  for (int64_t b = 0; b < 16; ++b) {
    absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kPile, 4096, 1, b);
    ASSERT_THAT(docs, IsOk());
    const Batch batch{*docs, 4};
    PlanOptions plain;
    plain.cost = *cpu;
    PlanOptions sped = plain;
    sped.rank_speed = speeds;
    absl::StatusOr<Plan> a = MakePlan(Strategy::kFlashCp, batch, plain);
    absl::StatusOr<Plan> c = MakePlan(Strategy::kFlashCp, batch, sped);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(c, IsOk());
    EXPECT_THAT(ValidatePlan(*c), IsOk());
    const CostPrediction pa = PredictPlanCost(*cpu, *a, speeds);
    const CostPrediction pc = PredictPlanCost(*cpu, *c, speeds);
    EXPECT_LE(pc.imbalance, pa.imbalance * (1 + 1e-12)) << "batch " << b;
    if (pc.imbalance < pa.imbalance * (1 - 1e-9)) ++lighter;
  }
  EXPECT_EQ(lighter, 13);
}

}  // namespace
}  // namespace flashcp::core

namespace flashcp::core {
namespace {

TEST(CostCalibratorTest, UsesTheFitOnceAcceptedAndKeepsItThroughARefusedRefit) {
  CostCalibrator cal(/*window=*/64);
  const std::vector<CostSample> s = Synthetic(kTruth, 40, 10);
  // 31 samples: not enough; the profile plans with its shipped coefficients.
  absl::StatusOr<CostCalibrator::State> st =
      cal.Add("cpu-fp32", absl::MakeConstSpan(s).subspan(0, 31));
  ASSERT_THAT(st, IsOk());
  EXPECT_FALSE(st->calibrated);
  EXPECT_EQ(st->samples, 31);
  EXPECT_EQ(st->status, "31 usable samples (0 of 31 rejected as outliers), need at least 32");
  absl::StatusOr<std::pair<CostCoefficients, bool>> r = cal.Resolve("cpu-fp32");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->first, *CostProfile("cpu-fp32"));
  EXPECT_FALSE(r->second);
  // 9 more: fitted, used.
  st = cal.Add("cpu-fp32", absl::MakeConstSpan(s).subspan(31));
  ASSERT_THAT(st, IsOk());
  EXPECT_TRUE(st->calibrated);
  EXPECT_EQ(st->fits, 1);
  EXPECT_EQ(st->status, "");
  r = cal.Resolve("cpu-fp32");
  ASSERT_THAT(r, IsOk());
  EXPECT_TRUE(r->second);
  ExpectRecovered(r->first, kTruth);
  // Other profiles are untouched.
  r = cal.Resolve("h200-cudnn");
  ASSERT_THAT(r, IsOk());
  EXPECT_FALSE(r->second);
  // 64 collinear samples replace the window: refused, the last fit stays.
  std::vector<CostSample> bad = Synthetic(kTruth, 64, 11);
  for (CostSample& x : bad) {
    x.features.sequences = 4;
    x.features.tokens = 1024;
    x.seconds = PredictRankCost(kTruth, x.features);
  }
  st = cal.Add("cpu-fp32", bad);
  ASSERT_THAT(st, IsOk());
  EXPECT_TRUE(st->calibrated);
  EXPECT_EQ(st->fits, 1);
  EXPECT_EQ(st->samples, 64);
  EXPECT_EQ(st->total, 104);
  EXPECT_THAT(st->status, HasSubstr("ill-conditioned"));
  r = cal.Resolve("cpu-fp32");
  ASSERT_THAT(r, IsOk());
  ExpectRecovered(r->first, kTruth);
}

TEST(CostCalibratorTest, BadReportsChangeNothing) {
  CostCalibrator cal;
  std::vector<CostSample> s = Synthetic(kTruth, 40, 12);
  EXPECT_THAT(cal.Add("pairs", s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("cost_profile: \"pairs\" counts pairs")));
  EXPECT_THAT(cal.Add("tpu", s), StatusIs(absl::StatusCode::kNotFound,
                                         HasSubstr("cost profile \"tpu\" is unknown")));
  s[39].seconds = -1;
  EXPECT_THAT(cal.Add("cpu-fp32", s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "samples[39].seconds: must be finite and > 0, got -1"));
  EXPECT_TRUE(cal.States().empty());
  EXPECT_THAT(cal.Resolve("tpu"), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace flashcp::core

namespace flashcp::core {
namespace {

// The closed loop on synthetic step times: each step plans a Pile batch
// (C = 4096, N = 4, flashcp, the README main job's shape) with the
// calibrator's current coefficients for "cpu-fp32", "measures" every rank as
// `truth` predicts it, times (1 + noise) with noise uniform in
// [-noise, noise], and every `outlier_every`th step rank 0 three times slower
// (a descheduled rank), and reports the step's 4 samples. Returns the number
// of steps reported before the profile was first calibrated (0: never, in
// `max_steps`) and leaves the calibrator as it ended.
struct LoopResult {
  int steps_to_calibrate = 0;
  CostCalibrator::State state;
};
double Noise(uint64_t k, double noise) { return noise * (2 * Uniform(k) - 1); }
LoopResult RunLoop(CostCalibrator& cal, const CostCoefficients& truth, double noise,
                   int outlier_every, int max_steps) {
  LoopResult out;
  for (int step = 0; step < max_steps; ++step) {
    absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kPile, 4096, 1, step);
    EXPECT_THAT(docs, IsOk());
    absl::StatusOr<std::pair<CostCoefficients, bool>> use = cal.Resolve("cpu-fp32");
    EXPECT_THAT(use, IsOk());
    PlanOptions options;
    options.cost = use->first;
    absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{*docs, 4}, options);
    EXPECT_THAT(plan, IsOk());
    std::vector<CostSample> samples;
    for (const RankFeatures& f : PlanRankFeatures(*plan)) {
      const uint64_t k = 7000 + static_cast<uint64_t>(step) * 8 + samples.size();
      double t = PredictRankCost(truth, f) * (1 + Noise(k, noise));
      if (outlier_every > 0 && step % outlier_every == outlier_every - 1 && samples.empty()) {
        t *= 3;
      }
      samples.push_back({f, t});
    }
    absl::StatusOr<CostCalibrator::State> st = cal.Add("cpu-fp32", samples);
    EXPECT_THAT(st, IsOk());
    out.state = *st;
    if (st->calibrated && out.steps_to_calibrate == 0) out.steps_to_calibrate = step + 1;
  }
  return out;
}

// A CPU-like truth away from the shipped cpu-fp32 profile (5.44e-8, 5.69e-8,
// 9.58e-5, 1.86e-6): prefixed pairs 30% dearer, sequences twice as dear.
constexpr CostCoefficients kCpuTruth{6.0e-8, 7.8e-8, 2.0e-4, 1.5e-6};

TEST(CostCalibratorTest, ConvergesWithinEightStepsOfFourRanks) {
  // Exact times: the 8th step's report brings the window to 32 samples, the
  // minimum (CostFitOptions::min_samples / 4 ranks), and the fit is the
  // truth.
  CostCalibrator exact;
  LoopResult r = RunLoop(exact, kCpuTruth, 0, 0, 12);
  EXPECT_EQ(r.steps_to_calibrate, 8);
  EXPECT_EQ(r.state.fits, 5);  // steps 8..12, each refit accepted
  ExpectRecovered(r.state.fit.coefficients, kCpuTruth);
}

TEST(CostCalibratorTest, ConvergesWithinTwelveStepsUnderNoiseAndOutliers) {
  // +-3% noise and one rank 3x slow every 5th step: the outliers are
  // rejected (they leave fewer than 32 inliers at step 8), so the first fit
  // comes later, within 12 steps; from then on every step's refit is
  // accepted and predicts the truth's rank costs to within the noise.
  CostCalibrator noisy;
  LoopResult r = RunLoop(noisy, kCpuTruth, 0.03, 5, 24);
  EXPECT_EQ(r.steps_to_calibrate, 9);
  EXPECT_LE(r.steps_to_calibrate, 12);
  EXPECT_EQ(r.state.fits, 24 - r.steps_to_calibrate + 1);
  EXPECT_EQ(r.state.samples, 96);
  EXPECT_EQ(r.state.fit.inliers, 96 - 24 / 5);
  EXPECT_LT(r.state.fit.mean_abs_rel_error, 0.03);
  for (int64_t b = 100; b < 116; ++b) {
    absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kPile, 4096, 1, b);
    ASSERT_THAT(docs, IsOk());
    absl::StatusOr<Plan> plan = MakePlan(Strategy::kFlashCp, Batch{*docs, 4});
    ASSERT_THAT(plan, IsOk());
    for (const RankFeatures& f : PlanRankFeatures(*plan)) {
      const double want = PredictRankCost(kCpuTruth, f);
      EXPECT_NEAR(PredictRankCost(r.state.fit.coefficients, f), want, 0.01 * want) << b;
    }
  }
}

// On the same batch, the plan made with a calibrated (noisy) fit against the
// pairs plan: by the fit, never heavier (the re-cut is kept only where the
// model's heaviest rank falls); by the truth, its imbalance is never above the
// pairs plan's by more than the fit's own mean error.
TEST(CostCalibratorTest, CalibratedPlansAreNeverWorseThanPairsByMoreThanTheFitsError) {
  CostCalibrator cal;
  const LoopResult r = RunLoop(cal, kCpuTruth, 0.03, 5, 16);
  ASSERT_TRUE(r.state.calibrated);
  const CostCoefficients& fit = r.state.fit.coefficients;
  const double fit_error = r.state.fit.mean_abs_rel_error;
  int better = 0;
  for (int64_t b = 200; b < 232; ++b) {
    absl::StatusOr<std::vector<int64_t>> docs = SampleBatch(Dataset::kPile, 4096, 1, b);
    ASSERT_THAT(docs, IsOk());
    const Batch batch{*docs, 4};
    absl::StatusOr<Plan> pairs = MakePlan(Strategy::kFlashCp, batch);
    PlanOptions options;
    options.cost = fit;
    absl::StatusOr<Plan> calibrated = MakePlan(Strategy::kFlashCp, batch, options);
    ASSERT_THAT(pairs, IsOk());
    ASSERT_THAT(calibrated, IsOk());
    EXPECT_LE(PredictPlanCost(fit, *calibrated).imbalance, PredictPlanCost(fit, *pairs).imbalance)
        << b;
    const double truth_calibrated = PredictPlanCost(kCpuTruth, *calibrated).imbalance;
    const double truth_pairs = PredictPlanCost(kCpuTruth, *pairs).imbalance;
    EXPECT_LE(truth_calibrated, truth_pairs + fit_error) << b;
    if (truth_calibrated < truth_pairs) {
      ++better;
    } else {
      EXPECT_EQ(calibrated->shards, pairs->shards) << b;
    }
  }
  // And by the truth it is strictly better on most batches (exact count; on
  // the other 3 the re-cut did not lower the fit's heaviest rank, the pairs
  // plan stayed).
  EXPECT_EQ(better, 29);
}

}  // namespace
}  // namespace flashcp::core

namespace flashcp::core {
namespace {

TEST(CheckFitNearProfileTest, RefusesThePairsShapeAndFitsFarFromTheShippedProfile) {
  const CostCoefficients cpu = *CostProfile("cpu-fp32");  // 5.44e-8, 5.69e-8, 9.58e-5, 1.86e-6
  EXPECT_TRUE(CheckFitNearProfile(cpu, cpu).ok());
  // Scaled 50x (a slower host) with sequence and token fitted to 0: allowed.
  EXPECT_TRUE(CheckFitNearProfile({50 * 5.44e-8, 50 * 5.69e-8, 0, 0}, cpu).ok());
  // The pairs model itself, and up to scale.
  EXPECT_EQ(CheckFitNearProfile({1, 1, 0, 0}, cpu),
            absl::FailedPreconditionError(
                "refused: the fit (1, 1, 0, 0) is the pairs model up to scale, not a time model"));
  EXPECT_EQ(CheckFitNearProfile({5e-8, 5e-8, 0, 0}, cpu).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckFitNearProfile({5.5e-6, 5.69e-6, 9.58e-3, 1.86e-4}, cpu),
            absl::FailedPreconditionError(
                "refused: far from the shipped profile: whole_pair 5.5e-06 is 101.103 times the "
                "shipped 5.44e-08 (allowed: 1/100 to 100)"));
  EXPECT_TRUE(CheckFitNearProfile({5.4e-6, 5.69e-6, 9.58e-3, 1.86e-4}, cpu).ok());
  // Shape: a sequence 11x as dear relative to pairs as shipped.
  EXPECT_EQ(CheckFitNearProfile({5.44e-8, 5.69e-8, 11 * 9.58e-5, 1.86e-6}, cpu),
            absl::FailedPreconditionError(
                "refused: far from the shipped profile: sequence / whole_pair is 19371.3, "
                "shipped 1761.03 (allowed: at most 10 times the shipped)"));
  EXPECT_TRUE(CheckFitNearProfile({5.44e-8, 5.69e-8, 9.9 * 9.58e-5, 1.86e-6}, cpu).ok());
  // The probe's takeover: prefixed pairs at a quarter of their shipped cost.
  EXPECT_EQ(CheckFitNearProfile({5.44e-8, 5.69e-8 / 4, 9.58e-5, 1.86e-6}, cpu),
            absl::FailedPreconditionError(
                "refused: far from the shipped profile: prefixed_pair / whole_pair is 0.261489, "
                "shipped 1.04596 (allowed: 1/1.5 to 1.5 times the shipped)"));
  EXPECT_TRUE(CheckFitNearProfile({5.44e-8, 5.69e-8 / 1.49, 9.58e-5, 1.86e-6}, cpu).ok());
  EXPECT_EQ(CheckFitNearProfile({5.44e-8, 5.69e-8 * 1.51, 9.58e-5, 1.86e-6}, cpu).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckFitNearProfile({5.44e-8, 5.69e-8, 9.58e-5, 11 * 1.86e-6}, cpu).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace flashcp::core
