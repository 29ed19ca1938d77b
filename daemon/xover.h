/*
 * xover.h - the crossover cache file, <state_dir>/crossover.json
 * (calibrate.h): {"version": 1, "crossover": {KEY: ROWS, ...}}. Its
 * parser is apart from the daemon so that the fuzz target links it alone.
 */
#ifndef QL_XOVER_H
#define QL_XOVER_H

#include <stddef.h>
#include <stdint.h>

#define QL_XOVER_VERSION 1
#define QL_XOVER_KEY_MAX 192

/* One cached crossover. */
typedef struct ql__xover_entry {
  char key[QL_XOVER_KEY_MAX]; /* printable ASCII, NUL-terminated */
  uint32_t rows; /* UINT32_MAX: never activation-quantized */
} ql__xover_entry;

/*
 * Parses the file's bytes: an object with exactly "version" (1) and
 * "crossover", an object of keys of printable ASCII shorter than
 * QL_XOVER_KEY_MAX and rows integers in [1, 2^32 - 1], no duplicate keys.
 * On success *out (n entries, NULL when n is 0) is the caller's to free();
 * 0, QL_EBADFILE (err says why) or QL_ENOMEM. Never logs.
 */
int ql__xover_parse(const char *buf, size_t len, ql__xover_entry **out,
                    size_t *n, char *err, size_t errlen);

#endif /* QL_XOVER_H */
