/*
 * counters.h - what every reply is counted in: requests, errors (in total
 * and per QL_E* code, one slot each), bytes. The wire layer counts as it
 * sends (reply.c), the rings count their own answers, Stats and /metrics
 * read them.
 */
#ifndef QL_COUNTERS_H
#define QL_COUNTERS_H

#include <stdint.h>

#include "ql_defs.h"

/* One slot per QL_E* code, in the order of QL_ERRNO_MAP, and one more
 * (QL__ERR_SLOTS) for any other code. */
enum {
#define QL__ERR_SLOT(name, val, msg) QL__ERR_SLOT_##name,
  QL_ERRNO_MAP(QL__ERR_SLOT)
#undef QL__ERR_SLOT
  QL__ERR_SLOTS
};

static inline unsigned ql__err_slot(int code) {
  switch (code) {
#define QL__ERR_CASE(name, val, msg)                                           \
  case QL_E##name:                                                             \
    return QL__ERR_SLOT_##name;
    QL_ERRNO_MAP(QL__ERR_CASE)
#undef QL__ERR_CASE
  default:
    return QL__ERR_SLOTS;
  }
}

/* The code of slot i (< QL__ERR_SLOTS). */
static inline int ql__err_slot_code(unsigned slot) {
  static const int codes[] = {
#define QL__ERR_CODE(name, val, msg) QL_E##name,
      QL_ERRNO_MAP(QL__ERR_CODE)
#undef QL__ERR_CODE
  };
  return slot < QL__ERR_SLOTS ? codes[slot] : 0;
}

typedef struct ql__counters {
  uint64_t requests; /* requests received (decodable or not); those a
                        ring answered itself are the ring's (net/ring.h) */
  uint64_t errors;   /* replies with a non-zero status */
  uint64_t bytes_in;
  uint64_t bytes_out;
  uint64_t errors_by_code[QL__ERR_SLOTS + 1]; /* of them, by code
                                                 (ql__err_slot) */
} ql__counters;

#endif /* QL_COUNTERS_H */
