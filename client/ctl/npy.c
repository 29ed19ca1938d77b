/*
 * npy.c - NumPy .npy reading and writing for qlinearctl (see npy.h).
 *
 * The format (numpy/lib/format.py): the magic "\x93NUMPY", a major and a
 * minor version byte, the header length (2 bytes little-endian in 1.0, 4
 * bytes in 2.0 and 3.0), then the header: a Python dict literal with the
 * keys 'descr', 'fortran_order' and 'shape', padded with spaces and ending
 * in '\n'; the raw array data follows. The header is parsed here with a
 * small hand-written grammar for exactly those literals, never evaluated.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"

/* The array bytes are handed on as they are, and both '<' in the header and
 * the daemon's wire format are little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
#define MAX_DIMS 32   /* parsed before "only 1 or 2" is reported */
#define MAX_STRING 64 /* longest string literal we care to read */

__attribute__((format(printf, 3, 4))) static int fail(char *err,
                                                      size_t errlen,
                                                      const char *fmt, ...) {
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return QL_EBADFILE;
}

/* Every type we know, in the order an error message lists them, with its
 * descr exactly as numpy writes it (1-byte types carry '|': no byte
 * order). */
static const struct {
  ql__npy_type type;
  const char *descr;
  size_t size;
} types_known[] = {
    {QL__NPY_F32, "<f4", 4}, {QL__NPY_F16, "<f2", 2}, {QL__NPY_U16, "<u2", 2},
    {QL__NPY_I8, "|i1", 1},  {QL__NPY_U8, "|u1", 1},  {QL__NPY_I32, "<i4", 4},
};
#define N_TYPES (sizeof types_known / sizeof types_known[0])

size_t ql__npy_type_size(ql__npy_type type) {
  for (size_t i = 0; i < N_TYPES; i++)
    if (types_known[i].type == type)
      return types_known[i].size;
  return 0;
}

const char *ql__npy_type_descr(ql__npy_type type) {
  for (size_t i = 0; i < N_TYPES; i++)
    if (types_known[i].type == type)
      return types_known[i].descr;
  return NULL;
}

int ql__npy_adt(ql__npy_type type, int u8_is_f8) {
  switch ((int)type) {
  case QL__NPY_F32:
    return QL_ADT_F32;
  case QL__NPY_F16:
    return QL_ADT_F16;
  case QL__NPY_U16:
    return QL_ADT_BF16;
  case (int)QL__NPY_I8:
    return QL_ADT_I8;
  case (int)QL__NPY_U8:
    return u8_is_f8 ? QL_ADT_F8E4M3 : QL_ADT_U8;
  case (int)QL__NPY_I32:
    return QL_ADT_I32;
  }
  return 0;
}

/* ------------------------------------------------------------ header */

/* A cursor over the header text; errors name the offset within it. */
typedef struct cursor {
  const char *start, *p, *end;
  char *err;
  size_t errlen;
} cursor;

static void skip_ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' ||
                           *c->p == '\r' || *c->p == '\f'))
    c->p++;
}

static size_t where(const cursor *c) { return (size_t)(c->p - c->start); }

static int expect(cursor *c, char ch, const char *what) {
  skip_ws(c);
  if (c->p >= c->end)
    return fail(c->err, c->errlen, "header ends where %s was expected",
                what);
  if (*c->p != ch)
    return fail(c->err, c->errlen, "header byte %zu: expected %s", where(c),
                what);
  c->p++;
  return 0;
}

/* A Python string literal in single or double quotes, without escapes (no
 * key or dtype we accept needs one). *s points into the header. */
static int parse_string(cursor *c, const char **s, size_t *len) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
    return fail(c->err, c->errlen, "header byte %zu: expected a string",
                where(c));
  char q = *c->p++;
  const char *begin = c->p;
  while (c->p < c->end && *c->p != q) {
    unsigned char ch = (unsigned char)*c->p;
    if (ch == '\\' || ch < 0x20 || ch >= 0x7f)
      return fail(c->err, c->errlen,
                  "header byte %zu: unsupported character in a string",
                  where(c));
    if ((size_t)(c->p - begin) >= MAX_STRING)
      return fail(c->err, c->errlen, "header byte %zu: string too long",
                  where(c));
    c->p++;
  }
  if (c->p >= c->end)
    return fail(c->err, c->errlen, "header: unterminated string");
  *s = begin;
  *len = (size_t)(c->p - begin);
  c->p++;
  return 0;
}

static bool word_is(const char *s, size_t len, const char *w) {
  return strlen(w) == len && memcmp(s, w, len) == 0;
}

static bool is_ident_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || ch == '_';
}

static int parse_bool(cursor *c, bool *v) {
  skip_ws(c);
  const char *begin = c->p;
  while (c->p < c->end && is_ident_char(*c->p))
    c->p++;
  size_t len = (size_t)(c->p - begin);
  if (word_is(begin, len, "True"))
    *v = true;
  else if (word_is(begin, len, "False"))
    *v = false;
  else
    return fail(c->err, c->errlen,
                "header byte %zu: fortran_order must be True or False",
                (size_t)(begin - c->start));
  return 0;
}

/* A non-negative decimal integer; an 'L' suffix (Python 2 numpy) is
 * allowed. */
static int parse_dim(cursor *c, uint64_t *v) {
  uint64_t x = 0;
  const char *begin = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    unsigned d = (unsigned)(*c->p - '0');
    if (x > (UINT64_MAX - d) / 10)
      return fail(c->err, c->errlen, "header byte %zu: dimension too large",
                  (size_t)(begin - c->start));
    x = x * 10 + d;
    c->p++;
  }
  if (c->p == begin)
    return fail(c->err, c->errlen,
                "header byte %zu: expected a non-negative dimension",
                where(c));
  if (c->p < c->end && (*c->p == 'L' || *c->p == 'l'))
    c->p++;
  if (c->p < c->end && is_ident_char(*c->p))
    return fail(c->err, c->errlen, "header byte %zu: malformed dimension",
                where(c));
  *v = x;
  return 0;
}

/* A tuple of dimensions: "()", "(3,)", "(2, 3)", "(2, 3,)". A single
 * element without a comma is a parenthesised int in Python, not a tuple. */
static int parse_shape(cursor *c, uint64_t *dims, int *ndim) {
  int rv, n = 0;
  bool comma = false;
  if ((rv = expect(c, '(', "'(' opening the shape")) != 0)
    return rv;
  for (;;) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ')')
      break;
    if (n > 0 && !comma)
      return fail(c->err, c->errlen, "header byte %zu: expected ',' or ')' "
                                     "in the shape", where(c));
    if (n == MAX_DIMS)
      return fail(c->err, c->errlen, "shape has more than %d dimensions",
                  MAX_DIMS);
    if ((rv = parse_dim(c, &dims[n])) != 0)
      return rv;
    n++;
    skip_ws(c);
    comma = c->p < c->end && *c->p == ',';
    if (comma)
      c->p++;
  }
  if (n == 1 && !comma)
    return fail(c->err, c->errlen,
                "shape is not a tuple: a single dimension needs a trailing "
                "comma, as in (3,)");
  c->p++; /* ')' */
  *ndim = n;
  return 0;
}

typedef struct header {
  const char *descr;
  size_t descr_len;
  bool fortran;
  uint64_t dims[MAX_DIMS];
  int ndim;
} header;

static int parse_dict(cursor *c, header *h) {
  bool seen_descr = false, seen_fortran = false, seen_shape = false;
  int rv;

  if ((rv = expect(c, '{', "'{' opening the header dict")) != 0)
    return rv;
  for (;;) {
    const char *key;
    size_t klen;
    bool *seen;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}')
      break;
    size_t key_at = where(c);
    if ((rv = parse_string(c, &key, &klen)) != 0)
      return rv;
    if ((rv = expect(c, ':', "':' after a key")) != 0)
      return rv;
    if (word_is(key, klen, "descr")) {
      seen = &seen_descr;
      skip_ws(c);
      if (c->p < c->end && *c->p != '\'' && *c->p != '"')
        return fail(c->err, c->errlen, "header byte %zu: descr is not a "
                                       "type string such as '<f4' "
                                       "(structured types are not "
                                       "supported)", where(c));
      rv = parse_string(c, &h->descr, &h->descr_len);
    } else if (word_is(key, klen, "fortran_order")) {
      seen = &seen_fortran;
      rv = parse_bool(c, &h->fortran);
    } else if (word_is(key, klen, "shape")) {
      seen = &seen_shape;
      rv = parse_shape(c, h->dims, &h->ndim);
    } else {
      return fail(c->err, c->errlen, "header byte %zu: unexpected key '%.*s'",
                  key_at, (int)klen, key);
    }
    if (rv != 0)
      return rv;
    if (*seen)
      return fail(c->err, c->errlen, "header byte %zu: key '%.*s' repeated",
                  key_at, (int)klen, key);
    *seen = true;
    skip_ws(c);
    if (c->p < c->end && *c->p == ',') {
      c->p++;
      continue;
    }
    if (c->p < c->end && *c->p == '}')
      break;
    return fail(c->err, c->errlen, "header byte %zu: expected ',' or '}'",
                where(c));
  }
  c->p++; /* '}' */
  skip_ws(c);
  if (c->p != c->end)
    return fail(c->err, c->errlen, "header byte %zu: unexpected text after "
                                   "the dict", where(c));
  if (!seen_descr || !seen_fortran || !seen_shape)
    return fail(c->err, c->errlen, "header lacks the key '%s'",
                !seen_descr ? "descr"
                : !seen_fortran ? "fortran_order"
                                : "shape");
  return 0;
}

/* ------------------------------------------------------------ parse */

static uint32_t get_le(const unsigned char *p, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = (v << 8) | p[i];
  return v;
}

/* "'<f4', '<f2' and '<u2'": the types in the set, for an error message. */
static void list_types(unsigned types, char *buf, size_t len) {
  size_t n = 0, at = 0, seen = 0;
  for (size_t i = 0; i < N_TYPES; i++)
    n += (types & QL__NPY_BIT(types_known[i].type)) != 0;
  buf[0] = '\0';
  for (size_t i = 0; i < N_TYPES && at < len; i++) {
    if (!(types & QL__NPY_BIT(types_known[i].type)))
      continue;
    seen++;
    int w = snprintf(buf + at, len - at, "%s'%s'",
                     seen == 1 ? "" : seen == n ? " and " : ", ",
                     types_known[i].descr);
    if (w < 0)
      break;
    at += (size_t)w;
  }
}

int ql__npy_parse(const void *buf, size_t len, ql__npy *out, char *err,
                  size_t errlen) {
  return ql__npy_parse_types(buf, len, QL__NPY_DEFAULT_TYPES, out, err,
                             errlen);
}

int ql__npy_parse_types(const void *buf, size_t len, unsigned types,
                        ql__npy *out, char *err, size_t errlen) {
  const unsigned char *b = buf;
  size_t prefix, hlen, esz;
  ql__npy_type type = (ql__npy_type)0;
  header h;
  uint64_t count, bytes;
  int rv;

  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (out == NULL)
    return fail(err, errlen, "no output");
  memset(out, 0, sizeof *out);
  if (b == NULL && len > 0)
    return fail(err, errlen, "no input");

  if (len < MAGIC_LEN + 2 || memcmp(b, MAGIC, MAGIC_LEN) != 0)
    return fail(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
  unsigned major = b[6], minor = b[7];
  if (minor != 0 || major < 1 || major > 3)
    return fail(err, errlen, "unsupported .npy format version %u.%u", major,
                minor);
  prefix = major == 1 ? 10 : 12;
  if (len < prefix)
    return fail(err, errlen, "file of %zu bytes ends inside the preamble",
                len);
  hlen = get_le(b + 8, major == 1 ? 2 : 4);
  if (hlen > len - prefix)
    return fail(err, errlen, "header length %zu exceeds the %zu bytes after "
                             "the preamble", hlen, len - prefix);

  memset(&h, 0, sizeof h);
  cursor c = {(const char *)b + prefix, (const char *)b + prefix,
              (const char *)b + prefix + hlen, err, errlen};
  if ((rv = parse_dict(&c, &h)) != 0)
    return rv;

  types &= QL__NPY_ALL_TYPES;
  for (size_t i = 0; i < N_TYPES; i++) {
    const char *want = types_known[i].descr;
    if (!(types & QL__NPY_BIT(types_known[i].type)))
      continue;
    if (word_is(h.descr, h.descr_len, want))
      type = types_known[i].type;
    /* A byte has no byte order: '<u1', '>i1' and '=u1' are '|u1'. */
    else if (types_known[i].size == 1 && h.descr_len == 3 &&
             strchr("<>=|", h.descr[0]) != NULL &&
             memcmp(h.descr + 1, want + 1, 2) == 0)
      type = types_known[i].type;
  }
  if (type == 0 && h.descr_len == 3 && h.descr[0] == '>' && h.descr[2] != '1')
    return fail(err, errlen, "big-endian data ('%.*s') is not supported",
                (int)h.descr_len, h.descr);
  if (type == 0) {
    char list[64];
    list_types(types, list, sizeof list);
    return fail(err, errlen, "data type '%.*s' is not supported (only %s)",
                (int)h.descr_len, h.descr, types ? list : "none asked for");
  }
  if (h.fortran)
    return fail(err, errlen, "Fortran-order arrays are not supported");
  if (h.ndim < 1 || h.ndim > 2)
    return fail(err, errlen, "%d-dimensional arrays are not supported (only "
                             "1 or 2 dimensions)", h.ndim);

  esz = ql__npy_type_size(type);
  uint64_t d0 = h.dims[0], d1 = h.ndim == 2 ? h.dims[1] : 1;
  if (d1 != 0 && d0 > UINT64_MAX / d1)
    return fail(err, errlen, "shape overflows: too many elements");
  count = d0 * d1;
  if (count > UINT64_MAX / esz || count * esz > SIZE_MAX)
    return fail(err, errlen, "shape overflows: too many bytes");
  bytes = count * esz;
  size_t avail = len - prefix - hlen;
  if (bytes != avail)
    return fail(err, errlen, "data of %zu bytes, the shape needs %llu (%s)",
                avail, (unsigned long long)bytes,
                avail < bytes ? "truncated" : "trailing bytes");

  out->type = type;
  out->elem_size = esz;
  out->ndim = h.ndim;
  out->shape[0] = d0;
  out->shape[1] = d1;
  out->count = count;
  out->data = b + prefix + hlen;
  out->data_len = (size_t)bytes;
  return 0;
}

/* ------------------------------------------------------------ files */

int ql__npy_load(const char *path, ql__npy *out, char *err, size_t errlen) {
  return ql__npy_load_types(path, QL__NPY_DEFAULT_TYPES, out, err, errlen);
}

int ql__npy_load_types(const char *path, unsigned types, ql__npy *out,
                       char *err, size_t errlen) {
  unsigned char *buf = NULL;
  size_t len = 0, cap;
  struct stat st;
  int fd = -1, rv;

  if (out != NULL)
    memset(out, 0, sizeof *out);
  if (path == NULL || out == NULL) {
    fail(err, errlen, "no path or output");
    return QL_EINVAL;
  }
  if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &st) != 0) {
    fail(err, errlen, "%s", strerror(errno));
    rv = QL_EIO;
    goto fail;
  }
  /* One read of the announced size for a regular file (plus one byte to
   * see the end); grow as needed for pipes or a file that grows. */
  cap = S_ISREG(st.st_mode) && (uint64_t)st.st_size < SIZE_MAX - 1
            ? (size_t)st.st_size + 1
            : 65536;
  if ((buf = malloc(cap)) == NULL) {
    fail(err, errlen, "cannot allocate %zu bytes", cap);
    rv = QL_ENOMEM;
    goto fail;
  }
  for (;;) {
    if (len == cap) {
      unsigned char *nb;
      if (cap > SIZE_MAX / 2 || (nb = realloc(buf, cap * 2)) == NULL) {
        fail(err, errlen, "cannot allocate %zu bytes", cap);
        rv = QL_ENOMEM;
        goto fail;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      fail(err, errlen, "%s", strerror(errno));
      rv = QL_EIO;
      goto fail;
    }
    if (got == 0)
      break;
    len += (size_t)got;
  }
  close(fd);
  fd = -1;
  if ((rv = ql__npy_parse_types(buf, len, types, out, err, errlen)) != 0)
    goto fail;
  out->owned = buf;
  return 0;

fail:
  if (fd >= 0)
    close(fd);
  free(buf);
  return rv;
}

void ql__npy_free(ql__npy *a) {
  if (a == NULL)
    return;
  free(a->owned);
  memset(a, 0, sizeof *a);
}

int ql__npy_encode(ql__npy_type type, int ndim, const uint64_t *shape,
                   const void *data, void **out, size_t *out_len, char *err,
                   size_t errlen) {
  char head[256];
  const char *descr = ql__npy_type_descr(type);
  size_t esz = ql__npy_type_size(type);
  uint64_t count;
  int n;

  if (out != NULL)
    *out = NULL;
  if (out_len != NULL)
    *out_len = 0;
  if (descr == NULL || ndim < 1 || ndim > 2 || shape == NULL || out == NULL ||
      out_len == NULL) {
    fail(err, errlen, "bad arguments");
    return QL_EINVAL;
  }
  count = shape[0];
  if (ndim == 2 && shape[1] != 0 && count > UINT64_MAX / shape[1]) {
    fail(err, errlen, "shape overflows");
    return QL_EINVAL;
  }
  if (ndim == 2)
    count *= shape[1];
  if (count > (SIZE_MAX - 1024) / esz) {
    fail(err, errlen, "array too large");
    return QL_EINVAL;
  }
  if (count > 0 && data == NULL) {
    fail(err, errlen, "no data");
    return QL_EINVAL;
  }
  size_t bytes = (size_t)count * esz;

  /* numpy's own layout: the dict, spaces, '\n', so that the data starts at
   * a multiple of 64 bytes. */
  if (ndim == 1)
    n = snprintf(head, sizeof head,
                 "{'descr': '%s', 'fortran_order': False, 'shape': (%llu,), }",
                 descr, (unsigned long long)shape[0]);
  else
    n = snprintf(head, sizeof head,
                 "{'descr': '%s', 'fortran_order': False, 'shape': (%llu, "
                 "%llu), }",
                 descr, (unsigned long long)shape[0],
                 (unsigned long long)shape[1]);
  if (n < 0 || (size_t)n >= sizeof head) {
    fail(err, errlen, "header too long");
    return QL_EINVAL;
  }
  size_t total_head = 10 + (size_t)n + 1;
  total_head = (total_head + 63) / 64 * 64;
  size_t hlen = total_head - 10;

  unsigned char *b = malloc(total_head + bytes);
  if (b == NULL) {
    fail(err, errlen, "cannot allocate %zu bytes", total_head + bytes);
    return QL_ENOMEM;
  }
  memcpy(b, MAGIC, MAGIC_LEN);
  b[6] = 1;
  b[7] = 0;
  b[8] = (unsigned char)(hlen & 0xff);
  b[9] = (unsigned char)(hlen >> 8);
  memcpy(b + 10, head, (size_t)n);
  memset(b + 10 + n, ' ', hlen - (size_t)n - 1);
  b[total_head - 1] = '\n';
  if (bytes > 0)
    memcpy(b + total_head, data, bytes);
  *out = b;
  *out_len = total_head + bytes;
  return 0;
}

int ql__npy_write(const char *path, ql__npy_type type, int ndim,
                  const uint64_t *shape, const void *data, char *err,
                  size_t errlen) {
  void *buf = NULL;
  size_t len, off = 0;
  int fd = -1, rv;
  bool created = false; /* remove what we wrote if we fail */

  if (path == NULL) {
    fail(err, errlen, "no path");
    return QL_EINVAL;
  }
  if ((rv = ql__npy_encode(type, ndim, shape, data, &buf, &len, err,
                           errlen)) != 0)
    return rv;
  if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)) < 0) {
    fail(err, errlen, "%s", strerror(errno));
    rv = QL_EIO;
    goto fail;
  }
  /* Only a regular file is removed after a failure: the path may name a
   * device or a pipe (-o /dev/stdout). */
  struct stat st;
  created = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  while (off < len) {
    ssize_t put = write(fd, (const char *)buf + off, len - off);
    if (put < 0 && errno == EINTR)
      continue;
    if (put < 0) {
      fail(err, errlen, "%s", strerror(errno));
      rv = QL_EIO;
      goto fail;
    }
    off += (size_t)put;
  }
  rv = close(fd);
  fd = -1;
  if (rv != 0) {
    fail(err, errlen, "%s", strerror(errno));
    rv = QL_EIO;
    goto fail;
  }
  free(buf);
  return 0;

fail:
  if (fd >= 0)
    close(fd);
  if (created)
    unlink(path);
  free(buf);
  return rv;
}
