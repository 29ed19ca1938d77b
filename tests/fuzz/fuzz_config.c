/*
 * fuzz_config.c - libFuzzer target for the config file parser
 * (daemon/conf.c), which reads a file an administrator may get wrong.
 *
 * Beyond "no crash, no out-of-bounds read", it checks what the daemon
 * relies on: a rejected file comes with a message naming the file and
 * leaves the config untouched; an accepted one holds only values the
 * table allows, --print-config writes it back to the same config, and a
 * reload onto the defaults applies exactly the live options.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conf.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

static char a[PATH_MAX + 64], b[PATH_MAX + 64];

/* Option o holds the same value in x and y. */
static int same(const ql__option *o, const ql__config *x,
                const ql__config *y) {
  ql__option_format(o, x, a, sizeof a);
  ql__option_format(o, y, b, sizeof b);
  return strcmp(a, b) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static ql__config defaults, cfg, copy, back, out;
  char err[512], report[1024];
  size_t n;
  const ql__option *t = ql__config_options(&n);

  ql__config_init_defaults(&defaults);
  memcpy(&cfg, &defaults, sizeof cfg);
  int rc = ql__config_parse_buffer("f.conf", (const char *)data, size, &cfg,
                                   err, sizeof err);
  if (rc != 0) {
    CHECK(rc == QL_EINVAL);
    CHECK(strncmp(err, "f.conf", 6) == 0);
    CHECK(memchr(err, '\0', sizeof err) != NULL);
    CHECK(memcmp(&cfg, &defaults, sizeof cfg) == 0);
    return 0;
  }
  CHECK(err[0] == '\0');

  /* Every value is one its option accepts: formatting and parsing it
   * again gives it back. */
  for (size_t i = 0; i < n; i++) {
    char why[256];
    ql__option_format(&t[i], &cfg, a, sizeof a);
    memcpy(&copy, &defaults, sizeof copy);
    CHECK(ql__option_parse(&t[i], a, &copy, why, sizeof why) == 0);
    CHECK(same(&t[i], &cfg, &copy));
  }

  /* --print-config round trip. */
  char *dump = NULL;
  size_t dump_len = 0;
  FILE *f = open_memstream(&dump, &dump_len);
  CHECK(f != NULL);
  ql__config_dump(&cfg, f);
  CHECK(fclose(f) == 0);
  memset(&back, 0, sizeof back);
  CHECK(ql__config_parse_buffer("dump", dump, dump_len, &back, err,
                                sizeof err) == 0);
  free(dump);
  for (size_t i = 0; i < n; i++)
    CHECK(same(&t[i], &cfg, &back));

  /* A reload from the defaults takes the live options only. */
  int applied = ql__config_reload(&defaults, &cfg, &out, report,
                                  sizeof report);
  int live_changed = 0;
  CHECK(memchr(report, '\0', sizeof report) != NULL);
  for (size_t i = 0; i < n; i++) {
    int live = (t[i].flags & QL_OPT_LIVE) != 0;
    live_changed += live && !same(&t[i], &defaults, &cfg);
    CHECK(same(&t[i], &out, live ? &cfg : &defaults));
  }
  CHECK(applied == live_changed);
  return 0;
}
