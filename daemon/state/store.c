/*
 * store.c - the persistent weight store: see store.h for the directory
 * layout and the file format.
 *
 * The header is JSON read from files that may be truncated, corrupted or
 * planted, so it is parsed with jansson (a maintained, widely fuzzed JSON
 * library: strict RFC 8259, duplicate keys refused, bounded nesting) rather
 * than by hand; this file only walks the parsed tree and checks every value.
 * The arrays then go through ql_qweight_import(), the same checks a client
 * import gets, and the content digest closes the loop: a file loads only if
 * it holds exactly the weight that was acknowledged.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "import.h"
#include "log.h"
#include "ql_errno.h"
#include "wire/protocol.h"
#include "state/store.h"

#define SUFFIX ".safetensors"
#define SUFFIX_LEN (sizeof SUFFIX - 1)
#define TMP_MARK SUFFIX ".tmp-"
#define DIGEST_HEX (2 * QL_DIGEST_BYTES)
#define TAG_HEX 32
/* <64 hex>-<32 hex>.safetensors */
#define FILE_NAME_LEN (DIGEST_HEX + 1 + TAG_HEX + SUFFIX_LEN)

struct ql__store {
  char *dir;
  int dirfd;         /* O_DIRECTORY, flock'ed for the store's life */
  atomic_uint seq;   /* temp file names */
};

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t errlen,
                                                      int rc, const char *fmt,
                                                      ...) {
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

static void hex_encode(const uint8_t *p, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[p[i] >> 4];
    out[2 * i + 1] = digits[p[i] & 15];
  }
  out[2 * n] = '\0';
}

static int hex_val(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1; /* uppercase is refused: the writer never produces it */
}

/* Exactly 2n lowercase hex digits into n bytes; 0 or -1. */
static int hex_decode(const char *s, uint8_t *out, size_t n) {
  if (strlen(s) != 2 * n)
    return -1;
  for (size_t i = 0; i < n; i++) {
    int hi = hex_val(s[2 * i]), lo = hex_val(s[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

/* ------------------------------------------------------------- names */

static const char *const format_names[] = {NULL, "q4g", "q8c", "q8b", "f8r"};
static const char *const dtype_names[] = {NULL, "f32", "f16", "bf16"};
static const char *const policy_names[] = {"auto", "weight_only",
                                           "act_quant"};

/* safetensors dtype strings, indexed by ql_array_dtype. */
static const char *const st_dtypes[] = {NULL, "F32", "F16",    "BF16",
                                        "I8", "U8",  "I32", "F8_E4M3"};
#define N_ST_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

static int lookup(const char *const *names, int count, const char *s) {
  for (int i = 0; i < count; i++)
    if (names[i] != NULL && strcmp(names[i], s) == 0)
      return i;
  return -1;
}

/* The name tag of the file name: 16 bytes of a domain-separated SHA-256
 * of the name (the NUL keeps "a"+"b" apart from "ab" in the prefix). */
static int name_tag(const char *name, char out[TAG_HEX + 1]) {
  static const char domain[] = "qlinear-store-name"; /* + its NUL */
  uint8_t md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  int ok = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == NULL)
    return QL_ENOMEM;
  ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
       EVP_DigestUpdate(ctx, domain, sizeof domain) == 1 &&
       EVP_DigestUpdate(ctx, name, strlen(name)) == 1 &&
       EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen >= TAG_HEX / 2;
  EVP_MD_CTX_free(ctx);
  if (!ok)
    return QL_EINTERNAL;
  hex_encode(md, TAG_HEX / 2, out);
  return 0;
}

int ql__store_file_name(const char *name,
                        const uint8_t digest[QL_DIGEST_BYTES],
                        char buf[QL_STORE_FILE_NAME_MAX]) {
  char tag[TAG_HEX + 1];
  int rc;
  if ((rc = name_tag(name, tag)) != 0)
    return rc;
  hex_encode(digest, QL_DIGEST_BYTES, buf);
  buf[DIGEST_HEX] = '-';
  memcpy(buf + DIGEST_HEX + 1, tag, TAG_HEX);
  memcpy(buf + DIGEST_HEX + 1 + TAG_HEX, SUFFIX, SUFFIX_LEN + 1);
  return 0;
}

/* True for a file name of the <digest>-<tag>.safetensors form. */
static int well_formed(const char *f) {
  if (strlen(f) != FILE_NAME_LEN || f[DIGEST_HEX] != '-' ||
      strcmp(f + DIGEST_HEX + 1 + TAG_HEX, SUFFIX) != 0)
    return 0;
  for (size_t i = 0; i < DIGEST_HEX + 1 + TAG_HEX; i++)
    if (i != DIGEST_HEX && hex_val(f[i]) < 0)
      return 0;
  return 1;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ------------------------------------------------------------ header */

/* Shapes of the canonical arrays (ql_kernels.h). */
static void qdata_shape(const ql_qweight *q, json_int_t d[2]) {
  d[0] = q->n;
  d[1] = q->format == QL_FORMAT_Q4G ? q->k / 2 + (q->k & 1) : q->k;
}

static int scale_is_grouped(ql_format f) {
  return f == QL_FORMAT_Q4G || f == QL_FORMAT_Q8B;
}

static int qdata_adt(ql_format f) {
  return f == QL_FORMAT_Q4G   ? QL_ADT_U8
         : f == QL_FORMAT_F8R ? QL_ADT_F8E4M3
                              : QL_ADT_I8;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} */
static json_t *tensor_json(int adt, int ndim, const json_int_t *shape,
                           size_t begin, size_t end) {
  json_t *t = json_object(), *sh = json_array(), *off = json_array();
  int bad = t == NULL || sh == NULL || off == NULL;
  for (int i = 0; i < ndim && !bad; i++)
    bad = json_array_append_new(sh, json_integer(shape[i])) != 0;
  if (!bad)
    bad = json_array_append_new(off, json_integer((json_int_t)begin)) != 0 ||
          json_array_append_new(off, json_integer((json_int_t)end)) != 0 ||
          json_object_set_new(t, "dtype", json_string(st_dtypes[adt])) != 0;
  if (!bad) {
    bad = json_object_set_new(t, "shape", sh) != 0;
    sh = NULL;
  }
  if (!bad) {
    bad = json_object_set_new(t, "data_offsets", off) != 0;
    off = NULL;
  }
  json_decref(sh);
  json_decref(off);
  if (bad) {
    json_decref(t);
    return NULL;
  }
  return t;
}

static int set_str(json_t *o, const char *k, const char *v) {
  return json_object_set_new(o, k, json_string(v));
}

static int set_u64(json_t *o, const char *k, uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  return set_str(o, k, buf);
}

/* A "devices" value the reader accepts: device-name characters and
 * commas, non-empty items, shorter than QL_STORE_DEVICES_MAX. */
static int devices_valid(const char *s) {
  size_t n = strlen(s);
  if (n >= QL_STORE_DEVICES_MAX || s[0] == ',' || (n > 0 && s[n - 1] == ','))
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == ':' || c == '-' || c == ',') ||
        (c == ',' && s[i + 1] == ','))
      return 0;
  }
  return 1;
}

int ql__store_header(const char *name, const ql_qweight *q,
                     const uint8_t digest[QL_DIGEST_BYTES], ql_path policy,
                     const char *devices, uint8_t **hdr, size_t *hdr_len) {
  json_t *root = NULL, *meta = NULL, *t;
  char hex[DIGEST_HEX + 1], *js = NULL;
  json_int_t shape[2];
  size_t at = 0, jlen, total;
  int rc = QL_ENOMEM, bad = 0;

  *hdr = NULL;
  *hdr_len = 0;
  if (name == NULL || q == NULL || !ql_format_valid(q->format) ||
      !ql_dtype_valid(q->scale_dtype) || !ql_path_valid(policy) ||
      (devices != NULL && !devices_valid(devices)))
    return QL_EINVAL;
  if ((root = json_object()) == NULL || (meta = json_object()) == NULL)
    goto done;
  hex_encode(digest, QL_DIGEST_BYTES, hex);
  bad = set_str(meta, "qlinear_store_version", QL_STORE_VERSION) ||
        set_str(meta, "name", name) ||
        set_str(meta, "format", format_names[q->format]) ||
        set_u64(meta, "group_size", q->group_size) ||
        set_u64(meta, "n", (uint64_t)q->n) ||
        set_u64(meta, "k", (uint64_t)q->k) ||
        set_str(meta, "asymmetric", q->asymmetric ? "1" : "0") ||
        set_str(meta, "scale_dtype", dtype_names[q->scale_dtype]) ||
        set_str(meta, "digest", hex) ||
        set_str(meta, "policy", policy_names[policy]) ||
        (devices != NULL && devices[0] != '\0' &&
         set_str(meta, "devices", devices));
  if (bad)
    goto done;
  bad = json_object_set_new(root, "__metadata__", meta) != 0;
  meta = NULL;
  if (bad)
    goto done;

  /* Wider elements first, so each array is aligned in the file. */
  if (q->bias != NULL) {
    shape[0] = q->n;
    t = tensor_json(QL_ADT_F32, 1, shape, at, at + (size_t)q->n * 4);
    if (t == NULL || json_object_set_new(root, "bias", t) != 0)
      goto done;
    at += (size_t)q->n * 4;
  }
  if (scale_is_grouped(q->format)) {
    shape[0] = q->groups;
    shape[1] = q->n;
  } else {
    shape[0] = q->n;
  }
  t = tensor_json(q->scale_dtype, scale_is_grouped(q->format) ? 2 : 1, shape,
                  at, at + q->scale_bytes);
  if (t == NULL || json_object_set_new(root, "scale", t) != 0)
    goto done;
  at += q->scale_bytes;
  if (q->zero != NULL) {
    shape[0] = q->groups;
    shape[1] = q->n;
    t = tensor_json(q->scale_dtype, 2, shape, at, at + q->scale_bytes);
    if (t == NULL || json_object_set_new(root, "zero", t) != 0)
      goto done;
    at += q->scale_bytes;
  }
  qdata_shape(q, shape);
  t = tensor_json(qdata_adt(q->format), 2, shape, at, at + q->qdata_bytes);
  if (t == NULL || json_object_set_new(root, "qdata", t) != 0)
    goto done;

  if ((js = json_dumps(root, JSON_COMPACT)) == NULL)
    goto done;
  jlen = strlen(js);
  /* Spaces after the JSON (allowed by safetensors) align the data. */
  total = (8 + jlen + QL_STORE_ALIGN - 1) / QL_STORE_ALIGN * QL_STORE_ALIGN;
  if (total - 8 > QL_STORE_MAX_HEADER) {
    rc = QL_EINVAL;
    goto done;
  }
  if ((*hdr = malloc(total)) == NULL)
    goto done;
  for (int i = 0; i < 8; i++)
    (*hdr)[i] = (uint8_t)((uint64_t)(total - 8) >> (8 * i));
  memcpy(*hdr + 8, js, jlen);
  memset(*hdr + 8 + jlen, ' ', total - 8 - jlen);
  *hdr_len = total;
  rc = 0;
done:
  free(js);
  json_decref(meta);
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------ parser */

enum { T_QDATA, T_SCALE, T_ZERO, T_BIAS, T_COUNT };
static const char *const tensor_names[T_COUNT] = {"qdata", "scale", "zero",
                                                  "bias"};

typedef struct tensor {
  int present;
  int adt;  /* ql_array_dtype */
  int ndim; /* 1 or 2 */
  int64_t shape[2];
  uint64_t begin, end;
} tensor;

/* A non-negative JSON integer. */
static int json_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/* One tensor entry; data_len is the size of the data section. */
static int parse_tensor(const char *name, json_t *v, uint64_t data_len,
                        tensor *t, char *err, size_t errlen) {
  const char *key;
  json_t *val, *dt = NULL, *sh = NULL, *off = NULL;
  uint64_t count = 1, bytes, esz, d;

  if (!json_is_object(v))
    return fail(err, errlen, QL_EBADFILE, "%s: not an object", name);
  json_object_foreach(v, key, val) {
    if (strcmp(key, "dtype") == 0)
      dt = val;
    else if (strcmp(key, "shape") == 0)
      sh = val;
    else if (strcmp(key, "data_offsets") == 0)
      off = val;
    else
      return fail(err, errlen, QL_EBADFILE, "%s: unknown key \"%.40s\"", name,
                  key);
  }
  if (dt == NULL || sh == NULL || off == NULL)
    return fail(err, errlen, QL_EBADFILE, "%s: missing %s", name,
                dt == NULL ? "dtype" : sh == NULL ? "shape" : "data_offsets");
  if (!json_is_string(dt) ||
      (t->adt = lookup(st_dtypes, N_ST_DTYPES, json_string_value(dt))) < 0)
    return fail(err, errlen, QL_EBADFILE, "%s: unsupported dtype", name);
  if (!json_is_array(sh) || json_array_size(sh) < 1 ||
      json_array_size(sh) > 2)
    return fail(err, errlen, QL_EBADFILE,
                "%s: shape must be an array of 1 or 2 dimensions", name);
  t->ndim = (int)json_array_size(sh);
  for (int i = 0; i < t->ndim; i++) {
    if (json_u64(json_array_get(sh, (size_t)i), &d) != 0 ||
        d > (uint64_t)QL_DIM_MAX)
      return fail(err, errlen, QL_EBADFILE, "%s: shape[%d] not an integer in "
                  "[0, %" PRId64 "]", name, i, (int64_t)QL_DIM_MAX);
    t->shape[i] = (int64_t)d;
    count *= d; /* both at most 2^31 - 1: no overflow in 64 bits */
  }
  if (!json_is_array(off) || json_array_size(off) != 2 ||
      json_u64(json_array_get(off, 0), &t->begin) != 0 ||
      json_u64(json_array_get(off, 1), &t->end) != 0)
    return fail(err, errlen, QL_EBADFILE,
                "%s: data_offsets must be two non-negative integers", name);
  if (t->begin > t->end)
    return fail(err, errlen, QL_EBADFILE,
                "%s: data_offsets [%" PRIu64 ", %" PRIu64 ") reversed", name,
                t->begin, t->end);
  if (t->end > data_len)
    return fail(err, errlen, QL_EBADFILE,
                "%s: data_offsets [%" PRIu64 ", %" PRIu64 ") past the end of "
                "the data section (%" PRIu64 " bytes; file truncated?)", name,
                t->begin, t->end, data_len);
  esz = ql_array_dtype_size(t->adt);
  if (count > UINT64_MAX / esz)
    return fail(err, errlen, QL_EBADFILE, "%s: shape too large", name);
  bytes = count * esz;
  if (bytes != t->end - t->begin)
    return fail(err, errlen, QL_EBADFILE,
                "%s: %" PRIu64 " bytes for %" PRIu64 " elements of %s (want "
                "%" PRIu64 ")", name, t->end - t->begin, count,
                st_dtypes[t->adt], bytes);
  t->present = 1;
  return 0;
}

/* The tensors must tile the data section: sorted by offset, each begins
 * where the previous ends, the first at 0 and the last at data_len. */
static int check_tiling(const tensor *t, uint64_t data_len, char *err,
                        size_t errlen) {
  int order[T_COUNT], n = 0;
  uint64_t at = 0;

  for (int i = 0; i < T_COUNT; i++) {
    if (!t[i].present)
      continue;
    int j = n++;
    while (j > 0 && (t[order[j - 1]].begin > t[i].begin ||
                     (t[order[j - 1]].begin == t[i].begin &&
                      t[order[j - 1]].end > t[i].end))) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = i;
  }
  for (int j = 0; j < n; j++) {
    const tensor *c = &t[order[j]];
    if (c->begin < at)
      return fail(err, errlen, QL_EBADFILE, "%s overlaps %s",
                  tensor_names[order[j]], tensor_names[order[j - 1]]);
    if (c->begin > at)
      return fail(err, errlen, QL_EBADFILE,
                  "%" PRIu64 " unused bytes before %s", c->begin - at,
                  tensor_names[order[j]]);
    at = c->end;
  }
  if (at != data_len)
    return fail(err, errlen, QL_EBADFILE,
                "%" PRIu64 " bytes after the last tensor", data_len - at);
  return 0;
}

/* A metadata string, or NULL (with the error in err). */
static const char *meta_str(json_t *meta, const char *key, char *err,
                            size_t errlen) {
  json_t *v = json_object_get(meta, key);
  if (v == NULL) {
    fail(err, errlen, QL_EBADFILE, "metadata: %s missing", key);
    return NULL;
  }
  /* Every value was checked to be a string when the object was walked. */
  return json_string_value(v);
}

/* A decimal without sign or leading zeros, at most max. */
static int meta_uint(json_t *meta, const char *key, uint64_t max,
                     uint64_t *out, char *err, size_t errlen) {
  const char *s = meta_str(meta, key, err, errlen);
  uint64_t v = 0;
  size_t n;
  if (s == NULL)
    return QL_EBADFILE;
  n = strlen(s);
  if (n == 0 || n > 19 || (s[0] == '0' && n > 1))
    goto bad;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      goto bad;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v > max)
    goto bad;
  *out = v;
  return 0;
bad:
  return fail(err, errlen, QL_EBADFILE,
              "metadata: %s \"%.24s\" is not an integer in [0, %" PRIu64 "]",
              key, s, max);
}

/* A metadata string that must be one of names[0..count). */
static int meta_enum(json_t *meta, const char *key, const char *const *names,
                     int count, int *out, char *err, size_t errlen) {
  const char *s = meta_str(meta, key, err, errlen);
  if (s == NULL)
    return QL_EBADFILE;
  if ((*out = lookup(names, count, s)) < 0)
    return fail(err, errlen, QL_EBADFILE, "metadata: %s \"%.24s\" unknown",
                key, s);
  return 0;
}

/* The header fields once checked. */
typedef struct header {
  tensor t[T_COUNT];
  ql__stored_weight *out;
  ql_format format;
  uint32_t group_size;
  int64_t n, k;
  int asymmetric;
  ql_dtype scale_dtype;
} header;

static int parse_metadata(json_t *meta, header *h, char *err, size_t errlen) {
  const char *key, *s;
  json_t *val;
  uint64_t v;
  int e, rc;

  if (!json_is_object(meta))
    return fail(err, errlen, QL_EBADFILE, "__metadata__: not an object");
  /* safetensors: a string-to-string map. Unknown keys are tolerated. */
  json_object_foreach(meta, key, val) {
    if (!json_is_string(val))
      return fail(err, errlen, QL_EBADFILE,
                  "metadata: %.40s is not a string", key);
  }
  if ((s = meta_str(meta, "qlinear_store_version", err, errlen)) == NULL)
    return QL_EBADFILE;
  if (strcmp(s, QL_STORE_VERSION) != 0)
    return fail(err, errlen, QL_EBADFILE,
                "metadata: qlinear_store_version \"%.24s\" unsupported (this "
                "daemon reads \"%s\")", s, QL_STORE_VERSION);
  if ((s = meta_str(meta, "name", err, errlen)) == NULL)
    return QL_EBADFILE;
  if (strlen(s) >= sizeof h->out->name || !ql__name_valid(s))
    return fail(err, errlen, QL_EBADFILE, "metadata: name is not a valid "
                "weight name");
  memcpy(h->out->name, s, strlen(s) + 1);
  if ((rc = meta_enum(meta, "format", format_names, 5, &e, err, errlen)))
    return rc;
  h->format = (ql_format)e;
  if ((rc = meta_uint(meta, "group_size", UINT32_MAX, &v, err, errlen)))
    return rc;
  h->group_size = (uint32_t)v;
  if ((rc = meta_uint(meta, "n", (uint64_t)QL_DIM_MAX, &v, err, errlen)))
    return rc;
  h->n = (int64_t)v;
  if ((rc = meta_uint(meta, "k", (uint64_t)QL_DIM_MAX, &v, err, errlen)))
    return rc;
  h->k = (int64_t)v;
  if ((rc = meta_uint(meta, "asymmetric", 1, &v, err, errlen)))
    return rc;
  h->asymmetric = (int)v;
  if ((rc = meta_enum(meta, "scale_dtype", dtype_names, 4, &e, err, errlen)))
    return rc;
  h->scale_dtype = (ql_dtype)e;
  if ((rc = meta_enum(meta, "policy", policy_names, 3, &e, err, errlen)))
    return rc;
  h->out->policy = (ql_path)e;
  if ((s = meta_str(meta, "digest", err, errlen)) == NULL)
    return QL_EBADFILE;
  if (hex_decode(s, h->out->digest, QL_DIGEST_BYTES) != 0)
    return fail(err, errlen, QL_EBADFILE,
                "metadata: digest is not %d lowercase hex digits", DIGEST_HEX);
  /* Optional: files written before placements existed have none. */
  h->out->devices[0] = '\0';
  if ((val = json_object_get(meta, "devices")) != NULL) {
    s = json_string_value(val);
    if (s[0] == '\0' || !devices_valid(s))
      return fail(err, errlen, QL_EBADFILE, "metadata: devices is not a "
                  "list of device names");
    memcpy(h->out->devices, s, strlen(s) + 1);
  }
  return 0;
}

/* What the writer writes is all the reader accepts: the canonical dtypes
 * and the metadata in agreement with the tensors. The shapes themselves
 * are checked by the import. */
static int check_consistent(const header *h, char *err, size_t errlen) {
  const tensor *t = h->t;
  if (!t[T_QDATA].present || !t[T_SCALE].present)
    return fail(err, errlen, QL_EBADFILE, "%s: missing",
                !t[T_QDATA].present ? "qdata" : "scale");
  if (t[T_QDATA].adt != qdata_adt(h->format))
    return fail(err, errlen, QL_EBADFILE, "qdata: dtype %s, expected %s for "
                "%s", st_dtypes[t[T_QDATA].adt],
                st_dtypes[qdata_adt(h->format)], format_names[h->format]);
  if (t[T_SCALE].adt != (int)h->scale_dtype)
    return fail(err, errlen, QL_EBADFILE, "scale: dtype %s, metadata says "
                "scale_dtype %s", st_dtypes[t[T_SCALE].adt],
                dtype_names[h->scale_dtype]);
  if (t[T_ZERO].present && t[T_ZERO].adt != (int)h->scale_dtype)
    return fail(err, errlen, QL_EBADFILE, "zero: dtype %s, metadata says "
                "scale_dtype %s", st_dtypes[t[T_ZERO].adt],
                dtype_names[h->scale_dtype]);
  if (t[T_BIAS].present && t[T_BIAS].adt != QL_ADT_F32)
    return fail(err, errlen, QL_EBADFILE, "bias: dtype %s, expected F32",
                st_dtypes[t[T_BIAS].adt]);
  if (h->asymmetric && h->format != QL_FORMAT_Q8B)
    return fail(err, errlen, QL_EBADFILE, "metadata: asymmetric is 1 for %s",
                format_names[h->format]);
  if (!scale_is_grouped(h->format) && (int64_t)h->group_size != h->k)
    return fail(err, errlen, QL_EBADFILE, "metadata: group_size %" PRIu32
                " for %s, expected k = %" PRId64, h->group_size,
                format_names[h->format], h->k);
  return 0;
}

static void set_array(ql_array *a, const tensor *t, const uint8_t *data) {
  if (!t->present)
    return;
  a->data = data + t->begin;
  a->bytes = (size_t)(t->end - t->begin);
  a->dtype = t->adt;
  a->ndim = t->ndim;
  a->shape[0] = t->shape[0];
  a->shape[1] = t->ndim == 2 ? t->shape[1] : 0;
}

/* ql__store_parse(); borrow: the weight's arrays stay in buf (which must
 * then outlive it) when they are canonical and aligned, as the writer
 * makes them. */
static int parse(const uint8_t *buf, size_t len, int borrow,
                 ql__stored_weight *out, char *err, size_t errlen);

int ql__store_parse(const uint8_t *buf, size_t len, ql__stored_weight *out,
                    char *err, size_t errlen) {
  return parse(buf, len, 0, out, err, errlen);
}

static int parse(const uint8_t *buf, size_t len, int borrow,
                 ql__stored_weight *out, char *err, size_t errlen) {
  header h;
  json_t *root = NULL, *val, *meta = NULL;
  json_error_t jerr;
  const char *key;
  uint64_t hlen = 0, data_len;
  const uint8_t *data;
  ql_import_desc d;
  ql_qweight *q = NULL;
  uint8_t digest[QL_DIGEST_BYTES];
  char ierr[200], a[DIGEST_HEX + 1], b[DIGEST_HEX + 1];
  int rc;

  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (out == NULL)
    return fail(err, errlen, QL_EINVAL, "no output");
  memset(out, 0, sizeof *out);
  memset(&h, 0, sizeof h);
  h.out = out;

  /* ---- the header length, against the file size */
  if (buf == NULL || len < 8)
    return fail(err, errlen, QL_EBADFILE,
                "truncated: %zu bytes, a header length needs 8", len);
  for (int i = 0; i < 8; i++)
    hlen |= (uint64_t)buf[i] << (8 * i);
  if (hlen < 2 || hlen > QL_STORE_MAX_HEADER)
    return fail(err, errlen, QL_EBADFILE,
                "header length %" PRIu64 " outside [2, %" PRIu64 "]", hlen,
                QL_STORE_MAX_HEADER);
  if (hlen > len - 8)
    return fail(err, errlen, QL_EBADFILE,
                "truncated: header length %" PRIu64 " but only %zu bytes "
                "follow", hlen, len - 8);
  data = buf + 8 + hlen;
  data_len = len - 8 - hlen;

  /* ---- the JSON */
  if (buf[8] != '{')
    return fail(err, errlen, QL_EBADFILE, "header does not start with '{'");
  root = json_loadb((const char *)buf + 8, (size_t)hlen,
                    JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return fail(err, errlen, QL_EBADFILE,
                "header is not JSON: %.80s (byte %d)", jerr.text,
                jerr.position);
  rc = QL_EBADFILE;
  if (!json_is_object(root)) {
    fail(err, errlen, rc, "header is not a JSON object");
    goto done;
  }
  json_object_foreach(root, key, val) {
    int i;
    if (strcmp(key, "__metadata__") == 0) {
      meta = val;
      continue;
    }
    for (i = 0; i < T_COUNT && strcmp(key, tensor_names[i]) != 0; i++)
      ;
    if (i == T_COUNT) {
      fail(err, errlen, rc, "unknown tensor \"%.40s\"", key);
      goto done;
    }
    if ((rc = parse_tensor(key, val, data_len, &h.t[i], err, errlen)))
      goto done;
    rc = QL_EBADFILE;
  }
  if ((rc = check_tiling(h.t, data_len, err, errlen)))
    goto done;
  if (meta == NULL) {
    rc = fail(err, errlen, QL_EBADFILE, "__metadata__ missing");
    goto done;
  }
  if ((rc = parse_metadata(meta, &h, err, errlen)) ||
      (rc = check_consistent(&h, err, errlen)))
    goto done;

  /* ---- the arrays, through the checks of a client import */
  memset(&d, 0, sizeof d);
  d.format = h.format;
  d.group_size = h.group_size;
  d.n = h.n;
  d.k = h.k;
  d.asymmetric = h.asymmetric;
  d.zero_kind = QL_ZERO_FLOAT;
  set_array(&d.qdata, &h.t[T_QDATA], data);
  set_array(&d.scale, &h.t[T_SCALE], data);
  set_array(&d.zero, &h.t[T_ZERO], data);
  set_array(&d.bias, &h.t[T_BIAS], data);
  rc = QL_ENOTSUP;
  if (borrow)
    rc = ql_qweight_import_borrowed(&d, &q, ierr, sizeof ierr);
  if (rc == QL_ENOTSUP)
    rc = ql_qweight_import(&d, &q, ierr, sizeof ierr);
  if (rc != 0) {
    if (rc != QL_ENOMEM)
      rc = QL_EBADFILE;
    fail(err, errlen, rc, "%s", ierr);
    goto done;
  }
  /* The import resolves nothing we did not already fix; make sure. */
  if (q->scale_dtype != h.scale_dtype || q->group_size != h.group_size ||
      q->asymmetric != h.asymmetric) {
    rc = fail(err, errlen, QL_EBADFILE, "metadata disagrees with the "
              "imported weight");
    goto done;
  }
  if ((rc = ql__qweight_digest(q, digest)) != 0) {
    rc = fail(err, errlen, rc == QL_ENOMEM ? QL_ENOMEM : QL_EINTERNAL,
              "cannot compute the digest");
    goto done;
  }
  if (memcmp(digest, out->digest, QL_DIGEST_BYTES) != 0) {
    hex_encode(out->digest, QL_DIGEST_BYTES, a);
    hex_encode(digest, QL_DIGEST_BYTES, b);
    rc = fail(err, errlen, QL_EBADFILE,
              "digest mismatch: metadata %.16s..., content %.16s...", a, b);
    goto done;
  }
  out->q = q;
  q = NULL;
  rc = 0;
done:
  ql_qweight_free(q);
  json_decref(root);
  if (rc != 0)
    memset(out, 0, sizeof *out);
  return rc;
}

/* -------------------------------------------------------- directory */

/* Calls fn(s, name, arg) for every directory entry (not . and ..), from
 * a fresh descriptor so that concurrent scans do not share a position.
 * Stops at the first non-zero return and returns it. */
static int scan_dir(ql__store *s, int (*fn)(ql__store *, const char *, void *),
                    void *arg) {
  int fd = openat(s->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *dir;
  struct dirent *e;
  int rc = 0;
  if (fd < 0)
    return ql__errno_from_sys(errno);
  if ((dir = fdopendir(fd)) == NULL) {
    rc = ql__errno_from_sys(errno);
    close(fd);
    return rc;
  }
  for (;;) {
    errno = 0;
    if ((e = readdir(dir)) == NULL) {
      if (errno != 0)
        rc = ql__errno_from_sys(errno);
      break;
    }
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if ((rc = fn(s, e->d_name, arg)) != 0)
      break;
  }
  closedir(dir);
  return rc;
}

static int sync_dir(ql__store *s) {
  return fsync(s->dirfd) == 0 ? 0 : ql__errno_from_sys(errno);
}

/* Makes the entry of a directory just created durable: fsync of its
 * parent. Best effort: the directory is usable either way, and the first
 * put syncs the directory itself. */
static void sync_parent(const char *path) {
  char *p = strdup(path), *slash;
  size_t n;
  int fd;
  if (p == NULL)
    return;
  for (n = strlen(p); n > 1 && p[n - 1] == '/'; n--)
    p[n - 1] = '\0';
  slash = strrchr(p, '/');
  if (slash == p)
    slash[1] = '\0';
  else if (slash != NULL)
    *slash = '\0';
  fd = open(slash != NULL ? p : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
  free(p);
}

#define LAYOUT_SUFFIX ".layout"
#define LAYOUT_TMP_MARK LAYOUT_SUFFIX ".tmp-"

static int remove_temp(ql__store *s, const char *f, void *arg) {
  int *removed = arg;
  if (strstr(f, TMP_MARK) == NULL && strstr(f, LAYOUT_TMP_MARK) == NULL)
    return 0;
  if (unlinkat(s->dirfd, f, 0) == 0) {
    ql__notice("store: removed %s left by an interrupted write", f);
    (*removed)++;
  } else {
    ql__warn("store: cannot remove %s/%s: %s", s->dir, f, strerror(errno));
  }
  return 0;
}

int ql__store_open(const char *state_dir, ql__store **out, char *err,
                   size_t errlen) {
  ql__store *s = NULL;
  struct stat st;
  int rc, removed = 0;

  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (out == NULL)
    return fail(err, errlen, QL_EINVAL, "no output");
  *out = NULL;
  if (state_dir == NULL || state_dir[0] == '\0')
    return fail(err, errlen, QL_EINVAL, "no state directory");
  if (mkdir(state_dir, 0750) == 0) {
    sync_parent(state_dir);
    ql__notice("store: created state directory %s", state_dir);
  } else if (errno != EEXIST) {
    return fail(err, errlen, ql__errno_from_sys(errno),
                "cannot create state directory %s: %s", state_dir,
                strerror(errno));
  }
  if ((s = calloc(1, sizeof *s)) == NULL ||
      (s->dir = strdup(state_dir)) == NULL) {
    free(s);
    return fail(err, errlen, QL_ENOMEM, "out of memory");
  }
  s->dirfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (s->dirfd < 0) {
    rc = fail(err, errlen,
              errno == ENOTDIR ? QL_EINVAL : ql__errno_from_sys(errno),
              "cannot open state directory %s: %s", state_dir,
              strerror(errno));
    goto fail;
  }
  if (fstat(s->dirfd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    rc = fail(err, errlen, QL_EINVAL, "%s is not a directory", state_dir);
    goto fail;
  }
  /* Its files become weights every client is served, mapped as they are:
   * anyone else who could write there could plant or truncate one. */
  if (st.st_uid != geteuid() || (st.st_mode & 022)) {
    rc = fail(err, errlen, QL_EPERM, "state directory %s must belong to "
              "this user and be writable by no one else (it is mode %04o, "
              "uid %u)", state_dir, (unsigned)(st.st_mode & 07777),
              (unsigned)st.st_uid);
    goto fail;
  }
  /* Two daemons on one directory would delete each other's temp files
   * and race on names: one holder at a time. */
  if (flock(s->dirfd, LOCK_EX | LOCK_NB) != 0) {
    rc = fail(err, errlen, QL_EIO, "state directory %s is %s", state_dir,
              errno == EWOULDBLOCK ? "in use by another process"
                                   : strerror(errno));
    goto fail;
  }
  if ((rc = scan_dir(s, remove_temp, &removed)) != 0) {
    fail(err, errlen, rc, "cannot read state directory %s", state_dir);
    goto fail;
  }
  if (removed > 0 && (rc = sync_dir(s)) != 0) {
    fail(err, errlen, rc, "cannot sync state directory %s: %s", state_dir,
         strerror(errno));
    goto fail;
  }
  *out = s;
  return 0;
fail:
  ql__store_close(s);
  return rc;
}

void ql__store_close(ql__store *s) {
  if (s == NULL)
    return;
  if (s->dirfd >= 0)
    close(s->dirfd); /* releases the flock */
  free(s->dir);
  free(s);
}

const char *ql__store_dir(const ql__store *s) { return s->dir; }

/* --------------------------------------------------------- load_all */

typedef struct name_list {
  char **v;
  size_t n, cap;
} name_list;

static int collect(ql__store *s, const char *f, void *arg) {
  name_list *l = arg;
  (void)s;
  if (!ends_with(f, SUFFIX))
    return 0;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    char **v = realloc(l->v, cap * sizeof *v);
    if (v == NULL)
      return QL_ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  if ((l->v[l->n] = strdup(f)) == NULL)
    return QL_ENOMEM;
  l->n++;
  return 0;
}

/* Sorts by name tag first, so that every file of one name is adjacent. */
static const char *sort_key(const char *f) {
  return well_formed(f) ? f + DIGEST_HEX + 1 : f;
}

static int cmp_files(const void *pa, const void *pb) {
  const char *a = *(char *const *)pa, *b = *(char *const *)pb;
  int c = strcmp(sort_key(a), sort_key(b));
  return c != 0 ? c : strcmp(a, b);
}

/* Renames f to <f>.<why>-<UTC time>[-i], never over an existing file. */
static void move_aside(ql__store *s, const char *f, const char *why,
                       const char *reason) {
  char ts[32], to[QL_STORE_FILE_NAME_MAX + 256];
  struct tm tm;
  time_t now = time(NULL);
  int ok = 0;

  if (gmtime_r(&now, &tm) == NULL ||
      strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm) == 0)
    snprintf(ts, sizeof ts, "%lld", (long long)now);
  for (int i = 0; i < 100 && !ok; i++) {
    if (i == 0)
      snprintf(to, sizeof to, "%s.%s-%s", f, why, ts);
    else
      snprintf(to, sizeof to, "%s.%s-%s-%d", f, why, ts, i);
    if (renameat2(s->dirfd, f, s->dirfd, to, RENAME_NOREPLACE) == 0) {
      ok = 1;
    } else if (errno == EINVAL || errno == ENOSYS) {
      /* A file system without RENAME_NOREPLACE: check, then rename. */
      struct stat st;
      if (fstatat(s->dirfd, to, &st, AT_SYMLINK_NOFOLLOW) == 0)
        continue;
      ok = renameat(s->dirfd, f, s->dirfd, to) == 0;
      if (!ok)
        break;
    } else if (errno != EEXIST) {
      break;
    }
  }
  if (ok) {
    (void)sync_dir(s);
    ql__warn("store: %s/%s: %s; moved aside to %s", s->dir, f, reason, to);
  } else {
    ql__err("store: %s/%s: %s; cannot move it aside: %s", s->dir, f, reason,
            strerror(errno));
  }
}

/* A stored weight's mapping, released with the weight that borrows it. */
typedef struct file_map {
  void *addr;
  size_t len;
} file_map;

static void unmap_release(void *backing) {
  file_map *m = backing;
  munmap(m->addr, m->len);
  free(m);
}

/* Maps and parses one file. QL_EBADFILE: the file is bad (err says why);
 * QL_ENOTSUP: not a regular file (left alone); others: could not read.
 * The weight reads its arrays from the mapping (the page cache: nothing is
 * copied, and the mapping outlives an unlink of the file), which it keeps
 * until it is freed. */
static int load_file(ql__store *s, const char *f, ql__stored_weight *w,
                     char *err, size_t errlen) {
  struct stat st;
  void *map = NULL;
  int rc;
  int fd = openat(s->dirfd, f,
                  O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ELOOP)
      return fail(err, errlen, QL_ENOTSUP, "a symbolic link");
    return fail(err, errlen, ql__errno_from_sys(errno), "cannot open: %s",
                strerror(errno));
  }
  if (fstat(fd, &st) != 0) {
    rc = fail(err, errlen, ql__errno_from_sys(errno), "cannot stat: %s",
              strerror(errno));
    goto done;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = fail(err, errlen, QL_ENOTSUP, "not a regular file");
    goto done;
  }
  if ((uint64_t)st.st_size > SIZE_MAX) {
    rc = fail(err, errlen, QL_EBADFILE, "too large");
    goto done;
  }
  if (st.st_size == 0) {
    rc = ql__store_parse((const uint8_t *)"", 0, w, err, errlen);
    goto done;
  }
  map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) {
    map = NULL;
    rc = fail(err, errlen, ql__errno_from_sys(errno), "cannot map: %s",
              strerror(errno));
    goto done;
  }
  (void)madvise(map, (size_t)st.st_size, MADV_SEQUENTIAL);
  file_map *fm = malloc(sizeof *fm);
  if (fm == NULL) {
    rc = fail(err, errlen, QL_ENOMEM, "out of memory");
    goto done;
  }
  rc = parse(map, (size_t)st.st_size, 1, w, err, errlen);
  if (rc == 0 && w->q->borrowed) {
    fm->addr = map;
    fm->len = (size_t)st.st_size;
    w->q->backing = fm;
    w->q->release = unmap_release;
    map = NULL; /* the weight's now */
  } else {
    free(fm);
  }
done:
  if (map != NULL)
    munmap(map, (size_t)st.st_size);
  close(fd);
  return rc;
}

static int drop_orphan(ql__store *s, const char *f, void *arg);

int ql__store_load_all(ql__store *s, ql__store_load_cb cb, void *arg) {
  name_list l = {NULL, 0, 0};
  char err[600], want[QL_STORE_FILE_NAME_MAX];
  char last_name[256] = "";
  int rc, loaded = 0, bad = 0;

  if (s == NULL || cb == NULL)
    return QL_EINVAL;
  if ((rc = scan_dir(s, collect, &l)) != 0) {
    ql__err("store: cannot read %s: %s", s->dir, ql_strerror(rc));
    goto done;
  }
  if (l.n > 1) /* qsort(NULL, 0, ...) is undefined */
    qsort(l.v, l.n, sizeof *l.v, cmp_files);
  for (size_t i = 0; i < l.n; i++) {
    const char *f = l.v[i];
    ql__stored_weight w;

    memset(&w, 0, sizeof w);
    rc = load_file(s, f, &w, err, sizeof err);
    if (rc == 0 && (rc = ql__store_file_name(w.name, w.digest, want)) != 0)
      snprintf(err, sizeof err, "cannot compute its file name");
    if (rc == 0 && strcmp(f, want) != 0) {
      rc = QL_EBADFILE;
      snprintf(err, sizeof err, "file name does not match its name '%s' and "
               "digest (expected %s)", w.name, want);
    }
    if (rc == QL_EBADFILE) {
      ql_qweight_free(w.q);
      move_aside(s, f, "corrupt", err);
      bad++;
      continue;
    }
    if (rc != 0) {
      ql_qweight_free(w.q);
      ql__warn("store: %s/%s: %s; skipped (%s)", s->dir, f, err,
               rc == QL_ENOTSUP ? "left alone" : ql_strerror(rc));
      continue;
    }
    /* Sorted by tag: another valid file of this name would be the
     * previous one loaded. One that did not load (its file kept) leaves
     * the name to the next. */
    if (strcmp(w.name, last_name) == 0) {
      ql_qweight_free(w.q);
      snprintf(err, sizeof err, "a second file for weight '%s'", w.name);
      move_aside(s, f, "duplicate", err);
      continue;
    }
    if ((rc = cb(arg, w.name, w.q, w.policy, w.digest, w.devices)) != 0) {
      ql__warn("store: weight '%s' (%s) not loaded: %s", w.name, f,
               ql_strerror(rc));
      ql_qweight_free(w.q);
      continue;
    }
    snprintf(last_name, sizeof last_name, "%s", w.name);
    loaded++;
  }
  if (bad > 0)
    ql__warn("store: %d corrupt file%s moved aside in %s", bad,
             bad == 1 ? "" : "s", s->dir);
  (void)scan_dir(s, drop_orphan, NULL);
  rc = loaded;
done:
  for (size_t i = 0; i < l.n; i++)
    free(l.v[i]);
  free(l.v);
  return rc;
}

/* -------------------------------------------------------- put, remove */

typedef struct tag_match {
  const char *tag;      /* TAG_HEX digits */
  const char *keep;     /* a file name not to report, or NULL */
  char found[QL_STORE_FILE_NAME_MAX];
  int unlink;           /* remove each match */
  int count;
  int err;              /* errno of a failed unlink */
} tag_match;

static int match_tag(ql__store *s, const char *f, void *arg) {
  tag_match *m = arg;
  if (!well_formed(f) || memcmp(f + DIGEST_HEX + 1, m->tag, TAG_HEX) != 0)
    return 0;
  if (m->keep != NULL && strcmp(f, m->keep) == 0)
    return 0;
  if (m->unlink && unlinkat(s->dirfd, f, 0) != 0) {
    m->err = errno;
    return QL_EIO;
  }
  snprintf(m->found, sizeof m->found, "%s", f);
  m->count++;
  return 0;
}

static int write_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

int ql__store_put(ql__store *s, const char *name, const ql_qweight *q,
                  const uint8_t digest[QL_DIGEST_BYTES], ql_path policy,
                  const char *devices, char *err, size_t errlen) {
  char file[QL_STORE_FILE_NAME_MAX], tmp[QL_STORE_FILE_NAME_MAX + 48];
  uint8_t check[QL_DIGEST_BYTES], *hdr = NULL;
  size_t hdr_len = 0;
  tag_match m;
  int rc, fd = -1, e;

  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (s == NULL || q == NULL || digest == NULL)
    return fail(err, errlen, QL_EINVAL, "missing argument");
  if (name == NULL || !ql__name_valid(name))
    return fail(err, errlen, QL_ENAME, "invalid weight name");
  if (!ql_path_valid(policy))
    return fail(err, errlen, QL_EINVAL, "unknown policy %d", (int)policy);
  if (devices != NULL && !devices_valid(devices))
    return fail(err, errlen, QL_EINVAL, "devices is not a list of device "
                "names");
  if ((rc = ql_qweight_check(q)) != 0)
    return fail(err, errlen, QL_EINVAL, "not a canonical weight (%s)",
                ql_err_name(rc));
  if ((rc = ql__qweight_digest(q, check)) != 0)
    return fail(err, errlen, rc, "cannot compute the digest");
  if (memcmp(check, digest, QL_DIGEST_BYTES) != 0)
    return fail(err, errlen, QL_EINVAL, "digest does not match the weight");
  if ((rc = ql__store_file_name(name, digest, file)) != 0)
    return fail(err, errlen, rc, "cannot compute the file name");

  /* One file per name: another digest under this name is a conflict. */
  memset(&m, 0, sizeof m);
  m.tag = file + DIGEST_HEX + 1;
  m.keep = file;
  if ((rc = scan_dir(s, match_tag, &m)) != 0)
    return fail(err, errlen, rc, "cannot read %s", s->dir);
  if (m.count > 0)
    return fail(err, errlen, QL_EEXIST, "'%s' is stored with other content "
                "(%s); remove it first", name, m.found);

  if ((rc = ql__store_header(name, q, digest, policy, devices, &hdr,
                              &hdr_len)) != 0)
    return fail(err, errlen, rc, "cannot encode the header");
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld.%u", file, (long)getpid(),
           atomic_fetch_add(&s->seq, 1));
  fd = openat(s->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  if (fd < 0) {
    e = errno;
    rc = fail(err, errlen, ql__errno_from_sys(e), "cannot create %s/%s: %s", s->dir,
              tmp, strerror(e));
    free(hdr);
    return rc;
  }
  if (write_all(fd, hdr, hdr_len) != 0 ||
      (q->bias != NULL &&
       write_all(fd, q->bias, (size_t)q->n * sizeof(float)) != 0) ||
      write_all(fd, q->scale, q->scale_bytes) != 0 ||
      (q->zero != NULL && write_all(fd, q->zero, q->scale_bytes) != 0) ||
      write_all(fd, q->qdata, q->qdata_bytes) != 0) {
    e = errno;
    rc = fail(err, errlen, ql__errno_from_sys(e), "cannot write %s/%s: %s", s->dir, tmp,
              strerror(e));
    goto fail;
  }
  /* After a failed fsync the page cache state is unknown: the file is
   * abandoned, never renamed. */
  if (fsync(fd) != 0) {
    e = errno;
    rc = fail(err, errlen, ql__errno_from_sys(e), "cannot sync %s/%s: %s", s->dir, tmp,
              strerror(e));
    goto fail;
  }
  if (close(fd) != 0) {
    fd = -1;
    e = errno;
    rc = fail(err, errlen, ql__errno_from_sys(e), "cannot close %s/%s: %s", s->dir, tmp,
              strerror(e));
    goto fail;
  }
  fd = -1;
  if (renameat(s->dirfd, tmp, s->dirfd, file) != 0) {
    e = errno;
    rc = fail(err, errlen, ql__errno_from_sys(e), "cannot rename %s/%s: %s", s->dir,
              tmp, strerror(e));
    goto fail;
  }
  free(hdr);
  /* The rename is done; only its durability is in question now. */
  if (fsync(s->dirfd) != 0) {
    e = errno;
    return fail(err, errlen, QL_EIO, "cannot sync %s: %s", s->dir,
                strerror(e));
  }
  return 0;
fail:
  if (fd >= 0)
    close(fd);
  (void)unlinkat(s->dirfd, tmp, 0);
  free(hdr);
  return rc;
}

/* Removes the cached layouts of a digest no stored file has any more. */
static void drop_layouts(ql__store *s, const char *digest_hex);

int ql__store_remove(ql__store *s, const char *name) {
  char tag[TAG_HEX + 1], digest_hex[DIGEST_HEX + 1];
  tag_match m;
  int rc;

  if (s == NULL)
    return QL_EINVAL;
  if (name == NULL || !ql__name_valid(name))
    return QL_ENAME;
  if ((rc = name_tag(name, tag)) != 0)
    return rc;
  memset(&m, 0, sizeof m);
  m.tag = tag;
  m.unlink = 1;
  rc = scan_dir(s, match_tag, &m);
  if (rc != 0) {
    ql__err("store: cannot remove '%s' from %s: %s", name, s->dir,
            m.err ? strerror(m.err) : ql_strerror(rc));
    return rc;
  }
  if (m.count == 0)
    return QL_ENOTFOUND;
  /* The file is gone from the directory: the removal is done, and
   * reporting it failed would leave the daemon serving a weight whose
   * file no longer exists. Only its durability is in doubt. */
  if (sync_dir(s) != 0)
    ql__err("store: cannot sync %s after removing '%s' (a crash may bring "
            "its file back): %s", s->dir, name, strerror(errno));
  memcpy(digest_hex, m.found, DIGEST_HEX);
  digest_hex[DIGEST_HEX] = '\0';
  drop_layouts(s, digest_hex);
  return 0;
}

/* ------------------------------------------------------- layout cache */

/*
 * <digest>.<layout id>.layout: a 96-byte header, then the image at
 * LAYOUT_DATA_OFF (page-aligned in the mapping, so every alignment a
 * layout needs holds). The image is a derived copy: written without the
 * directory fsync of a put, used when its header, size and SHA-256 are
 * right, removed and rebuilt when they are not. The kernels trust a
 * layout's bytes (registry.h, adopt), so a flipped bit in the cache
 * would otherwise give wrong results on every request, for good, where
 * the same damage to the weight's own file is caught by its digest.
 */
#define LAYOUT_MAGIC "QLLAYOUT"
#define LAYOUT_VERSION 2u
#define LAYOUT_DATA_OFF 4096u
#define LAYOUT_ID_MAX 32
#define LAYOUT_SHA_BYTES 32

typedef struct layout_header {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t data_off;
  uint64_t data_len;
  char layout_id[LAYOUT_ID_MAX];   /* NUL-padded */
  uint8_t sha256[LAYOUT_SHA_BYTES]; /* of the image's data_len bytes */
} layout_header;

_Static_assert(sizeof(layout_header) == 96, "layout header is 96 bytes");

/* SHA-256 of [p, p + n): 0, or QL_ENOMEM. */
static int image_sha256(const void *p, size_t n,
                        uint8_t out[LAYOUT_SHA_BYTES]) {
  unsigned len = 0;
  uint8_t md[EVP_MAX_MD_SIZE];
  if (EVP_Digest(p, n, md, &len, EVP_sha256(), NULL) != 1 ||
      len != LAYOUT_SHA_BYTES)
    return QL_ENOMEM;
  memcpy(out, md, LAYOUT_SHA_BYTES);
  return 0;
}

/* The file name of (digest, id); 0, or QL_EINVAL for an id that is not
 * [A-Za-z0-9_-]{1,31}. */
static int layout_file(const uint8_t digest[QL_DIGEST_BYTES], const char *id,
                       char *buf, size_t len) {
  char hex[DIGEST_HEX + 1];
  size_t n = strlen(id);
  if (n == 0 || n >= LAYOUT_ID_MAX)
    return QL_EINVAL;
  for (size_t i = 0; i < n; i++) {
    char c = id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return QL_EINVAL;
  }
  hex_encode(digest, QL_DIGEST_BYTES, hex);
  if ((size_t)snprintf(buf, len, "%s.%s" LAYOUT_SUFFIX, hex, id) >= len)
    return QL_EINVAL;
  return 0;
}

int ql__store_layout_check(const uint8_t *head, size_t head_len,
                           uint64_t file_size, const char *layout_id,
                           uint64_t *data_len) {
  layout_header h;
  *data_len = 0;
  if (head_len < sizeof h || file_size < LAYOUT_DATA_OFF)
    return QL_EBADFILE;
  memcpy(&h, head, sizeof h);
  if (memcmp(h.magic, LAYOUT_MAGIC, 8) != 0 || h.version != LAYOUT_VERSION ||
      h.data_off != LAYOUT_DATA_OFF ||
      h.data_len != file_size - LAYOUT_DATA_OFF ||
      h.layout_id[LAYOUT_ID_MAX - 1] != '\0' ||
      strcmp(h.layout_id, layout_id) != 0 || h.data_len > SIZE_MAX)
    return QL_EBADFILE;
  *data_len = h.data_len;
  return 0;
}

int ql__store_layout_map(ql__store *s, const uint8_t digest[QL_DIGEST_BYTES],
                         const char *layout_id, const void **data,
                         size_t *len, void **map) {
  char f[DIGEST_HEX + LAYOUT_ID_MAX + 16];
  struct stat st;
  layout_header h;
  uint64_t dlen;
  int rc = QL_ENOTFOUND;
  *data = NULL;
  *len = 0;
  *map = NULL;
  if (s == NULL || layout_file(digest, layout_id, f, sizeof f) != 0)
    return QL_EINVAL;
  int fd = openat(s->dirfd, f, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return QL_ENOTFOUND;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h ||
      ql__store_layout_check((const uint8_t *)&h, sizeof h,
                             (uint64_t)st.st_size, layout_id, &dlen) != 0) {
    ql__warn("store: cached layout %s is malformed; rebuilding it", f);
    (void)unlinkat(s->dirfd, f, 0);
    goto done;
  }
  file_map *fm = malloc(sizeof *fm);
  void *addr = fm == NULL ? MAP_FAILED
                          : mmap(NULL, (size_t)st.st_size, PROT_READ,
                                 MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) {
    free(fm);
    rc = QL_ENOMEM;
    goto done;
  }
  uint8_t sha[LAYOUT_SHA_BYTES];
  if (image_sha256((const uint8_t *)addr + LAYOUT_DATA_OFF, (size_t)dlen,
                   sha) != 0) {
    munmap(addr, (size_t)st.st_size);
    free(fm);
    rc = QL_ENOMEM;
    goto done;
  }
  if (memcmp(sha, h.sha256, sizeof sha) != 0) {
    ql__warn("store: cached layout %s does not match its SHA-256; "
             "rebuilding it", f);
    munmap(addr, (size_t)st.st_size);
    free(fm);
    (void)unlinkat(s->dirfd, f, 0);
    goto done;
  }
  fm->addr = addr;
  fm->len = (size_t)st.st_size;
  *data = (const uint8_t *)addr + LAYOUT_DATA_OFF;
  *len = (size_t)dlen;
  *map = fm;
  rc = 0;
done:
  close(fd);
  return rc;
}

void ql__store_layout_unmap(void *map) {
  if (map != NULL)
    unmap_release(map);
}

int ql__store_layout_put(ql__store *s, const uint8_t digest[QL_DIGEST_BYTES],
                         const char *layout_id, const void *data, size_t len) {
  char f[DIGEST_HEX + LAYOUT_ID_MAX + 16], tmp[sizeof f + 48];
  static const uint8_t zeros[LAYOUT_DATA_OFF];
  layout_header h;
  int rc;
  if (s == NULL || data == NULL || layout_file(digest, layout_id, f,
                                               sizeof f) != 0)
    return QL_EINVAL;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, LAYOUT_MAGIC, 8);
  h.version = LAYOUT_VERSION;
  h.data_off = LAYOUT_DATA_OFF;
  h.data_len = len;
  snprintf(h.layout_id, sizeof h.layout_id, "%s", layout_id);
  if ((rc = image_sha256(data, len, h.sha256)) != 0)
    return rc;
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld.%u", f, (long)getpid(),
           atomic_fetch_add(&s->seq, 1));
  int fd = openat(s->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                  0640);
  if (fd < 0)
    return ql__errno_from_sys(errno);
  /* fsync before the rename: after a crash the name holds all of the
   * image or none of it. */
  if (write_all(fd, &h, sizeof h) != 0 ||
      write_all(fd, zeros, LAYOUT_DATA_OFF - sizeof h) != 0 ||
      write_all(fd, data, len) != 0 || fsync(fd) != 0) {
    rc = ql__errno_from_sys(errno);
    close(fd);
    (void)unlinkat(s->dirfd, tmp, 0);
    return rc;
  }
  close(fd);
  if (renameat(s->dirfd, tmp, s->dirfd, f) != 0) {
    rc = ql__errno_from_sys(errno);
    (void)unlinkat(s->dirfd, tmp, 0);
    return rc;
  }
  return 0;
}

/* scan_dir() callbacks: does a weight file of this digest exist; remove
 * the layouts of a digest. */
typedef struct digest_scan {
  const char *hex; /* DIGEST_HEX digits; NULL: any digest (orphans) */
  int found;
} digest_scan;

static int has_weight_of(ql__store *s, const char *f, void *arg) {
  digest_scan *d = arg;
  (void)s;
  if (well_formed(f) && memcmp(f, d->hex, DIGEST_HEX) == 0)
    d->found = 1;
  return 0;
}

static int is_layout(const char *f) {
  size_t n = strlen(f);
  return n > DIGEST_HEX + 1 + sizeof LAYOUT_SUFFIX - 1 &&
         f[DIGEST_HEX] == '.' &&
         strcmp(f + n - (sizeof LAYOUT_SUFFIX - 1), LAYOUT_SUFFIX) == 0;
}

static int unlink_layout_of(ql__store *s, const char *f, void *arg) {
  digest_scan *d = arg;
  if (is_layout(f) && memcmp(f, d->hex, DIGEST_HEX) == 0 &&
      unlinkat(s->dirfd, f, 0) != 0)
    ql__warn("store: cannot remove %s/%s: %s", s->dir, f, strerror(errno));
  return 0;
}

static void drop_layouts(ql__store *s, const char *digest_hex) {
  digest_scan d = {digest_hex, 0};
  if (scan_dir(s, has_weight_of, &d) != 0 || d.found)
    return;
  (void)scan_dir(s, unlink_layout_of, &d);
}

/* A layout whose weight file is gone (an unload interrupted between the
 * two unlinks, or a corrupt file moved aside) is removed at start. */
static int drop_orphan(ql__store *s, const char *f, void *arg) {
  char hex[DIGEST_HEX + 1];
  (void)arg;
  if (!is_layout(f))
    return 0;
  memcpy(hex, f, DIGEST_HEX);
  hex[DIGEST_HEX] = '\0';
  drop_layouts(s, hex);
  return 0;
}
