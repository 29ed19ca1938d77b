/*
 * test_store.c - the persistent weight store (daemon/state/store.c): round trips
 * of every format through a real state directory, the atomic write and
 * what a crash leaves behind, every kind of corrupt file (moved aside with
 * a log line while the others still load), removal, names with '/', the
 * callback's ownership rule and the directory lock.
 *
 * Each test runs in its own process (check's fork mode) in its own fresh
 * directory under $TMPDIR (or /tmp), removed at the end. Corrupt files are
 * made from a valid one: its header is parsed with jansson, changed, and
 * written back, so every case differs from a good file in one thing only.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "state/store.h"
#include "testutil.h"
#include "state/weights.h"

/* ------------------------------------------------------------- helpers */

static char dir[4096];

static void make_dir(void) {
  const char *t = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ql-store-XXXXXX",
           t != NULL && t[0] != '\0' ? t : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static int rm_one(const char *p, const struct stat *st, int flag,
                  struct FTW *f) {
  (void)st;
  (void)flag;
  (void)f;
  return remove(p);
}

static void rm_dir(void) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* A weight quantized from Gaussian data. */
static ql_qweight *make_q(ql_format f, uint32_t gs, int asym, ql_dtype sdt,
                          int64_t n, int64_t k, int bias, uint64_t seed) {
  float *w = tu_xmalloc((size_t)(n * k) * sizeof *w);
  float *b = tu_xmalloc((size_t)n * sizeof *b);
  uint64_t st = seed;
  for (int64_t i = 0; i < n * k; i++)
    w[i] = (float)tu_rng_gauss(&st);
  for (int64_t i = 0; i < n; i++)
    b[i] = (float)tu_rng_gauss(&st);
  ql_quant_params p = {f, gs, asym, sdt};
  ql_qweight *q = NULL;
  ck_assert_int_eq(
      ql_qweight_quantize(&p, n, k, QL_DTYPE_F32, w, bias ? b : NULL, &q), 0);
  free(w);
  free(b);
  return q;
}

static ql_qweight *small_q(uint64_t seed) {
  return make_q(QL_FORMAT_Q4G, 32, 0, QL_DTYPE_BF16, 4, 40, 1, seed);
}

static void digest_of(const ql_qweight *q, uint8_t d[QL_DIGEST_BYTES]) {
  ck_assert_int_eq(ql__qweight_digest(q, d), 0);
}

static void same_q(const ql_qweight *a, const ql_qweight *b) {
  ck_assert_int_eq(a->format, b->format);
  ck_assert_uint_eq(a->group_size, b->group_size);
  ck_assert_int_eq(a->n, b->n);
  ck_assert_int_eq(a->k, b->k);
  ck_assert_int_eq(a->groups, b->groups);
  ck_assert_int_eq(a->asymmetric, b->asymmetric);
  ck_assert_int_eq(a->scale_dtype, b->scale_dtype);
  ck_assert_uint_eq(a->qdata_bytes, b->qdata_bytes);
  ck_assert_uint_eq(a->scale_bytes, b->scale_bytes);
  ck_assert(memcmp(a->qdata, b->qdata, a->qdata_bytes) == 0);
  ck_assert(memcmp(a->scale, b->scale, a->scale_bytes) == 0);
  ck_assert_int_eq(a->zero != NULL, b->zero != NULL);
  if (a->zero != NULL)
    ck_assert(memcmp(a->zero, b->zero, a->scale_bytes) == 0);
  ck_assert_int_eq(a->bias != NULL, b->bias != NULL);
  if (a->bias != NULL)
    ck_assert(memcmp(a->bias, b->bias, (size_t)a->n * sizeof(float)) == 0);
}

/* What a load_all handed over. */
#define MAX_LOADED 64
typedef struct loaded {
  int n;
  char name[MAX_LOADED][256];
  ql_qweight *q[MAX_LOADED];
  ql_path policy[MAX_LOADED];
  uint8_t digest[MAX_LOADED][QL_DIGEST_BYTES];
  char devices[MAX_LOADED][QL_STORE_DEVICES_MAX];
  int refuse; /* the callback returns this instead of 0 */
  int refuse_once; /* ... this, the first time only */
} loaded;

static int collect(void *arg, const char *name, ql_qweight *q, ql_path policy,
                   const uint8_t digest[QL_DIGEST_BYTES],
                   const char *devices) {
  loaded *l = arg;
  if (l->refuse != 0)
    return l->refuse;
  if (l->refuse_once != 0) {
    int rc = l->refuse_once;
    l->refuse_once = 0;
    return rc;
  }
  ck_assert_int_lt(l->n, MAX_LOADED);
  snprintf(l->name[l->n], sizeof l->name[l->n], "%s", name);
  l->q[l->n] = q;
  l->policy[l->n] = policy;
  memcpy(l->digest[l->n], digest, QL_DIGEST_BYTES);
  snprintf(l->devices[l->n], sizeof l->devices[l->n], "%s", devices);
  l->n++;
  return 0;
}

static int find_loaded(const loaded *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->name[i], name) == 0)
      return i;
  return -1;
}

static void free_loaded(loaded *l) {
  for (int i = 0; i < l->n; i++)
    ql_qweight_free(l->q[i]);
  l->n = 0;
}

static ql__store *open_store(void) {
  ql__store *s = NULL;
  char err[256];
  int rc = ql__store_open(dir, &s, err, sizeof err);
  ck_assert_msg(rc == 0, "open: %s", err);
  return s;
}

static void put(ql__store *s, const char *name, const ql_qweight *q,
                ql_path policy) {
  uint8_t d[QL_DIGEST_BYTES];
  char err[256];
  digest_of(q, d);
  int rc = ql__store_put(s, name, q, d, policy, NULL, err, sizeof err);
  ck_assert_msg(rc == 0, "put %s: %d %s", name, rc, err);
}

/* Reopens the store (a restart) and loads everything into l. */
static int reload(loaded *l) {
  ql__store *s = open_store();
  memset(l, 0, sizeof *l);
  int n = ql__store_load_all(s, collect, l);
  ql__store_close(s);
  return n;
}

/* Entries of the directory whose name contains sub. */
static int count_files(const char *sub) {
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c -- '%s'", dir, sub);
  FILE *p = popen(cmd, "r");
  int n = -1;
  ck_assert_ptr_nonnull(p);
  ck_assert_int_eq(fscanf(p, "%d", &n), 1);
  pclose(p);
  return n;
}

static void write_file(const char *name, const void *buf, size_t len) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0640);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
  close(fd);
}

/* The bytes ql__store_put writes for (name, q), built in memory. */
static uint8_t *encode(const char *name, const ql_qweight *q, ql_path policy,
                       size_t *len) {
  uint8_t d[QL_DIGEST_BYTES], *hdr, *buf;
  size_t hl, at;
  digest_of(q, d);
  ck_assert_int_eq(ql__store_header(name, q, d, policy, NULL, &hdr, &hl), 0);
  *len = hl + (q->bias ? (size_t)q->n * 4 : 0) + q->scale_bytes * 2 +
         q->qdata_bytes;
  buf = tu_xmalloc(*len);
  memcpy(buf, hdr, hl);
  at = hl;
  if (q->bias) {
    memcpy(buf + at, q->bias, (size_t)q->n * 4);
    at += (size_t)q->n * 4;
  }
  memcpy(buf + at, q->scale, q->scale_bytes);
  at += q->scale_bytes;
  if (q->zero) {
    memcpy(buf + at, q->zero, q->scale_bytes);
    at += q->scale_bytes;
  }
  memcpy(buf + at, q->qdata, q->qdata_bytes);
  at += q->qdata_bytes;
  *len = at;
  free(hdr);
  return buf;
}

static void file_name_of(const char *name, const ql_qweight *q,
                         char out[QL_STORE_FILE_NAME_MAX]) {
  uint8_t d[QL_DIGEST_BYTES];
  digest_of(q, d);
  ck_assert_int_eq(ql__store_file_name(name, d, out), 0);
}

/* stderr into a file, to check the log lines. */
static int saved_stderr = -1;
static char log_path[4400];

static void log_begin(void) {
  snprintf(log_path, sizeof log_path, "%s.log", dir);
  fflush(stderr);
  saved_stderr = dup(2);
  int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  dup2(fd, 2);
  close(fd);
}

/* Returns what was logged since log_begin (the caller frees it). */
static char *log_end(void) {
  fflush(stderr);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  FILE *f = fopen(log_path, "r");
  ck_assert_ptr_nonnull(f);
  char *buf = calloc(1, 1 << 16);
  size_t n = fread(buf, 1, (1 << 16) - 1, f);
  buf[n] = '\0';
  fclose(f);
  unlink(log_path);
  return buf;
}

/* ------------------------------------------------------------ round trips */

typedef struct fmt_case {
  ql_format f;
  uint32_t gs;
  int asym;
  int64_t n, k;
} fmt_case;

static const fmt_case fmt_cases[] = {
    {QL_FORMAT_Q4G, 32, 0, 5, 67},  /* odd K, short last group */
    {QL_FORMAT_Q4G, 128, 0, 3, 256},
    {QL_FORMAT_Q8C, 0, 0, 6, 33},
    {QL_FORMAT_Q8B, 32, 0, 4, 80},
    {QL_FORMAT_Q8B, 64, 1, 4, 100},
    {QL_FORMAT_F8R, 0, 0, 7, 19},
};
static const ql_dtype sdts[] = {QL_DTYPE_F32, QL_DTYPE_F16, QL_DTYPE_BF16};

START_TEST(test_roundtrip_every_format) {
  ql_qweight *qs[64];
  char names[64][64];
  int count = 0;
  make_dir();
  ql__store *s = open_store();
  for (size_t c = 0; c < sizeof fmt_cases / sizeof fmt_cases[0]; c++)
    for (int d = 0; d < 3; d++)
      for (int bias = 0; bias < 2; bias++) {
        const fmt_case *fc = &fmt_cases[c];
        ql_qweight *q = make_q(fc->f, fc->gs, fc->asym, sdts[d], fc->n, fc->k,
                               bias, (uint64_t)count + 1);
        snprintf(names[count], sizeof names[count], "w.%zu/%s/%d", c,
                 tu_dtype_name(sdts[d]), bias);
        put(s, names[count], q, (ql_path)(count % 3));
        qs[count++] = q;
      }
  ql__store_close(s);
  ck_assert_int_eq(count_files(".safetensors"), count);
  ck_assert_int_eq(count_files(".tmp-"), 0);

  loaded l;
  ck_assert_int_eq(reload(&l), count);
  ck_assert_int_eq(l.n, count);
  for (int i = 0; i < count; i++) {
    int j = find_loaded(&l, names[i]);
    uint8_t d[QL_DIGEST_BYTES];
    ck_assert_msg(j >= 0, "%s not loaded", names[i]);
    same_q(qs[i], l.q[j]);
    digest_of(qs[i], d);
    ck_assert(memcmp(d, l.digest[j], QL_DIGEST_BYTES) == 0);
    ck_assert_int_eq(l.policy[j], (ql_path)(i % 3));

    /* The file: mode 0640, data aligned, exactly what the encoder makes. */
    char f[QL_STORE_FILE_NAME_MAX], path[4400];
    struct stat st;
    size_t len;
    file_name_of(names[i], qs[i], f);
    snprintf(path, sizeof path, "%s/%s", dir, f);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0640);
    uint8_t *want = encode(names[i], qs[i], (ql_path)(i % 3), &len);
    ck_assert_uint_eq((size_t)st.st_size, len);
    uint64_t hl = 0;
    for (int b = 0; b < 8; b++)
      hl |= (uint64_t)want[b] << (8 * b);
    ck_assert_uint_eq((8 + hl) % QL_STORE_ALIGN, 0);
    FILE *fp = fopen(path, "rb");
    uint8_t *got = tu_xmalloc(len);
    ck_assert_uint_eq(fread(got, 1, len, fp), len);
    fclose(fp);
    ck_assert(memcmp(got, want, len) == 0);
    free(got);
    free(want);
    ql_qweight_free(qs[i]);
  }
  free_loaded(&l);
  rm_dir();
}
END_TEST

START_TEST(test_header_is_safetensors) {
  ql_qweight *q = make_q(QL_FORMAT_Q8B, 32, 1, QL_DTYPE_F16, 3, 64, 1, 9);
  size_t len;
  uint8_t *buf = encode("a/b", q, QL_PATH_WEIGHT_ONLY, &len);
  uint64_t hl = 0;
  for (int b = 0; b < 8; b++)
    hl |= (uint64_t)buf[b] << (8 * b);
  json_error_t je;
  json_t *root = json_loadb((const char *)buf + 8, hl, 0, &je);
  ck_assert_ptr_nonnull(root);
  json_t *m = json_object_get(root, "__metadata__");
  ck_assert_str_eq(json_string_value(json_object_get(m, "format")), "q8b");
  ck_assert_str_eq(json_string_value(json_object_get(m, "group_size")), "32");
  ck_assert_str_eq(json_string_value(json_object_get(m, "n")), "3");
  ck_assert_str_eq(json_string_value(json_object_get(m, "k")), "64");
  ck_assert_str_eq(json_string_value(json_object_get(m, "asymmetric")), "1");
  ck_assert_str_eq(json_string_value(json_object_get(m, "scale_dtype")), "f16");
  ck_assert_str_eq(json_string_value(json_object_get(m, "name")), "a/b");
  ck_assert_str_eq(json_string_value(json_object_get(m, "policy")),
                   "weight_only");
  ck_assert_str_eq(
      json_string_value(json_object_get(m, "qlinear_store_version")), "1");
  ck_assert_uint_eq(
      strlen(json_string_value(json_object_get(m, "digest"))), 64);
  json_t *t = json_object_get(root, "qdata");
  ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "I8");
  ck_assert_int_eq(json_integer_value(
                       json_array_get(json_object_get(t, "shape"), 1)), 64);
  t = json_object_get(root, "zero");
  ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F16");
  t = json_object_get(root, "bias");
  ck_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32");
  ck_assert_int_eq(json_integer_value(
                       json_array_get(json_object_get(t, "data_offsets"), 0)),
                   0);
  json_decref(root);
  free(buf);
  ql_qweight_free(q);
}
END_TEST

START_TEST(test_names_with_slashes) {
  static const char *names[] = {
      "model/layers.0/self_attn/q_proj", "a/b/c/d/e/f/g", "x", "-._",
      "model/layers.0/self_attn/q_proj.weight"};
  ql_qweight *q = small_q(3);
  make_dir();
  ql__store *s = open_store();
  for (int i = 0; i < 5; i++)
    put(s, names[i], q, QL_PATH_AUTO);
  ql__store_close(s);
  /* Nothing but the five files (ls -a: and . and ..): no subdirectory
   * was made from a name. */
  ck_assert_int_eq(count_files(".safetensors"), 5);
  ck_assert_int_eq(count_files(""), 7);
  loaded l;
  ck_assert_int_eq(reload(&l), 5);
  for (int i = 0; i < 5; i++) {
    int j = find_loaded(&l, names[i]);
    ck_assert_int_ge(j, 0);
    same_q(q, l.q[j]);
  }
  free_loaded(&l);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

/* Two names with the same content get a file each; removing one name
 * leaves the other alone. */
START_TEST(test_same_content_two_names) {
  ql_qweight *q = small_q(4);
  make_dir();
  ql__store *s = open_store();
  put(s, "first", q, QL_PATH_AUTO);
  put(s, "second", q, QL_PATH_AUTO);
  ck_assert_int_eq(count_files(".safetensors"), 2);
  ck_assert_int_eq(ql__store_remove(s, "first"), 0);
  ql__store_close(s);
  loaded l;
  ck_assert_int_eq(reload(&l), 1);
  ck_assert_str_eq(l.name[0], "second");
  same_q(q, l.q[0]);
  free_loaded(&l);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

/* A placement the load named comes back at the next start; a weight put
 * without one comes back with none; a malformed one is refused. */
START_TEST(test_devices_kept) {
  ql_qweight *q = small_q(7);
  uint8_t d[QL_DIGEST_BYTES];
  char err[256];
  make_dir();
  digest_of(q, d);
  ql__store *s = open_store();
  ck_assert_int_eq(ql__store_put(s, "placed", q, d, QL_PATH_AUTO,
                                 "cuda:GPU-00000000-1111-2222-3333-"
                                 "444444444444,cpu", err, sizeof err),
                   0);
  put(s, "default", q, QL_PATH_AUTO);
  static const char *const bad[] = {"cuda 0", ",cpu", "cpu,", "cpu,,cuda:0",
                                    "cpu;cuda:0", "\"cpu\""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_int_eq(ql__store_put(s, "bad", q, d, QL_PATH_AUTO, bad[i], err,
                                   sizeof err),
                     QL_EINVAL);
  ql__store_close(s);
  loaded l;
  ck_assert_int_eq(reload(&l), 2);
  int p = find_loaded(&l, "placed"), n = find_loaded(&l, "default");
  ck_assert_int_ge(p, 0);
  ck_assert_int_ge(n, 0);
  ck_assert_str_eq(l.devices[p],
                   "cuda:GPU-00000000-1111-2222-3333-444444444444,cpu");
  ck_assert_str_eq(l.devices[n], "");
  free_loaded(&l);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

START_TEST(test_put_conflict_and_rewrite) {
  ql_qweight *a = small_q(5), *b = small_q(6);
  uint8_t db[QL_DIGEST_BYTES];
  char err[256];
  make_dir();
  ql__store *s = open_store();
  put(s, "w", a, QL_PATH_AUTO);
  /* The same content again: rewritten, still one file. */
  put(s, "w", a, QL_PATH_AUTO);
  ck_assert_int_eq(count_files(".safetensors"), 1);
  /* Other content under the same name: never a silent swap. */
  digest_of(b, db);
  ck_assert_int_eq(ql__store_put(s, "w", b, db, QL_PATH_AUTO, NULL, err, sizeof err),
                   QL_EEXIST);
  ck_assert_ptr_nonnull(strstr(err, "remove it first"));
  ck_assert_int_eq(count_files(".safetensors"), 1);
  ck_assert_int_eq(count_files(".tmp-"), 0);
  /* After a remove it goes in. */
  ck_assert_int_eq(ql__store_remove(s, "w"), 0);
  put(s, "w", b, QL_PATH_ACT_QUANT);
  ql__store_close(s);
  loaded l;
  ck_assert_int_eq(reload(&l), 1);
  same_q(b, l.q[0]);
  ck_assert_int_eq(l.policy[0], QL_PATH_ACT_QUANT);
  free_loaded(&l);
  ql_qweight_free(a);
  ql_qweight_free(b);
  rm_dir();
}
END_TEST

START_TEST(test_put_refuses_bad_arguments) {
  ql_qweight *q = small_q(7);
  uint8_t d[QL_DIGEST_BYTES];
  char err[256];
  make_dir();
  ql__store *s = open_store();
  digest_of(q, d);
  static const char *bad[] = {"", "/abs", "a/../b", "a..b", "sp ace",
                              "semi;colon"};
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(
        ql__store_put(s, bad[i], q, d, QL_PATH_AUTO, NULL, err, sizeof err),
        QL_ENAME);
  char longname[300];
  memset(longname, 'a', 256);
  longname[256] = '\0';
  ck_assert_int_eq(
      ql__store_put(s, longname, q, d, QL_PATH_AUTO, NULL, err, sizeof err),
      QL_ENAME);
  longname[255] = '\0';
  ck_assert_int_eq(
      ql__store_put(s, longname, q, d, QL_PATH_AUTO, NULL, err, sizeof err), 0);
  ck_assert_int_eq(ql__store_put(s, "p", q, d, (ql_path)7, NULL, err, sizeof err),
                   QL_EINVAL);
  d[3] ^= 1; /* a digest that is not the weight's */
  ck_assert_int_eq(ql__store_put(s, "d", q, d, QL_PATH_AUTO, NULL, err, sizeof err),
                   QL_EINVAL);
  d[3] ^= 1;
  size_t keep = q->scale_bytes; /* not a canonical weight */
  q->scale_bytes = 3;
  ck_assert_int_eq(ql__store_put(s, "c", q, d, QL_PATH_AUTO, NULL, err, sizeof err),
                   QL_EINVAL);
  q->scale_bytes = keep;
  ck_assert_int_eq(count_files(".safetensors"), 1);
  ck_assert_int_eq(count_files(".tmp-"), 0);
  ql__store_close(s);
  loaded l;
  ck_assert_int_eq(reload(&l), 1);
  ck_assert_str_eq(l.name[0], longname);
  free_loaded(&l);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

START_TEST(test_remove) {
  ql_qweight *q = small_q(8);
  make_dir();
  ql__store *s = open_store();
  put(s, "a/x", q, QL_PATH_AUTO);
  put(s, "a/y", q, QL_PATH_AUTO);
  ck_assert_int_eq(ql__store_remove(s, "a/x"), 0);
  ck_assert_int_eq(ql__store_remove(s, "a/x"), QL_ENOTFOUND);
  ck_assert_int_eq(ql__store_remove(s, "nothing"), QL_ENOTFOUND);
  ck_assert_int_eq(ql__store_remove(s, "../etc"), QL_ENAME);
  ck_assert_int_eq(count_files(".safetensors"), 1);
  ck_assert_int_eq(ql__store_remove(s, "a/y"), 0);
  ck_assert_int_eq(count_files(".safetensors"), 0);
  ql__store_close(s);
  loaded l;
  ck_assert_int_eq(reload(&l), 0);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

/* The layout cache: an image round-trips through put and map (page-aligned
 * data), outlives an unlink while mapped, goes with the last file of its
 * digest, is removed when its header or its bytes are wrong and at start
 * when it is an orphan; layout ids that are not file-name safe are
 * refused. */
START_TEST(test_layout_cache) {
  ql_qweight *q = small_q(12);
  uint8_t d[QL_DIGEST_BYTES], img[3000];
  const void *data;
  size_t len;
  void *map;
  char path[4400], hex[65];
  for (size_t i = 0; i < sizeof img; i++)
    img[i] = (uint8_t)(i * 7 + 1);
  digest_of(q, d);
  for (int i = 0; i < QL_DIGEST_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", d[i]);
  make_dir();
  ql__store *s = open_store();
  ck_assert_int_eq(ql__store_layout_map(s, d, "cpu-1", &data, &len, &map),
                   QL_ENOTFOUND);
  ck_assert_int_eq(ql__store_layout_put(s, d, "../x", img, sizeof img),
                   QL_EINVAL);
  ck_assert_int_eq(ql__store_layout_put(s, d, "", img, sizeof img),
                   QL_EINVAL);
  put(s, "w/a", q, QL_PATH_AUTO);
  put(s, "w/b", q, QL_PATH_AUTO);
  ck_assert_int_eq(ql__store_layout_put(s, d, "cpu-1", img, sizeof img), 0);
  ck_assert_int_eq(ql__store_layout_map(s, d, "cpu-1", &data, &len, &map), 0);
  ck_assert_uint_eq(len, sizeof img);
  ck_assert_uint_eq((uintptr_t)data % 4096, 0);
  ck_assert_mem_eq(data, img, sizeof img);
  ql__store_layout_unmap(map);
  ck_assert_int_eq(ql__store_layout_map(s, d, "cpu-2", &data, &len, &map),
                   QL_ENOTFOUND);
  ck_assert_ptr_null(map);
  ck_assert_int_eq(ql__store_layout_map(s, d, "cpu-1", &data, &len, &map), 0);
  /* Another name with the same content keeps the layout; the last one
   * takes it along, and a mapping stays readable after that. */
  ck_assert_int_eq(ql__store_remove(s, "w/a"), 0);
  ck_assert_int_eq(count_files(".layout"), 1);
  ck_assert_int_eq(ql__store_remove(s, "w/b"), 0);
  ck_assert_int_eq(count_files(".layout"), 0);
  ck_assert_mem_eq(data, img, sizeof img);
  ql__store_layout_unmap(map);
  ql__store_layout_unmap(NULL);

  /* A header that disagrees with the file's size: removed, reported as
   * absent. */
  put(s, "w/a", q, QL_PATH_AUTO);
  ck_assert_int_eq(ql__store_layout_put(s, d, "cpu-1", img, sizeof img), 0);
  snprintf(path, sizeof path, "%s/%s.cpu-1.layout", dir, hex);
  ck_assert_int_eq(truncate(path, 4096 + 100), 0);
  ck_assert_int_eq(ql__store_layout_map(s, d, "cpu-1", &data, &len, &map),
                   QL_ENOTFOUND);
  ck_assert_int_eq(count_files(".layout"), 0);
  /* One byte of the image changed, the header and size right: its SHA-256
   * disagrees, so it is removed and reported as absent too. */
  ck_assert_int_eq(ql__store_layout_put(s, d, "cpu-1", img, sizeof img), 0);
  {
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 4096 + 1234, SEEK_SET), 0);
    ck_assert_int_eq(fputc(0x5A, f), 0x5A);
    ck_assert_int_eq(fclose(f), 0);
  }
  ck_assert_int_eq(ql__store_layout_map(s, d, "cpu-1", &data, &len, &map),
                   QL_ENOTFOUND);
  ck_assert_ptr_null(map);
  ck_assert_int_eq(count_files(".layout"), 0);
  /* An orphan (its weight file gone behind the store's back) is removed
   * at start; a layout with its weight stays. */
  ck_assert_int_eq(ql__store_layout_put(s, d, "cpu-1", img, sizeof img), 0);
  uint8_t other[QL_DIGEST_BYTES];
  memset(other, 0xab, sizeof other);
  ck_assert_int_eq(ql__store_layout_put(s, other, "cpu-1", img, sizeof img),
                   0);
  ck_assert_int_eq(count_files(".layout"), 2);
  ql__store_close(s);
  loaded l;
  ck_assert_int_eq(reload(&l), 1);
  free_loaded(&l);
  ck_assert_int_eq(count_files(".layout"), 1);
  ck_assert_int_eq(count_files(hex), 2);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

/* ------------------------------------------------- crashes and corruption */

/* A crash mid-put leaves a temp file (removed at open, never loaded); a
 * crash of a writer that did not rename atomically leaves a truncated final
 * file (moved aside). The other weights load. */
START_TEST(test_crash_leftovers) {
  ql_qweight *a = small_q(10), *b = small_q(11);
  char fb[QL_STORE_FILE_NAME_MAX], tmp[QL_STORE_FILE_NAME_MAX + 32];
  size_t len;
  make_dir();
  ql__store *s = open_store();
  put(s, "good", a, QL_PATH_AUTO);
  ql__store_close(s);
  uint8_t *buf = encode("torn", b, QL_PATH_AUTO, &len);
  file_name_of("torn", b, fb);
  snprintf(tmp, sizeof tmp, "%s.tmp-999.0", fb);
  write_file(tmp, buf, len / 2);  /* interrupted put */
  write_file(fb, buf, len - 1);   /* torn final file */
  ck_assert_int_eq(count_files(".tmp-"), 1);

  log_begin();
  loaded l;
  int n = reload(&l);
  char *log = log_end();
  ck_assert_int_eq(n, 1);
  ck_assert_str_eq(l.name[0], "good");
  ck_assert_int_eq(count_files(".tmp-"), 0);
  ck_assert_int_eq(count_files(".corrupt-"), 1);
  ck_assert_ptr_nonnull(strstr(log, "interrupted write"));
  ck_assert_ptr_nonnull(strstr(log, "moved aside"));
  ck_assert_ptr_nonnull(strstr(log, "truncated"));
  /* Restarting again loads the same and moves nothing more. */
  free_loaded(&l);
  ck_assert_int_eq(reload(&l), 1);
  ck_assert_int_eq(count_files(".corrupt-"), 1);
  free_loaded(&l);
  free(log);
  free(buf);
  ql_qweight_free(a);
  ql_qweight_free(b);
  rm_dir();
}
END_TEST

START_TEST(test_truncated_at_every_length) {
  ql_qweight *q = make_q(QL_FORMAT_Q8B, 32, 1, QL_DTYPE_BF16, 3, 40, 1, 12);
  ql__stored_weight w;
  char err[256];
  size_t len;
  uint8_t *buf = encode("t", q, QL_PATH_AUTO, &len);
  /* The whole file parses; every strict prefix is refused, and so is the
   * file with a byte appended. */
  ck_assert_int_eq(ql__store_parse(buf, len, &w, err, sizeof err), 0);
  ql_qweight_free(w.q);
  for (size_t cut = 0; cut < len; cut++) {
    uint8_t *p = tu_xmalloc(cut + 1); /* exact size: ASan sees overreads */
    memcpy(p, buf, cut);
    int rc = ql__store_parse(p, cut, &w, err, sizeof err);
    REQUIRE(rc == QL_EBADFILE, "cut %zu: %d", cut, rc);
    REQUIRE(w.q == NULL && err[0] != '\0', "cut %zu", cut);
    free(p);
  }
  uint8_t *longer = tu_xmalloc(len + 1);
  memcpy(longer, buf, len);
  longer[len] = 0;
  ck_assert_int_eq(ql__store_parse(longer, len + 1, &w, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "after the last tensor"));
  free(longer);

  /* And through load_all, at a spread of lengths, beside a good file. */
  char f[QL_STORE_FILE_NAME_MAX];
  file_name_of("t", q, f);
  make_dir();
  ql__store *s = open_store();
  put(s, "good", q, QL_PATH_AUTO);
  ql__store_close(s);
  for (size_t cut = 0; cut < len; cut += 1 + len / 13) {
    write_file(f, buf, cut);
    log_begin();
    loaded l;
    int n = reload(&l);
    char *log = log_end();
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(l.name[0], "good");
    ck_assert_int_eq(count_files(".corrupt-"), 1);
    ck_assert_ptr_nonnull(strstr(log, "moved aside"));
    free(log);
    free_loaded(&l);
    char cmd[4500];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*.corrupt-*", dir);
    ck_assert_int_eq(system(cmd), 0);
  }
  free(buf);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

/* A corrupt variant of a good file: the header is edited as JSON, or the
 * bytes are edited directly. */
typedef struct variant {
  const char *what;    /* the case, for messages */
  const char *expect;  /* a substring of the parse error */
  void (*edit)(json_t *root, uint8_t **buf, size_t *len);
} variant;

static json_t *tensor(json_t *root, const char *name) {
  return json_object_get(root, name);
}

static void set_offsets(json_t *root, const char *name, json_int_t b,
                        json_int_t e) {
  json_t *off = json_object_get(tensor(root, name), "data_offsets");
  json_array_set_new(off, 0, json_integer(b));
  json_array_set_new(off, 1, json_integer(e));
}

static json_int_t offset(json_t *root, const char *name, int i) {
  return json_integer_value(
      json_array_get(json_object_get(tensor(root, name), "data_offsets"),
                     (size_t)i));
}

static void e_overlap(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  /* scale starts 4 bytes early, overlapping bias */
  set_offsets(r, "scale", offset(r, "scale", 0) - 4, offset(r, "scale", 1) - 4);
}
static void e_outside(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  set_offsets(r, "qdata", offset(r, "qdata", 0),
              offset(r, "qdata", 1) + 1000);
}
static void e_huge_offset(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  set_offsets(r, "qdata", offset(r, "qdata", 0), (json_int_t)1 << 62);
}
static void e_reversed(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  set_offsets(r, "qdata", offset(r, "qdata", 1), offset(r, "qdata", 0));
}
static void e_negative(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  set_offsets(r, "bias", -4, offset(r, "bias", 1));
}
static void e_gap(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  /* zero shrinks by its first 2 bytes: a gap, and a size mismatch */
  json_t *z = tensor(r, "zero");
  json_object_set_new(z, "shape", json_pack("[ii]", 1, 1));
  set_offsets(r, "zero", offset(r, "zero", 1) - 2, offset(r, "zero", 1));
}
static void e_shape_mismatch(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_array_set_new(json_object_get(tensor(r, "qdata"), "shape"), 0,
                     json_integer(1));
}
static void e_dtype_size(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_set_new(tensor(r, "scale"), "dtype", json_string("F32"));
}
static void e_dtype_unknown(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_set_new(tensor(r, "qdata"), "dtype", json_string("I4"));
}
static void e_dtype_wrong(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_set_new(tensor(r, "qdata"), "dtype", json_string("U8"));
}
static void e_three_dims(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_array_append_new(json_object_get(tensor(r, "qdata"), "shape"),
                        json_integer(1));
}
static void e_unknown_tensor(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_set(r, "extra", tensor(r, "bias"));
}
static void e_unknown_key(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_set_new(tensor(r, "qdata"), "strides", json_pack("[i]", 1));
}
static void e_no_metadata(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_del(r, "__metadata__");
}
static void e_no_scale(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  /* bias becomes the only data before qdata */
  json_int_t s0 = offset(r, "scale", 0), z1 = offset(r, "zero", 1);
  json_object_del(r, "scale");
  set_offsets(r, "zero", s0, z1);
  json_object_set_new(tensor(r, "zero"), "shape", json_pack("[ii]", 2, 4));
}
static void e_no_zero(json_t *r, uint8_t **b, size_t *l) {
  (void)l;
  /* a symmetric-looking file that still says asymmetric */
  json_int_t z0 = offset(r, "zero", 0), z1 = offset(r, "zero", 1);
  json_object_del(r, "zero");
  json_int_t q0 = offset(r, "qdata", 0), q1 = offset(r, "qdata", 1);
  memmove(*b + z0, *b + q0, (size_t)(q1 - q0));
  *l -= (size_t)(z1 - z0);
  set_offsets(r, "qdata", z0, z0 + (q1 - q0));
}
static void e_meta_not_string(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_object_set_new(json_object_get(r, "__metadata__"), "n",
                      json_integer(3));
}
static void meta_set(json_t *r, const char *k, const char *v) {
  json_object_set_new(json_object_get(r, "__metadata__"), k, json_string(v));
}
static void e_version(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "qlinear_store_version", "2");
}
static void e_bad_name(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "name", "../etc/passwd");
}
static void e_bad_format(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "format", "q3k");
}
static void e_other_format(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "format", "q8c");
}
static void e_group_size(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "group_size", "64");
}
static void e_group_leading_zero(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "group_size", "032");
}
static void e_n(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "n", "4");
}
static void e_k_negative(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "k", "-40");
}
static void e_asym(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "asymmetric", "0");
}
static void e_scale_dtype(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "scale_dtype", "f16");
}
static void e_policy(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "policy", "fast");
}
static void e_digest_hex(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  meta_set(r, "digest", "zz");
}
static void e_digest_upper(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_t *m = json_object_get(r, "__metadata__");
  char d[65];
  snprintf(d, sizeof d, "%s", json_string_value(json_object_get(m, "digest")));
  for (int i = 0; i < 64; i++)
    if (d[i] >= 'a' && d[i] <= 'f')
      d[i] = (char)(d[i] - 32);
  meta_set(r, "digest", d);
}
static void e_digest_other(json_t *r, uint8_t **b, size_t *l) {
  (void)b, (void)l;
  json_t *m = json_object_get(r, "__metadata__");
  char d[65];
  snprintf(d, sizeof d, "%s", json_string_value(json_object_get(m, "digest")));
  d[10] = d[10] == '0' ? '1' : '0';
  meta_set(r, "digest", d);
}
static void e_data_flip(json_t *r, uint8_t **b, size_t *l) {
  (void)r;
  (*b)[*l - 1] ^= 0x10; /* the last qdata byte: still a valid int8 */
}
static void e_scale_nan(json_t *r, uint8_t **b, size_t *l) {
  (void)l;
  json_int_t s0 = offset(r, "scale", 0);
  (*b)[s0] = 0xC0; /* bf16 0x7FC0 = NaN */
  (*b)[s0 + 1] = 0x7F;
}

/* The cases that edit the raw bytes around the JSON. */
typedef struct raw_variant {
  const char *what, *expect;
  const char *header; /* the whole JSON header, or NULL */
  uint64_t hlen;      /* header length to write when header is NULL */
} raw_variant;

static const variant variants[] = {
    {"overlap", "overlaps", e_overlap},
    {"outside", "past the end", e_outside},
    {"huge offset", "past the end", e_huge_offset},
    {"reversed offsets", "reversed", e_reversed},
    {"negative offset", "non-negative", e_negative},
    {"gap", "bytes", e_gap},
    {"shape mismatch", "elements", e_shape_mismatch},
    {"dtype size", "elements", e_dtype_size},
    {"unknown dtype", "unsupported dtype", e_dtype_unknown},
    {"wrong dtype", "qdata: dtype U8", e_dtype_wrong},
    {"three dims", "1 or 2", e_three_dims},
    {"unknown tensor", "unknown tensor", e_unknown_tensor},
    {"unknown key", "unknown key", e_unknown_key},
    {"no metadata", "__metadata__ missing", e_no_metadata},
    {"no scale", "scale: missing", e_no_scale},
    {"no zero", "zero", e_no_zero},
    {"metadata not string", "not a string", e_meta_not_string},
    {"version", "unsupported", e_version},
    {"bad name", "name", e_bad_name},
    {"bad format", "format", e_bad_format},
    {"other format", "for q8c", e_other_format},
    {"group size", "", e_group_size},
    {"group size leading zero", "group_size", e_group_leading_zero},
    {"n", "", e_n},
    {"k negative", "k", e_k_negative},
    {"asymmetric", "zero", e_asym},
    {"scale dtype", "scale_dtype", e_scale_dtype},
    {"policy", "policy", e_policy},
    {"digest not hex", "digest", e_digest_hex},
    {"digest uppercase", "digest", e_digest_upper},
    {"digest other", "digest mismatch", e_digest_other},
    {"data flipped", "digest mismatch", e_data_flip},
    {"scale NaN", "scale", e_scale_nan},
};

static const raw_variant raw_variants[] = {
    {"header length huge", "header length", NULL, UINT64_MAX},
    {"header length 2^40", "header length", NULL, (uint64_t)1 << 40},
    {"header length past the end", "truncated", NULL, 60000},
    {"header length 0", "header length", NULL, 0},
    {"header not JSON", "not JSON", "{this is not json}", 0},
    {"header not an object", "'{'", "[1,2,3]", 0},
    {"header trailing garbage", "not JSON", "{} x", 0},
    {"header NUL", "not JSON", "{\"a\":\"\\u0000\"}", 0},
    {"duplicate keys", "not JSON",
     "{\"__metadata__\":{},\"__metadata__\":{}}", 0},
    {"empty object", "after the last tensor", "{}", 0},
    {"tensor not object", "not an object", "{\"qdata\":1}", 0},
    {"deep nesting", "not JSON", NULL, 1},
};

/* The parts of a good file: header as JSON, data section as bytes. */
static void split(const uint8_t *buf, size_t len, json_t **root,
                  uint8_t **data, size_t *dlen) {
  uint64_t hl = 0;
  json_error_t je;
  for (int b = 0; b < 8; b++)
    hl |= (uint64_t)buf[b] << (8 * b);
  *root = json_loadb((const char *)buf + 8, hl, 0, &je);
  ck_assert_ptr_nonnull(*root);
  *dlen = len - 8 - hl;
  *data = tu_xmalloc(*dlen + 1);
  memcpy(*data, buf + 8 + hl, *dlen);
}

static uint8_t *join(const char *js, size_t jlen, uint64_t hlen,
                     const uint8_t *data, size_t dlen, size_t *len) {
  uint8_t *buf = tu_xmalloc(8 + jlen + dlen + 1);
  for (int b = 0; b < 8; b++)
    buf[b] = (uint8_t)(hlen >> (8 * b));
  memcpy(buf + 8, js, jlen);
  memcpy(buf + 8 + jlen, data, dlen);
  *len = 8 + jlen + dlen;
  return buf;
}

/* Every variant is refused by the parser with its own message, and in a
 * state directory it is moved aside with a log line while a good file
 * beside it loads. */
START_TEST(test_corrupt_variants) {
  ql_qweight *q = make_q(QL_FORMAT_Q8B, 32, 1, QL_DTYPE_BF16, 2, 40, 1, 13);
  ql_qweight *good = small_q(14);
  char f[QL_STORE_FILE_NAME_MAX], err[256];
  size_t len, dlen;
  uint8_t *orig = encode("victim", q, QL_PATH_AUTO, &len), *data;
  json_t *root;
  size_t nv = sizeof variants / sizeof variants[0];
  size_t nr = sizeof raw_variants / sizeof raw_variants[0];

  split(orig, len, &root, &data, &dlen);
  file_name_of("victim", q, f);
  make_dir();
  ql__store *s = open_store();
  put(s, "good", good, QL_PATH_AUTO);
  ql__store_close(s);

  for (size_t i = 0; i < nv + nr; i++) {
    const char *what, *expect;
    uint8_t *buf;
    size_t blen;
    if (i < nv) {
      json_t *r = json_deep_copy(root);
      uint8_t *d = tu_xmalloc(dlen + 1);
      size_t dl = dlen;
      memcpy(d, data, dlen);
      variants[i].edit(r, &d, &dl);
      char *js = json_dumps(r, JSON_COMPACT);
      buf = join(js, strlen(js), strlen(js), d, dl, &blen);
      free(js);
      free(d);
      json_decref(r);
      what = variants[i].what;
      expect = variants[i].expect;
    } else {
      const raw_variant *v = &raw_variants[i - nv];
      what = v->what;
      expect = v->expect;
      if (v->header != NULL) {
        buf = join(v->header, strlen(v->header), strlen(v->header), data,
                   dlen, &blen);
      } else if (v->hlen == 1) {
        /* nesting far past jansson's depth limit */
        size_t depth = 5000;
        char *js = tu_xmalloc(2 * depth + 16);
        size_t at = 0;
        js[at++] = '{';
        memcpy(js + at, "\"a\":", 4);
        at += 4;
        for (size_t j = 0; j < depth; j++)
          js[at++] = '[';
        for (size_t j = 0; j < depth; j++)
          js[at++] = ']';
        js[at++] = '}';
        buf = join(js, at, at, data, dlen, &blen);
        free(js);
      } else {
        buf = join("{}", 2, v->hlen, data, dlen, &blen);
      }
    }
    ql__stored_weight w;
    int rc = ql__store_parse(buf, blen, &w, err, sizeof err);
    ck_assert_msg(rc == QL_EBADFILE, "%s: parse gave %d (%s)", what, rc, err);
    ck_assert_msg(strstr(err, expect) != NULL, "%s: error \"%s\" lacks \"%s\"",
                  what, err, expect);
    ck_assert_ptr_null(w.q);

    write_file(f, buf, blen);
    log_begin();
    loaded l;
    int n = reload(&l);
    char *log = log_end();
    ck_assert_msg(n == 1 && l.n == 1, "%s: %d loaded", what, n);
    ck_assert_str_eq(l.name[0], "good");
    ck_assert_msg(count_files(".corrupt-") == 1, "%s: not moved aside", what);
    ck_assert_msg(strstr(log, "moved aside") != NULL && strstr(log, f),
                  "%s: log \"%s\"", what, log);
    free(log);
    free_loaded(&l);
    char cmd[4500];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*.corrupt-*", dir);
    ck_assert_int_eq(system(cmd), 0);
    free(buf);
  }
  json_decref(root);
  free(data);
  free(orig);
  ql_qweight_free(q);
  ql_qweight_free(good);
  rm_dir();
}
END_TEST

/* Every metadata field is required. */
START_TEST(test_metadata_fields_required) {
  static const char *keys[] = {"qlinear_store_version", "name", "format",
                               "group_size", "n", "k", "asymmetric",
                               "scale_dtype", "digest", "policy"};
  ql_qweight *q = small_q(15);
  size_t len, dlen, blen;
  uint8_t *orig = encode("m", q, QL_PATH_AUTO, &len), *data, *buf;
  json_t *root;
  char err[256], want[64];
  split(orig, len, &root, &data, &dlen);
  for (int i = 0; i < 10; i++) {
    json_t *r = json_deep_copy(root);
    json_object_del(json_object_get(r, "__metadata__"), keys[i]);
    char *js = json_dumps(r, JSON_COMPACT);
    buf = join(js, strlen(js), strlen(js), data, dlen, &blen);
    ql__stored_weight w;
    ck_assert_int_eq(ql__store_parse(buf, blen, &w, err, sizeof err),
                     QL_EBADFILE);
    snprintf(want, sizeof want, "%s missing", keys[i]);
    ck_assert_msg(strstr(err, want) != NULL, "%s: %s", keys[i], err);
    free(js);
    free(buf);
    json_decref(r);
  }
  /* An unknown metadata key is tolerated (safetensors tools add some),
   * and the padding after the JSON may be longer. */
  json_t *r = json_deep_copy(root);
  json_object_set_new(json_object_get(r, "__metadata__"), "format_note",
                      json_string("pt"));
  char *js = json_dumps(r, JSON_COMPACT);
  size_t jl = strlen(js);
  char *padded = tu_xmalloc(jl + 200);
  memcpy(padded, js, jl);
  memset(padded + jl, ' ', 200);
  buf = join(padded, jl + 200, jl + 200, data, dlen, &blen);
  ql__stored_weight w;
  ck_assert_int_eq(ql__store_parse(buf, blen, &w, err, sizeof err), 0);
  same_q(q, w.q);
  ck_assert_str_eq(w.name, "m");
  ql_qweight_free(w.q);
  free(padded);
  free(js);
  free(buf);
  json_decref(r);
  json_decref(root);
  free(data);
  free(orig);
  ql_qweight_free(q);
}
END_TEST

/* A valid file whose file name is not that of its (name, digest), and a
 * second valid file for a name already loaded. */
START_TEST(test_misnamed_and_duplicate) {
  ql_qweight *a = small_q(16), *b = small_q(17);
  char fa[QL_STORE_FILE_NAME_MAX], fb[QL_STORE_FILE_NAME_MAX];
  size_t la, lb;
  uint8_t *ea = encode("dup", a, QL_PATH_AUTO, &la);
  uint8_t *eb = encode("dup", b, QL_PATH_AUTO, &lb);
  file_name_of("dup", a, fa);
  file_name_of("dup", b, fb);
  make_dir();
  write_file(fa, ea, la);
  write_file(fb, eb, lb);
  write_file("model.safetensors", ea, la); /* misnamed */
  log_begin();
  loaded l;
  int n = reload(&l);
  char *log = log_end();
  ck_assert_int_eq(n, 1);
  ck_assert_str_eq(l.name[0], "dup");
  ck_assert_int_eq(count_files(".duplicate-"), 1);
  ck_assert_int_eq(count_files(".corrupt-"), 1);
  ck_assert_int_eq(count_files("model.safetensors.corrupt-"), 1);
  ck_assert_ptr_nonnull(strstr(log, "does not match"));
  ck_assert_ptr_nonnull(strstr(log, "a second file"));
  /* The one kept is the one a put of that name now conflicts with. */
  ql__store *s = open_store();
  uint8_t d[QL_DIGEST_BYTES];
  char err[256];
  const ql_qweight *other = memcmp(l.q[0]->qdata, a->qdata,
                                   a->qdata_bytes) == 0 ? b : a;
  digest_of(other, d);
  ck_assert_int_eq(
      ql__store_put(s, "dup", other, d, QL_PATH_AUTO, NULL, err, sizeof err),
      QL_EEXIST);
  ql__store_close(s);
  free_loaded(&l);
  free(log);
  free(ea);
  free(eb);
  ql_qweight_free(a);
  ql_qweight_free(b);
  rm_dir();
}
END_TEST

/* Two valid files for one name, the first of which the daemon refuses
 * (past a budget, say): the second is not "a second file" of a weight
 * loaded, and loads; both files stay. */
START_TEST(test_duplicate_after_refused) {
  ql_qweight *a = small_q(16), *b = small_q(17);
  char fa[QL_STORE_FILE_NAME_MAX], fb[QL_STORE_FILE_NAME_MAX];
  size_t la, lb;
  uint8_t *ea = encode("dup", a, QL_PATH_AUTO, &la);
  uint8_t *eb = encode("dup", b, QL_PATH_AUTO, &lb);
  file_name_of("dup", a, fa);
  file_name_of("dup", b, fb);
  make_dir();
  write_file(fa, ea, la);
  write_file(fb, eb, lb);
  ql__store *s = open_store();
  loaded l;
  memset(&l, 0, sizeof l);
  l.refuse_once = QL_ENOMEM;
  ck_assert_int_eq(ql__store_load_all(s, collect, &l), 1);
  ql__store_close(s);
  ck_assert_int_eq(l.n, 1);
  ck_assert_str_eq(l.name[0], "dup");
  ck_assert_int_eq(count_files(".duplicate-"), 0);
  ck_assert_int_eq(count_files(".safetensors"), 2);
  free_loaded(&l);
  free(ea);
  free(eb);
  ql_qweight_free(a);
  ql_qweight_free(b);
  rm_dir();
}
END_TEST

/* The callback refusing a weight: the store frees it (ASan would see a
 * leak otherwise) and keeps the file. Non-regular entries are left alone. */
START_TEST(test_callback_refuses_and_odd_entries) {
  ql_qweight *q = small_q(18);
  char path[4400];
  make_dir();
  ql__store *s = open_store();
  put(s, "kept", q, QL_PATH_AUTO);
  ql__store_close(s);
  snprintf(path, sizeof path, "%s/adir.safetensors", dir);
  ck_assert_int_eq(mkdir(path, 0700), 0);
  char f[QL_STORE_FILE_NAME_MAX], target[4400];
  file_name_of("kept", q, f);
  snprintf(target, sizeof target, "%s/%s", dir, f);
  snprintf(path, sizeof path, "%s/link.safetensors", dir);
  ck_assert_int_eq(symlink(target, path), 0);
  write_file("notes.txt", "hello", 5);

  s = open_store();
  loaded l;
  memset(&l, 0, sizeof l);
  l.refuse = QL_EEXHAUSTED;
  log_begin();
  int n = ql__store_load_all(s, collect, &l);
  char *log = log_end();
  ck_assert_int_eq(n, 0);
  ck_assert_ptr_nonnull(strstr(log, "not loaded"));
  ck_assert_ptr_nonnull(strstr(log, "left alone"));
  free(log);
  ql__store_close(s);
  ck_assert_int_eq(count_files(".corrupt-"), 0);
  ck_assert_int_eq(count_files("notes.txt"), 1);
  /* The file is still there and loads next time. */
  ck_assert_int_eq(count_files(f), 1);
  unlink(path);
  snprintf(path, sizeof path, "%s/adir.safetensors", dir);
  rmdir(path);
  ck_assert_int_eq(reload(&l), 1);
  free_loaded(&l);
  ql_qweight_free(q);
  rm_dir();
}
END_TEST

START_TEST(test_open_creates_and_locks) {
  char sub[4400], err[256];
  struct stat st;
  ql__store *s, *s2;
  make_dir();
  snprintf(sub, sizeof sub, "%s/state/", dir);
  mode_t um = umask(022);
  ck_assert_int_eq(ql__store_open(sub, &s, err, sizeof err), 0);
  umask(um);
  ck_assert_int_eq(stat(sub, &st), 0);
  ck_assert(S_ISDIR(st.st_mode));
  ck_assert_int_eq(st.st_mode & 0777, 0750);
  ck_assert_str_eq(ql__store_dir(s), sub);
  /* One holder at a time. */
  ck_assert_int_eq(ql__store_open(sub, &s2, err, sizeof err), QL_EIO);
  ck_assert_ptr_null(s2);
  ck_assert_ptr_nonnull(strstr(err, "in use"));
  ql__store_close(s);
  ck_assert_int_eq(ql__store_open(sub, &s2, err, sizeof err), 0);
  ql__store_close(s2);
  ql__store_close(NULL);
  /* Not a directory; a missing parent. */
  write_file("plain", "x", 1);
  snprintf(sub, sizeof sub, "%s/plain", dir);
  ck_assert_int_ne(ql__store_open(sub, &s, err, sizeof err), 0);
  ck_assert_ptr_null(s);
  snprintf(sub, sizeof sub, "%s/no/such/dir", dir);
  ck_assert_int_ne(ql__store_open(sub, &s, err, sizeof err), 0);
  ck_assert_ptr_nonnull(strstr(err, "cannot create"));
  rm_dir();
}
END_TEST

int main(void) {
  Suite *s = suite_create("store");
  TCase *tc = tcase_create("store");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_roundtrip_every_format);
  tcase_add_test(tc, test_header_is_safetensors);
  tcase_add_test(tc, test_names_with_slashes);
  tcase_add_test(tc, test_same_content_two_names);
  tcase_add_test(tc, test_put_conflict_and_rewrite);
  tcase_add_test(tc, test_devices_kept);
  tcase_add_test(tc, test_put_refuses_bad_arguments);
  tcase_add_test(tc, test_remove);
  tcase_add_test(tc, test_crash_leftovers);
  tcase_add_test(tc, test_truncated_at_every_length);
  tcase_add_test(tc, test_corrupt_variants);
  tcase_add_test(tc, test_metadata_fields_required);
  tcase_add_test(tc, test_misnamed_and_duplicate);
  tcase_add_test(tc, test_duplicate_after_refused);
  tcase_add_test(tc, test_callback_refuses_and_odd_entries);
  tcase_add_test(tc, test_open_creates_and_locks);
  tcase_add_test(tc, test_layout_cache);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
