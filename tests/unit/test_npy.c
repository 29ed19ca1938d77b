/*
 * test_npy.c - the .npy reader and writer of qlinearctl (client/ctl/npy.c):
 * round trips through memory and files, headers as numpy writes them in
 * every version, and every malformed header, truncation and overflow we
 * could think of, each of which must fail cleanly with QL_EBADFILE and a
 * reason.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"
#include "testutil.h"

/* Builds a file: magic, version major.0, the header length field, the
 * header text as given (no padding added) and data_len bytes of data. */
static unsigned char *make(int major, const char *hdr, size_t data_len,
                           size_t *len) {
  size_t hl = strlen(hdr), pre = major == 1 ? 10 : 12;
  unsigned char *b = tu_xmalloc(pre + hl + data_len + 1);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (unsigned char)major;
  b[7] = 0;
  b[8] = (unsigned char)(hl & 0xff);
  b[9] = (unsigned char)((hl >> 8) & 0xff);
  if (major != 1) {
    b[10] = (unsigned char)((hl >> 16) & 0xff);
    b[11] = (unsigned char)((hl >> 24) & 0xff);
  }
  memcpy(b + pre, hdr, hl);
  for (size_t i = 0; i < data_len; i++)
    b[pre + hl + i] = (unsigned char)(i * 7 + 1);
  *len = pre + hl + data_len;
  return b;
}

/* ------------------------------------------------------------ valid */

static const struct valid_case {
  int major;
  const char *hdr;
  size_t data_len;
  ql__npy_type type;
  int ndim;
  uint64_t d0, d1;
} valid[] = {
    /* exactly what numpy 2.x writes (see np.save) */
    {1,
     "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }        "
     "                                                  \n",
     24, QL__NPY_F32, 2, 2, 3},
    {1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }\n", 6,
     QL__NPY_F16, 1, 3, 1},
    {1, "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }\n", 8,
     QL__NPY_U16, 1, 4, 1},
    /* empty arrays are well-formed */
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }\n", 0,
     QL__NPY_F32, 2, 0, 5},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }\n", 0,
     QL__NPY_F32, 1, 0, 1},
    /* versions 2.0 and 3.0 differ only in the length field */
    {2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }\n", 8,
     QL__NPY_F32, 2, 1, 2},
    {3, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 2), }\n", 8,
     QL__NPY_F16, 2, 2, 2},
    /* what the grammar allows: other key order, double quotes, no trailing
     * comma, odd spacing, Python 2 long suffixes, a trailing comma in the
     * shape */
    {1, "{\"shape\": (2, 1), \"descr\": \"<f4\", \"fortran_order\": False}", 8,
     QL__NPY_F32, 2, 2, 1},
    {1, "  {'descr':'<f4','fortran_order':False,'shape':(3L, 2L)}  \n", 24,
     QL__NPY_F32, 2, 3, 2},
    {1, "{\n'descr' : '<f4' ,\n\t'fortran_order' : False ,\r\n'shape' : ( 2 , "
        "2 , ) , }\n",
     16, QL__NPY_F32, 2, 2, 2},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1)}\n\n\n", 4,
     QL__NPY_F32, 2, 1, 1},
};

START_TEST(test_valid) {
  const struct valid_case *v = &valid[_i];
  size_t len;
  unsigned char *b = make(v->major, v->hdr, v->data_len, &len);
  ql__npy a;
  char err[256];
  int rv = ql__npy_parse(b, len, &a, err, sizeof err);
  ck_assert_msg(rv == 0, "case %d: %s", _i, err);
  ck_assert_str_eq(err, "");
  ck_assert_int_eq(a.type, v->type);
  ck_assert_int_eq(a.ndim, v->ndim);
  ck_assert_uint_eq(a.shape[0], v->d0);
  ck_assert_uint_eq(a.shape[1], v->d1);
  ck_assert_uint_eq(a.count, v->d0 * v->d1);
  ck_assert_uint_eq(a.data_len, v->data_len);
  ck_assert_uint_eq(a.elem_size, ql__npy_type_size(v->type));
  ck_assert_ptr_eq(a.data, b + len - v->data_len);
  ck_assert_ptr_null(a.owned);
  ql__npy_free(&a); /* harmless on a parsed (not loaded) array */
  free(b);
}
END_TEST

/* ------------------------------------------------------------ malformed */

#define F4 "'descr': '<f4', 'fortran_order': False, "
static const struct bad_case {
  int major;
  const char *hdr;
  size_t data_len;
  const char *why; /* a substring of the reason */
} bad[] = {
    {1, "{}", 0, "lacks the key 'descr'"},
    {1, "", 0, "header ends"},
    {1, "   ", 0, "header ends"},
    {1, "[]", 0, "expected '{'"},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4,
     "expected ',' or '}'"},
    {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), ", 4,
     "expected a string"}, /* ends where a key would start */
    {1, "{'descr: '<f4'}", 0, "expected ':'"},
    {1, "{'descr': '<f4", 0, "unterminated string"},
    {1, "{descr: '<f4'}", 0, "expected a string"},
    {1, "{'descr' '<f4'}", 0, "expected ':'"},
    {1, "{'descr': '<f4' 'shape': (1,)}", 0, "expected ',' or '}'"},
    {1, "{" F4 "'shape': (1,), 'extra': 1}", 4, "unexpected key 'extra'"},
    {1, "{" F4 "'shape': (1,), 'descr': '<f4'}", 4, "repeated"},
    {1, "{'descr': '<f4', 'shape': (1,)}", 4, "lacks the key 'fortran_order'"},
    {1, "{'fortran_order': False, 'shape': (1,)}", 4, "lacks the key 'descr'"},
    {1, "{" F4 "}", 4, "lacks the key 'shape'"},
    {1, "{" F4 "'shape': (1,)} x", 4, "unexpected text after"},
    {1, "{" F4 "'shape': (1,)}}", 4, "unexpected text after"},
    /* descr */
    {1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,)}", 4,
     "big-endian"},
    {1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}", 8,
     "'<f8' is not supported"},
    {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (1,)}", 1,
     "not supported"},
    {1, "{'descr': '<f4 ', 'fortran_order': False, 'shape': (1,)}", 4,
     "not supported"},
    {1, "{'descr': 'f4', 'fortran_order': False, 'shape': (1,)}", 4,
     "not supported"},
    {1, "{'descr': '', 'fortran_order': False, 'shape': (1,)}", 4,
     "not supported"},
    {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4,
     "structured types"},
    {1, "{'descr': 4, 'fortran_order': False, 'shape': (1,)}", 4,
     "not a type string"},
    {1, "{'descr': ", 4, "expected a string"},
    {1, "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", 4,
     "unsupported character"},
    {1, "{'descr': '<f\xc3\xa9" "4', 'fortran_order': False, 'shape': (1,)}", 4,
     "unsupported character"},
    {1, "{'descr': '<f\t4', 'fortran_order': False, 'shape': (1,)}", 4,
     "unsupported character"},
    {1, "{'descr': 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "xxxxxxxxxxxxxxxxxxxx', 'fortran_order': False, 'shape': (1,)}",
     4, "string too long"},
    /* fortran_order */
    {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2)}", 8,
     "Fortran-order"},
    {1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4,
     "True or False"},
    {1, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}", 4,
     "True or False"},
    {1, "{'descr': '<f4', 'fortran_order': 'False', 'shape': (1,)}", 4,
     "True or False"},
    {1, "{'descr': '<f4', 'fortran_order': , 'shape': (1,)}", 4,
     "True or False"},
    /* shape */
    {1, "{" F4 "'shape': (3)}", 12, "not a tuple"},
    {1, "{" F4 "'shape': 3}", 12, "expected '('"},
    {1, "{" F4 "'shape': [3]}", 12, "expected '('"},
    {1, "{" F4 "'shape': ()}", 4, "0-dimensional"},
    {1, "{" F4 "'shape': (1, 2, 3)}", 24, "3-dimensional"},
    {1, "{" F4 "'shape': (-1,)}", 4, "non-negative"},
    {1, "{" F4 "'shape': (+1,)}", 4, "non-negative"},
    {1, "{" F4 "'shape': (1a,)}", 4, "malformed dimension"},
    {1, "{" F4 "'shape': (0x10,)}", 64, "malformed dimension"},
    {1, "{" F4 "'shape': (1.0,)}", 4, "expected ',' or ')'"},
    {1, "{" F4 "'shape': (1 2)}", 8, "expected ',' or ')'"},
    {1, "{" F4 "'shape': (1,,2)}", 8, "non-negative"},
    {1, "{" F4 "'shape': (,)}", 0, "non-negative"},
    {1, "{" F4 "'shape': (1,", 4, "non-negative"},
    {1, "{" F4 "'shape': (1", 4, "expected ',' or ')'"},
    {1, "{" F4 "'shape': (", 4, "non-negative"},
    {1, "{" F4 "'shape': (18446744073709551616,)}", 4, "too large"},
    {1, "{" F4 "'shape': (99999999999999999999999,)}", 4, "too large"},
    {1, "{" F4 "'shape': (4294967296, 4294967296)}", 0, "too many elements"},
    {1, "{" F4 "'shape': (18446744073709551615, 2)}", 0, "too many elements"},
    {1, "{" F4 "'shape': (4611686018427387904,)}", 0, "too many bytes"},
    {1, "{" F4 "'shape': (1, 4611686018427387904)}", 0, "too many bytes"},
    {1,
     "{" F4 "'shape': (1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
     "1,1,1,1,1,)}",
     4, "more than 32"},
    /* data length against the shape */
    {1, "{" F4 "'shape': (2, 3)}", 23, "truncated"},
    {1, "{" F4 "'shape': (2, 3)}", 25, "trailing"},
    {1, "{" F4 "'shape': (2, 3)}", 0, "truncated"},
    {1, "{" F4 "'shape': (0, 3)}", 1, "trailing"},
    {2, "{" F4 "'shape': (2,)}", 7, "truncated"},
    {3, "{" F4 "'shape': (2,)}", 9, "trailing"},
};

START_TEST(test_bad) {
  const struct bad_case *v = &bad[_i];
  size_t len;
  unsigned char *b = make(v->major, v->hdr, v->data_len, &len);
  ql__npy a;
  char err[256];
  memset(&a, 0xab, sizeof a);
  int rv = ql__npy_parse(b, len, &a, err, sizeof err);
  ck_assert_msg(rv == QL_EBADFILE, "case %d accepted", _i);
  ck_assert_msg(strstr(err, v->why) != NULL, "case %d: '%s' lacks '%s'", _i,
                err, v->why);
  ck_assert_ptr_null(a.data); /* *out is zeroed on failure */
  ck_assert_uint_eq(a.count, 0);
  free(b);
}
END_TEST

/* Headers with a NUL byte inside cannot go through make()'s strlen. */
START_TEST(test_nul_in_header) {
  static const char hdr[] = "{'descr': '<f4'\0, 'fortran_order': False, "
                            "'shape': (1,)}";
  unsigned char b[10 + sizeof hdr - 1 + 4];
  memcpy(b, "\x93NUMPY\x01\x00", 8);
  b[8] = (unsigned char)(sizeof hdr - 1);
  b[9] = 0;
  memcpy(b + 10, hdr, sizeof hdr - 1);
  memset(b + 10 + sizeof hdr - 1, 0, 4);
  ql__npy a;
  char err[256];
  ck_assert_int_eq(ql__npy_parse(b, sizeof b, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "expected ',' or '}'"));
}
END_TEST

START_TEST(test_preamble) {
  unsigned char b[64];
  ql__npy a;
  char err[256];
  size_t len;
  unsigned char *f;

  ck_assert_int_eq(ql__npy_parse(NULL, 0, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "magic"));
  ck_assert_int_eq(ql__npy_parse("", 0, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_int_eq(ql__npy_parse("\x93NUMP", 5, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_int_eq(ql__npy_parse("\x93NUMPY\x01", 7, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_int_eq(ql__npy_parse("PK\x03\x04zipfile", 11, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "magic"));
  ck_assert_int_eq(ql__npy_parse("\x92NUMPY\x01\x00\x00\x00", 10, &a, err,
                                 sizeof err),
                   QL_EBADFILE);

  /* preamble cut short: version 1 needs 10 bytes, versions 2/3 need 12 */
  ck_assert_int_eq(ql__npy_parse("\x93NUMPY\x01\x00\x00", 9, &a, err,
                                 sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "preamble"));
  ck_assert_int_eq(ql__npy_parse("\x93NUMPY\x02\x00\x00\x00\x00", 11, &a, err,
                                 sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "preamble"));

  /* versions */
  static const unsigned char vers[][2] = {{0, 0}, {1, 1}, {2, 1}, {4, 0},
                                          {255, 0}, {1, 255}};
  for (size_t i = 0; i < sizeof vers / sizeof vers[0]; i++) {
    f = make(1, "{" F4 "'shape': (1,)}", 4, &len);
    f[6] = vers[i][0];
    f[7] = vers[i][1];
    ck_assert_int_eq(ql__npy_parse(f, len, &a, err, sizeof err), QL_EBADFILE);
    ck_assert_ptr_nonnull(strstr(err, "unsupported .npy format version"));
    free(f);
  }

  /* header length past the end of the file, in each length field size */
  memcpy(b, "\x93NUMPY\x01\x00\xff\xff", 10);
  memset(b + 10, ' ', sizeof b - 10);
  ck_assert_int_eq(ql__npy_parse(b, sizeof b, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "header length 65535 exceeds"));
  memcpy(b, "\x93NUMPY\x02\x00\xff\xff\xff\xff", 12);
  ck_assert_int_eq(ql__npy_parse(b, sizeof b, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "header length 4294967295 exceeds"));
  memcpy(b, "\x93NUMPY\x03\x00\x35\x00\x00\x00", 12); /* 53 > 52 */
  ck_assert_int_eq(ql__npy_parse(b, sizeof b, &a, err, sizeof err),
                   QL_EBADFILE);

  /* header length reaching exactly the end: no data, then truncated */
  f = make(1, "{" F4 "'shape': (1,)}", 0, &len);
  ck_assert_int_eq(ql__npy_parse(f, len, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "truncated"));
  free(f);
}
END_TEST

/* Every prefix of a valid file is invalid, and none reads past the end
 * (ASan checks that, the copy makes every prefix its own allocation). */
START_TEST(test_every_prefix) {
  size_t len;
  unsigned char *f = make(1, "{" F4 "'shape': (2, 3), }   \n", 24, &len);
  ql__npy a;
  char err[256];
  ck_assert_int_eq(ql__npy_parse(f, len, &a, err, sizeof err), 0);
  for (size_t n = 0; n < len; n++) {
    unsigned char *p = malloc(n > 0 ? n : 1);
    memcpy(p, f, n);
    ck_assert_int_eq(ql__npy_parse(p, n, &a, err, sizeof err), QL_EBADFILE);
    ck_assert_str_ne(err, "");
    free(p);
  }
  free(f);
}
END_TEST

START_TEST(test_err_buffer) {
  size_t len;
  unsigned char *f = make(1, "{" F4 "'shape': (1,)}", 3, &len);
  ql__npy a;
  char err[8];
  ck_assert_int_eq(ql__npy_parse(f, len, &a, NULL, 0), QL_EBADFILE);
  ck_assert_int_eq(ql__npy_parse(f, len, &a, err, 0), QL_EBADFILE);
  memset(err, 'x', sizeof err);
  ck_assert_int_eq(ql__npy_parse(f, len, &a, err, 1), QL_EBADFILE);
  ck_assert_int_eq(err[0], '\0');
  ck_assert_int_eq(err[1], 'x'); /* nothing written past errlen */
  ck_assert_int_eq(ql__npy_parse(f, len, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_uint_eq(strlen(err), sizeof err - 1);
  ck_assert_int_eq(ql__npy_parse(f, len, NULL, err, sizeof err), QL_EBADFILE);
  free(f);
}
END_TEST

/* ------------------------------------------------------------ packed types */

/* The types only ql__npy_parse_types() returns: each is accepted when asked
 * for, with the same shape and size checks, and refused by the default
 * parser (qlinearctl's) with the usual reason. */
static const struct valid_case packed[] = {
    {1, "{'descr': '|i1', 'fortran_order': False, 'shape': (2, 3), }\n", 6,
     QL__NPY_I8, 2, 2, 3},
    {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }\n", 5,
     QL__NPY_U8, 1, 5, 1},
    {1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 2), }\n", 24,
     QL__NPY_I32, 2, 3, 2},
    {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 7), }\n", 0,
     QL__NPY_U8, 2, 0, 7},
    {2, "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (1,)}", 4,
     QL__NPY_I32, 1, 1, 1},
    {3, "{'shape': (4, 1), 'fortran_order': False, 'descr': '|i1'}", 4,
     QL__NPY_I8, 2, 4, 1},
    /* a byte has no byte order: any mark is '|' (cnpy writes '<i1') */
    {1, "{'descr': '<i1', 'fortran_order': False, 'shape': (1,)}", 1,
     QL__NPY_I8, 1, 1, 1},
    {1, "{'descr': '>u1', 'fortran_order': False, 'shape': (2,)}", 2,
     QL__NPY_U8, 1, 2, 1},
    {1, "{'descr': '=u1', 'fortran_order': False, 'shape': (2,)}", 2,
     QL__NPY_U8, 1, 2, 1},
};

START_TEST(test_packed) {
  const struct valid_case *v = &packed[_i];
  size_t len;
  unsigned char *b = make(v->major, v->hdr, v->data_len, &len);
  ql__npy a;
  char err[256];

  int rv = ql__npy_parse_types(b, len, QL__NPY_ALL_TYPES, &a, err, sizeof err);
  ck_assert_msg(rv == 0, "case %d: %s", _i, err);
  ck_assert_int_eq(a.type, v->type);
  ck_assert_int_eq(a.ndim, v->ndim);
  ck_assert_uint_eq(a.shape[0], v->d0);
  ck_assert_uint_eq(a.shape[1], v->d1);
  ck_assert_uint_eq(a.elem_size, ql__npy_type_size(v->type));
  ck_assert_uint_eq(a.data_len, v->data_len);
  ck_assert_ptr_eq(a.data, b + len - v->data_len);

  /* exactly its own type is enough */
  rv = ql__npy_parse_types(b, len, QL__NPY_BIT(v->type), &a, err, sizeof err);
  ck_assert_msg(rv == 0, "case %d: %s", _i, err);
  ck_assert_int_eq(a.type, v->type);

  /* the default set (and ql__npy_parse) refuses it, naming what it takes */
  memset(&a, 0xab, sizeof a);
  ck_assert_int_eq(ql__npy_parse(b, len, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_null(a.data);
  ck_assert_msg(strstr(err, "is not supported (only '<f4', '<f2' and "
                            "'<u2')") != NULL, "case %d: %s", _i, err);
  ck_assert_int_eq(ql__npy_parse_types(b, len, QL__NPY_DEFAULT_TYPES, &a, err,
                                       sizeof err),
                   QL_EBADFILE);

  /* the reason lists the set that was asked for */
  ck_assert_int_eq(ql__npy_parse_types(b, len,
                                       QL__NPY_ALL_TYPES &
                                           ~QL__NPY_BIT(v->type),
                                       &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "not supported (only '<f4', "));
  ck_assert_int_eq(ql__npy_parse_types(b, len, 0, &a, err, sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "none asked for"));
  free(b);
}
END_TEST

/* Asking for the packed types changes nothing else: the default types
 * parse as before, and what is malformed stays malformed. */
#define I4 "'descr': '<i4', 'fortran_order': False, "
static const struct bad_case bad_packed[] = {
    {1, "{'descr': '|u2', 'fortran_order': False, 'shape': (1,)}", 2,
     "'|u2' is not supported"},
    {1, "{'descr': '|i4', 'fortran_order': False, 'shape': (1,)}", 4,
     "'|i4' is not supported"},
    {1, "{'descr': '<u4', 'fortran_order': False, 'shape': (1,)}", 4,
     "'<u4' is not supported"},
    {1, "{'descr': '|b1', 'fortran_order': False, 'shape': (1,)}", 1,
     "'|b1' is not supported"},
    {1, "{'descr': '<b1', 'fortran_order': False, 'shape': (1,)}", 1,
     "'<b1' is not supported"},
    {1, "{'descr': '!i1', 'fortran_order': False, 'shape': (1,)}", 1,
     "'!i1' is not supported"},
    {1, "{'descr': 'i1', 'fortran_order': False, 'shape': (1,)}", 1,
     "not supported"},
    {1, "{'descr': '>i4', 'fortran_order': False, 'shape': (1,)}", 4,
     "big-endian"},
    {1, "{" I4 "'shape': (2, 3)}", 23, "truncated"},
    {1, "{" I4 "'shape': (2, 3)}", 25, "trailing"},
    {1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3)}", 7,
     "trailing"},
    {1, "{'descr': '|i1', 'fortran_order': True, 'shape': (2, 3)}", 6,
     "Fortran-order"},
    {1, "{'descr': '|i1', 'fortran_order': False, 'shape': (1, 2, 3)}", 6,
     "3-dimensional"},
    {1, "{'descr': '|i1', 'fortran_order': False, 'shape': ()}", 1,
     "0-dimensional"},
    {1, "{" I4 "'shape': (4611686018427387904,)}", 0, "too many bytes"},
    {1, "{'descr': '|u1', 'fortran_order': False, "
        "'shape': (4294967296, 4294967296)}",
     0, "too many elements"},
    {1, "{'descr': '|u1', 'fortran_order': False, "
        "'shape': (18446744073709551615,)}",
     0, "truncated"},
};

START_TEST(test_bad_packed) {
  const struct bad_case *v = &bad_packed[_i];
  size_t len;
  unsigned char *b = make(v->major, v->hdr, v->data_len, &len);
  ql__npy a;
  char err[256];
  memset(&a, 0xab, sizeof a);
  int rv = ql__npy_parse_types(b, len, QL__NPY_ALL_TYPES, &a, err, sizeof err);
  ck_assert_msg(rv == QL_EBADFILE, "case %d accepted", _i);
  ck_assert_msg(strstr(err, v->why) != NULL, "case %d: '%s' lacks '%s'", _i,
                err, v->why);
  ck_assert_ptr_null(a.data);
  free(b);
}
END_TEST

/* The malformed cases above fail the same way with every type allowed. */
START_TEST(test_bad_all_types) {
  const struct bad_case *v = &bad[_i];
  size_t len;
  unsigned char *b = make(v->major, v->hdr, v->data_len, &len);
  ql__npy a;
  char err[256];
  int rv = ql__npy_parse_types(b, len, QL__NPY_ALL_TYPES, &a, err, sizeof err);
  if (strstr(v->hdr, "'|u1'") != NULL) { /* the one now accepted */
    ck_assert_int_eq(rv, 0);
  } else {
    ck_assert_msg(rv == QL_EBADFILE, "case %d accepted", _i);
    /* the list of accepted types differs, the rest of the reason not */
    const char *why =
        strstr(v->why, "' is not supported") ? v->why : "not supported";
    if (strstr(v->why, "not supported") == NULL)
      why = v->why;
    ck_assert_msg(strstr(err, why) != NULL, "case %d: '%s' lacks '%s'", _i,
                  err, why);
  }
  free(b);
}
END_TEST

/* ------------------------------------------------------------ writer */

static void round_trip(ql__npy_type type, int ndim, uint64_t d0, uint64_t d1) {
  uint64_t shape[2] = {d0, d1};
  size_t esz = ql__npy_type_size(type), count = d0 * (ndim == 2 ? d1 : 1);
  unsigned char *data = malloc(count * esz + 1);
  void *buf;
  size_t len;
  ql__npy a;
  char err[256];

  for (size_t i = 0; i < count * esz; i++)
    data[i] = (unsigned char)(i * 13 + 5);
  ck_assert_int_eq(
      ql__npy_encode(type, ndim, shape, data, &buf, &len, err, sizeof err), 0);
  /* numpy's layout: data aligned to 64 bytes, header ends in '\n' */
  ck_assert_uint_eq((len - count * esz) % 64, 0);
  ck_assert_int_eq(((char *)buf)[len - count * esz - 1], '\n');
  ck_assert_int_eq(
      ql__npy_parse_types(buf, len, QL__NPY_ALL_TYPES, &a, err, sizeof err), 0);
  ck_assert_int_eq(a.type, type);
  ck_assert_int_eq(a.ndim, ndim);
  ck_assert_uint_eq(a.shape[0], d0);
  ck_assert_uint_eq(a.shape[1], ndim == 2 ? d1 : 1);
  ck_assert_uint_eq(a.data_len, count * esz);
  ck_assert_int_eq(memcmp(a.data, data, count * esz), 0);
  free(buf);
  free(data);
}

START_TEST(test_round_trip) {
  round_trip(QL__NPY_F32, 2, 2, 3);
  round_trip(QL__NPY_F32, 1, 7, 0);
  round_trip(QL__NPY_F16, 2, 17, 33);
  round_trip(QL__NPY_F16, 1, 1, 0);
  round_trip(QL__NPY_U16, 2, 1, 1);
  round_trip(QL__NPY_F32, 2, 0, 5);
  round_trip(QL__NPY_F32, 2, 5, 0);
  round_trip(QL__NPY_F32, 1, 0, 0);
  round_trip(QL__NPY_F32, 2, 1, 4096);
  round_trip(QL__NPY_I8, 2, 3, 5);
  round_trip(QL__NPY_U8, 1, 7, 0);
  round_trip(QL__NPY_U8, 2, 0, 3);
  round_trip(QL__NPY_I32, 2, 4, 2);
  round_trip(QL__NPY_I32, 1, 1, 0);
}
END_TEST

/* The exact bytes numpy 2.x writes for np.arange(6, dtype='<f4')
 * .reshape(2, 3): the header is the dict padded to 118 bytes. */
START_TEST(test_numpy_bytes) {
  const float v[6] = {0, 1, 2, 3, 4, 5};
  const uint64_t shape[2] = {2, 3};
  const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': "
                     "(2, 3), }";
  void *buf;
  size_t len;
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 2, shape, v, &buf, &len, NULL, 0), 0);
  ck_assert_uint_eq(len, 152);
  ck_assert_int_eq(memcmp(buf, "\x93NUMPY\x01\x00v\x00", 10), 0);
  ck_assert_int_eq(memcmp((char *)buf + 10, dict, strlen(dict)), 0);
  for (size_t i = 10 + strlen(dict); i < 127; i++)
    ck_assert_int_eq(((char *)buf)[i], ' ');
  ck_assert_int_eq(((char *)buf)[127], '\n');
  ck_assert_int_eq(memcmp((char *)buf + 128, v, sizeof v), 0);
  free(buf);
}
END_TEST

START_TEST(test_encode_errors) {
  const uint64_t shape[2] = {2, 3}, huge[2] = {UINT64_MAX, 2},
                 big[2] = {UINT64_MAX / 2, 1};
  float v[6] = {0};
  void *buf = (void *)1;
  size_t len = 1;
  char err[128];
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 0, shape, v, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_ptr_null(buf);
  ck_assert_uint_eq(len, 0);
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 3, shape, v, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_int_eq(
      ql__npy_encode((ql__npy_type)9, 2, shape, v, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 2, NULL, v, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 2, shape, NULL, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 2, huge, v, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_int_eq(
      ql__npy_encode(QL__NPY_F32, 2, big, v, &buf, &len, err, sizeof err),
      QL_EINVAL);
  ck_assert_ptr_null(buf);
}
END_TEST

/* ------------------------------------------------------------ files */

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/test_npy.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", tmpdir);
}

START_TEST(test_files) {
  char path[128], err[256];
  const uint16_t v[4] = {1, 2, 0x3c00, 0xffff};
  const uint64_t shape[2] = {2, 2};
  ql__npy a;

  snprintf(path, sizeof path, "%s/a.npy", tmpdir);
  ck_assert_int_eq(
      ql__npy_write(path, QL__NPY_F16, 2, shape, v, err, sizeof err), 0);
  ck_assert_int_eq(ql__npy_load(path, &a, err, sizeof err), 0);
  ck_assert_ptr_nonnull(a.owned);
  ck_assert_int_eq(a.type, QL__NPY_F16);
  ck_assert_uint_eq(a.shape[0], 2);
  ck_assert_uint_eq(a.shape[1], 2);
  ck_assert_int_eq(memcmp(a.data, v, sizeof v), 0);
  ql__npy_free(&a);
  ck_assert_ptr_null(a.owned);
  ql__npy_free(&a); /* twice is fine: the struct was zeroed */
  ql__npy_free(NULL);

  /* a large file goes through the same path */
  float *big = calloc(1024 * 1024, sizeof *big);
  const uint64_t bshape[2] = {1024, 1024};
  big[12345] = 3.5f;
  ck_assert_int_eq(
      ql__npy_write(path, QL__NPY_F32, 2, bshape, big, err, sizeof err), 0);
  ck_assert_int_eq(ql__npy_load(path, &a, err, sizeof err), 0);
  ck_assert_int_eq(memcmp(a.data, big, 4u << 20), 0);
  ql__npy_free(&a);
  free(big);

  /* a packed type: only ql__npy_load_types() takes it */
  const int32_t iv[4] = {-1, 0x7fffffff, 8, -2147483647 - 1};
  ck_assert_int_eq(
      ql__npy_write(path, QL__NPY_I32, 2, shape, iv, err, sizeof err), 0);
  ck_assert_int_eq(ql__npy_load(path, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_null(a.owned);
  ck_assert_ptr_nonnull(strstr(err, "'<i4' is not supported"));
  ck_assert_int_eq(ql__npy_load_types(path, QL__NPY_BIT(QL__NPY_I32), &a, err,
                                      sizeof err),
                   0);
  ck_assert_ptr_nonnull(a.owned);
  ck_assert_int_eq(a.type, QL__NPY_I32);
  ck_assert_int_eq(memcmp(a.data, iv, sizeof iv), 0);
  ql__npy_free(&a);
  ck_assert_int_eq(ql__npy_load_types(path, QL__NPY_BIT(QL__NPY_I8), &a, err,
                                      sizeof err),
                   QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "(only '|i1')"));
  snprintf(path, sizeof path, "%s/missing.npy", tmpdir);
  ck_assert_int_eq(
      ql__npy_load_types(path, QL__NPY_ALL_TYPES, &a, err, sizeof err),
      QL_EIO);
  snprintf(path, sizeof path, "%s/a.npy", tmpdir);

  /* a malformed file: QL_EBADFILE, nothing held */
  FILE *f = fopen(path, "wb");
  ck_assert_uint_eq(fwrite("\x93NUMPY\x01\x00\x04\x00{}\n\n", 1, 14, f), 14);
  fclose(f);
  ck_assert_int_eq(ql__npy_load(path, &a, err, sizeof err), QL_EBADFILE);
  ck_assert_ptr_null(a.owned);
  ck_assert_ptr_nonnull(strstr(err, "lacks the key"));

  /* an empty file */
  f = fopen(path, "wb");
  fclose(f);
  ck_assert_int_eq(ql__npy_load(path, &a, err, sizeof err), QL_EBADFILE);

  /* files that cannot be read or written */
  snprintf(path, sizeof path, "%s/missing.npy", tmpdir);
  ck_assert_int_eq(ql__npy_load(path, &a, err, sizeof err), QL_EIO);
  ck_assert_ptr_nonnull(strstr(err, "No such file"));
  ck_assert_int_eq(ql__npy_load(tmpdir, &a, err, sizeof err), QL_EIO);
  ck_assert_ptr_nonnull(strstr(err, "directory"));
  snprintf(path, sizeof path, "%s/no/such/dir.npy", tmpdir);
  ck_assert_int_eq(
      ql__npy_write(path, QL__NPY_F16, 2, shape, v, err, sizeof err), QL_EIO);
  ck_assert_int_eq(
      ql__npy_write(tmpdir, QL__NPY_F16, 2, shape, v, err, sizeof err),
      QL_EIO);
  ck_assert_int_eq(ql__npy_load(NULL, &a, err, sizeof err), QL_EINVAL);
  ck_assert_int_eq(
      ql__npy_write(NULL, QL__NPY_F16, 2, shape, v, err, sizeof err),
      QL_EINVAL);

  /* /dev/full: the write fails, the error is reported */
  if (access("/dev/full", W_OK) == 0)
    ck_assert_int_eq(
        ql__npy_write("/dev/full", QL__NPY_F16, 2, shape, v, err, sizeof err),
        QL_EIO);
}
END_TEST

START_TEST(test_types) {
  ck_assert_uint_eq(ql__npy_type_size(QL__NPY_F32), 4);
  ck_assert_uint_eq(ql__npy_type_size(QL__NPY_F16), 2);
  ck_assert_uint_eq(ql__npy_type_size(QL__NPY_U16), 2);
  ck_assert_uint_eq(ql__npy_type_size((ql__npy_type)0), 0);
  ck_assert_str_eq(ql__npy_type_descr(QL__NPY_U16), "<u2");
  ck_assert_ptr_null(ql__npy_type_descr((ql__npy_type)7));
  ck_assert_uint_eq(ql__npy_type_size(QL__NPY_I8), 1);
  ck_assert_uint_eq(ql__npy_type_size(QL__NPY_U8), 1);
  ck_assert_uint_eq(ql__npy_type_size(QL__NPY_I32), 4);
  ck_assert_uint_eq(ql__npy_type_size((ql__npy_type)7), 0);
  ck_assert_str_eq(ql__npy_type_descr(QL__NPY_I8), "|i1");
  ck_assert_str_eq(ql__npy_type_descr(QL__NPY_U8), "|u1");
  ck_assert_str_eq(ql__npy_type_descr(QL__NPY_I32), "<i4");
  /* the sets: the default is what qlinearctl takes, all adds the rest */
  ck_assert_uint_eq(QL__NPY_DEFAULT_TYPES, 0xe);
  ck_assert_uint_eq(QL__NPY_ALL_TYPES, 0x7e);
}
END_TEST

static Suite *npy_suite(void) {
  Suite *s = suite_create("npy");
  TCase *tc = tcase_create("parse");
  tcase_add_loop_test(tc, test_valid, 0, sizeof valid / sizeof valid[0]);
  tcase_add_loop_test(tc, test_bad, 0, sizeof bad / sizeof bad[0]);
  tcase_add_test(tc, test_nul_in_header);
  tcase_add_test(tc, test_preamble);
  tcase_add_test(tc, test_every_prefix);
  tcase_add_test(tc, test_err_buffer);
  tcase_add_test(tc, test_types);
  tcase_add_loop_test(tc, test_packed, 0, sizeof packed / sizeof packed[0]);
  tcase_add_loop_test(tc, test_bad_packed, 0,
                      sizeof bad_packed / sizeof bad_packed[0]);
  tcase_add_loop_test(tc, test_bad_all_types, 0, sizeof bad / sizeof bad[0]);
  suite_add_tcase(s, tc);

  tc = tcase_create("write");
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_numpy_bytes);
  tcase_add_test(tc, test_encode_errors);
  suite_add_tcase(s, tc);

  tc = tcase_create("files");
  tcase_add_unchecked_fixture(tc, make_tmpdir, remove_tmpdir);
  tcase_add_test(tc, test_files);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(npy_suite(), CK_NORMAL); }
