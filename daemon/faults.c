/* faults.c - see faults.h. */
#include "faults.h"

#ifdef QL_TEST_HOOKS
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "log.h"

static const struct {
  const char *name;
  uint64_t max;     /* in its unit; a larger value is clamped */
  uint64_t unit_ns; /* 1 ms or 1 us */
  const char *what;
} hooks[QL_FAULT_N_] = {
    [QL_FAULT_KERNEL] = {"QL_TEST_KERNEL_DELAY_MS", 60000, 1000000,
                         "every linear job sleeps that many ms"},
    [QL_FAULT_EARLY] = {"QL_TEST_EARLY_DELAY_MS", 60000, 1000000,
                        "a job that replied early sleeps that many ms "
                        "before the loop hears of it"},
    [QL_FAULT_PIECE] = {"QL_TEST_PIECE_DELAY_US", 1000000, 1000,
                        "a launch in parts sleeps that many us between its "
                        "pieces"},
    [QL_FAULT_START] = {"QL_TEST_START_DELAY_MS", 60000, 1000000,
                        "the start sleeps that many ms before its signal "
                        "handlers are in place"},
};

static uint64_t delay_ns[QL_FAULT_N_];

void ql__faults_init(void) {
  for (int f = 0; f < QL_FAULT_N_; f++) {
    const char *v = getenv(hooks[f].name);
    delay_ns[f] = 0;
    if (v == NULL)
      continue;
    uint64_t n = strtoull(v, NULL, 10);
    if (n > hooks[f].max)
      n = hooks[f].max;
    ql__warn("%s=%llu: %s", hooks[f].name, (unsigned long long)n,
             hooks[f].what);
    delay_ns[f] = n * hooks[f].unit_ns;
  }
}

uint64_t ql__fault_delay_ns(ql__fault f) { return delay_ns[f]; }

void ql__fault_sleep(ql__fault f) {
  uint64_t ns = delay_ns[f];
  if (ns == 0)
    return;
  struct timespec ts = {(time_t)(ns / 1000000000u),
                        (long)(ns % 1000000000u)};
  nanosleep(&ts, NULL);
}
#else
/* (ISO C wants a translation unit to declare something.) */
typedef int ql__faults_none;
#endif
