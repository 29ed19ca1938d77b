/*
 * test_safetensors.c - the safetensors reader of qlinearctl import
 * (client/ctl/safetensors.c): files as the format's writers make them, and
 * every malformed one we could think of (truncated, header larger than the
 * file, overlapping offsets, wrong dtypes and shapes, bad JSON), each of
 * which must fail with its own error code and a message naming the problem.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "safetensors.h"
#include "testutil.h"

/* A file: the 8-byte length of hdr, hdr, then data_len bytes of data. */
static unsigned char *make(const char *hdr, size_t data_len, size_t *len) {
  size_t hl = strlen(hdr);
  unsigned char *b = tu_xmalloc(8 + hl + data_len + 1);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
  memcpy(b + 8, hdr, hl);
  for (size_t i = 0; i < data_len; i++)
    b[8 + hl + i] = (unsigned char)(i * 5 + 3);
  *len = 8 + hl + data_len;
  return b;
}

static const char good_hdr[] =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a.weight\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
    "\"a.bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
    "\"s\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[20,24]}}   ";

START_TEST(test_good) {
  size_t len;
  unsigned char *b = make(good_hdr, 24, &len);
  ql__st_file *f = NULL;
  char err[256];
  ck_assert_int_eq(ql__st_parse(b, len, &f, err, sizeof err), 0);
  ck_assert_uint_eq(f->n_tensors, 3);
  const ql__st_tensor *w = ql__st_find(f, "a.weight");
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(w->dtype, QL__ST_F16);
  ck_assert_int_eq(w->ndim, 2);
  ck_assert_uint_eq(w->shape[0], 2);
  ck_assert_uint_eq(w->shape[1], 3);
  ck_assert_uint_eq(w->bytes, 12);
  ck_assert_ptr_eq(w->data, b + 8 + strlen(good_hdr));
  const ql__st_tensor *s = ql__st_find(f, "s");
  ck_assert_int_eq(s->ndim, 0);
  ck_assert_uint_eq(s->bytes, 4);
  ck_assert_ptr_eq(s->data, b + 8 + strlen(good_hdr) + 20);
  ck_assert_str_eq(ql__st_meta(f, "format"), "pt");
  ck_assert_ptr_null(ql__st_meta(f, "nope"));
  ck_assert_ptr_null(ql__st_find(f, "nope"));
  ql__st_free(f);
  free(b);
}
END_TEST

/* A header alone, no tensors: valid. */
START_TEST(test_empty) {
  size_t len;
  unsigned char *b = make("{}", 0, &len);
  ql__st_file *f = NULL;
  ck_assert_int_eq(ql__st_parse(b, len, &f, NULL, 0), 0);
  ck_assert_uint_eq(f->n_tensors, 0);
  ql__st_free(f);
  free(b);
}
END_TEST

static const struct bad_case {
  const char *what;
  const char *hdr;
  size_t data_len;
  int rc;
  const char *msg; /* a substring of the error message */
} bad[] = {
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, QL_EBADFILE, "overlap"},
    {"same range",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
     4, QL_EBADFILE, "overlap"},
    {"past the end",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12,
     QL_EBADFILE, "outside"},
    {"begin after end",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 12,
     QL_EBADFILE, "outside"},
    {"unknown dtype",
     "{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     QL_EDTYPE, "unknown dtype 'F31'"},
    {"dtype not a string",
     "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     QL_EBADFILE, "dtype"},
    {"shape vs bytes",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
     QL_ESHAPE, "needs 12"},
    {"negative dim",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
     QL_ESHAPE, "dimension 0"},
    {"float dim",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
     QL_ESHAPE, "dimension 0"},
    {"shape overflow",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
     "\"data_offsets\":[0,4]}}",
     4, QL_ESHAPE, "overflow"},
    {"too many dims",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
     "\"data_offsets\":[0,1]}}",
     1, QL_ESHAPE, "9 dimensions"},
    {"offsets not a pair",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
     QL_EBADFILE, "data_offsets"},
    {"negative offset",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
     QL_EBADFILE, "data_offsets"},
    {"unknown field",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
     "\"x\":1}}",
     1, QL_EBADFILE, "unknown field 'x'"},
    {"no shape", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
     QL_EBADFILE, "shape"},
    {"entry not an object", "{\"a\":[1,2]}", 0, QL_EBADFILE, "not a JSON"},
    {"not an object", "[1,2,3]", 0, QL_EBADFILE, "not a JSON object"},
    {"bad JSON", "{\"a\":", 0, QL_EBADFILE, "bad JSON"},
    {"duplicate key",
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
     "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
     1, QL_EBADFILE, "bad JSON"},
    {"metadata not strings", "{\"__metadata__\":{\"a\":1}}", 0, QL_EBADFILE,
     "not a string"},
    {"metadata not an object", "{\"__metadata__\":[]}", 0, QL_EBADFILE,
     "not an object"},
    {"header too short", " ", 0, QL_EBADFILE, "cannot hold"},
};

START_TEST(test_bad) {
  const struct bad_case *c = &bad[_i];
  size_t len;
  unsigned char *b = make(c->hdr, c->data_len, &len);
  ql__st_file *f = (ql__st_file *)1;
  char err[256] = "";
  int rc = ql__st_parse(b, len, &f, err, sizeof err);
  ck_assert_msg(rc == c->rc, "%s: rc %d, expected %d (%s)", c->what, rc,
                c->rc, err);
  ck_assert_ptr_null(f);
  ck_assert_msg(strstr(err, c->msg) != NULL, "%s: message '%s' lacks '%s'",
                c->what, err, c->msg);
  free(b);
}
END_TEST

/* The header length against the file size, before any JSON is read. */
START_TEST(test_header_larger_than_file) {
  size_t len;
  unsigned char *b = make(good_hdr, 24, &len);
  ql__st_file *f = NULL;
  char err[256];
  /* Claim one byte more than everything after the length field. */
  uint64_t hl = len - 8 + 1;
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(hl >> (8 * i));
  ck_assert_int_eq(ql__st_parse(b, len, &f, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "larger than"));
  /* And a huge one: no overflow in the comparison. */
  memset(b, 0xff, 8);
  ck_assert_int_eq(ql__st_parse(b, len, &f, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "larger than"));
  ck_assert_int_eq(ql__st_parse(b, 7, &f, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "shorter than"));
  ck_assert_int_eq(ql__st_parse(NULL, 0, &f, err, sizeof err), QL_EBADFILE);
  free(b);
}
END_TEST

/* Every truncation of a good file fails cleanly (and never reads past the
 * end: the sanitizer build checks that). */
START_TEST(test_every_prefix) {
  size_t len;
  unsigned char *b = make(good_hdr, 24, &len);
  for (size_t l = 0; l < len; l++) {
    unsigned char *p = tu_xmalloc(l + 1);
    memcpy(p, b, l);
    ql__st_file *f = NULL;
    char err[256];
    int rc = ql__st_parse(p, l, &f, err, sizeof err);
    ck_assert_msg(rc == QL_EBADFILE, "prefix %zu: rc %d (%s)", l, rc, err);
    ck_assert_ptr_null(f);
    free(p);
  }
  free(b);
}
END_TEST

START_TEST(test_open_file) {
  char path[] = "/tmp/ql-st-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  size_t len;
  unsigned char *b = make(good_hdr, 24, &len);
  ck_assert_int_eq(write(fd, b, len), (ssize_t)len);
  close(fd);
  ql__st_file *f = NULL;
  char err[256];
  ck_assert_int_eq(ql__st_open(path, &f, err, sizeof err), 0);
  ck_assert_uint_eq(f->n_tensors, 3);
  ck_assert_int_eq(memcmp(ql__st_find(f, "a.bias")->data,
                          b + 8 + strlen(good_hdr) + 12, 8),
                   0);
  ql__st_free(f);
  /* Truncated on disk. */
  ck_assert_int_eq(truncate(path, (off_t)len - 1), 0);
  ck_assert_int_eq(ql__st_open(path, &f, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "outside"));
  unlink(path);
  ck_assert_int_eq(ql__st_open(path, &f, err, sizeof err), QL_EIO);
  free(b);
}
END_TEST

START_TEST(test_index) {
  static const char idx[] =
      "{\"metadata\":{\"total_size\":10},\"weight_map\":{"
      "\"a\":\"model-00001-of-00002.safetensors\","
      "\"b\":\"model-00002-of-00002.safetensors\","
      "\"c\":\"model-00001-of-00002.safetensors\"}}";
  char **files = NULL, err[256];
  size_t n = 0;
  ck_assert_int_eq(ql__st_index_parse(idx, strlen(idx), &files, &n, err,
                                      sizeof err),
                   0);
  ck_assert_uint_eq(n, 2);
  ck_assert_str_eq(files[0], "model-00001-of-00002.safetensors");
  ck_assert_str_eq(files[1], "model-00002-of-00002.safetensors");
  ql__st_strv_free(files, n);
  static const char *bad_idx[] = {
      "{\"weight_map\":{\"a\":\"../x.safetensors\"}}",
      "{\"weight_map\":{\"a\":\"..\"}}", "{\"weight_map\":{\"a\":1}}",
      "{\"weight_map\":[]}", "{}", "nope"};
  for (size_t i = 0; i < sizeof bad_idx / sizeof bad_idx[0]; i++) {
    ck_assert_int_eq(ql__st_index_parse(bad_idx[i], strlen(bad_idx[i]), &files,
                                        &n, err, sizeof err),
                     QL_EBADFILE);
    ck_assert_ptr_null(files);
  }
}
END_TEST

static Suite *st_suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("parse");
  tcase_add_test(tc, test_good);
  tcase_add_test(tc, test_empty);
  tcase_add_loop_test(tc, test_bad, 0, sizeof bad / sizeof bad[0]);
  tcase_add_test(tc, test_header_larger_than_file);
  tcase_add_test(tc, test_every_prefix);
  tcase_add_test(tc, test_open_file);
  tcase_add_test(tc, test_index);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(st_suite(), CK_NORMAL); }
