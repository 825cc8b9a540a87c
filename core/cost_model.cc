#include "core/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/analysis.h"
#include "core/status_macros.h"

namespace flashcp::core {
namespace {

constexpr int kF = kNumCostFeatures;
using Vec = std::array<double, kF>;
using Mat = std::array<Vec, kF>;

struct NamedProfile {
  absl::string_view name;
  CostCoefficients coefficients;
};

// Seconds per feature unit unless noted. h200-cudnn: docs/gpu.md, "A cost
// model for the planner" (run 3, in sample, 384 rank timings). cpu-fp32:
// bench/rank_cost_fit (docs/planner.md, "Cost model").
constexpr std::array<NamedProfile, 3> kProfiles = {{
    {kPairsProfile, {1.0, 1.0, 0.0, 0.0}},  // pairs, not seconds
    {"h200-cudnn", {1.05e-10, 1.25e-10, 7.6e-6, 4.6e-8}},
    {"cpu-fp32", {5.44e-8, 5.69e-8, 9.58e-5, 1.86e-6}},
}};

// Eigenvalues of a symmetric matrix (cyclic Jacobi), and the eigenvector of
// the smallest one.
std::pair<Vec, Vec> SymmetricEigen(Mat a) {
  Mat v{};
  for (int i = 0; i < kF; ++i) v[i][i] = 1.0;
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = 0;
    for (int p = 0; p < kF; ++p) {
      for (int q = p + 1; q < kF; ++q) off += a[p][q] * a[p][q];
    }
    if (off < 1e-300) break;
    for (int p = 0; p < kF; ++p) {
      for (int q = p + 1; q < kF; ++q) {
        if (a[p][q] == 0.0) continue;
        const double theta = (a[q][q] - a[p][p]) / (2.0 * a[p][q]);
        const double t = (theta >= 0 ? 1.0 : -1.0) /
                         (std::abs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < kF; ++k) {
          const double akp = a[k][p], akq = a[k][q];
          a[k][p] = c * akp - s * akq;
          a[k][q] = s * akp + c * akq;
        }
        for (int k = 0; k < kF; ++k) {
          const double apk = a[p][k], aqk = a[q][k];
          a[p][k] = c * apk - s * aqk;
          a[q][k] = s * apk + c * aqk;
        }
        for (int k = 0; k < kF; ++k) {
          const double vkp = v[k][p], vkq = v[k][q];
          v[k][p] = c * vkp - s * vkq;
          v[k][q] = s * vkp + c * vkq;
        }
      }
    }
  }
  Vec eig{};
  int lo = 0;
  for (int i = 0; i < kF; ++i) {
    eig[i] = a[i][i];
    if (eig[i] < eig[lo]) lo = i;
  }
  Vec low{};
  for (int k = 0; k < kF; ++k) low[k] = v[k][lo];
  return {eig, low};
}

// Solves G_SS x = g_S by Cholesky for the features in `mask`; false when not
// positive definite.
bool SolveSubset(const Mat& g, const Vec& rhs, unsigned mask, Vec& x) {
  std::array<int, kF> idx{};
  int m = 0;
  for (int j = 0; j < kF; ++j) {
    if (mask & (1u << j)) idx[m++] = j;
  }
  Mat l{};
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j <= i; ++j) {
      double s = g[idx[i]][idx[j]];
      for (int k = 0; k < j; ++k) s -= l[i][k] * l[j][k];
      if (i == j) {
        if (!(s > 0)) return false;
        l[i][i] = std::sqrt(s);
      } else {
        l[i][j] = s / l[j][j];
      }
    }
  }
  Vec y{};
  for (int i = 0; i < m; ++i) {
    double s = rhs[idx[i]];
    for (int k = 0; k < i; ++k) s -= l[i][k] * y[k];
    y[i] = s / l[i][i];
  }
  Vec z{};
  for (int i = m - 1; i >= 0; --i) {
    double s = y[i];
    for (int k = i + 1; k < m; ++k) s -= l[k][i] * z[k];
    z[i] = s / l[i][i];
  }
  x = Vec{};
  for (int i = 0; i < m; ++i) x[idx[i]] = z[i];
  return true;
}

double Median(std::vector<double> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
}

std::string FeatureList(const Vec& v, double threshold) {
  std::vector<std::string> names;
  for (int j = 0; j < kF; ++j) {
    if (std::abs(v[j]) > threshold) names.emplace_back(CostFeatureName(j));
  }
  return absl::StrJoin(names, ", ");
}

}  // namespace

absl::string_view CostFeatureName(int feature) {
  switch (feature) {
    case 0: return "whole_pairs";
    case 1: return "prefixed_pairs";
    case 2: return "sequences";
    case 3: return "tokens";
    default: return "?";
  }
}

std::array<double, kNumCostFeatures> FeatureVector(const RankFeatures& f) {
  return {f.whole_pairs, f.prefixed_pairs, f.sequences, f.tokens};
}

absl::Status ValidateCostCoefficients(const CostCoefficients& c) {
  const std::array<std::pair<absl::string_view, double>, kF> fields = {{
      {"whole_pair", c.whole_pair},
      {"prefixed_pair", c.prefixed_pair},
      {"sequence", c.sequence},
      {"token", c.token},
  }};
  for (const auto& [name, v] : fields) {
    if (!std::isfinite(v) || v < 0 || v > kMaxCostCoefficient) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": must be finite and in [0, ", kMaxCostCoefficient, "], got ", v));
    }
  }
  if (!(c.whole_pair > 0)) return absl::InvalidArgumentError("whole_pair: must be > 0");
  if (!(c.prefixed_pair > 0)) return absl::InvalidArgumentError("prefixed_pair: must be > 0");
  return absl::OkStatus();
}

bool IsPairsModel(const CostCoefficients& c) { return c == CostCoefficients{}; }

std::vector<std::string> CostProfileNames() {
  std::vector<std::string> names;
  for (const NamedProfile& p : kProfiles) names.emplace_back(p.name);
  return names;
}

absl::StatusOr<CostCoefficients> CostProfile(absl::string_view name) {
  for (const NamedProfile& p : kProfiles) {
    if (p.name == name) return p.coefficients;
  }
  return absl::NotFoundError(absl::StrCat("cost profile \"", name, "\" is unknown; known: ",
                                          absl::StrJoin(CostProfileNames(), ", ")));
}

absl::Status CheckFitNearProfile(const CostCoefficients& fit, const CostCoefficients& shipped) {
  if (fit.sequence == 0 && fit.token == 0 &&
      std::abs(fit.whole_pair - fit.prefixed_pair) <= 1e-9 * fit.whole_pair) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refused: the fit (", fit.whole_pair, ", ", fit.prefixed_pair,
        ", 0, 0) is the pairs model up to scale, not a time model"));
  }
  if (!(fit.whole_pair > 0) || !(shipped.whole_pair > 0)) {
    return absl::FailedPreconditionError("refused: whole_pair must be > 0");
  }
  const double scale = fit.whole_pair / shipped.whole_pair;
  if (!(scale <= kMaxFitScale && scale >= 1 / kMaxFitScale)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refused: far from the shipped profile: whole_pair ", fit.whole_pair, " is ", scale,
        " times the shipped ", shipped.whole_pair, " (allowed: 1/", kMaxFitScale, " to ",
        kMaxFitScale, ")"));
  }
  // (term, fit, shipped, bound, two-sided)
  const std::array<std::tuple<absl::string_view, double, double, double, bool>, 3> terms = {{
      {"prefixed_pair", fit.prefixed_pair, shipped.prefixed_pair, kMaxFitPairRatio, true},
      {"sequence", fit.sequence, shipped.sequence, kMaxFitShape, false},
      {"token", fit.token, shipped.token, kMaxFitShape, false},
  }};
  for (const auto& [name, f, s, bound, two_sided] : terms) {
    const double fit_ratio = f / fit.whole_pair;
    const double shipped_ratio = s / shipped.whole_pair;
    const bool high = fit_ratio > bound * shipped_ratio;
    const bool low = two_sided && fit_ratio < shipped_ratio / bound;
    if (high || low) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refused: far from the shipped profile: ", name, " / whole_pair is ", fit_ratio,
          ", shipped ", shipped_ratio, " (allowed: ",
          two_sided ? absl::StrCat("1/", bound, " to ") : std::string("at most "), bound,
          " times the shipped)"));
    }
  }
  return absl::OkStatus();
}

std::vector<RankFeatures> PlanRankFeatures(const Plan& plan) {
  std::vector<RankFeatures> f(static_cast<size_t>(plan.cp_size));
  for (const Shard& s : plan.shards) {
    RankFeatures& r = f[s.rank];
    (s.start == 0 ? r.whole_pairs : r.prefixed_pairs) += ShardWorkload(s.start, s.len);
    r.sequences += 1;
    r.tokens += static_cast<double>(s.len);
  }
  return f;
}

double PredictRankCost(const CostCoefficients& c, const RankFeatures& f) {
  return c.whole_pair * f.whole_pairs + c.prefixed_pair * f.prefixed_pairs +
         c.sequence * f.sequences + c.token * f.tokens;
}

double MaxOverMean(absl::Span<const double> v) {
  double sum = 0, max = 0;
  for (const double x : v) {
    sum += x;
    max = std::max(max, x);
  }
  const double mean = v.empty() ? 0 : sum / static_cast<double>(v.size());
  return mean > 0 ? max / mean : 1.0;
}

CostPrediction PredictCost(const CostCoefficients& c, absl::Span<const RankFeatures> ranks,
                           absl::Span<const double> rank_speed) {
  CostPrediction p;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const double speed = r < rank_speed.size() ? rank_speed[r] : 1.0;
    p.rank_cost.push_back(speed * PredictRankCost(c, ranks[r]));
  }
  p.imbalance = MaxOverMean(p.rank_cost);
  p.rank_speed.assign(rank_speed.begin(), rank_speed.end());
  return p;
}

CostPrediction PredictPlanCost(const CostCoefficients& c, const Plan& plan,
                               absl::Span<const double> rank_speed) {
  return PredictCost(c, PlanRankFeatures(plan), rank_speed);
}

absl::Status ValidateRankSpeeds(absl::Span<const double> rank_speed, int32_t cp_size,
                                const CostCoefficients& cost) {
  if (rank_speed.empty()) return absl::OkStatus();
  if (IsPairsModel(cost)) {
    return absl::InvalidArgumentError(
        "rank_speed: needs a cost model other than pairs (cost_profile or cost)");
  }
  if (static_cast<int64_t>(rank_speed.size()) != cp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank_speed: ", rank_speed.size(), " entries for ", cp_size, " ranks (give none or one per rank)"));
  }
  for (size_t r = 0; r < rank_speed.size(); ++r) {
    const double v = rank_speed[r];
    if (!std::isfinite(v) || v < kMinRankSpeed || v > kMaxRankSpeed) {
      return absl::InvalidArgumentError(absl::StrCat("rank_speed[", r, "]: must be finite and in [",
                                                     kMinRankSpeed, ", ", kMaxRankSpeed, "], got ", v));
    }
  }
  return absl::OkStatus();
}

std::vector<double> FitRankSpeeds(absl::Span<const std::vector<double>> measured,
                                  absl::Span<const std::vector<double>> predicted) {
  if (measured.empty() || measured.size() != predicted.size()) return {};
  const size_t n = measured.front().size();
  std::vector<double> m(n, 0.0), p(n, 0.0);
  bool any = false;
  for (size_t t = 0; t < measured.size(); ++t) {
    if (measured[t].size() != n || predicted[t].size() != n) continue;
    if (std::any_of(predicted[t].begin(), predicted[t].end(), [](double c) { return !(c > 0); })) {
      continue;
    }
    for (size_t r = 0; r < n; ++r) {
      m[r] += measured[t][r];
      p[r] += predicted[t][r];
    }
    any = true;
  }
  if (!any) return {};
  std::vector<double> ratio(n);
  double mean = 0;
  for (size_t r = 0; r < n; ++r) {
    ratio[r] = m[r] / p[r];
    mean += ratio[r] / static_cast<double>(n);
  }
  if (!(mean > 0) || !std::isfinite(mean)) return {};
  for (double& x : ratio) x = std::clamp(x / mean, kMinRankSpeed, kMaxRankSpeed);
  return ratio;
}

absl::Status ValidateCostSample(const CostSample& s) {
  if (!std::isfinite(s.seconds) || !(s.seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("seconds: must be finite and > 0, got ", s.seconds));
  }
  const Vec v = FeatureVector(s.features);
  for (int j = 0; j < kF; ++j) {
    if (!std::isfinite(v[j]) || v[j] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          CostFeatureName(j), ": must be finite and >= 0, got ", v[j]));
    }
  }
  if (!(s.features.whole_pairs + s.features.prefixed_pairs > 0)) {
    return absl::InvalidArgumentError("whole_pairs + prefixed_pairs: must be > 0");
  }
  return absl::OkStatus();
}

namespace {

// The norm of each feature's column over the inliers (`used` of them), or
// FAILED_PRECONDITION when too few are left or a feature is 0 in all.
absl::StatusOr<Vec> InlierColumnNorms(absl::Span<const CostSample> samples,
                                      const std::vector<char>& inlier,
                                      const CostFitOptions& options, int64_t& used) {
  const int64_t n = static_cast<int64_t>(samples.size());
  used = 0;
  Vec norm{};
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!inlier[i]) continue;
    ++used;
    const Vec x = FeatureVector(samples[i].features);
    for (int j = 0; j < kF; ++j) norm[j] += x[j] * x[j];
  }
  if (used < options.min_samples) {
    return absl::FailedPreconditionError(absl::StrCat(
        used, " usable samples (", n - used, " of ", n,
        " rejected as outliers), need at least ", options.min_samples));
  }
  for (int j = 0; j < kF; ++j) {
    if (!(norm[j] > 0)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "feature ", CostFeatureName(j), " is 0 in all ", used,
          " samples: its coefficient cannot be fitted"));
    }
    norm[j] = std::sqrt(norm[j]);
  }
  return norm;
}

// Normal equations of the inliers on unit-norm columns: g beta = rhs.
void NormalEquations(absl::Span<const CostSample> samples, const std::vector<char>& inlier,
                     const Vec& norm, Mat& g, Vec& rhs) {
  g = Mat{};
  rhs = Vec{};
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!inlier[i]) continue;
    Vec x = FeatureVector(samples[i].features);
    for (int j = 0; j < kF; ++j) x[j] /= norm[j];
    for (int j = 0; j < kF; ++j) {
      rhs[j] += x[j] * samples[i].seconds;
      for (int k = 0; k < kF; ++k) g[j][k] += x[j] * x[k];
    }
  }
}

// Exact NNLS over subsets: the optimum is the least-squares solution on its
// support, which is non-negative. Coefficients of the unit-norm columns.
Vec NonNegativeLeastSquares(absl::Span<const CostSample> samples,
                            const std::vector<char>& inlier, const Vec& norm, const Mat& g,
                            const Vec& rhs) {
  Vec best{};
  double best_ss = std::numeric_limits<double>::infinity();
  for (unsigned mask = 1; mask < (1u << kF); ++mask) {
    Vec beta;
    if (!SolveSubset(g, rhs, mask, beta)) continue;
    if (std::any_of(beta.begin(), beta.end(), [](double b) { return b < 0; })) continue;
    double ss = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (!inlier[i]) continue;
      const Vec x = FeatureVector(samples[i].features);
      double pred = 0;
      for (int j = 0; j < kF; ++j) pred += beta[j] * x[j] / norm[j];
      ss += (pred - samples[i].seconds) * (pred - samples[i].seconds);
    }
    if (ss < best_ss) {
      best_ss = ss;
      best = beta;
    }
  }
  return best;
}

// Under coefficients `c`: the inliers' mean absolute relative error into
// `fit`, and the inliers afresh (relative residual within outlier_sigmas
// robust scales of the inliers' median). True when the inliers changed.
bool RefitInliers(absl::Span<const CostSample> samples, const CostCoefficients& c,
                  const CostFitOptions& options, std::vector<char>& inlier, CostFit& fit) {
  // Relative residuals of every sample under this fit.
  std::vector<double> rel(samples.size());
  std::vector<double> in_rel;
  for (size_t i = 0; i < samples.size(); ++i) {
    rel[i] = (PredictRankCost(c, samples[i].features) - samples[i].seconds) / samples[i].seconds;
    if (inlier[i]) in_rel.push_back(rel[i]);
  }
  const double med = Median(in_rel);
  std::vector<double> dev;
  for (double e : in_rel) dev.push_back(std::abs(e - med));
  const double scale = std::max(1.4826 * Median(dev), options.min_residual_scale);
  double err = 0;
  for (double e : in_rel) err += std::abs(e);
  fit.mean_abs_rel_error = err / static_cast<double>(fit.inliers);
  bool changed = false;
  for (size_t i = 0; i < samples.size(); ++i) {
    const char keep = std::abs(rel[i] - med) <= options.outlier_sigmas * scale ? 1 : 0;
    changed |= keep != inlier[i];
    inlier[i] = keep;
  }
  return changed;
}

// The final fit's coefficients within kMaxCostCoefficient, its pair
// coefficients > 0.
absl::Status CheckFittedCoefficients(const CostCoefficients& c) {
  const Vec v = {c.whole_pair, c.prefixed_pair, c.sequence, c.token};
  for (int j = 0; j < kF; ++j) {
    if (v[j] > kMaxCostCoefficient) {
      return absl::FailedPreconditionError(absl::StrCat(
          "fitted coefficient of ", CostFeatureName(j), " is ", v[j], ", above the bound ",
          kMaxCostCoefficient));
    }
  }
  if (!(c.whole_pair > 0) || !(c.prefixed_pair > 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fitted pair coefficients must be > 0, got whole_pair ", c.whole_pair,
        ", prefixed_pair ", c.prefixed_pair));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostFit> FitCostModel(absl::Span<const CostSample> samples,
                                     const CostFitOptions& options) {
  for (size_t i = 0; i < samples.size(); ++i) {
    if (absl::Status s = ValidateCostSample(samples[i]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("samples[", i, "].", s.message()));
    }
  }
  std::vector<char> inlier(samples.size(), 1);
  CostFit fit;
  fit.samples = static_cast<int64_t>(samples.size());
  for (int32_t round = 0;; ++round) {
    int64_t used = 0;
    FLASHCP_ASSIGN_OR_RETURN(const Vec norm, InlierColumnNorms(samples, inlier, options, used));
    Mat g;
    Vec rhs;
    NormalEquations(samples, inlier, norm, g, rhs);
    const auto [eig, low] = SymmetricEigen(g);
    const double hi = *std::max_element(eig.begin(), eig.end());
    const double lo = *std::min_element(eig.begin(), eig.end());
    const double condition = lo > 0 ? std::sqrt(hi / lo) : std::numeric_limits<double>::infinity();
    if (!(condition <= options.max_condition)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ill-conditioned: condition number ", condition, " > ", options.max_condition,
          " over ", used, " samples; these features move together: ", FeatureList(low, 0.3)));
    }
    const Vec best = NonNegativeLeastSquares(samples, inlier, norm, g, rhs);
    const CostCoefficients c{best[0] / norm[0], best[1] / norm[1], best[2] / norm[2],
                             best[3] / norm[3]};
    fit.coefficients = c;
    fit.condition = condition;
    fit.inliers = used;
    const bool changed = RefitInliers(samples, c, options, inlier, fit);
    if (!changed || round + 1 >= options.max_rounds) break;
  }
  FLASHCP_RETURN_IF_ERROR(CheckFittedCoefficients(fit.coefficients));
  return fit;
}

void CostSampleWindow::Add(const CostSample& s) {
  if (static_cast<int64_t>(samples_.size()) == capacity_) samples_.pop_front();
  samples_.push_back(s);
  ++total_added_;
}

absl::StatusOr<CostFit> CostSampleWindow::Fit(const CostFitOptions& options) const {
  const std::vector<CostSample> v(samples_.begin(), samples_.end());
  return FitCostModel(v, options);
}

absl::Status ValidateCalibrationProfile(absl::string_view profile) {
  if (profile == kPairsProfile) {
    return absl::InvalidArgumentError(
        "cost_profile: \"pairs\" counts pairs, not time, and is not calibrated; report under a "
        "time profile (h200-cudnn, cpu-fp32)");
  }
  return CostProfile(profile).status();
}

absl::StatusOr<CostCalibrator::State> CostCalibrator::Add(absl::string_view profile,
                                                           absl::Span<const CostSample> samples) {
  FLASHCP_RETURN_IF_ERROR(ValidateCalibrationProfile(profile));
  for (size_t i = 0; i < samples.size(); ++i) {
    if (absl::Status s = ValidateCostSample(samples[i]); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("samples[", i, "].", s.message()));
    }
  }
  auto it = std::find_if(profiles_.begin(), profiles_.end(),
                         [&](const auto& p) { return p.first == profile; });
  if (it == profiles_.end()) {
    profiles_.push_back({std::string(profile), Entry{CostSampleWindow(window_), State{}}});
    it = std::prev(profiles_.end());
  }
  Entry& e = it->second;
  for (const CostSample& s : samples) e.window.Add(s);
  e.state.samples = e.window.size();
  e.state.total = e.window.total_added();
  absl::StatusOr<CostFit> fit = e.window.Fit(options_);
  if (fit.ok()) {
    e.state.fit = *fit;
    e.state.calibrated = true;
    ++e.state.fits;
    e.state.status.clear();
  } else {
    e.state.status = std::string(fit.status().message());
  }
  return e.state;
}

absl::StatusOr<std::pair<CostCoefficients, bool>> CostCalibrator::Resolve(
    absl::string_view profile) const {
  FLASHCP_ASSIGN_OR_RETURN(const CostCoefficients fixed, CostProfile(profile));
  for (const auto& [name, e] : profiles_) {
    if (name == profile && e.state.calibrated) {
      return std::pair<CostCoefficients, bool>{e.state.fit.coefficients, true};
    }
  }
  return std::pair<CostCoefficients, bool>{fixed, false};
}

std::vector<std::pair<std::string, CostCalibrator::State>> CostCalibrator::States() const {
  std::vector<std::pair<std::string, State>> out;
  for (const auto& [name, e] : profiles_) out.push_back({name, e.state});
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace flashcp::core
