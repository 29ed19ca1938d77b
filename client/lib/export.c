/*
 * export.c - libqlinear: ql_export_weight(), a resident weight's canonical
 * arrays read back through ExportWeight requests.
 *
 * The daemon is not trusted further than its replies are checked: every
 * array's shape and dtype must fit the weight's format and shape before
 * anything is allocated, the arrays must add up to the stream's length,
 * and every chunk must start where the last one ended and name the same
 * digest.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define ALIGN 64u

/* The byte count of an ArraySpec, 0 when it is malformed. */
static uint64_t array_bytes(const Qlinear__V1__ArraySpec *a) {
  uint64_t bytes;
  if (a == NULL || a->n_shape < 1 || a->n_shape > 2)
    return 0;
  bytes = ql_array_dtype_size((int)a->dtype);
  for (size_t i = 0; i < a->n_shape; i++)
    if (a->shape[i] == 0 || !ql__mul_ok(bytes, a->shape[i], &bytes))
      return 0;
  return bytes;
}

/* Whether a is the array the canonical form has for (rows, cols) in one
 * of the dtypes dt0/dt1 (cols 0: a 1-D [rows]). */
static int array_is(const Qlinear__V1__ArraySpec *a, int dt, uint64_t rows,
                    uint64_t cols) {
  if (a == NULL || (int)a->dtype != dt)
    return 0;
  if (cols == 0)
    return a->n_shape == 1 && a->shape[0] == rows;
  return a->n_shape == 2 && a->shape[0] == rows && a->shape[1] == cols;
}

/* Checks that the first reply's PackedSpec is the canonical form of the
 * weight info describes. */
static int check_spec(const ql_weight_info *w,
                      const Qlinear__V1__PackedSpec *p) {
  uint64_t n = w->n, k = w->k, g = 1;
  int grouped = w->format == QL_FORMAT_Q4G || w->format == QL_FORMAT_Q8B;
  int sdt = w->scale_dtype;
  if (p == NULL)
    return ql__err_set(QL_EPROTO, "export: no packed spec for %s", w->name);
  if (!ql_format_valid(w->format) || n == 0 || k == 0 ||
      (grouped && w->group_size == 0))
    return ql__err_set(QL_EPROTO, "export: %s: format %d, group %u, "
                       "[%llu,%llu] is not a weight this library reads",
                       w->name, w->format, w->group_size,
                       (unsigned long long)n, (unsigned long long)k);
  if (grouped)
    g = k / w->group_size + (k % w->group_size != 0);
  int qdt = w->format == QL_FORMAT_F8R ? QL_ADT_F8E4M3 : QL_ADT_I8;
  uint64_t qcols = w->format == QL_FORMAT_Q4G ? k / 2 + (k & 1) : k;
  int has_zero = w->format == QL_FORMAT_Q4G ||
                 (w->format == QL_FORMAT_Q8B && w->asymmetric);
  if (p->zero_kind != QLINEAR__V1__ZERO_KIND__ZERO_FLOAT ||
      !array_is(p->qdata, qdt, n, qcols) ||
      (sdt != QL_DTYPE_F32 && sdt != QL_DTYPE_F16 && sdt != QL_DTYPE_BF16) ||
      !(grouped ? array_is(p->scale, sdt, g, n) : array_is(p->scale, sdt, n, 0)) ||
      (has_zero ? !array_is(p->zero, sdt, g, n) : p->zero != NULL) ||
      (w->has_bias ? !array_is(p->bias, QL_ADT_F32, n, 0) : p->bias != NULL))
    return ql__err_set(QL_EPROTO, "export: %s: the daemon's arrays do not "
                       "fit its format and shape", w->name);
  return 0;
}

static uint64_t round_up(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

/* Describes array a of the export at data (in the allocation) into *out. */
static void describe(ql_packed_array *out, const Qlinear__V1__ArraySpec *a,
                     const void *data) {
  out->data = data;
  out->dtype = (int)a->dtype;
  out->ndim = (int)a->n_shape;
  out->shape[0] = a->shape[0];
  out->shape[1] = a->n_shape > 1 ? a->shape[1] : 0;
}

/* One ExportWeight round trip: the reply for [offset, ...) of name. */
static int request(ql_client *c, const char *name, uint64_t offset,
                   Response **out) {
  Qlinear__V1__ExportWeightRequest er =
      QLINEAR__V1__EXPORT_WEIGHT_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  int rv;
  er.name = (char *)name; /* pack only reads it */
  er.offset = offset;
  req.body_case = QLINEAR__V1__REQUEST__BODY_EXPORT_WEIGHT;
  req.export_weight = &er;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_EXPORT_WEIGHT,
                     c->timeout_ms, out)) != 0)
    return rv;
  if ((*out)->export_weight == NULL) {
    qlinear__v1__response__free_unpacked(*out, NULL);
    *out = NULL;
    return ql__err_set(QL_EPROTO, "export: a reply without its body");
  }
  return 0;
}

QL_EXPORT int ql_export_weight(ql_client *c, const char *name,
                               ql_exported_weight **out) {
  Response *resp = NULL;
  ql_exported_weight *e = NULL;
  const Qlinear__V1__ArraySpec *arr[4];
  uint64_t lens[4], at[4], total = 0, off = 0, size;
  int rv;

  ql__err_clear();
  if (out != NULL)
    *out = NULL;
  if (c == NULL || out == NULL)
    return ql__err_set(QL_EINVAL, "client or output is NULL");
  if ((rv = ql__check_name(name)) != 0)
    return rv;
  if ((rv = request(c, name, 0, &resp)) != 0)
    return rv;
  const Qlinear__V1__ExportWeightResponse *r = resp->export_weight;
  ql_weight_info info;
  if ((rv = ql__weight_info_from(r->weight, &info)) != 0 ||
      (rv = check_spec(&info, r->packed)) != 0)
    goto fail;
  arr[0] = r->packed->qdata;
  arr[1] = r->packed->scale;
  arr[2] = r->packed->zero;
  arr[3] = r->packed->bias;
  /* Each array at its own aligned place after the struct. */
  size = round_up(sizeof *e);
  for (int i = 0; i < 4; i++) {
    lens[i] = arr[i] != NULL ? array_bytes(arr[i]) : 0;
    at[i] = size;
    if (lens[i] > UINT64_MAX / 4 || size > UINT64_MAX / 4) {
      rv = ql__err_set(QL_EPROTO, "export: %s: arrays too large", name);
      goto fail;
    }
    total += lens[i];
    size = round_up(size + lens[i]);
  }
  if (r->total_bytes != total || r->offset != 0) {
    rv = ql__err_set(QL_EPROTO, "export: %s: a stream of %llu bytes at %llu, "
                     "its arrays hold %llu", name,
                     (unsigned long long)r->total_bytes,
                     (unsigned long long)r->offset,
                     (unsigned long long)total);
    goto fail;
  }
  /* size is a multiple of ALIGN, as aligned_alloc() wants; ql_free()'s
   * free() takes what it returns. */
  if (size > SIZE_MAX || (e = aligned_alloc(ALIGN, (size_t)size)) == NULL) {
    rv = ql__err_set(QL_ENOMEM, "export: %s: no memory for %llu bytes", name,
                     (unsigned long long)size);
    goto fail;
  }
  memset(e, 0, (size_t)size);
  e->info = info;
  e->bytes = total;
  ql_packed_desc *p = &e->packed;
  p->name = e->info.name;
  p->format = (ql_format)info.format;
  p->group_size = info.group_size;
  p->n = info.n;
  p->k = info.k;
  p->asymmetric = info.asymmetric;
  p->zero_kind = QL_ZERO_FLOAT;
  p->policy = (ql_path)info.policy;
  ql_packed_array *dst[4] = {&p->qdata, &p->scale, &p->zero, &p->bias};
  for (int i = 0; i < 4; i++)
    if (arr[i] != NULL)
      describe(dst[i], arr[i], (uint8_t *)e + at[i]);

  /* The chunks, in order, each copied part by part to where its arrays
   * begin in the allocation. */
  for (;;) {
    r = resp->export_weight;
    const ProtobufCBinaryData *d = &r->data;
    if (r->offset != off || r->total_bytes != total || r->weight == NULL ||
        r->weight->digest.len != QL_DIGEST_BYTES ||
        d->len > total - off || (d->len == 0 && off < total)) {
      rv = ql__err_set(QL_EPROTO, "export: %s: a chunk of %zu bytes at %llu "
                       "(expected at %llu of %llu)", name, d->len,
                       (unsigned long long)r->offset,
                       (unsigned long long)off, (unsigned long long)total);
      goto fail;
    }
    if (memcmp(r->weight->digest.data, info.digest, QL_DIGEST_BYTES) != 0) {
      rv = ql__err_set(QL_EEXIST, "export: weight %s was replaced by other "
                       "content while it was read", name);
      goto fail;
    }
    uint64_t done = 0, base = 0;
    for (int i = 0; i < 4 && done < d->len; base += lens[i], i++) {
      if (off + done >= base + lens[i])
        continue;
      uint64_t from = off + done - base, take = lens[i] - from;
      if (take > d->len - done)
        take = d->len - done;
      memcpy((uint8_t *)e + at[i] + from, d->data + done, (size_t)take);
      done += take;
    }
    off += d->len;
    qlinear__v1__response__free_unpacked(resp, NULL);
    resp = NULL;
    if (off == total)
      break;
    if ((rv = request(c, name, off, &resp)) != 0)
      goto fail;
  }
  *out = e;
  return 0;

fail:
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  free(e);
  return rv;
}
