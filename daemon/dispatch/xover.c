/* xover.c - see xover.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ql_defs.h"
#include "dispatch/xover.h"

#define CACHE_VERSION QL_XOVER_VERSION

/* Reads array a of n integers in [lo, hi] into u32 or u64; 0 or -1. */
static int int_array(const json_t *a, size_t n, uint64_t lo, uint64_t hi,
                     uint32_t *u32, uint64_t *u64) {
  if (!json_is_array(a) || json_array_size(a) != n)
    return -1;
  for (size_t i = 0; i < n; i++) {
    const json_t *v = json_array_get(a, i);
    json_int_t x;
    if (!json_is_integer(v) || (x = json_integer_value(v)) < 0 ||
        (uint64_t)x < lo || (uint64_t)x > hi)
      return -1;
    if (u32 != NULL)
      u32[i] = (uint32_t)x;
    else
      u64[i] = (uint64_t)x;
  }
  return 0;
}

/* Fills e's rows and times from val (see xover.h); 0 or -1. */
static int entry_value(const json_t *val, int version, ql__xover_entry *e) {
  const json_t *rows = val, *m = NULL;
  json_int_t v;
  size_t n = 0;
  if (version >= 2 && json_is_object(val)) {
    rows = json_object_get(val, "rows");
    m = json_object_get(val, "m");
    if (json_object_size(val) != 4 || m == NULL || !json_is_array(m) ||
        (n = json_array_size(m)) > QL_XOVER_POINTS ||
        int_array(m, n, 1, QL_XOVER_MAX_M, e->m, NULL) != 0 ||
        int_array(json_object_get(val, "wo_ns"), n, 1, QL_XOVER_MAX_NS, NULL,
                  e->wo_ns) != 0 ||
        int_array(json_object_get(val, "aq_ns"), n, 0, QL_XOVER_MAX_NS, NULL,
                  e->aq_ns) != 0)
      return -1;
  }
  if (rows == NULL || !json_is_integer(rows) ||
      (v = json_integer_value(rows)) < 1 || (uint64_t)v > UINT32_MAX)
    return -1;
  e->rows = (uint32_t)v;
  e->n = (unsigned)n;
  return 0;
}

int ql__xover_parse(const char *buf, size_t len, ql__xover_entry **out,
                    size_t *n, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root, *ver, *obj, *val;
  const char *key;
  ql__xover_entry *e = NULL;
  size_t cnt = 0;
  int rc = QL_EBADFILE, version = 0;
  *out = NULL;
  *n = 0;
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL) {
    snprintf(err, errlen, "not JSON: %.80s", jerr.text);
    return QL_EBADFILE;
  }
  if (!json_is_object(root) || (ver = json_object_get(root, "version")) ==
                                   NULL ||
      !json_is_integer(ver) || json_integer_value(ver) < 1 ||
      json_integer_value(ver) > CACHE_VERSION ||
      (obj = json_object_get(root, "crossover")) == NULL ||
      !json_is_object(obj) || json_object_size(root) != 2) {
    snprintf(err, errlen, "expected {\"version\": 1..%d, \"crossover\": "
             "{...}}", CACHE_VERSION);
    goto done;
  }
  version = (int)json_integer_value(ver);
  if (json_object_size(obj) > 0 &&
      (e = calloc(json_object_size(obj), sizeof *e)) == NULL) {
    rc = QL_ENOMEM;
    goto done;
  }
  json_object_foreach(obj, key, val) {
    size_t kl = strlen(key);
    if (kl == 0 || kl >= sizeof e->key) {
      snprintf(err, errlen, "a key of %zu bytes", kl);
      goto done;
    }
    for (size_t i = 0; i < kl; i++)
      if (key[i] < 0x20 || key[i] > 0x7e) {
        snprintf(err, errlen, "a key with a non-printable byte");
        goto done;
      }
    if (entry_value(val, version, &e[cnt]) != 0) {
      snprintf(err, errlen, "\"%.60s\": not rows in [1, 2^32-1]%s", key,
               version >= 2 ? " or {rows, m, wo_ns, aq_ns} in bounds" : "");
      goto done;
    }
    memcpy(e[cnt].key, key, kl + 1);
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

/* The text of entries e[first .. n), or NULL when out of memory. */
static char *dump_from(const ql__xover_entry *e, size_t n, size_t first) {
  json_t *root = json_object(), *obj = json_object();
  char *text = NULL;
  if (root == NULL || obj == NULL)
    goto done;
  for (size_t i = first; i < n; i++) {
    json_t *v = json_object(), *m = json_array(), *wo = json_array(),
           *aq = json_array();
    if (v == NULL || m == NULL || wo == NULL || aq == NULL) {
      json_decref(v);
      json_decref(m);
      json_decref(wo);
      json_decref(aq);
      goto done;
    }
    for (unsigned j = 0; j < e[i].n; j++) {
      json_array_append_new(m, json_integer(e[i].m[j]));
      json_array_append_new(wo, json_integer((json_int_t)e[i].wo_ns[j]));
      json_array_append_new(aq, json_integer((json_int_t)e[i].aq_ns[j]));
    }
    json_object_set_new(v, "rows", json_integer(e[i].rows));
    json_object_set_new(v, "m", m);
    json_object_set_new(v, "wo_ns", wo);
    json_object_set_new(v, "aq_ns", aq);
    json_object_set_new(obj, e[i].key, v);
  }
  json_object_set_new(root, "version", json_integer(QL_XOVER_VERSION));
  json_object_set(root, "crossover", obj);
  text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
done:
  json_decref(obj);
  json_decref(root);
  return text;
}

int ql__xover_dump(const ql__xover_entry *e, size_t n, size_t max_bytes,
                   char **text, size_t *kept) {
  size_t first = 0;
  *text = NULL;
  *kept = 0;
  for (;;) {
    char *t = dump_from(e, n, first);
    if (t == NULL)
      return QL_ENOMEM;
    size_t len = strlen(t);
    if (len <= max_bytes || first == n) {
      *text = t;
      *kept = n - first;
      return 0;
    }
    free(t);
    /* Leave out the oldest share the excess asks for, at least one. */
    size_t drop = (size_t)((double)(n - first) *
                           (double)(len - max_bytes) / (double)len) + 1;
    first += drop < n - first ? drop : n - first;
  }
}
