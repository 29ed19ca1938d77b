/*
 * load.c - libqlinear: uploads, holds, unloads, list and lookup.
 */
#include "internal.h"

/* ------------------------------------------------------------ weights */

/* Checks a name the caller gives before it travels; the daemon checks the
 * character rules (QL_ENAME), here only what makes the message absurd. */
int ql__check_name(const char *name) {
  if (name == NULL)
    return ql__err_set(QL_EINVAL, "weight name is NULL");
  size_t len = strlen(name);
  if (len == 0 || len >= QL_NAME_MAX)
    return ql__err_set(QL_ENAME, "weight name of %zu bytes (1 to %d allowed)",
                       len, QL_NAME_MAX - 1);
  return 0;
}

/* Fills *out from a WeightInfo of the daemon. */
int ql__weight_info_from(const Qlinear__V1__WeightInfo *w,
                         ql_weight_info *out) {
  int rv;
  memset(out, 0, sizeof *out);
  if (w == NULL || w->spec == NULL)
    return ql__err_set(QL_EPROTO, "weight description without spec");
  const Qlinear__V1__WeightSpec *sp = w->spec;
  if ((rv = ql__copy_name(out->name, sp->name, "weight")) != 0)
    return rv;
  if (w->digest.len != QL_DIGEST_BYTES)
    return ql__err_set(QL_EPROTO, "digest of %zu bytes for %s, expected %d",
                       w->digest.len, out->name, QL_DIGEST_BYTES);
  out->format = (int)sp->format;
  out->group_size = sp->group_size;
  out->n = sp->n;
  out->k = sp->k;
  out->has_bias = sp->has_bias ? 1 : 0;
  out->asymmetric = sp->asymmetric ? 1 : 0;
  out->persistent = sp->persistent ? 1 : 0;
  out->policy = (int)sp->policy;
  out->scale_dtype = (int)sp->scale_dtype;
  memcpy(out->digest, w->digest.data, QL_DIGEST_BYTES);
  /* Absent (a stored plain-named weight, an older daemon) or whole. */
  if (w->source_digest.len == QL_DIGEST_BYTES) {
    memcpy(out->source_digest, w->source_digest.data, QL_DIGEST_BYTES);
    out->has_source_digest = 1;
  }
  out->bytes_resident = w->bytes_resident;
  out->crossover_rows = w->crossover_rows;
  out->crossover_measured = w->crossover_measured ? 1 : 0;
  out->n_devices = w->n_devices;

  /* Join the device names. Until the last one, keep room for "...\0" so
   * that a list that does not fit can say so. */
  size_t used = 0, cap = sizeof out->devices;
  for (size_t i = 0; i < w->n_devices; i++) {
    char dev[QL_DEVICE_NAME_MAX];
    ql__copy_str(dev, sizeof dev, w->devices[i]);
    size_t need = strlen(dev) + (i > 0);
    size_t reserve = i + 1 < w->n_devices ? 4 : 1;
    if (need + reserve > cap - used) {
      memcpy(out->devices + used, "...", 4);
      break;
    }
    snprintf(out->devices + used, cap - used, "%s%s", i > 0 ? "," : "", dev);
    used += need;
  }
  return 0;
}

/* Best-effort LoadAbort after a failed upload. It must neither replace the
 * first error's message nor wait long for a daemon that already failed. */
static void abort_upload(ql_client *c, uint64_t upload_id) {
  Qlinear__V1__LoadAbortRequest ar = QLINEAR__V1__LOAD_ABORT_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  char saved[ERRBUF_SIZE];
  int timeout = c->timeout_ms;

  if (timeout < 0 || timeout > ABORT_TIMEOUT_MS)
    timeout = ABORT_TIMEOUT_MS;
  memcpy(saved, ql__errbuf, sizeof saved);
  ar.upload_id = upload_id;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_ABORT;
  req.load_abort = &ar;
  if (ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_ABORT, timeout,
               &resp) == 0)
    qlinear__v1__response__free_unpacked(resp, NULL);
  memcpy(ql__errbuf, saved, sizeof saved);
}

/* a * b unless it overflows uint64_t or size_t. */
bool ql__mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  if (a != 0 && b > UINT64_MAX / a)
    return false;
  *out = a * b;
  return *out <= SIZE_MAX;
}

/* One contiguous piece of an upload stream. */
typedef struct segment {
  const uint8_t *p;
  uint64_t len;
} segment;

/*
 * The upload protocol shared by every load: LoadBegin with br, the
 * segments in order as LoadChunks (a chunk never spans two segments, so
 * nothing is copied), LoadCommit. After a failure past LoadBegin the
 * upload is aborted (best effort) and the first error returned.
 */
static int upload(ql_client *c, Qlinear__V1__LoadBeginRequest *br,
                  const segment *segs, int nseg, ql_progress_cb progress,
                  void *progress_arg, ql_weight_info *info_out,
                  int *shared_out) {
  Qlinear__V1__LoadChunkRequest cr = QLINEAR__V1__LOAD_CHUNK_REQUEST__INIT;
  Qlinear__V1__LoadCommitRequest mr = QLINEAR__V1__LOAD_COMMIT_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  ql_weight_info info;
  uint64_t total = 0, cap, max_chunk, lim, upload_id = 0, off = 0;
  bool begun = false;
  int rv;

  for (int i = 0; i < nseg; i++) {
    if (segs[i].len > UINT64_MAX - total)
      return ql__err_set(QL_ETOOBIG, "upload too large");
    total += segs[i].len;
  }
  /* Chunk payloads must fit the daemon's two limits with room for the
   * envelope. */
  ql__client_limits(c, &cap, &max_chunk);
  lim = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
  if (max_chunk != 0 && max_chunk < lim)
    lim = max_chunk;
  if (lim > CHUNK_CEILING)
    lim = CHUNK_CEILING;
  if (lim == 0)
    return ql__err_set(QL_ETOOBIG,
                       "the daemon's cap of %llu bytes leaves no room "
                       "for chunk data",
                       (unsigned long long)cap);

  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN;
  req.load_begin = br;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_BEGIN,
                     c->timeout_ms, &resp)) != 0)
    goto fail;
  upload_id = resp->load_begin->upload_id;
  begun = true;
  if (resp->load_begin->total_bytes != total) {
    rv =
        ql__err_set(QL_EPROTO, "daemon expects %llu bytes, the upload has %llu",
                    (unsigned long long)resp->load_begin->total_bytes,
                    (unsigned long long)total);
    goto fail;
  }
  qlinear__v1__response__free_unpacked(resp, NULL);
  resp = NULL;

  if (progress != NULL)
    progress(progress_arg, 0, total);
  for (int i = 0; i < nseg; i++) {
    for (uint64_t done = 0; done < segs[i].len;) {
      uint64_t len = segs[i].len - done;
      if (len > lim)
        len = lim;
      cr.upload_id = upload_id;
      cr.offset = off;
      cr.data.data = (uint8_t *)segs[i].p + done; /* pack only reads it */
      cr.data.len = (size_t)len;
      req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK;
      req.load_chunk = &cr;
      if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_CHUNK,
                         c->timeout_ms, &resp)) != 0)
        goto fail;
      if (resp->load_chunk->received_bytes != off + len) {
        rv = ql__err_set(QL_EPROTO,
                         "daemon acknowledged %llu bytes, %llu were sent",
                         (unsigned long long)resp->load_chunk->received_bytes,
                         (unsigned long long)(off + len));
        goto fail;
      }
      qlinear__v1__response__free_unpacked(resp, NULL);
      resp = NULL;
      done += len;
      off += len;
      if (progress != NULL)
        progress(progress_arg, off, total);
    }
  }

  mr.upload_id = upload_id;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT;
  req.load_commit = &mr;
  /* Quantizing a large weight takes a while and a commit cannot be
   * aborted once running: wait longer than for other calls. */
  int commit_timeout = c->timeout_ms < 0 || c->timeout_ms > COMMIT_TIMEOUT_MS
                           ? c->timeout_ms
                           : COMMIT_TIMEOUT_MS;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_COMMIT,
                     commit_timeout, &resp)) != 0)
    goto fail;
  /* Committed: from here on the weight exists, so no abort. */
  begun = false;
  if ((rv = ql__weight_info_from(resp->load_commit->weight, &info)) != 0)
    goto fail;
  if (info_out != NULL)
    *info_out = info;
  if (shared_out != NULL)
    *shared_out = resp->load_commit->shared ? 1 : 0;
  rv = 0;

fail:
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  if (begun)
    abort_upload(c, upload_id);
  return rv;
}

/* Checks what every load descriptor shares. */
static int check_load_common(const char *name, ql_format format, ql_path policy,
                             int scale_dtype, uint64_t n, uint64_t k) {
  int rv;
  if ((rv = ql__check_name(name)) != 0)
    return rv;
  if (scale_dtype != 0 && !ql_dtype_valid(scale_dtype))
    return ql__err_set(QL_EDTYPE, "scale data type %d is not f32, f16 or bf16",
                       scale_dtype);
  if (!ql_format_valid(format))
    return ql__err_set(QL_EFORMAT, "format %d is unknown", (int)format);
  if (!ql_path_valid(policy))
    return ql__err_set(QL_EINVAL, "policy %d is unknown", (int)policy);
  if (n == 0 || k == 0)
    return ql__err_set(QL_ESHAPE, "weight of shape [%llu, %llu]",
                       (unsigned long long)n, (unsigned long long)k);
  return 0;
}

/* A load's placement: the comma-separated list (NULL or blank: none), its
 * items trimmed of blanks, copied into buf (DEVICES_BUF bytes) and pointed
 * to by names. The daemon decides which devices exist. */
#define DEVICES_MAX 16
#define DEVICES_BUF (DEVICES_MAX * 64 + 16)
static int split_devices(const char *list, char *buf, char **names, size_t *n) {
  size_t at = 0;
  *n = 0;
  if (list == NULL)
    return 0;
  while (*list == ' ' || *list == '\t')
    list++;
  if (*list == '\0')
    return 0;
  for (;;) {
    const char *end = strchr(list, ',');
    size_t len = end != NULL ? (size_t)(end - list) : strlen(list);
    while (len > 0 && (list[0] == ' ' || list[0] == '\t')) {
      list++;
      len--;
    }
    while (len > 0 && (list[len - 1] == ' ' || list[len - 1] == '\t'))
      len--;
    if (len == 0)
      return ql__err_set(QL_EINVAL, "devices: an empty item in the list");
    if (len > 63)
      return ql__err_set(QL_EINVAL, "devices: a name of %zu bytes", len);
    if (*n == DEVICES_MAX)
      return ql__err_set(QL_EINVAL, "devices: more than %d", DEVICES_MAX);
    memcpy(buf + at, list, len);
    buf[at + len] = '\0';
    names[(*n)++] = buf + at;
    at += len + 1;
    if (end == NULL)
      return 0;
    list = end + 1;
  }
}

QL_EXPORT int ql_load_float(ql_client *c, const ql_load_desc *d,
                            ql_weight_info *info_out, int *shared_out) {
  Qlinear__V1__WeightSpec spec = QLINEAR__V1__WEIGHT_SPEC__INIT;
  Qlinear__V1__LoadBeginRequest br = QLINEAR__V1__LOAD_BEGIN_REQUEST__INIT;
  uint64_t nk, wbytes, bbytes;
  size_t esz;
  int rv;

  ql__err_clear();
  if (c == NULL || d == NULL || d->data == NULL)
    return ql__err_set(QL_EINVAL, "client, descriptor or data is NULL");
  if ((rv = check_load_common(d->name, d->format, d->policy, d->scale_dtype,
                              d->n, d->k)) != 0)
    return rv;
  if (!ql_dtype_valid(d->dtype))
    return ql__err_set(QL_EDTYPE, "data type %d is not f32, f16 or bf16",
                       (int)d->dtype);
  esz = ql_dtype_size(d->dtype);
  if (!ql__mul_ok(d->n, d->k, &nk) || !ql__mul_ok(nk, esz, &wbytes) ||
      !ql__mul_ok(d->bias != NULL ? d->n : 0, esz, &bbytes) ||
      wbytes > SIZE_MAX - bbytes)
    return ql__err_set(QL_ETOOBIG, "weight of shape [%llu, %llu] is too large",
                       (unsigned long long)d->n, (unsigned long long)d->k);

  spec.name = (char *)d->name; /* pack only reads it */
  spec.format = (Qlinear__V1__Format)d->format;
  spec.group_size = d->group_size;
  spec.n = d->n;
  spec.k = d->k;
  spec.dtype = (Qlinear__V1__DType)d->dtype;
  spec.has_bias = d->bias != NULL;
  spec.policy = (Qlinear__V1__Path)d->policy;
  spec.scale_dtype = (Qlinear__V1__DType)d->scale_dtype;
  spec.asymmetric = d->asymmetric != 0;
  spec.persistent = d->persistent != 0;
  br.spec = &spec;
  char dbuf[DEVICES_BUF], *dnames[DEVICES_MAX];
  if ((rv = split_devices(d->devices, dbuf, dnames, &br.n_devices)) != 0)
    return rv;
  br.devices = dnames;
  segment segs[2] = {{d->data, wbytes}, {d->bias, bbytes}};
  return upload(c, &br, segs, 2, d->progress, d->progress_arg, info_out,
                shared_out);
}

/* Describes one packed array on the wire and as a stream segment. */
static int packed_array(const char *what, const ql_packed_array *a,
                        Qlinear__V1__ArraySpec *spec, uint64_t *shape,
                        segment *seg) {
  size_t es = ql_array_dtype_size(a->dtype);
  uint64_t n1, bytes;
  if (es == 0)
    return ql__err_set(QL_EDTYPE, "%s: array dtype %d is unknown", what,
                       a->dtype);
  if (a->ndim < 1 || a->ndim > 2)
    return ql__err_set(QL_ESHAPE, "%s: %d dims (1 or 2 allowed)", what,
                       a->ndim);
  if (!ql__mul_ok(a->shape[0], a->ndim == 2 ? a->shape[1] : 1, &n1) ||
      !ql__mul_ok(n1, es, &bytes) || n1 == 0)
    return ql__err_set(QL_ESHAPE, "%s: empty or too large", what);
  qlinear__v1__array_spec__init(spec);
  spec->dtype = (Qlinear__V1__ArrayDType)a->dtype;
  shape[0] = a->shape[0];
  shape[1] = a->shape[1];
  spec->shape = shape;
  spec->n_shape = (size_t)a->ndim;
  seg->p = a->data;
  seg->len = bytes;
  return 0;
}

QL_EXPORT int ql_load_packed(ql_client *c, const ql_packed_desc *d,
                             ql_weight_info *info_out, int *shared_out) {
  Qlinear__V1__WeightSpec spec = QLINEAR__V1__WEIGHT_SPEC__INIT;
  Qlinear__V1__LoadBeginRequest br = QLINEAR__V1__LOAD_BEGIN_REQUEST__INIT;
  Qlinear__V1__PackedSpec ps = QLINEAR__V1__PACKED_SPEC__INIT;
  Qlinear__V1__ArraySpec as[4];
  uint64_t shapes[4][2];
  segment segs[4];
  static const char *names[4] = {"qdata", "scale", "zero", "bias"};
  Qlinear__V1__ArraySpec **slots[4] = {&ps.qdata, &ps.scale, &ps.zero,
                                       &ps.bias};
  int nseg = 0, rv;

  ql__err_clear();
  if (c == NULL || d == NULL || d->qdata.data == NULL || d->scale.data == NULL)
    return ql__err_set(QL_EINVAL, "client, descriptor, qdata or scale is NULL");
  if ((rv = check_load_common(d->name, d->format, d->policy, 0, d->n, d->k)) !=
      0)
    return rv;
  if (d->zero_kind != QL_ZERO_FLOAT && d->zero_kind != QL_ZERO_INT)
    return ql__err_set(QL_EINVAL, "zero kind %d is unknown", (int)d->zero_kind);
  const ql_packed_array *arr[4] = {&d->qdata, &d->scale, &d->zero, &d->bias};
  for (int i = 0; i < 4; i++) {
    if (arr[i]->data == NULL)
      continue;
    if ((rv = packed_array(names[i], arr[i], &as[nseg], shapes[nseg],
                           &segs[nseg])) != 0)
      return rv;
    *slots[i] = &as[nseg];
    nseg++;
  }
  ps.zero_kind = (Qlinear__V1__ZeroKind)d->zero_kind;
  spec.name = (char *)d->name; /* pack only reads it */
  spec.format = (Qlinear__V1__Format)d->format;
  spec.group_size = d->group_size;
  spec.n = d->n;
  spec.k = d->k;
  spec.has_bias = d->bias.data != NULL;
  spec.policy = (Qlinear__V1__Path)d->policy;
  spec.asymmetric = d->asymmetric != 0;
  spec.persistent = d->persistent != 0;
  br.spec = &spec;
  br.packed = &ps;
  char dbuf[DEVICES_BUF], *dnames[DEVICES_MAX];
  if ((rv = split_devices(d->devices, dbuf, dnames, &br.n_devices)) != 0)
    return rv;
  br.devices = dnames;
  return upload(c, &br, segs, nseg, d->progress, d->progress_arg, info_out,
                shared_out);
}

QL_EXPORT int ql_unload(ql_client *c, const char *name) {
  Qlinear__V1__UnloadWeightRequest ur =
      QLINEAR__V1__UNLOAD_WEIGHT_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  ql__err_clear();
  if (c == NULL)
    return ql__err_set(QL_EINVAL, "client is NULL");
  if ((rv = ql__check_name(name)) != 0)
    return rv;
  ur.name = (char *)name; /* pack only reads it */
  req.body_case = QLINEAR__V1__REQUEST__BODY_UNLOAD;
  req.unload = &ur;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_UNLOAD, c->timeout_ms,
                     &resp)) != 0)
    return rv;
  qlinear__v1__response__free_unpacked(resp, NULL);
  return 0;
}

QL_EXPORT int ql_hold(ql_client *c, const char *name,
                      const uint8_t digest[QL_DIGEST_BYTES],
                      ql_weight_info *out) {
  Qlinear__V1__HoldWeightRequest hr = QLINEAR__V1__HOLD_WEIGHT_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  ql__err_clear();
  if (c == NULL)
    return ql__err_set(QL_EINVAL, "client is NULL");
  if ((rv = ql__check_name(name)) != 0)
    return rv;
  hr.name = (char *)name; /* pack only reads it */
  if (digest != NULL) {
    hr.digest.data = (uint8_t *)digest;
    hr.digest.len = QL_DIGEST_BYTES;
  }
  req.body_case = QLINEAR__V1__REQUEST__BODY_HOLD;
  req.hold = &hr;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_HOLD, c->timeout_ms,
                     &resp)) != 0)
    return rv;
  if (out != NULL)
    rv = ql__weight_info_from(resp->hold->weight, out);
  qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

QL_EXPORT int ql_reload_config(ql_client *c, char *report, size_t len) {
  Qlinear__V1__ReloadConfigRequest rr =
      QLINEAR__V1__RELOAD_CONFIG_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  ql__err_clear();
  if (report != NULL && len > 0)
    report[0] = '\0';
  if (c == NULL)
    return ql__err_set(QL_EINVAL, "client is NULL");
  req.body_case = QLINEAR__V1__REQUEST__BODY_RELOAD;
  req.reload = &rr;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_RELOAD, c->timeout_ms,
                     &resp)) != 0)
    return rv;
  if (report != NULL && len > 0)
    ql__copy_str(report, len, resp->reload->report);
  qlinear__v1__response__free_unpacked(resp, NULL);
  return 0;
}

QL_EXPORT int ql_list(ql_client *c, ql_weight_info **out, size_t *count) {
  Qlinear__V1__ListWeightsRequest lr = QLINEAR__V1__LIST_WEIGHTS_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  ql_weight_info *arr = NULL;
  size_t n = 0;
  int rv;

  ql__err_clear();
  if (out != NULL)
    *out = NULL;
  if (count != NULL)
    *count = 0;
  if (c == NULL || out == NULL || count == NULL)
    return ql__err_set(QL_EINVAL, "client or output is NULL");
  req.body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  req.list = &lr;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_LIST, c->timeout_ms,
                     &resp)) != 0)
    goto fail;
  n = resp->list->n_weights;
  if (n > 0) {
    /* n is bounded by the received message size, calloc checks n * size. */
    if ((arr = calloc(n, sizeof *arr)) == NULL) {
      rv = ql__err_set(QL_ENOMEM, "allocating %zu weight descriptions", n);
      goto fail;
    }
    for (size_t i = 0; i < n; i++)
      if ((rv = ql__weight_info_from(resp->list->weights[i], &arr[i])) != 0)
        goto fail;
  }
  qlinear__v1__response__free_unpacked(resp, NULL);
  *out = arr;
  *count = n;
  return 0;

fail:
  free(arr);
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

QL_EXPORT int ql_lookup(ql_client *c, const char *name, ql_weight_info *out) {
  ql_weight_info *arr = NULL;
  size_t n = 0;
  int rv;

  ql__err_clear();
  if (out == NULL)
    return ql__err_set(QL_EINVAL, "output is NULL");
  if ((rv = ql__check_name(name)) != 0)
    return rv;
  if ((rv = ql_list(c, &arr, &n)) != 0)
    return rv;
  rv = QL_ENOTFOUND;
  for (size_t i = 0; i < n && rv != 0; i++) {
    if (strcmp(arr[i].name, name) == 0) {
      *out = arr[i];
      rv = 0;
    }
  }
  if (rv != 0)
    ql__err_set(rv, "no weight named %s is resident", name);
  free(arr);
  return rv;
}

/* ------------------------------------------------------ source digests */

/* SHA-256 of sp's header and the n segments, into out. */
static int source_hash(const ql_source_spec *sp, const segment *segs, int n,
                       uint8_t out[QL_DIGEST_BYTES]) {
  uint8_t hdr[QL_SOURCE_HEADER_BYTES];
  unsigned int len = 0;
  int ok;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == NULL)
    return ql__err_set(QL_ENOMEM, "cannot allocate a digest context");
  ql_source_header(sp, hdr);
  ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 &&
       EVP_DigestUpdate(ctx, hdr, sizeof hdr) == 1;
  for (int i = 0; ok && i < n; i++)
    ok = segs[i].len == 0 ||
         EVP_DigestUpdate(ctx, segs[i].p, (size_t)segs[i].len) == 1;
  ok = ok && EVP_DigestFinal_ex(ctx, out, &len) == 1 &&
       len == QL_DIGEST_BYTES;
  EVP_MD_CTX_free(ctx);
  return ok ? 0 : ql__err_set(QL_EINTERNAL, "SHA-256 failed");
}

QL_EXPORT int ql_source_digest_float(const ql_load_desc *d,
                                     uint32_t quantizer_version,
                                     uint8_t out[QL_DIGEST_BYTES]) {
  uint64_t nk, wbytes, bbytes;
  ql_source_spec sp;
  int rv;

  ql__err_clear();
  if (d == NULL || d->data == NULL || out == NULL)
    return ql__err_set(QL_EINVAL, "descriptor, data or out is NULL");
  if (!ql_dtype_valid(d->dtype))
    return ql__err_set(QL_EDTYPE, "data type %d is not f32, f16 or bf16",
                       (int)d->dtype);
  size_t esz = ql_dtype_size(d->dtype);
  if (!ql__mul_ok(d->n, d->k, &nk) || !ql__mul_ok(nk, esz, &wbytes) ||
      !ql__mul_ok(d->bias != NULL ? d->n : 0, esz, &bbytes) ||
      wbytes > SIZE_MAX - bbytes)
    return ql__err_set(QL_ETOOBIG, "weight of shape [%llu, %llu] is too large",
                       (unsigned long long)d->n, (unsigned long long)d->k);
  /* The fields exactly as ql_load_float() sends them. */
  memset(&sp, 0, sizeof sp);
  sp.quantizer_version = quantizer_version;
  sp.format = (uint32_t)d->format;
  sp.group_size = d->group_size;
  sp.dtype = (uint32_t)d->dtype;
  sp.has_bias = d->bias != NULL;
  sp.policy = (uint32_t)d->policy;
  sp.scale_dtype = (uint32_t)d->scale_dtype;
  sp.asymmetric = d->asymmetric != 0;
  sp.n = d->n;
  sp.k = d->k;
  segment segs[2] = {{d->data, wbytes}, {d->bias, bbytes}};
  if ((rv = source_hash(&sp, segs, 2, out)) != 0)
    return rv;
  return 0;
}

QL_EXPORT int ql_source_digest_packed(const ql_packed_desc *d,
                                      uint8_t out[QL_DIGEST_BYTES]) {
  static const char *names[4] = {"qdata", "scale", "zero", "bias"};
  Qlinear__V1__ArraySpec as;
  uint64_t shape[2];
  segment segs[4];
  ql_source_spec sp;
  int nseg = 0, rv;

  ql__err_clear();
  if (d == NULL || d->qdata.data == NULL || d->scale.data == NULL ||
      out == NULL)
    return ql__err_set(QL_EINVAL, "descriptor, qdata, scale or out is NULL");
  memset(&sp, 0, sizeof sp);
  sp.packed = 1;
  sp.format = (uint32_t)d->format;
  sp.group_size = d->group_size;
  sp.has_bias = d->bias.data != NULL;
  sp.policy = (uint32_t)d->policy;
  sp.asymmetric = d->asymmetric != 0;
  sp.zero_kind = (uint32_t)d->zero_kind;
  sp.n = d->n;
  sp.k = d->k;
  const ql_packed_array *arr[4] = {&d->qdata, &d->scale, &d->zero, &d->bias};
  for (int i = 0; i < 4; i++) {
    if (arr[i]->data == NULL)
      continue;
    if ((rv = packed_array(names[i], arr[i], &as, shape, &segs[nseg])) != 0)
      return rv;
    sp.arrays[i].present = 1;
    sp.arrays[i].dtype = (uint32_t)arr[i]->dtype;
    sp.arrays[i].ndim = (uint32_t)arr[i]->ndim;
    sp.arrays[i].shape[0] = arr[i]->shape[0];
    sp.arrays[i].shape[1] = arr[i]->ndim == 2 ? arr[i]->shape[1] : 1;
    nseg++;
  }
  return source_hash(&sp, segs, nseg, out);
}
