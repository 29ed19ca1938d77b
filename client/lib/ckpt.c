/*
 * ckpt.c - ql_ckpt_convert(): a GPTQ or AWQ layer given as tensors, to the
 * canonical packed form, through the converter `qlinearctl import` uses
 * (ckpt_import.c).
 */
#include <stdlib.h>
#include <string.h>

#include "qlinear/qlinear_ckpt.h"

#include "ckpt_import.h"
#include "internal.h"

/* The converter reads tensors as the safetensors reader gives them. */
static int st_tensor(const char *layer, const char *part,
                     const ql_ckpt_tensor *in, ql__st_tensor *out) {
  memset(out, 0, sizeof *out);
  ql__st_dtype dt;
  size_t el;
  switch (in->dtype) {
  case QL_ADT_I32:
    dt = QL__ST_I32, el = 4;
    break;
  case QL_ADT_F32:
    dt = QL__ST_F32, el = 4;
    break;
  case QL_ADT_F16:
    dt = QL__ST_F16, el = 2;
    break;
  case QL_ADT_BF16:
    dt = QL__ST_BF16, el = 2;
    break;
  default:
    return ql__err_set(QL_EDTYPE, "%s%s: element type %d (int32, f16, "
                                  "bf16 or f32 expected)",
                       layer, part, in->dtype);
  }
  if (in->ndim != 1 && in->ndim != 2)
    return ql__err_set(QL_ESHAPE, "%s%s: %d dimensions, not 1 or 2", layer,
                       part, in->ndim);
  uint64_t n = 1;
  for (int d = 0; d < in->ndim; d++) {
    if (in->shape[d] != 0 && n > UINT64_MAX / in->shape[d])
      return ql__err_set(QL_ESHAPE, "%s%s: its shape overflows", layer,
                         part);
    n *= in->shape[d];
  }
  if (n > UINT64_MAX / el || n * el != in->bytes || in->data == NULL)
    return ql__err_set(QL_ESHAPE, "%s%s: %llu bytes for a shape of %llu "
                                  "elements of %zu bytes",
                       layer, part, (unsigned long long)in->bytes,
                       (unsigned long long)n, el);
  out->name = (char *)part;
  out->dtype = dt;
  out->ndim = in->ndim;
  out->shape[0] = in->shape[0];
  out->shape[1] = in->ndim == 2 ? in->shape[1] : 0;
  out->bytes = in->bytes;
  out->data = in->data;
  return 0;
}

int ql_ckpt_convert(const char *layer, const ql_ckpt_tensor *qweight,
                    const ql_ckpt_tensor *qzeros, const ql_ckpt_tensor *scales,
                    const ql_ckpt_tensor *g_idx, const char *config,
                    size_t len, ql_ckpt_layer **out) {
  ql__err_clear();
  char err[512] = "";
  ql__ck_canon c = {0};
  int rc;
  if (out == NULL)
    return ql__err_set(QL_EINVAL, "ql_ckpt_convert: out is NULL");
  *out = NULL;
  if (layer == NULL || qweight == NULL || qzeros == NULL || scales == NULL)
    return ql__err_set(QL_EINVAL, "ql_ckpt_convert: a layer name, qweight, "
                                  "qzeros and scales are needed");
  ql__st_tensor qw, qz, sc, gi;
  if ((rc = st_tensor(layer, ".qweight", qweight, &qw)) != 0 ||
      (rc = st_tensor(layer, ".qzeros", qzeros, &qz)) != 0 ||
      (rc = st_tensor(layer, ".scales", scales, &sc)) != 0 ||
      (g_idx != NULL && (rc = st_tensor(layer, ".g_idx", g_idx, &gi)) != 0))
    return rc;
  ql__ck_config cfg = {.sym = -1, .desc_act = -1};
  if (config != NULL &&
      (rc = ql__ck_config_parse(config, len, &cfg, err, sizeof err)) != 0)
    return ql__err_set(rc, "%s: %s", layer, err);
  ql__ck_layer l = {.name = layer, .qweight = &qw, .qzeros = &qz,
                    .scales = &sc, .g_idx = g_idx != NULL ? &gi : NULL};
  if ((rc = ql__ck_convert(&l, &cfg, &c, err, sizeof err)) != 0)
    return ql__err_set(rc, "%s", err);
  /* One allocation: the struct, then each array at an 8-byte offset. */
  size_t head = (sizeof(ql_ckpt_layer) + 7) & ~(size_t)7;
  size_t q = (c.qdata_bytes + 7) & ~(size_t)7;
  size_t s = (c.scale_bytes + 7) & ~(size_t)7;
  ql_ckpt_layer *o = calloc(1, head + q + s * (c.zero != NULL ? 2 : 1));
  if (o == NULL) {
    ql__ck_canon_free(&c);
    return ql__err_set(QL_ENOMEM, "%s: no memory for the converted arrays",
                       layer);
  }
  unsigned char *p = (unsigned char *)o + head;
  memcpy(p, c.qdata, c.qdata_bytes);
  memcpy(p + q, c.scale, c.scale_bytes);
  if (c.zero != NULL)
    memcpy(p + q + s, c.zero, c.scale_bytes);
  ql_packed_desc *d = &o->desc;
  d->format = c.format;
  d->group_size = c.group_size;
  d->n = c.n;
  d->k = c.k;
  d->asymmetric = c.asymmetric;
  d->zero_kind = QL_ZERO_FLOAT;
  d->qdata = (ql_packed_array){p, c.qdata_dtype, 2, {c.n, c.qdata_bytes / c.n}};
  d->scale = (ql_packed_array){p + q, c.scale_dtype, 2, {c.groups, c.n}};
  if (c.zero != NULL)
    d->zero = (ql_packed_array){p + q + s, c.scale_dtype, 2, {c.groups, c.n}};
  o->method = c.method == QL__CK_AWQ ? 2 : 1;
  o->bits = c.bits;
  o->src_group = c.src_group;
  o->symmetric = c.symmetric_src;
  ql__ck_canon_free(&c);
  *out = o;
  return 0;
}
