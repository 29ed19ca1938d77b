/*
 * fuzz_xover.c - libFuzzer target for the crossover cache file parser
 * (daemon/dispatch/xover.c), which reads a file of the state directory at start.
 *
 * Beyond "no crash, no out-of-bounds read": an accepted file yields only
 * keys of printable ASCII that fit the key buffer, distinct, with rows of
 * at least 1 and times within their bounds; a rejected one comes with a message and no entries.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ql_defs.h"
#include "dispatch/xover.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ql__xover_entry *e = (ql__xover_entry *)1;
  size_t n = 99;
  char err[160] = "";
  int rc = ql__xover_parse((const char *)data, size, &e, &n, err, sizeof err);
  if (rc != 0) {
    CHECK(rc == QL_EBADFILE || rc == QL_ENOMEM);
    CHECK(e == NULL && n == 0);
    CHECK(rc == QL_ENOMEM || err[0] != '\0');
    return 0;
  }
  CHECK(n == 0 || e != NULL);
  for (size_t i = 0; i < n; i++) {
    size_t kl = strnlen(e[i].key, sizeof e[i].key);
    CHECK(kl > 0 && kl < sizeof e[i].key);
    for (size_t j = 0; j < kl; j++)
      CHECK(e[i].key[j] >= 0x20 && e[i].key[j] <= 0x7e);
    CHECK(e[i].rows >= 1);
    CHECK(e[i].n <= QL_XOVER_POINTS);
    for (unsigned j = 0; j < e[i].n; j++)
      CHECK(e[i].m[j] >= 1 && e[i].m[j] <= QL_XOVER_MAX_M &&
            e[i].wo_ns[j] >= 1 && e[i].wo_ns[j] <= QL_XOVER_MAX_NS &&
            e[i].aq_ns[j] <= QL_XOVER_MAX_NS);
    for (size_t j = 0; j < i; j++)
      CHECK(strcmp(e[i].key, e[j].key) != 0);
  }
  free(e);
  return 0;
}
