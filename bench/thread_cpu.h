// The calling thread's CPU time, for the benchmarks' per-call figures: it
// leaves out time the thread spent descheduled, which on a shared machine is
// most of the wall-time noise.
#ifndef FLASHCP_BENCH_THREAD_CPU_H_
#define FLASHCP_BENCH_THREAD_CPU_H_

#include <time.h>

namespace flashcp::bench {

// Seconds of CPU time this thread has used (CLOCK_THREAD_CPUTIME_ID).
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace flashcp::bench

#endif  // FLASHCP_BENCH_THREAD_CPU_H_
