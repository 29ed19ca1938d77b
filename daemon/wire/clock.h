/*
 * clock.h - the daemon's one clock: CLOCK_MONOTONIC in nanoseconds, for
 * deadlines, leases and latencies. Header only, so the lowest layers (the
 * rings, the workers) share it without depending on each other.
 */
#ifndef QL_CLOCK_H
#define QL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t ql__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif /* QL_CLOCK_H */
