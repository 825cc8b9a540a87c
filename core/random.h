// The project's one pseudo-random generator: splitmix64 (Steele, Lea and
// Flood 2014), integer-only, so its output is the same on every platform and
// standard library (std:: distributions are not). Seeded state, no globals:
// callers own the state, so every stream is reproducible from its seed.
#ifndef FLASHCP_CORE_RANDOM_H_
#define FLASHCP_CORE_RANDOM_H_

#include <cstdint>

namespace flashcp::core {

// Advances `state` by the golden-ratio increment and returns the mixed value.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A splitmix64 stream.
class SplitMix64Rng {
 public:
  explicit SplitMix64Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64(state_); }
  // Uniform in [0, 1): the top 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // In [lo, hi] (lo <= hi), one Next() per call: the modulo's slight bias
  // is harmless for test inputs and keeps every stream drawn from it as it was.
  int64_t Between(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
    return lo + static_cast<int64_t>(Next() % span);
  }

 private:
  uint64_t state_;
};

}  // namespace flashcp::core

#endif  // FLASHCP_CORE_RANDOM_H_
