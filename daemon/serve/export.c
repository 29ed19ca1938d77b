/*
 * export.c - see serve.h: ExportWeight, a resident weight's canonical
 * packed arrays read back in LoadBegin's packed upload order, so that a
 * client can save what it offloaded (and load it again, bit for bit).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "serve/serve.h"

/* Describes one canonical array as an ArraySpec. */
static void array_spec(Qlinear__V1__ArraySpec *a, uint64_t *shape, int dtype,
                       int ndim, uint64_t d0, uint64_t d1) {
  qlinear__v1__array_spec__init(a);
  a->dtype = (Qlinear__V1__ArrayDType)dtype;
  shape[0] = d0;
  shape[1] = d1;
  a->shape = shape;
  a->n_shape = (size_t)ndim;
}

/*
 * The stream of q: its arrays (pointers and sizes) in upload order and
 * their ArraySpecs in b. q is canonical (the store holds nothing else):
 * qdata i8 (q4g: two codes a byte, [N, ceil(K/2)]; f8r: e4m3 bytes), scale
 * and zero [G, N] (q4g, q8b) or [N] (q8c, f8r) in the scale dtype, bias
 * f32 [N]; ql_dtype and ql_array_dtype share the float codes.
 */
static size_t stream_of(const ql_qweight *q, ql__export_buf *b,
                        const void *parts[4], size_t lens[4]) {
  uint64_t n = (uint64_t)q->n, k = (uint64_t)q->k;
  int grouped = q->format == QL_FORMAT_Q4G || q->format == QL_FORMAT_Q8B;
  size_t np = 0, total = 0;

  qlinear__v1__packed_spec__init(&b->packed);
  b->packed.zero_kind = QLINEAR__V1__ZERO_KIND__ZERO_FLOAT;
  array_spec(&b->arr[0], b->shape[0],
             q->format == QL_FORMAT_F8R ? QL_ADT_F8E4M3 : QL_ADT_I8, 2, n,
             q->format == QL_FORMAT_Q4G ? k / 2 + (k & 1) : k);
  b->packed.qdata = &b->arr[0];
  parts[np] = q->qdata;
  lens[np++] = q->qdata_bytes;
  if (grouped)
    array_spec(&b->arr[1], b->shape[1], (int)q->scale_dtype, 2,
               (uint64_t)q->groups, n);
  else
    array_spec(&b->arr[1], b->shape[1], (int)q->scale_dtype, 1, n, 0);
  b->packed.scale = &b->arr[1];
  parts[np] = q->scale;
  lens[np++] = q->scale_bytes;
  if (q->zero != NULL) {
    array_spec(&b->arr[2], b->shape[2], (int)q->scale_dtype, 2,
               (uint64_t)q->groups, n);
    b->packed.zero = &b->arr[2];
    parts[np] = q->zero;
    lens[np++] = q->scale_bytes;
  }
  if (q->bias != NULL) {
    array_spec(&b->arr[3], b->shape[3], QL_ADT_F32, 1, n, 0);
    b->packed.bias = &b->arr[3];
    parts[np] = q->bias;
    lens[np++] = (size_t)q->n * sizeof(float);
  }
  for (size_t i = np; i < 4; i++) {
    parts[i] = NULL;
    lens[i] = 0;
  }
  for (size_t i = 0; i < np; i++)
    total += lens[i];
  return total;
}

void ql__serve_export(ql__server *s, ql__session *ss,
                      const Qlinear__V1__ExportWeightRequest *m, ql__reply *r,
                      ql__export_buf *b) {
  const void *parts[4];
  size_t lens[4], total, limit, len, at, off;
  ql__weight *w;

  /* A session reads only what it holds: the hold is where the tenancy
   * rule is applied (a digest, a content-addressed name, or the loader's
   * uid: ql__weight_holdable()). The admin socket reads any weight. */
  w = ss != NULL ? ql__session_held(ss, m->name)
                 : ql__weight_store_get(s->weights, m->name);
  if (w == NULL) {
    if (ss != NULL && ql__weight_store_get(s->weights, m->name) != NULL) {
      ql__reply_set_error(r, QL_EPERM, "export: this session does not hold "
                          "weight '%s' (load or hold it first)", m->name);
      return;
    }
    ql__reply_set_error(r, QL_ENOTFOUND, "export: no weight named '%s'",
                        m->name);
    return;
  }
  total = stream_of(w->q, b, parts, lens);
  if (m->offset > total) {
    ql__reply_set_error(r, QL_EINVAL, "export: offset %llu is past the end "
                        "of weight '%s' (%zu bytes)",
                        (unsigned long long)m->offset, m->name, total);
    return;
  }
  /* A chunk fits a reply as a LoadChunk fits a request. */
  limit = s->cfg.max_chunk_bytes;
  if (m->max_bytes != 0 && m->max_bytes < limit)
    limit = (size_t)m->max_bytes;
  off = (size_t)m->offset;
  len = total - off < limit ? total - off : limit;
  if (len > 0 && (b->data = malloc(len)) == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "export: no memory for a chunk of %zu "
                        "bytes", len);
    return;
  }
  /* Copy [off, off + len) of the stream, part by part. */
  at = 0;
  for (size_t i = 0, base = 0; i < 4 && at < len; base += lens[i], i++) {
    if (off + at >= base + lens[i])
      continue;
    size_t from = off + at - base, take = lens[i] - from;
    if (take > len - at)
      take = len - at;
    memcpy(b->data + at, (const uint8_t *)parts[i] + from, take);
    at += take;
  }
  ql__fill_info(s, &b->info, w);
  qlinear__v1__export_weight_response__init(&b->resp);
  b->resp.weight = &b->info.info;
  b->resp.packed = &b->packed;
  b->resp.total_bytes = total;
  b->resp.offset = off;
  b->resp.data.data = b->data;
  b->resp.data.len = len;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_EXPORT_WEIGHT;
  r->resp.export_weight = &b->resp;
  if (off == 0)
    ql__info("%s exports weight %s (%zu bytes)",
             ss != NULL ? "a session" : "the admin socket", m->name, total);
}

void ql__export_buf_free(ql__export_buf *b) {
  free(b->data);
  b->data = NULL;
}
