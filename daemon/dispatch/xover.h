/*
 * xover.h - the crossover cache file, <state_dir>/crossover.json
 * (calibrate.h): {"version": 2, "crossover": {KEY: VALUE, ...}} where a
 * VALUE is {"rows": ROWS, "m": [M...], "wo_ns": [NS...], "aq_ns": [NS...]}
 * (the crossover and the launch times it was chosen from, which also size
 * prefill chunks), or a bare ROWS as version 1 wrote it (no times). Its
 * parser is apart from the daemon so that the fuzz target links it alone.
 */
#ifndef QL_XOVER_H
#define QL_XOVER_H

#include <stddef.h>
#include <stdint.h>

#define QL_XOVER_VERSION 2
#define QL_XOVER_KEY_MAX 192
/* Times per entry, and their bounds. */
#define QL_XOVER_POINTS 16
#define QL_XOVER_MAX_M (1u << 20)
#define QL_XOVER_MAX_NS ((uint64_t)1 << 40)

/* One cached crossover. */
typedef struct ql__xover_entry {
  char key[QL_XOVER_KEY_MAX]; /* printable ASCII, NUL-terminated */
  uint32_t rows; /* UINT32_MAX: never activation-quantized */
  unsigned n;    /* sizes timed, 0 .. QL_XOVER_POINTS (0: none kept) */
  uint32_t m[QL_XOVER_POINTS];     /* rows of each size, 1 .. 2^20 */
  uint64_t wo_ns[QL_XOVER_POINTS]; /* weight-only launch, 1 .. 2^40 ns */
  uint64_t aq_ns[QL_XOVER_POINTS]; /* activation-quantized, 0 .. 2^40 ns
                                      (0: no such path) */
} ql__xover_entry;

/*
 * Parses the file's bytes: an object with exactly "version" (1 or 2) and
 * "crossover", an object of keys of printable ASCII shorter than
 * QL_XOVER_KEY_MAX, no duplicate keys, whose values are rows integers in
 * [1, 2^32 - 1] or (version 2) objects of exactly "rows" (the same),
 * "m", "wo_ns" and "aq_ns": arrays of one length up to QL_XOVER_POINTS of
 * integers in the bounds of ql__xover_entry.
 * On success *out (n entries, NULL when n is 0) is the caller's to free();
 * 0, QL_EBADFILE (err says why) or QL_ENOMEM. Never logs.
 */
int ql__xover_parse(const char *buf, size_t len, ql__xover_entry **out,
                    size_t *n, char *err, size_t errlen);

/*
 * The file's text for entries e[0 .. n), at most max_bytes long: when all
 * of them would not fit, the first ones are left out (the daemon keeps
 * its entries oldest first) and *kept says how many of the last were
 * written. On success *text (NUL-terminated) is the caller's to free();
 * 0 or QL_ENOMEM.
 */
int ql__xover_dump(const ql__xover_entry *e, size_t n, size_t max_bytes,
                   char **text, size_t *kept);

#endif /* QL_XOVER_H */
