/*
 * linear.c - libqlinear: the Linear calls: inline and multi (through the
 * ring or a message, staged when the ring carries them), and on region, CUDA
 * IPC and Level Zero slices (one tensor_slice for the three).
 */
#include "internal.h"

/* ------------------------------------------------------------ linear */

/* Checks what every linear call shares before anything is sent. */
static int check_linear_args(ql_client *c, const char *weight, ql_path path,
                             ql_dtype dtype, uint64_t m, uint64_t k,
                             uint64_t n) {
  int rv;
  if (c == NULL)
    return ql__err_set(QL_EINVAL, "client is NULL");
  if ((rv = ql__check_name(weight)) != 0)
    return rv;
  if (!ql_dtype_valid(dtype))
    return ql__err_set(QL_EDTYPE, "data type %d is not f32, f16 or bf16",
                       (int)dtype);
  if (!ql_path_valid(path))
    return ql__err_set(QL_EINVAL, "path %d is unknown", (int)path);
  if (m == 0 || k == 0 || n == 0)
    return ql__err_set(QL_ESHAPE,
                       "x [%llu, %llu], y [%llu, %llu]: every "
                       "dimension must be at least 1",
                       (unsigned long long)m, (unsigned long long)k,
                       (unsigned long long)m, (unsigned long long)n);
  return 0;
}

/*
 * Sends a prepared Linear request and checks its reply: y must be [m, n]
 * in dtype, inline with ybytes bytes when neither ys nor yc is given
 * (copied to y), else naming exactly the region slice ys or the CUDA IPC
 * slice yc (its offset and length: the reply carries no handle). st, when
 * not NULL, is the staging region ys lies in: on success y receives the
 * result from there. st is consumed (ql__exchange()).
 */
static int linear_call(ql_client *c, Qlinear__V1__LinearRequest *lr,
                       ql_dtype dtype, uint64_t m, uint64_t n, uint64_t ybytes,
                       const Qlinear__V1__RegionSlice *ys,
                       const Qlinear__V1__CudaIpcSlice *yc, void *y,
                       ql_linear_result *res, stage *st) {
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  req.linear = lr;
  if ((rv = ql__exchange(c, &req, QLINEAR__V1__RESPONSE__BODY_LINEAR,
                         c->timeout_ms, st, &resp)) != 0)
    return rv;

  const Qlinear__V1__LinearResponse *lp = resp->linear;
  const Qlinear__V1__Tensor *yt = lp->y;
  if (yt == NULL) {
    rv = ql__err_set(QL_EPROTO, "reply without y");
    goto fail;
  }
  if ((int)yt->dtype != (int)dtype) {
    rv = ql__err_set(QL_EDTYPE, "reply y has data type %d, expected %d",
                     (int)yt->dtype, (int)dtype);
    goto fail;
  }
  if (yt->n_shape != 2 || yt->shape[0] != m || yt->shape[1] != n) {
    rv = ql__err_set(QL_ESHAPE,
                     "reply y has %zu dimensions [%llu, %llu%s], "
                     "expected [%llu, %llu]",
                     yt->n_shape,
                     (unsigned long long)(yt->n_shape > 0 ? yt->shape[0] : 0),
                     (unsigned long long)(yt->n_shape > 1 ? yt->shape[1] : 0),
                     yt->n_shape > 2 ? ", ..." : "", (unsigned long long)m,
                     (unsigned long long)n);
    goto fail;
  }
  if (ys != NULL) {
    const Qlinear__V1__RegionSlice *got =
        yt->data_case == QLINEAR__V1__TENSOR__DATA_REGION ? yt->region : NULL;
    if (got == NULL || got->region_id != ys->region_id ||
        got->offset != ys->offset || got->length != ys->length) {
      rv = ql__err_set(QL_EPROTO, "reply y is not the slice asked for");
      goto fail;
    }
  } else if (lr->y_out_ze != NULL) {
    const Qlinear__V1__ZeIpcSlice *got =
        yt->data_case == QLINEAR__V1__TENSOR__DATA_ZE_IPC ? yt->ze_ipc : NULL;
    if (got == NULL || got->import_id != lr->y_out_ze->import_id ||
        got->offset != lr->y_out_ze->offset ||
        got->length != lr->y_out_ze->length) {
      rv = ql__err_set(QL_EPROTO, "reply y is not the Level Zero slice asked "
                                  "for");
      goto fail;
    }
  } else if (yc != NULL) {
    const Qlinear__V1__CudaIpcSlice *got =
        yt->data_case == QLINEAR__V1__TENSOR__DATA_CUDA_IPC ? yt->cuda_ipc
                                                            : NULL;
    if (got == NULL || got->offset != yc->offset || got->length != yc->length) {
      rv = ql__err_set(QL_EPROTO, "reply y is not the CUDA slice asked for");
      goto fail;
    }
  } else if (yt->data_case != QLINEAR__V1__TENSOR__DATA_INLINE_DATA ||
             yt->inline_data.len != ybytes) {
    rv = ql__err_set(QL_EPROTO,
                     "reply y carries %zu bytes of data, [%llu, %llu] "
                     "needs %llu",
                     yt->data_case == QLINEAR__V1__TENSOR__DATA_INLINE_DATA
                         ? yt->inline_data.len
                         : 0,
                     (unsigned long long)m, (unsigned long long)n,
                     (unsigned long long)ybytes);
    goto fail;
  }
  /* Strict here, unlike listings: the path that ran is part of the answer
   * and this protocol version knows every path. */
  if (!ql_path_valid(lp->path)) {
    rv = ql__err_set(QL_EPROTO, "reply names unknown path %d", (int)lp->path);
    goto fail;
  }
  if (ys == NULL && yc == NULL && lr->y_out_ze == NULL)
    memcpy(y, yt->inline_data.data, (size_t)ybytes);
  if (st != NULL)
    memcpy(y, (const uint8_t *)st->reg->data + ys->offset, (size_t)ybytes);
  if (res != NULL) {
    res->path = (ql_path)lp->path;
    ql__copy_str(res->impl, sizeof res->impl, lp->impl);
  }
  rv = 0;

fail:
  ql__stage_put(st);
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

QL_EXPORT int ql_linear(ql_client *c, const char *weight, ql_path path,
                        ql_dtype dtype, uint64_t m, uint64_t k, const void *x,
                        uint64_t n, void *y, ql_linear_result *res) {
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {m, k}, mk, mn, xbytes, ybytes, cap, room;
  size_t esz;
  int rv;

  ql__err_clear();
  if (c == NULL || x == NULL || y == NULL)
    return ql__err_set(QL_EINVAL, "client, x or y is NULL");
  if ((rv = check_linear_args(c, weight, path, dtype, m, k, n)) != 0)
    return rv;
  esz = ql_dtype_size(dtype);
  ql__client_limits(c, &cap, NULL);
  room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
  /* Both directions must fit the cap: the daemon cannot send a larger y
   * and our receive limit would drop it. Checked before anything is
   * packed, so a huge x costs no copy. */
  if (!ql__mul_ok(m, k, &mk) || !ql__mul_ok(mk, esz, &xbytes) || xbytes > room)
    return ql__err_set(QL_ETOOBIG,
                       "x [%llu, %llu] does not fit the daemon's cap "
                       "of %llu bytes",
                       (unsigned long long)m, (unsigned long long)k,
                       (unsigned long long)cap);
  if (!ql__mul_ok(m, n, &mn) || !ql__mul_ok(mn, esz, &ybytes) || ybytes > room)
    return ql__err_set(QL_ETOOBIG,
                       "y [%llu, %llu] does not fit the daemon's cap "
                       "of %llu bytes",
                       (unsigned long long)m, (unsigned long long)n,
                       (unsigned long long)cap);

  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  lr.weight = (char *)weight;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  /* On the ring, x and y go through a staging region: one copy each way,
   * which costs less than packing them into messages. */
  uint64_t yoff = (xbytes + 63) & ~(uint64_t)63;
  stage *st = c->ring != NULL && yoff + ybytes <= STAGE_MAX_BYTES
                  ? ql__stage_take(c, (size_t)(yoff + ybytes))
                  : NULL;
  if (st != NULL) {
    Qlinear__V1__RegionSlice xs, ys;
    memcpy(st->reg->data, x, (size_t)xbytes);
    qlinear__v1__region_slice__init(&xs);
    qlinear__v1__region_slice__init(&ys);
    xs.region_id = ys.region_id = st->reg->id;
    xs.offset = 0;
    xs.length = xbytes;
    ys.offset = yoff;
    ys.length = ybytes;
    xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    xt.region = &xs;
    lr.y_out = &ys;
    return linear_call(c, &lr, dtype, m, n, ybytes, &ys, NULL, y, res, st);
  }
  xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  xt.inline_data.data = (uint8_t *)x; /* pack only reads it */
  xt.inline_data.len = (size_t)xbytes;
  return linear_call(c, &lr, dtype, m, n, ybytes, NULL, NULL, y, res, NULL);
}

QL_EXPORT int ql_linear_multi(ql_client *c, size_t count,
                              const char *const *weights, ql_path path,
                              ql_dtype dtype, uint64_t m, uint64_t k,
                              const void *x, const uint64_t *n, void *const *y,
                              ql_linear_result *res) {
  Qlinear__V1__LinearMultiRequest lr = QLINEAR__V1__LINEAR_MULTI_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {m, k}, mk, xbytes, cap, room, ytotal = 0;
  uint64_t ybytes[QL_MULTI_MAX];
  size_t esz;
  int rv;

  ql__err_clear();
  if (c == NULL || x == NULL || weights == NULL || n == NULL || y == NULL)
    return ql__err_set(QL_EINVAL, "client, weights, x, n or y is NULL");
  if (count == 0 || count > QL_MULTI_MAX)
    return ql__err_set(QL_EINVAL, "%zu weights, expected 1 to %d", count,
                       QL_MULTI_MAX);
  esz = ql_dtype_size(dtype);
  ql__client_limits(c, &cap, NULL);
  room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
  for (size_t i = 0; i < count; i++) {
    uint64_t mn;
    if ((rv = check_linear_args(c, weights[i], path, dtype, m, k, n[i])) != 0)
      return rv;
    if (y[i] == NULL)
      return ql__err_set(QL_EINVAL, "y[%zu] is NULL", i);
    if (!ql__mul_ok(m, n[i], &mn) || !ql__mul_ok(mn, esz, &ybytes[i]) ||
        ybytes[i] > room - ytotal)
      return ql__err_set(QL_ETOOBIG,
                         "the results do not fit the daemon's cap of "
                         "%llu bytes",
                         (unsigned long long)cap);
    ytotal += ybytes[i];
  }
  if (!ql__mul_ok(m, k, &mk) || !ql__mul_ok(mk, esz, &xbytes) || xbytes > room)
    return ql__err_set(QL_ETOOBIG,
                       "x [%llu, %llu] does not fit the daemon's cap "
                       "of %llu bytes",
                       (unsigned long long)m, (unsigned long long)k,
                       (unsigned long long)cap);
  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  lr.weights = (char **)weights; /* pack only reads them */
  lr.n_weights = count;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI;
  req.linear_multi = &lr;
  /* On the ring, through a staging region (as ql_linear()): x, then each
   * y at a 64-byte boundary. */
  uint64_t yoff[QL_MULTI_MAX], end = (xbytes + 63) & ~(uint64_t)63;
  for (size_t i = 0; i < count; i++) {
    yoff[i] = end;
    end = (end + ybytes[i] + 63) & ~(uint64_t)63;
  }
  stage *st = c->ring != NULL && end <= STAGE_MAX_BYTES
                  ? ql__stage_take(c, (size_t)end)
                  : NULL;
  Qlinear__V1__RegionSlice xs, ys[QL_MULTI_MAX], *pys[QL_MULTI_MAX];
  if (st != NULL) {
    memcpy(st->reg->data, x, (size_t)xbytes);
    qlinear__v1__region_slice__init(&xs);
    xs.region_id = st->reg->id;
    xs.length = xbytes;
    xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    xt.region = &xs;
    for (size_t i = 0; i < count; i++) {
      qlinear__v1__region_slice__init(&ys[i]);
      ys[i].region_id = st->reg->id;
      ys[i].offset = yoff[i];
      ys[i].length = ybytes[i];
      pys[i] = &ys[i];
    }
    lr.y_out = pys;
    lr.n_y_out = count;
  } else {
    xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
    xt.inline_data.data = (uint8_t *)x; /* pack only reads it */
    xt.inline_data.len = (size_t)xbytes;
  }
  if ((rv = ql__exchange(c, &req, QLINEAR__V1__RESPONSE__BODY_LINEAR_MULTI,
                         c->timeout_ms, st, &resp)) != 0)
    return rv;
  const Qlinear__V1__LinearMultiResponse *mp = resp->linear_multi;
  if (mp->n_results != count) {
    rv = ql__err_set(QL_EPROTO, "%zu results for %zu weights", mp->n_results,
                     count);
    goto done;
  }
  /* Everything is checked before anything is copied out. */
  for (size_t i = 0; i < count; i++) {
    const Qlinear__V1__LinearResponse *lp = mp->results[i];
    const Qlinear__V1__Tensor *yt = lp ? lp->y : NULL;
    bool where_asked =
        st != NULL
            ? yt != NULL && yt->data_case == QLINEAR__V1__TENSOR__DATA_REGION &&
                  yt->region->region_id == ys[i].region_id &&
                  yt->region->offset == ys[i].offset &&
                  yt->region->length == ys[i].length
            : yt != NULL &&
                  yt->data_case == QLINEAR__V1__TENSOR__DATA_INLINE_DATA &&
                  yt->inline_data.len == ybytes[i];
    if (yt == NULL || (int)yt->dtype != (int)dtype || yt->n_shape != 2 ||
        yt->shape[0] != m || yt->shape[1] != n[i] || !where_asked ||
        !ql_path_valid(lp->path)) {
      rv = ql__err_set(QL_EPROTO,
                       "result %zu is not a [%llu, %llu] y of the "
                       "request's data type",
                       i, (unsigned long long)m, (unsigned long long)n[i]);
      goto done;
    }
  }
  for (size_t i = 0; i < count; i++) {
    const Qlinear__V1__LinearResponse *lp = mp->results[i];
    memcpy(y[i],
           st != NULL ? (const uint8_t *)st->reg->data + yoff[i]
                      : lp->y->inline_data.data,
           (size_t)ybytes[i]);
    if (res != NULL) {
      res[i].path = (ql_path)lp->path;
      ql__copy_str(res[i].impl, sizeof res[i].impl, lp->impl);
    }
  }
  rv = 0;
done:
  ql__stage_put(st);
  qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

/* True if r is a live region of c. */
static bool region_of(ql_client *c, const ql_region *r) {
  bool found = false;
  pthread_mutex_lock(&c->lock);
  for (region_node *p = c->regions; p != NULL && !found; p = p->next)
    found = &p->pub == r;
  pthread_mutex_unlock(&c->lock);
  return found;
}

/*
 * Where a Linear call's x or y lies: in one of the client's regions, in
 * CUDA device memory (CUDA IPC) or in an imported Level Zero allocation.
 * One descriptor for the three, so the checks that need no daemon and the
 * request they make are written once (ql_linear_region, ql_linear_cuda
 * and ql_linear_ze are wrappers of linear_slices()).
 */
typedef enum { SLICE_REGION, SLICE_CUDA, SLICE_ZE } slice_kind;

typedef struct tensor_slice {
  slice_kind kind;
  union {
    const ql_slice *region;
    const ql_cuda_slice *cuda;
    const ql_ze_slice *ze;
  } u; /* the caller's, by kind; NULL: none given */
  /* Filled by slice_msg(): the slice on the wire (it may point into the
   * caller's slice: pack only reads it). */
  union {
    Qlinear__V1__RegionSlice region;
    Qlinear__V1__CudaIpcSlice cuda;
    Qlinear__V1__ZeIpcSlice ze;
  } msg;
} tensor_slice;

static const char *const slice_names[] = {"region", "CUDA", "Level Zero"};

static uint64_t slice_offset(const tensor_slice *t) {
  return t->kind == SLICE_REGION ? t->u.region->offset
         : t->kind == SLICE_CUDA ? t->u.cuda->offset
                                 : t->u.ze->offset;
}

static uint64_t slice_length(const tensor_slice *t) {
  return t->kind == SLICE_REGION ? t->u.region->length
         : t->kind == SLICE_CUDA ? t->u.cuda->length
                                 : t->u.ze->length;
}

/*
 * Checks t (x when is_x, else y) for a tensor of bytes bytes of esz-byte
 * elements and describes it in t->msg: what each kind needs (a region of
 * this client, the slice inside it; a terminated CUDA device name; a Level
 * Zero import), then what all share (the offset aligned to the element,
 * the length exactly the tensor's). Only x carries a CUDA ready event.
 */
static int slice_msg(ql_client *c, tensor_slice *t, int is_x, uint64_t bytes,
                     size_t esz) {
  const char *what = is_x ? "x" : "y";
  switch (t->kind) {
  case SLICE_REGION: {
    const ql_slice *sl = t->u.region;
    if (sl->region == NULL || !region_of(c, sl->region))
      return ql__err_set(QL_EINVAL, "%s: not a region of this client", what);
    /* off <= size && len <= size - off: no sum that could wrap. */
    uint64_t size = sl->region->size;
    if (!(sl->offset <= size && sl->length <= size - sl->offset))
      return ql__err_set(QL_EINVAL,
                         "%s: %llu bytes at offset %llu do not fit the "
                         "region's %llu bytes",
                         what, (unsigned long long)sl->length,
                         (unsigned long long)sl->offset,
                         (unsigned long long)size);
    break;
  }
  case SLICE_CUDA:
    if (memchr(t->u.cuda->device, '\0', sizeof t->u.cuda->device) == NULL ||
        t->u.cuda->device[0] == '\0')
      return ql__err_set(QL_EINVAL,
                         "%s: the CUDA slice names no device, or an "
                         "unterminated one",
                         what);
    break;
  case SLICE_ZE:
    if (t->u.ze->import_id == 0)
      return ql__err_set(QL_EINVAL, "%s: the slice names no import", what);
    break;
  }
  const uint64_t off = slice_offset(t), len = slice_length(t);
  if (off % esz != 0)
    return ql__err_set(QL_EINVAL,
                       "%s: offset %llu is not a multiple of the "
                       "%zu-byte element size",
                       what, (unsigned long long)off, esz);
  if (len != bytes)
    return ql__err_set(QL_ESHAPE, "%s: the slice holds %llu bytes, %llu needed",
                       what, (unsigned long long)len,
                       (unsigned long long)bytes);
  switch (t->kind) {
  case SLICE_REGION:
    qlinear__v1__region_slice__init(&t->msg.region);
    t->msg.region.region_id = t->u.region->region->id;
    t->msg.region.offset = off;
    t->msg.region.length = len;
    break;
  case SLICE_CUDA: {
    const ql_cuda_slice *sl = t->u.cuda;
    Qlinear__V1__CudaIpcSlice *m = &t->msg.cuda;
    qlinear__v1__cuda_ipc_slice__init(m);
    m->mem_handle.data = (uint8_t *)sl->mem_handle;
    m->mem_handle.len = sizeof sl->mem_handle;
    m->offset = off;
    m->length = len;
    m->device = (char *)sl->device;
    if (is_x && sl->has_ready_event) {
      m->ready_event.data = (uint8_t *)sl->ready_event;
      m->ready_event.len = sizeof sl->ready_event;
    }
    break;
  }
  case SLICE_ZE:
    qlinear__v1__ze_ipc_slice__init(&t->msg.ze);
    t->msg.ze.import_id = t->u.ze->import_id;
    t->msg.ze.offset = off;
    t->msg.ze.length = len;
    break;
  }
  return 0;
}

/* Whether x and y, both given, can serve one request: region slices must
 * not overlap, CUDA slices must be of one device. */
static int slices_pair(const tensor_slice *x, const tensor_slice *y) {
  if (x->kind == SLICE_REGION) {
    const ql_slice *a = x->u.region, *b = y->u.region;
    if (a->region == b->region && a->offset < b->offset + b->length &&
        b->offset < a->offset + a->length)
      return ql__err_set(QL_EINVAL, "the x and y slices overlap");
  } else if (x->kind == SLICE_CUDA &&
             strcmp(x->u.cuda->device, y->u.cuda->device) != 0) {
    return ql__err_set(QL_EINVAL,
                       "x is on %s, y on %s: one request runs on "
                       "one device",
                       x->u.cuda->device, y->u.cuda->device);
  }
  return 0;
}

/*
 * A Linear call with x in slice x and y into slice y (y given, y_inline
 * NULL) or inline into y_inline (y's slice pointer NULL): the argument
 * checks, the slices' checks, an inline y against the daemon's message
 * cap, then the request.
 */
static int linear_slices(ql_client *c, const char *weight, ql_path path,
                         ql_dtype dtype, uint64_t m, uint64_t k,
                         tensor_slice *x, uint64_t n, tensor_slice *y,
                         void *y_inline, ql_linear_result *res) {
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {m, k}, mk, mn, xbytes, ybytes, cap, room;
  const int has_y = y->u.region != NULL; /* any member: one pointer */
  size_t esz;
  int rv;

  ql__err_clear();
  if (c == NULL || x->u.region == NULL || has_y == (y_inline != NULL))
    return ql__err_set(QL_EINVAL,
                       "client or x is NULL, or not exactly one of y "
                       "and y_inline is given");
  if ((rv = check_linear_args(c, weight, path, dtype, m, k, n)) != 0)
    return rv;
  esz = ql_dtype_size(dtype);
  if (!ql__mul_ok(m, k, &mk) || !ql__mul_ok(mk, esz, &xbytes) ||
      !ql__mul_ok(m, n, &mn) || !ql__mul_ok(mn, esz, &ybytes))
    return ql__err_set(QL_ETOOBIG,
                       "x [%llu, %llu] or y [%llu, %llu] is too large",
                       (unsigned long long)m, (unsigned long long)k,
                       (unsigned long long)m, (unsigned long long)n);
  if ((rv = slice_msg(c, x, 1, xbytes, esz)) != 0)
    return rv;
  if (has_y) {
    if ((rv = slice_msg(c, y, 0, ybytes, esz)) != 0 ||
        (rv = slices_pair(x, y)) != 0)
      return rv;
  } else {
    ql__client_limits(c, &cap, NULL);
    room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
    if (ybytes > room)
      return ql__err_set(QL_ETOOBIG,
                         "y [%llu, %llu] does not fit the daemon's "
                         "cap of %llu bytes: give a %s slice",
                         (unsigned long long)m, (unsigned long long)n,
                         (unsigned long long)cap, slice_names[x->kind]);
  }

  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  lr.weight = (char *)weight;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  switch (x->kind) {
  case SLICE_REGION:
    xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    xt.region = &x->msg.region;
    lr.y_out = has_y ? &y->msg.region : NULL;
    break;
  case SLICE_CUDA:
    xt.data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
    xt.cuda_ipc = &x->msg.cuda;
    lr.y_out_cuda = has_y ? &y->msg.cuda : NULL;
    break;
  case SLICE_ZE:
    xt.data_case = QLINEAR__V1__TENSOR__DATA_ZE_IPC;
    xt.ze_ipc = &x->msg.ze;
    lr.y_out_ze = has_y ? &y->msg.ze : NULL;
    break;
  }
  return linear_call(c, &lr, dtype, m, n, ybytes, lr.y_out, lr.y_out_cuda,
                     y_inline, res, NULL);
}

QL_EXPORT int ql_linear_region(ql_client *c, const char *weight, ql_path path,
                               ql_dtype dtype, uint64_t m, uint64_t k,
                               const ql_slice *x, uint64_t n, const ql_slice *y,
                               void *y_inline, ql_linear_result *res) {
  tensor_slice xs = {.kind = SLICE_REGION, .u.region = x};
  tensor_slice ys = {.kind = SLICE_REGION, .u.region = y};
  return linear_slices(c, weight, path, dtype, m, k, &xs, n, &ys, y_inline,
                       res);
}

QL_EXPORT int ql_linear_cuda(ql_client *c, const char *weight, ql_path path,
                             ql_dtype dtype, uint64_t m, uint64_t k,
                             const ql_cuda_slice *x, uint64_t n,
                             const ql_cuda_slice *y, void *y_inline,
                             ql_linear_result *res) {
  tensor_slice xs = {.kind = SLICE_CUDA, .u.cuda = x};
  tensor_slice ys = {.kind = SLICE_CUDA, .u.cuda = y};
  return linear_slices(c, weight, path, dtype, m, k, &xs, n, &ys, y_inline,
                       res);
}

QL_EXPORT int ql_linear_ze(ql_client *c, const char *weight, ql_path path,
                           ql_dtype dtype, uint64_t m, uint64_t k,
                           const ql_ze_slice *x, uint64_t n,
                           const ql_ze_slice *y, void *y_inline,
                           ql_linear_result *res) {
  tensor_slice xs = {.kind = SLICE_ZE, .u.ze = x};
  tensor_slice ys = {.kind = SLICE_ZE, .u.ze = y};
  return linear_slices(c, weight, path, dtype, m, k, &xs, n, &ys, y_inline,
                       res);
}
