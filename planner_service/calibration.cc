#include "planner_service/calibration.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace flashcp::planner_service {

Calibration::Calibration(ServiceObserver* observer, CalibrationOptions options)
    : observer_(observer), options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

Calibration::~Calibration() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Calibration::Report(const CalibrationCaller& caller, proto::StepTimesReport report,
                         Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_ && static_cast<int64_t>(pending_.size()) < options_.max_pending) {
      pending_.push_back(Pending{caller, std::move(report), std::move(done)});
      return;
    }
  }
  done(absl::ResourceExhaustedError(absl::StrCat(
      "ReportStepTimes: ", options_.max_pending,
      " reports already wait for the planner's refit; retry later")));
}

absl::StatusOr<std::pair<core::CostCoefficients, bool>> Calibration::Resolve(
    const std::string& tenant, absl::string_view profile) const {
  FLASHCP_ASSIGN_OR_RETURN(const core::CostCoefficients shipped, core::CostProfile(profile));
  absl::MutexLock lock(&mu_);
  const auto t = tenants_.find(tenant);
  if (t != tenants_.end()) {
    const auto w = t->second.profiles.find(std::string(profile));
    if (w != t->second.profiles.end() && w->second.state.calibrated) {
      return std::pair<core::CostCoefficients, bool>{w->second.state.fit.coefficients, true};
    }
  }
  return std::pair<core::CostCoefficients, bool>{shipped, false};
}

void Calibration::WaitIdle() const {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](const Calibration* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
        return c->pending_.empty() && !c->busy_;
      },
      this));
}

Calibration::Tenant& Calibration::TenantLocked(const std::string& tenant) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second;
  }
  while (static_cast<int64_t>(tenants_.size()) >= std::max(1, options_.max_tenants)) {
    tenants_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(tenant);
  Tenant& t = tenants_[tenant];
  t.lru = lru_.begin();
  return t;
}

void Calibration::AddLocked(Window& w, const std::string& reporter,
                            const std::vector<core::CostSample>& samples) {
  const int64_t window = std::max<int64_t>(1, options_.window);
  const int64_t quota = std::min(
      window, std::max(options_.fit.min_samples,
                       static_cast<int64_t>(options_.max_reporter_share * window)));
  for (const core::CostSample& s : samples) {
    std::deque<Sample>& mine = w.by_reporter[reporter];
    mine.push_back(Sample{s, next_seq_++});
    ++w.size;
    if (static_cast<int64_t>(mine.size()) > quota) {  // its own oldest make room
      mine.pop_front();
      --w.size;
    }
    if (w.size > window) {  // the largest holder's oldest (ties: the oldest sample)
      auto victim = w.by_reporter.begin();
      for (auto it = w.by_reporter.begin(); it != w.by_reporter.end(); ++it) {
        if (it->second.size() > victim->second.size() ||
            (it->second.size() == victim->second.size() &&
             it->second.front().seq < victim->second.front().seq)) {
          victim = it;
        }
      }
      victim->second.pop_front();
      --w.size;
      if (victim->second.empty()) w.by_reporter.erase(victim);
    }
  }
}

void Calibration::Loop() {
  for (;;) {
    std::deque<Pending> taken;
    // The windows touched, with their samples in arrival order, to fit.
    struct Refit {
      std::string tenant, profile;
      std::vector<core::CostSample> samples;
      int64_t accepted = 0;
      absl::StatusOr<core::CostFit> fit;
      core::CostCalibrator::State state;
    };
    std::vector<Refit> refits;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Calibration* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return c->stop_ || !c->pending_.empty();
          },
          this));
      if (pending_.empty()) return;  // stopping, and nothing left
      taken.swap(pending_);
      busy_ = true;
      for (const Pending& p : taken) {
        Window& w = TenantLocked(p.caller.tenant).profiles[p.report.cost_profile];
        AddLocked(w, p.caller.reporter, p.report.samples);
        w.state.total += static_cast<int64_t>(p.report.samples.size());
        w.state.samples = w.size;
        auto r = std::find_if(refits.begin(), refits.end(), [&](const Refit& x) {
          return x.tenant == p.caller.tenant && x.profile == p.report.cost_profile;
        });
        if (r == refits.end()) {
          refits.push_back(Refit{p.caller.tenant, p.report.cost_profile, {}, 0,
                                 absl::UnknownError("unfitted"), {}});
          r = std::prev(refits.end());
        }
        r->accepted += static_cast<int64_t>(p.report.samples.size());
      }
      for (Refit& r : refits) {
        // A tenant added earlier in this batch may have been dropped by a
        // later one (max_tenants): nothing to fit, its reporters still answered.
        const auto t = tenants_.find(r.tenant);
        if (t == tenants_.end()) continue;
        const Window& w = t->second.profiles.at(r.profile);
        std::vector<Sample> all;
        for (const auto& [reporter, q] : w.by_reporter) all.insert(all.end(), q.begin(), q.end());
        std::sort(all.begin(), all.end(),
                  [](const Sample& a, const Sample& b) { return a.seq < b.seq; });
        r.samples.reserve(all.size());
        for (const Sample& s : all) r.samples.push_back(s.sample);
      }
    }
    // The fits, outside the lock: plans resolve their coefficients meanwhile.
    for (Refit& r : refits) {
      r.fit = core::FitCostModel(r.samples, options_.fit);
      if (r.fit.ok()) {
        const absl::Status near =
            core::CheckFitNearProfile(r.fit->coefficients, *core::CostProfile(r.profile));
        if (!near.ok()) r.fit = near;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      for (Refit& r : refits) {
        // The tenant may have been dropped meanwhile (max_tenants): its
        // reporters are still answered, with this refit's outcome.
        core::CostCalibrator::State scratch;
        core::CostCalibrator::State* state = &scratch;
        if (auto t = tenants_.find(r.tenant); t != tenants_.end()) {
          if (auto w = t->second.profiles.find(r.profile); w != t->second.profiles.end()) {
            state = &w->second.state;
          }
        }
        if (r.fit.ok()) {
          state->fit = *r.fit;
          state->calibrated = true;
          ++state->fits;
          state->status.clear();
        } else {
          state->status = std::string(r.fit.status().message());
        }
        r.state = *state;
      }
    }
    for (const Refit& r : refits) observer_->OnCalibration(r.profile, r.accepted, r.state);
    for (Pending& p : taken) {
      const auto r = std::find_if(refits.begin(), refits.end(), [&](const Refit& x) {
        return x.tenant == p.caller.tenant && x.profile == p.report.cost_profile;
      });
      p.done(r->state);
    }
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

}  // namespace flashcp::planner_service
