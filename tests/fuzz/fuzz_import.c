/*
 * fuzz_import.c - libFuzzer target for ql_qweight_import() (kernels/
 * import.c), the parser of packed weights a client or a file supplies.
 *
 * The whole descriptor comes from the input, all integers little-endian:
 *
 *   offset size  field
 *   0      1     format (uint8 as is: 1 q4g, 2 q8c, 3 q8b, 4 f8r)
 *   1      1     group size: 0..3 mean 32 << value, any other byte is the
 *                group size itself
 *   2      2     n (int16)
 *   4      2     k (int16)
 *   6      1     flags: bit 0 asymmetric = 1, bit 1 zero_kind = INT,
 *                bit 2 asymmetric = 2 (invalid), bit 3 n and k times 65536,
 *                bit 4 zero_kind = 7 (invalid)
 *   7      4x7   one descriptor per array, in the order qdata, scale, zero,
 *                bias:
 *                +0  flags: bit 0 present, bits 1-2 ndim (0..3), bit 3
 *                    "canonical shape": ignore the shape fields and use the
 *                    shape the format expects for this array (so that the
 *                    fuzzer reaches the value checks easily)
 *                +1  dtype (int8, a ql_array_dtype or anything else)
 *                +2  shape[0] (int16)
 *                +4  shape[1] (int16)
 *                +6  size delta (int8): the array asks for its shape's byte
 *                    count plus this, at least 0
 *   35     ...   the arrays' bytes, one after the other in the same order;
 *                an array whose bytes run past the end gets what is left,
 *                and its `bytes` says how many it got.
 *
 * Each array is copied to its own allocation of exactly its size, at an odd
 * address: ASan catches any read past an array's stated size, and the
 * parser must not assume alignment. An accepted weight must pass
 * ql_qweight_check() and dequantize; a refused one must come with a known
 * error code, a message, and *out == NULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

#define HEADER 35
#define DESC 7

static int16_t get16(const uint8_t *p) {
  return (int16_t)(uint16_t)(p[0] | (p[1] << 8));
}

/* The shape the format expects for array `role` (0 qdata, 1 scale, 2 zero,
 * 3 bias), as import.h documents it. */
static void canonical_shape(const ql_import_desc *d, int role, ql_array *a) {
  int64_t n = d->n, k = d->k;
  int64_t gs = d->group_size >= 1 ? d->group_size : 1;
  int64_t g = (k + gs - 1) / gs;
  int per_row = d->format == QL_FORMAT_Q8C || d->format == QL_FORMAT_F8R;

  a->shape[1] = 1;
  switch (role) {
  case 0:
    a->shape[0] = n;
    a->shape[1] = d->format != QL_FORMAT_Q4G ? k
                  : a->dtype == QL_ADT_I32   ? k / 8
                                             : k / 2 + (k & 1);
    break;
  case 1:
    a->shape[0] = per_row ? n : g;
    a->shape[1] = per_row ? 1 : n;
    break;
  case 2:
    a->shape[0] = g;
    a->shape[1] = n;
    break;
  default:
    a->shape[0] = n;
    break;
  }
}

/* The byte count of a's shape, or 0 when it is negative or overflows. */
static size_t shape_bytes(const ql_array *a) {
  size_t esz = ql_array_dtype_size(a->dtype), d0, d1;
  if (esz == 0)
    esz = 1;
  if (a->shape[0] < 0 || a->shape[1] < 0)
    return 0;
  d0 = (size_t)a->shape[0];
  d1 = a->ndim == 2 ? (size_t)a->shape[1] : 1;
  if (d1 != 0 && d0 > SIZE_MAX / d1)
    return 0;
  if (d0 * d1 > SIZE_MAX / esz)
    return 0;
  return d0 * d1 * esz;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ql_import_desc d;
  ql_array *arrays[4];
  uint8_t *bufs[4] = {NULL, NULL, NULL, NULL};
  ql_qweight *w = (ql_qweight *)&d; /* must be overwritten */
  size_t at = HEADER;
  char err[256];
  int rc;

  if (size < HEADER)
    return 0;
  memset(&d, 0, sizeof d);
  d.format = (ql_format)data[0];
  d.group_size = data[1] < 4 ? 32u << data[1] : data[1];
  d.n = get16(data + 2);
  d.k = get16(data + 4);
  if (data[6] & 8) {
    d.n *= 65536;
    d.k *= 65536;
  }
  d.asymmetric = (data[6] & 4) ? 2 : (data[6] & 1);
  d.zero_kind = (data[6] & 16)  ? (ql_zero_kind)7
                : (data[6] & 2) ? QL_ZERO_INT
                                : QL_ZERO_FLOAT;
  arrays[0] = &d.qdata;
  arrays[1] = &d.scale;
  arrays[2] = &d.zero;
  arrays[3] = &d.bias;
  for (int i = 0; i < 4; i++) {
    const uint8_t *p = data + 7 + DESC * i;
    ql_array *a = arrays[i];
    size_t want, got;

    if (!(p[0] & 1))
      continue;
    a->ndim = (p[0] >> 1) & 3;
    a->dtype = (int8_t)p[1];
    a->shape[0] = get16(p + 2);
    a->shape[1] = get16(p + 4);
    if (p[0] & 8)
      canonical_shape(&d, i, a);
    want = shape_bytes(a);
    if ((int8_t)p[6] < 0 && want < (size_t)(-(int)(int8_t)p[6]))
      want = 0;
    else
      want += (size_t)(int)(int8_t)p[6];
    got = size - at < want ? size - at : want;
    /* exactly `got` bytes at an odd address */
    CHECK((bufs[i] = malloc(got + 1)) != NULL);
    memcpy(bufs[i] + 1, data + at, got);
    a->data = bufs[i] + 1;
    a->bytes = got;
    at += got;
  }

  memset(err, 'x', sizeof err);
  rc = ql_qweight_import(&d, &w, err, sizeof err);
  CHECK(memchr(err, '\0', sizeof err) != NULL);
  if (rc == 0) {
    CHECK(w != NULL);
    CHECK(ql_qweight_check(w) == 0);
    CHECK(w->format == d.format && w->n == d.n && w->k == d.k);
    CHECK((w->bias != NULL) == (d.bias.data != NULL));
    /* the weight dequantizes; each row has K floats */
    float *row = malloc((size_t)w->k * sizeof *row);
    CHECK(row != NULL);
    CHECK(ql_qweight_dequantize_row(w, 0, row) == 0);
    CHECK(ql_qweight_dequantize_row(w, w->n - 1, row) == 0);
    free(row);
    ql_qweight_free(w);
  } else {
    CHECK(w == NULL);
    CHECK(rc == QL_EINVAL || rc == QL_EFORMAT || rc == QL_ESHAPE ||
          rc == QL_EDTYPE || rc == QL_ENONFINITE || rc == QL_ENOMEM);
    CHECK(err[0] != '\0');
  }
  for (int i = 0; i < 4; i++)
    free(bufs[i]);
  return 0;
}
