/* xover.c - see xover.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ql_defs.h"
#include "xover.h"

#define CACHE_VERSION QL_XOVER_VERSION

int ql__xover_parse(const char *buf, size_t len, ql__xover_entry **out,
                    size_t *n, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root, *ver, *obj, *val;
  const char *key;
  ql__xover_entry *e = NULL;
  size_t cnt = 0;
  int rc = QL_EBADFILE;
  *out = NULL;
  *n = 0;
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL) {
    snprintf(err, errlen, "not JSON: %.80s", jerr.text);
    return QL_EBADFILE;
  }
  if (!json_is_object(root) || (ver = json_object_get(root, "version")) ==
                                   NULL ||
      !json_is_integer(ver) || json_integer_value(ver) != CACHE_VERSION ||
      (obj = json_object_get(root, "crossover")) == NULL ||
      !json_is_object(obj) || json_object_size(root) != 2) {
    snprintf(err, errlen, "expected {\"version\": %d, \"crossover\": {...}}",
             CACHE_VERSION);
    goto done;
  }
  if (json_object_size(obj) > 0 &&
      (e = calloc(json_object_size(obj), sizeof *e)) == NULL) {
    rc = QL_ENOMEM;
    goto done;
  }
  json_object_foreach(obj, key, val) {
    size_t kl = strlen(key);
    json_int_t v;
    if (kl == 0 || kl >= sizeof e->key) {
      snprintf(err, errlen, "a key of %zu bytes", kl);
      goto done;
    }
    for (size_t i = 0; i < kl; i++)
      if (key[i] < 0x20 || key[i] > 0x7e) {
        snprintf(err, errlen, "a key with a non-printable byte");
        goto done;
      }
    if (!json_is_integer(val) || (v = json_integer_value(val)) < 1 ||
        (uint64_t)v > UINT32_MAX) {
      snprintf(err, errlen, "\"%.60s\": not an integer in [1, 2^32-1]", key);
      goto done;
    }
    memcpy(e[cnt].key, key, kl + 1);
    e[cnt].rows = (uint32_t)v;
    cnt++;
  }
  *out = e;
  *n = cnt;
  e = NULL;
  rc = 0;
done:
  free(e);
  json_decref(root);
  return rc;
}

