/* protocol.c - see protocol.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/protocol.h"

/* The C enums of ql_defs.h are the wire enums: a value is range-checked
 * and then cast. */
_Static_assert((int)QLINEAR__V1__DTYPE__DTYPE_F32 == QL_DTYPE_F32 &&
                   (int)QLINEAR__V1__DTYPE__DTYPE_F16 == QL_DTYPE_F16 &&
                   (int)QLINEAR__V1__DTYPE__DTYPE_BF16 == QL_DTYPE_BF16,
               "dtype values");
_Static_assert((int)QLINEAR__V1__FORMAT__FORMAT_Q4G == QL_FORMAT_Q4G &&
                   (int)QLINEAR__V1__FORMAT__FORMAT_Q8C == QL_FORMAT_Q8C &&
                   (int)QLINEAR__V1__FORMAT__FORMAT_Q8B == QL_FORMAT_Q8B &&
                   (int)QLINEAR__V1__FORMAT__FORMAT_F8R == QL_FORMAT_F8R,
               "format values");
_Static_assert((int)QLINEAR__V1__PATH__PATH_AUTO == QL_PATH_AUTO &&
                   (int)QLINEAR__V1__PATH__PATH_WEIGHT_ONLY ==
                       QL_PATH_WEIGHT_ONLY &&
                   (int)QLINEAR__V1__PATH__PATH_ACT_QUANT == QL_PATH_ACT_QUANT,
               "path values");

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Every allocation carries its size in a header so that free can return it
 * to the budget; 16 bytes keep the payload max-aligned. */
#define HDR 16

static void *budget_take(size_t *used, size_t limit, size_t size) {
  if (size > limit - *used || size > SIZE_MAX - HDR)
    return NULL;
  unsigned char *p = malloc(size + HDR);
  if (p == NULL)
    return NULL;
  memcpy(p, &size, sizeof size);
  *used += size;
  return p + HDR;
}

static void budget_give(size_t *used, void *ptr) {
  if (ptr == NULL)
    return;
  unsigned char *p = (unsigned char *)ptr - HDR;
  size_t size;
  memcpy(&size, p, sizeof size);
  *used -= size;
  free(p);
}

static void *budget_alloc(void *data, size_t size) {
  ql__request *r = data;
  return budget_take(&r->used, r->limit, size);
}

static void budget_free(void *data, void *ptr) {
  ql__request *r = data;
  budget_give(&r->used, ptr);
}

static void *session_budget_alloc(void *data, size_t size) {
  ql__session_request *r = data;
  return budget_take(&r->used, r->limit, size);
}

static void session_budget_free(void *data, void *ptr) {
  ql__session_request *r = data;
  budget_give(&r->used, ptr);
}

int ql__mul_size(size_t a, size_t b, size_t c, size_t *out) {
  size_t ab;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, out))
    return QL_ESHAPE;
  return 0;
}

int ql__name_valid(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > 255 || name[0] == '/')
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
             (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '/' ||
             c == '-';
    if (!ok)
      return 0;
  }
  /* ".." anywhere, not only as a whole component: simpler and stricter. */
  return strstr(name, "..") == NULL;
}

static int check_name(const char *what, const char *name, char *err,
                      size_t errlen) {
  if (name == NULL || !ql__name_valid(name)) {
    seterr(err, errlen,
           "%s: invalid weight name (want [A-Za-z0-9._/-]{1,255}, no '..', "
           "no leading '/')",
           what);
    return QL_ENAME;
  }
  return 0;
}

/* Checks one array of a packed import: a known dtype, 1 or 2 positive
 * dims, and a byte size that does not overflow. */
static int validate_array(const char *what, const Qlinear__V1__ArraySpec *a,
                          char *err, size_t errlen) {
  size_t es = ql_array_dtype_size((int)a->dtype), bytes;
  if (es == 0) {
    seterr(err, errlen, "load: %s: unknown dtype %d", what,
           (int)a->dtype);
    return QL_EDTYPE;
  }
  if (a->n_shape < 1 || a->n_shape > 2) {
    seterr(err, errlen, "load: %s: %zu dims (want 1 or 2)", what,
           a->n_shape);
    return QL_ESHAPE;
  }
  for (size_t i = 0; i < a->n_shape; i++) {
    if (a->shape[i] == 0 || a->shape[i] > QL_MAX_DIM) {
      seterr(err, errlen, "load: %s: dim %zu is %llu", what, i,
             (unsigned long long)a->shape[i]);
      return QL_ESHAPE;
    }
  }
  if (ql__mul_size(a->shape[0], a->n_shape == 2 ? a->shape[1] : 1, es,
                   &bytes) != 0) {
    seterr(err, errlen, "load: %s: size overflows", what);
    return QL_ESHAPE;
  }
  return 0;
}

static int validate_packed(const Qlinear__V1__PackedSpec *p, int has_bias,
                           char *err, size_t errlen) {
  int rc;
  if (p->qdata == NULL || p->scale == NULL) {
    seterr(err, errlen, "load: packed: %s missing",
           p->qdata == NULL ? "qdata" : "scale");
    return QL_EINVAL;
  }
  if (has_bias != (p->bias != NULL)) {
    seterr(err, errlen, "load: packed: bias %s",
           has_bias ? "declared but missing" : "given but not declared");
    return QL_EINVAL;
  }
  if (p->zero_kind != QLINEAR__V1__ZERO_KIND__ZERO_FLOAT &&
      p->zero_kind != QLINEAR__V1__ZERO_KIND__ZERO_INT) {
    seterr(err, errlen, "load: packed: unknown zero kind %d",
           (int)p->zero_kind);
    return QL_EINVAL;
  }
  if ((rc = validate_array("qdata", p->qdata, err, errlen)) != 0 ||
      (rc = validate_array("scale", p->scale, err, errlen)) != 0 ||
      (p->zero && (rc = validate_array("zero", p->zero, err, errlen)) != 0) ||
      (p->bias && (rc = validate_array("bias", p->bias, err, errlen)) != 0))
    return rc;
  return 0;
}

static int validate_spec(const Qlinear__V1__WeightSpec *s, int packed,
                         char *err, size_t errlen) {
  int rc;
  if (s == NULL) {
    seterr(err, errlen, "load: missing spec");
    return QL_EINVAL;
  }
  if ((rc = check_name("load", s->name, err, errlen)) != 0)
    return rc;
  if (!ql_format_valid((int)s->format)) {
    seterr(err, errlen, "load: unknown format %d", (int)s->format);
    return QL_EFORMAT;
  }
  int fmt = (int)s->format;
  int grouped = fmt == QL_FORMAT_Q4G || fmt == QL_FORMAT_Q8B;
  if (grouped && s->group_size != 32 && s->group_size != 64 &&
      s->group_size != 128 && s->group_size != 256) {
    seterr(err, errlen, "load: %s %s %u (want 32, 64, 128 or 256)",
           fmt == QL_FORMAT_Q4G ? "q4g" : "q8b",
           fmt == QL_FORMAT_Q4G ? "group size" : "block size", s->group_size);
    return QL_EINVAL;
  }
  if (s->asymmetric && fmt != QL_FORMAT_Q8B) {
    seterr(err, errlen, "load: only q8b has a symmetric and an "
           "asymmetric form");
    return QL_EINVAL;
  }
  if (s->n == 0 || s->k == 0 || s->n > QL_MAX_DIM || s->k > QL_MAX_DIM) {
    seterr(err, errlen, "load: shape %llux%llu out of range",
           (unsigned long long)s->n, (unsigned long long)s->k);
    return QL_ESHAPE;
  }
  if (!packed && !ql_dtype_valid((int)s->dtype)) {
    seterr(err, errlen, "load: unknown data dtype %d", (int)s->dtype);
    return QL_EDTYPE;
  }
  if (s->scale_dtype != 0 && !ql_dtype_valid((int)s->scale_dtype)) {
    seterr(err, errlen, "load: unknown scale dtype %d",
           (int)s->scale_dtype);
    return QL_EDTYPE;
  }
  if (!ql_path_valid((int)s->policy)) {
    seterr(err, errlen, "load: unknown policy %d", (int)s->policy);
    return QL_EINVAL;
  }
  return 0;
}

/* The stateless part of every slice: an offset aligned to the element
 * size (the mapping is page-aligned, so the kernels see aligned elements).
 * Bounds need the memory: dispatch/admit.c checks them with
 * ql__slice_valid() (resolve_tensor). */
static int check_offset(const char *what, uint64_t offset, size_t es,
                        char *err, size_t errlen) {
  if (offset % es != 0) {
    seterr(err, errlen, "linear: %s slice offset %llu is not a multiple of "
           "the %zu-byte element size", what, (unsigned long long)offset,
           es);
    return QL_EINVAL;
  }
  return 0;
}

/* A region slice: an aligned offset. */
static int check_slice(const char *what, const Qlinear__V1__RegionSlice *sl,
                       size_t es, char *err, size_t errlen) {
  return check_offset(what, sl->offset, es, err, errlen);
}

/* The stateless part of a Level Zero IPC slice: an import named, an
 * aligned offset. Bounds need the import: admit.c checks them against
 * the allocation's real size. */
static int check_ze(const char *what, const Qlinear__V1__ZeIpcSlice *sl,
                    size_t es, char *err, size_t errlen) {
  if (sl->import_id == 0) {
    seterr(err, errlen, "linear: %s: the Level Zero IPC slice names no "
           "import", what);
    return QL_EINVAL;
  }
  return check_offset(what, sl->offset, es, err, errlen);
}

/* The stateless part of a CUDA IPC slice: handles of the right size, a
 * device named, an aligned offset. Bounds need the opened allocation:
 * admit.c checks them against its real size. */
static int check_cuda(const char *what, const Qlinear__V1__CudaIpcSlice *sl,
                      size_t es, char *err, size_t errlen) {
  if (sl->mem_handle.len != QL_CUDA_IPC_HANDLE_BYTES) {
    seterr(err, errlen, "linear: %s: a CUDA IPC memory handle has %d bytes, "
           "got %zu", what, QL_CUDA_IPC_HANDLE_BYTES, sl->mem_handle.len);
    return QL_EINVAL;
  }
  if (sl->ready_event.len != 0 &&
      sl->ready_event.len != QL_CUDA_IPC_HANDLE_BYTES) {
    seterr(err, errlen, "linear: %s: a CUDA IPC event handle has %d bytes, "
           "got %zu", what, QL_CUDA_IPC_HANDLE_BYTES, sl->ready_event.len);
    return QL_EINVAL;
  }
  if (sl->device == NULL || sl->device[0] == '\0') {
    seterr(err, errlen, "linear: %s: the CUDA IPC slice names no device",
           what);
    return QL_EINVAL;
  }
  return check_offset(what, sl->offset, es, err, errlen);
}

/* x of a Linear or LinearMulti request; *es gets its element size. */
static int validate_x(const Qlinear__V1__Tensor *x, size_t *es_out,
                      char *err, size_t errlen) {
  int rc;
  if (x == NULL) {
    seterr(err, errlen, "linear: missing x");
    return QL_EINVAL;
  }
  size_t es = ql_dtype_size((int)x->dtype);
  if (es == 0) {
    seterr(err, errlen, "linear: x has unknown dtype %d", (int)x->dtype);
    return QL_EDTYPE;
  }
  if (x->n_shape != 2) {
    seterr(err, errlen, "linear: x must be 2-D [M,K], got %zu dims",
           x->n_shape);
    return QL_ESHAPE;
  }
  uint64_t m = x->shape[0], k = x->shape[1];
  if (m == 0 || k == 0 || m > QL_MAX_DIM || k > QL_MAX_DIM) {
    seterr(err, errlen, "linear: x shape [%llu,%llu] out of range",
           (unsigned long long)m, (unsigned long long)k);
    return QL_ESHAPE;
  }
  size_t want;
  int overflow = ql__mul_size((size_t)m, (size_t)k, es, &want) != 0;
  if (x->data_case == QLINEAR__V1__TENSOR__DATA_INLINE_DATA) {
    if (overflow || x->inline_data.len != want) {
      seterr(err, errlen, "linear: x holds %zu bytes, [%llu,%llu] of "
             "%zu-byte elements needs %llu",
             x->inline_data.len, (unsigned long long)m, (unsigned long long)k,
             es, (unsigned long long)m * k * es);
      return QL_ESHAPE;
    }
  } else {
    /* A slice: of a region, or of CUDA or Level Zero device memory. */
    uint64_t len;
    if (x->data_case == QLINEAR__V1__TENSOR__DATA_REGION && x->region) {
      rc = check_slice("x", x->region, es, err, errlen);
      len = x->region->length;
    } else if (x->data_case == QLINEAR__V1__TENSOR__DATA_CUDA_IPC &&
               x->cuda_ipc) {
      rc = check_cuda("x", x->cuda_ipc, es, err, errlen);
      len = x->cuda_ipc->length;
    } else if (x->data_case == QLINEAR__V1__TENSOR__DATA_ZE_IPC &&
               x->ze_ipc) {
      rc = check_ze("x", x->ze_ipc, es, err, errlen);
      len = x->ze_ipc->length;
    } else {
      seterr(err, errlen, "linear: x carries no data");
      return QL_EINVAL;
    }
    if (rc != 0)
      return rc;
    if (overflow || len != want) {
      seterr(err, errlen, "linear: the x slice holds %llu bytes, [%llu,%llu] "
             "of %zu-byte elements needs %llu", (unsigned long long)len,
             (unsigned long long)m, (unsigned long long)k, es,
             (unsigned long long)m * k * es);
      return QL_ESHAPE;
    }
  }
  *es_out = es;
  return 0;
}

static int validate_linear(const Qlinear__V1__LinearRequest *l, char *err,
                           size_t errlen) {
  int rc;
  size_t es;
  if ((rc = check_name("linear", l->weight, err, errlen)) != 0)
    return rc;
  if (!ql_path_valid((int)l->path)) {
    seterr(err, errlen, "linear: unknown path %d", (int)l->path);
    return QL_EINVAL;
  }
  if ((rc = validate_x(l->x, &es, err, errlen)) != 0)
    return rc;
  /* y_out's length depends on the weight's N: dispatch/admit.c checks it. */
  if (l->y_out != NULL &&
      (rc = check_slice("y_out", l->y_out, es, err, errlen)) != 0)
    return rc;
  if (l->y_out != NULL && l->y_out_cuda != NULL) {
    seterr(err, errlen, "linear: both y_out and y_out_cuda are given");
    return QL_EINVAL;
  }
  if (l->y_out_cuda != NULL &&
      (rc = check_cuda("y_out_cuda", l->y_out_cuda, es, err, errlen)) != 0)
    return rc;
  if (l->y_out_ze != NULL && (l->y_out != NULL || l->y_out_cuda != NULL)) {
    seterr(err, errlen, "linear: y_out_ze with y_out or y_out_cuda");
    return QL_EINVAL;
  }
  if (l->y_out_ze != NULL &&
      (rc = check_ze("y_out_ze", l->y_out_ze, es, err, errlen)) != 0)
    return rc;
  return 0;
}

static int validate_multi(const Qlinear__V1__LinearMultiRequest *l,
                          char *err, size_t errlen) {
  int rc;
  size_t es;
  if (l->n_weights == 0 || l->n_weights > QL_MULTI_MAX) {
    seterr(err, errlen, "linear_multi: %zu weights, expected 1 to %d",
           l->n_weights, QL_MULTI_MAX);
    return QL_EINVAL;
  }
  for (size_t i = 0; i < l->n_weights; i++)
    if ((rc = check_name("linear_multi", l->weights[i], err, errlen)) != 0)
      return rc;
  if (!ql_path_valid((int)l->path)) {
    seterr(err, errlen, "linear_multi: unknown path %d", (int)l->path);
    return QL_EINVAL;
  }
  if ((rc = validate_x(l->x, &es, err, errlen)) != 0)
    return rc;
  if (l->n_y_out != 0 && l->n_y_out != l->n_weights) {
    seterr(err, errlen, "linear_multi: %zu y_out slices for %zu weights",
           l->n_y_out, l->n_weights);
    return QL_EINVAL;
  }
  for (size_t i = 0; i < l->n_y_out; i++) {
    if (l->y_out[i] == NULL) {
      seterr(err, errlen, "linear_multi: empty y_out slice");
      return QL_EINVAL;
    }
    if ((rc = check_slice("y_out", l->y_out[i], es, err, errlen)) != 0)
      return rc;
  }
  if (l->n_y_out_cuda != 0 &&
      (l->n_y_out != 0 || l->n_y_out_cuda != l->n_weights)) {
    seterr(err, errlen, "linear_multi: %zu y_out_cuda slices for %zu weights "
           "(and %zu y_out)", l->n_y_out_cuda, l->n_weights, l->n_y_out);
    return QL_EINVAL;
  }
  for (size_t i = 0; i < l->n_y_out_cuda; i++) {
    if (l->y_out_cuda[i] == NULL) {
      seterr(err, errlen, "linear_multi: empty y_out_cuda slice");
      return QL_EINVAL;
    }
    if ((rc = check_cuda("y_out_cuda", l->y_out_cuda[i], es, err, errlen)) !=
        0)
      return rc;
  }
  if (l->n_y_out_ze != 0 &&
      (l->n_y_out != 0 || l->n_y_out_cuda != 0 ||
       l->n_y_out_ze != l->n_weights)) {
    seterr(err, errlen, "linear_multi: %zu y_out_ze slices for %zu weights "
           "(and %zu y_out, %zu y_out_cuda)", l->n_y_out_ze, l->n_weights,
           l->n_y_out, l->n_y_out_cuda);
    return QL_EINVAL;
  }
  for (size_t i = 0; i < l->n_y_out_ze; i++) {
    if (l->y_out_ze[i] == NULL) {
      seterr(err, errlen, "linear_multi: empty y_out_ze slice");
      return QL_EINVAL;
    }
    if ((rc = check_ze("y_out_ze", l->y_out_ze[i], es, err, errlen)) != 0)
      return rc;
  }
  return 0;
}

int ql__request_validate(const ql__msg_request *req, char *err,
                         size_t errlen) {
  switch (req->body_case) {
  case QLINEAR__V1__REQUEST__BODY_HELLO:
  case QLINEAR__V1__REQUEST__BODY_LIST:
  case QLINEAR__V1__REQUEST__BODY_STATS:
  case QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT:
  case QLINEAR__V1__REQUEST__BODY_LOAD_ABORT:
  case QLINEAR__V1__REQUEST__BODY_RELOAD:
    return 0;
  case QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN: {
    const Qlinear__V1__LoadBeginRequest *b = req->load_begin;
    int rc = validate_spec(b->spec, b->packed != NULL, err, errlen);
    if (rc == 0 && b->packed != NULL)
      rc = validate_packed(b->packed, b->spec->has_bias, err, errlen);
    /* 16: the daemon's most devices (QL__MAX_DEVICES); 63: the longest
     * device name (ql_device_desc.name). Which exist is the handler's. */
    if (rc == 0 && b->n_devices > 16) {
      seterr(err, errlen, "load: %zu devices, at most 16",
             b->n_devices);
      return QL_EINVAL;
    }
    for (size_t i = 0; rc == 0 && i < b->n_devices; i++) {
      size_t n = strlen(b->devices[i]);
      if (n == 0 || n > 63) {
        seterr(err, errlen, "load: device %zu: a name of %zu bytes",
               i, n);
        return QL_EINVAL;
      }
    }
    return rc;
  }
  case QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK:
    if (req->load_chunk->data.len == 0) {
      seterr(err, errlen, "load: empty chunk");
      return QL_EINVAL;
    }
    return 0;
  case QLINEAR__V1__REQUEST__BODY_UNLOAD:
    return check_name("unload", req->unload->name, err, errlen);
  case QLINEAR__V1__REQUEST__BODY_HOLD:
    if (req->hold->digest.len != 0 && req->hold->digest.len != 32) {
      /* 32: SHA-256, the weight digest (weights.h) */
      seterr(err, errlen, "hold: digest of %zu bytes, want 0 or 32",
             req->hold->digest.len);
      return QL_EINVAL;
    }
    return check_name("hold", req->hold->name, err, errlen);
  case QLINEAR__V1__REQUEST__BODY_EXPORT_WEIGHT:
    return check_name("export", req->export_weight->name, err, errlen);
  case QLINEAR__V1__REQUEST__BODY_LINEAR:
    return validate_linear(req->linear, err, errlen);
  case QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI:
    return validate_multi(req->linear_multi, err, errlen);
  default:
    seterr(err, errlen, "request has no known body");
    return QL_EPROTO;
  }
}

/* Reads a varint at *p (below end); -1 when it is cut or too long. */
static int wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
  uint64_t v = 0;
  for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1;
}

/*
 * protobuf-c hands a string field over as a C string: a NUL byte inside
 * it would cut it short, so "a\0/../x" would arrive as the valid name "a"
 * and the request would act on something other than what was sent. This
 * walks the wire bytes of a message that unpacked and returns the first
 * string field (of d or of a message inside it) that holds a NUL, or NULL.
 * The messages are not recursive; depth bounds a hostile nesting anyway.
 */
static const ProtobufCFieldDescriptor *
string_with_nul(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                const uint8_t *end, int depth) {
  while (p < end) {
    uint64_t key, n;
    if (wire_varint(&p, end, &key) != 0)
      return NULL; /* unpack accepted it: nothing more to find */
    switch (key & 7) {
    case 0:
      if (wire_varint(&p, end, &n) != 0)
        return NULL;
      break;
    case 1:
      p += (size_t)(end - p) < 8 ? (size_t)(end - p) : 8;
      break;
    case 5:
      p += (size_t)(end - p) < 4 ? (size_t)(end - p) : 4;
      break;
    case 2: {
      if (wire_varint(&p, end, &n) != 0 || n > (uint64_t)(end - p))
        return NULL;
      const ProtobufCFieldDescriptor *f =
          key >> 3 <= UINT32_MAX
              ? protobuf_c_message_descriptor_get_field(d,
                                                        (unsigned)(key >> 3))
              : NULL;
      if (f != NULL && f->type == PROTOBUF_C_TYPE_STRING &&
          memchr(p, 0, (size_t)n) != NULL)
        return f;
      if (f != NULL && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 8) {
        const ProtobufCFieldDescriptor *in =
            string_with_nul(f->descriptor, p, p + n, depth + 1);
        if (in != NULL)
          return in;
      }
      p += n;
      break;
    }
    default:
      return NULL;
    }
  }
  return NULL;
}

int ql__request_check_strings(const void *buf, size_t len, char *err,
                              size_t errlen) {
  const ProtobufCFieldDescriptor *f =
      string_with_nul(&qlinear__v1__request__descriptor, buf,
                      (const uint8_t *)buf + len, 0);
  if (f == NULL)
    return 0;
  if (strcmp(f->name, "name") == 0 || strcmp(f->name, "weight") == 0 ||
      strcmp(f->name, "weights") == 0) {
    seterr(err, errlen, "invalid weight name: a NUL byte inside '%s'",
           f->name);
    return QL_ENAME;
  }
  seterr(err, errlen, "string field '%s' holds a NUL byte", f->name);
  return QL_EPROTO;
}

int ql__request_decode(const void *buf, size_t len, size_t budget,
                       ql__request **out, char *err, size_t errlen) {
  int rc;
  *out = NULL;
  ql__request *r = calloc(1, sizeof *r);
  if (r == NULL) {
    seterr(err, errlen, "out of memory");
    return QL_ENOMEM;
  }
  r->limit = budget;
  r->alloc.alloc = budget_alloc;
  r->alloc.free = budget_free;
  r->alloc.allocator_data = r;
  r->msg = qlinear__v1__request__unpack(&r->alloc, len, buf);
  if (r->msg == NULL) {
    seterr(err, errlen, "not a valid qlinear.v1.Request");
    rc = QL_EPROTO;
    goto fail;
  }
  *out = r;
  return 0;
fail:
  ql__request_free(r);
  return rc;
}

void ql__request_free(ql__request *r) {
  if (r == NULL)
    return;
  if (r->msg != NULL)
    qlinear__v1__request__free_unpacked(r->msg, &r->alloc);
  free(r);
}

/* ------------------------------------------------------- session socket */

int ql__session_request_validate(const ql__msg_session_request *req,
                                 char *err, size_t errlen) {
  switch (req->body_case) {
  case QLINEAR__V1__SESSION_REQUEST__BODY_OPEN:
    return 0; /* the version is compared by the session, which answers */
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION:
    if (req->create_region->size == 0) {
      seterr(err, errlen, "create_region: size 0");
      return QL_EINVAL;
    }
    return 0;
  case QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION:
    if (req->destroy_region->region_id == 0) {
      seterr(err, errlen, "destroy_region: region id 0");
      return QL_EINVAL;
    }
    return 0;
  case QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC:
    if (req->import_ze_ipc->ipc_handle.len != QL_ZE_IPC_HANDLE_BYTES) {
      seterr(err, errlen, "import_ze_ipc: a Level Zero IPC handle has %d "
             "bytes, got %zu", QL_ZE_IPC_HANDLE_BYTES,
             req->import_ze_ipc->ipc_handle.len);
      return QL_EINVAL;
    }
    if (req->import_ze_ipc->device == NULL ||
        req->import_ze_ipc->device[0] == '\0') {
      seterr(err, errlen, "import_ze_ipc: no device named");
      return QL_EINVAL;
    }
    return 0;
  case QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT:
    if (req->release_import->import_id == 0) {
      seterr(err, errlen, "release_import: import id 0");
      return QL_EINVAL;
    }
    return 0;
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING:
    return 0; /* the size is checked where the ring is made */
  case QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT:
    return check_name("map_weight", req->map_weight->name, err, errlen);
  default:
    seterr(err, errlen, "session request has no known body");
    return QL_EPROTO;
  }
}

int ql__session_request_decode(const void *buf, size_t len, size_t budget,
                               ql__session_request **out, char *err,
                               size_t errlen) {
  *out = NULL;
  if (len > QL_SESSION_MSG_MAX) {
    seterr(err, errlen, "session message of %zu bytes (at most %d)", len,
           QL_SESSION_MSG_MAX);
    return QL_EPROTO;
  }
  ql__session_request *r = calloc(1, sizeof *r);
  if (r == NULL) {
    seterr(err, errlen, "out of memory");
    return QL_ENOMEM;
  }
  r->limit = budget;
  r->alloc.alloc = session_budget_alloc;
  r->alloc.free = session_budget_free;
  r->alloc.allocator_data = r;
  r->msg = qlinear__v1__session_request__unpack(&r->alloc, len, buf);
  if (r->msg == NULL) {
    seterr(err, errlen, "not a valid qlinear.v1.SessionRequest");
    ql__session_request_free(r);
    return QL_EPROTO;
  }
  *out = r;
  return 0;
}

void ql__session_request_free(ql__session_request *r) {
  if (r == NULL)
    return;
  if (r->msg != NULL)
    qlinear__v1__session_request__free_unpacked(r->msg, &r->alloc);
  free(r);
}

const char *ql__format_name(int f) {
  static const char *const names[] = {"?", "q4g", "q8c", "q8b", "f8r"};
  return f >= 1 && f <= 4 ? names[f] : "?";
}
