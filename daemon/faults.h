/*
 * faults.h - the daemon's test hooks: delays that the integration tests
 * set through the environment (QL_TEST_*_DELAY_*) to hold a job, a
 * reply or the start open long enough to act on it. Read once at the
 * start (ql__faults_init), read-only after, so workers may ask from any
 * thread. A build configured --disable-test-hooks (a release package)
 * compiles all of it to nothing: no environment variable can slow it,
 * and the worker's path carries no check.
 */
#ifndef QL_FAULTS_H
#define QL_FAULTS_H

#include "config.h"

#include <stdint.h>

typedef enum ql__fault {
  QL_FAULT_KERNEL, /* QL_TEST_KERNEL_DELAY_MS: every linear job first */
  QL_FAULT_EARLY,  /* QL_TEST_EARLY_DELAY_MS: a job that replied early,
                      before the loop hears of it */
  QL_FAULT_PIECE,  /* QL_TEST_PIECE_DELAY_US: a launch in parts, each time
                      it asks whether to stop, so that it lasts long
                      enough to be stopped */
  QL_FAULT_START,  /* QL_TEST_START_DELAY_MS: the start, before its signal
                      handlers are in place */
  QL_FAULT_N_
} ql__fault;

#ifdef QL_TEST_HOOKS
/* Reads the hooks from the environment (no configuration can set them)
 * and logs each one set, with what it does. Before any thread starts. */
void ql__faults_init(void);
/* Sleeps for hook f's delay; returns at once when it is not set. */
void ql__fault_sleep(ql__fault f);
/* Hook f's delay in ns (0: not set), as ql__faults_init read it. */
uint64_t ql__fault_delay_ns(ql__fault f);
#else
static inline void ql__faults_init(void) {}
static inline void ql__fault_sleep(ql__fault f) { (void)f; }
static inline uint64_t ql__fault_delay_ns(ql__fault f) {
  (void)f;
  return 0;
}
#endif

#endif
