/* load.c - see serve.h: LoadBegin, LoadChunk, LoadCommit, LoadAbort and
 * the persistent writes. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/calibrate.h"
#include "import.h"
#include "log.h"
#include "serve/serve.h"
#include "state/devices.h"
#include "state/store.h"

/* ---------------------------------------------------------------- uploads */

/* Fills the packed part of an upload template from its wire spec and
 * returns the bytes the stream carries (validated: no overflow). */
static int packed_template(const Qlinear__V1__PackedSpec *p, ql__upload *t,
                           size_t *total) {
  const Qlinear__V1__ArraySpec *arr[QL__ARR_N] = {p->qdata, p->scale, p->zero,
                                                  p->bias};
  size_t sum = 0;
  t->packed = 1;
  t->zero_kind = (ql_zero_kind)p->zero_kind;
  for (int i = 0; i < QL__ARR_N; i++) {
    ql__upload_array *a = &t->arrays[i];
    if (arr[i] == NULL)
      continue;
    a->present = 1;
    a->dtype = (int)arr[i]->dtype;
    a->ndim = (int)arr[i]->n_shape;
    a->shape[0] = (int64_t)arr[i]->shape[0];
    a->shape[1] = a->ndim == 2 ? (int64_t)arr[i]->shape[1] : 1;
    if (ql__mul_size((size_t)a->shape[0], (size_t)a->shape[1],
                     ql_array_dtype_size(a->dtype), &a->bytes) != 0 ||
        a->bytes > SIZE_MAX - sum)
      return QL_ESHAPE;
    sum += a->bytes;
  }
  *total = sum;
  return 0;
}

void ql__serve_load_begin(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadBeginRequest *b, ql__reply *r,
                          Qlinear__V1__LoadBeginResponse *out) {
  const Qlinear__V1__WeightSpec *sp = b->spec;
  ql__upload tmpl;
  memset(&tmpl, 0, sizeof tmpl);
  ql_dtype sdt = (ql_dtype)sp->scale_dtype; /* 0: the format's default */
  /* The canonical sizes must be computable too: this rejects shapes the
   * kernels cannot hold before any byte is uploaded. */
  int rc = ql_qweight_sizes((ql_format)sp->format, sp->group_size,
                            (int64_t)sp->n, (int64_t)sp->k,
                            sdt ? sdt : QL_DTYPE_F32, NULL, NULL, NULL);
  if (rc != 0) {
    ql__reply_set_error(r, rc, "load: %llux%llu is not a valid %s weight",
              (unsigned long long)sp->n, (unsigned long long)sp->k,
              ql__format_name((int)sp->format));
    return;
  }
  if (b->packed != NULL) {
    if (packed_template(b->packed, &tmpl, &tmpl.total) != 0) {
      ql__reply_set_error(r, QL_ESHAPE, "load: packed arrays overflow");
      return;
    }
  } else {
    size_t es = ql_dtype_size((int)sp->dtype), wbytes, bbytes = 0;
    if (ql__mul_size(sp->n, sp->k, es, &wbytes) != 0 ||
        (sp->has_bias && ql__mul_size(sp->n, 1, es, &bbytes) != 0) ||
        wbytes > SIZE_MAX - bbytes) {
      ql__reply_set_error(r, QL_ESHAPE, "load: weight size overflows");
      return;
    }
    tmpl.total = wbytes + bbytes;
  }
  snprintf(tmpl.name, sizeof tmpl.name, "%s", sp->name);
  tmpl.format = (ql_format)sp->format;
  tmpl.group_size = sp->group_size;
  tmpl.n = sp->n;
  tmpl.k = sp->k;
  tmpl.dtype = (ql_dtype)sp->dtype;
  tmpl.scale_dtype = sdt;
  tmpl.policy = (ql_path)sp->policy;
  tmpl.has_bias = sp->has_bias;
  tmpl.asymmetric = sp->asymmetric;
  tmpl.persistent = sp->persistent;
  tmpl.owner = ss != NULL ? ql__session_id(ss) : 0;
  tmpl.uid = ss != NULL ? ql__session_uid(ss) : 0;
  tmpl.last_ns = ql__now_ns();
  if (sp->persistent && ss != NULL) {
    ql__reply_set_error(r, QL_EPERM, "load: persistent loads go through the "
              "admin socket");
    return;
  }
  if (sp->persistent && s->store == NULL) {
    ql__reply_set_error(r, QL_ENOTSUP, "load: the daemon has no state "
              "directory (state_dir) to store persistent weights in");
    return;
  }
  /* The placement is checked now, before any byte is uploaded, and again
   * at commit (a device may fail in between). */
  char why[300];
  if (b->n_devices > 0 &&
      (rc = ql__devices_resolve(s, b->devices, b->n_devices, &tmpl.devices,
                                why, sizeof why)) != 0) {
    ql__reply_set_error(r, rc, "load: %s", why);
    return;
  }
  if (ss != NULL && ql__uploads_count_owned(s->uploads, tmpl.owner) >=
                        QL_SESSION_MAX_UPLOADS) {
    ql__reply_set_error(r, QL_EEXHAUSTED, "load: the session already has %d "
              "uploads in progress", QL_SESSION_MAX_UPLOADS);
    return;
  }
  ql__upload *up;
  if ((rc = ql__uploads_begin(s->uploads, &tmpl, &up)) != 0) {
    if (rc == QL_EPERM) {
      size_t b, n;
      ql__uploads_of_uid(s->uploads, tmpl.uid, &b, &n);
      ql__tenant_refused(&s->tenants, tmpl.uid, "uploads");
      ql__reply_set_error(r, QL_EEXHAUSTED, "load: uid %u's uploads in "
                          "progress (%zu, %zu bytes) and %zu more bytes "
                          "would pass its share (uid_share = %u%% of "
                          "max_upload_bytes and of the uploads)",
                          (unsigned)tmpl.uid, n, b, tmpl.total,
                          (unsigned)s->cfg.uid_share);
    } else if (rc == QL_EEXHAUSTED)
      ql__reply_set_error(r, rc, "load: the upload budget cannot hold %zu more "
                "bytes (or too many uploads are in progress)", tmpl.total);
    else
      ql__reply_set_error(r, rc, "load: cannot allocate %zu bytes", tmpl.total);
    return;
  }
  qlinear__v1__load_begin_response__init(out);
  out->upload_id = up->id;
  out->total_bytes = up->total;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_LOAD_BEGIN;
  r->resp.load_begin = out;
}

/* The upload of that id if this session began it (ss NULL: the admin
 * socket): another's upload is not found, exactly like one that does not
 * exist. */
static ql__upload *session_upload(ql__server *s, ql__session *ss,
                                  uint64_t id) {
  return ql__uploads_get_owned(s->uploads, id,
                               ss != NULL ? ql__session_id(ss) : 0);
}

void ql__serve_load_chunk(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadChunkRequest *c, ql__reply *r,
                          Qlinear__V1__LoadChunkResponse *out) {
  ql__upload *up = session_upload(s, ss, c->upload_id);
  if (up == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "load: no upload %llu",
              (unsigned long long)c->upload_id);
    return;
  }
  if (c->data.len > s->cfg.max_chunk_bytes) {
    ql__reply_set_error(r, QL_ETOOBIG, "load: %zu bytes, the limit is %zu",
              c->data.len, s->cfg.max_chunk_bytes);
    return;
  }
  int rc = ql__upload_append(up, c->offset, c->data.data, c->data.len,
                             ql__now_ns());
  if (rc == QL_ESEQUENCE)
    ql__reply_set_error(r, rc, "load: offset %llu, expected %zu",
              (unsigned long long)c->offset, up->received);
  else if (rc == QL_ESHAPE)
    ql__reply_set_error(r, rc, "load: %zu bytes at %zu exceed the %zu expected",
              c->data.len, up->received, up->total);
  else if (rc != 0)
    ql__reply_set_error(r, QL_ESEQUENCE, "load: upload is being committed");
  if (rc != 0)
    return;
  qlinear__v1__load_chunk_response__init(out);
  out->received_bytes = up->received;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_LOAD_CHUNK;
  r->resp.load_chunk = out;
}

/* A LoadCommit: quantization and digest run in the libuv thread pool so
 * that a large weight does not stall the loop. */
typedef struct commit_work {
  uv_work_t work;
  ql__server *s;
  ql__upload *up;
  uint64_t session_id; /* the session may end while the commit runs */
  int admin;           /* from the admin socket: no session */
  void *route;
  uint64_t request_id;
  ql__weight *w;
  int rc;
  char err[200]; /* from the import, naming the array */
  ql__placement place; /* where the weight goes, chosen at commit */
  uint8_t source[QL_DIGEST_BYTES]; /* the upload's source digest */
} commit_work;

/* Builds the canonical weight of an upload: quantizes float data, or
 * checks and imports packed arrays. Thread-pool thread; reads only the
 * upload, which nobody changes while it commits. */
/* The source-digest fields (ql_source.h) of an upload, as its LoadBegin
 * sent them. */
static void source_spec(const ql__upload *up, ql_source_spec *sp) {
  memset(sp, 0, sizeof *sp);
  sp->packed = up->packed != 0;
  sp->quantizer_version = up->packed ? 0 : QL_QUANTIZER_VERSION;
  sp->format = (uint32_t)up->format;
  sp->group_size = up->group_size;
  sp->dtype = up->packed ? 0 : (uint32_t)up->dtype;
  sp->has_bias = up->has_bias != 0;
  sp->policy = (uint32_t)up->policy;
  sp->scale_dtype = (uint32_t)up->scale_dtype;
  sp->asymmetric = up->asymmetric != 0;
  sp->zero_kind = up->packed ? (uint32_t)up->zero_kind : 0;
  sp->n = up->n;
  sp->k = up->k;
  for (int i = 0; up->packed && i < QL__ARR_N; i++) {
    const ql__upload_array *a = &up->arrays[i];
    if (!a->present)
      continue;
    sp->arrays[i].present = 1;
    sp->arrays[i].dtype = (uint32_t)a->dtype;
    sp->arrays[i].ndim = (uint32_t)a->ndim;
    sp->arrays[i].shape[0] = (uint64_t)a->shape[0];
    sp->arrays[i].shape[1] = (uint64_t)a->shape[1];
  }
}

static void commit_run(uv_work_t *work) {
  commit_work *c = work->data;
  ql__upload *up = c->up;
  ql_qweight *q = NULL;
  /* What was sent, hashed here (never what the loader claims): a
   * content-addressed name must be the digest of these bytes. */
  ql_source_spec sp;
  uint8_t named[QL_DIGEST_BYTES];
  source_spec(up, &sp);
  if ((c->rc = ql__source_digest(&sp, up->data, up->received, c->source)) !=
      0)
    return;
  if (ql_source_name_digest(up->name, named) &&
      memcmp(named, c->source, QL_DIGEST_BYTES) != 0) {
    c->rc = QL_ENAME;
    snprintf(c->err, sizeof c->err, "the name ends in a source digest and "
             "the content sent has another (quantizer version %d)",
             up->packed ? 0 : QL_QUANTIZER_VERSION);
    return;
  }
  if (up->packed) {
    ql_import_desc d;
    memset(&d, 0, sizeof d);
    d.format = up->format;
    d.group_size = up->group_size;
    d.n = (int64_t)up->n;
    d.k = (int64_t)up->k;
    d.asymmetric = up->asymmetric;
    d.zero_kind = up->zero_kind;
    ql_array *dst[QL__ARR_N] = {&d.qdata, &d.scale, &d.zero, &d.bias};
    size_t off = 0;
    for (int i = 0; i < QL__ARR_N; i++) {
      const ql__upload_array *a = &up->arrays[i];
      if (!a->present)
        continue;
      dst[i]->data = up->data + off;
      dst[i]->bytes = a->bytes;
      dst[i]->dtype = a->dtype;
      dst[i]->ndim = a->ndim;
      dst[i]->shape[0] = a->shape[0];
      dst[i]->shape[1] = a->shape[1];
      off += a->bytes;
    }
    c->rc = ql_qweight_import(&d, &q, c->err, sizeof c->err);
  } else {
    size_t wbytes = (size_t)up->n * up->k * ql_dtype_size(up->dtype);
    ql_quant_params p = {up->format, up->group_size, up->asymmetric,
                         up->scale_dtype};
    c->rc = ql_qweight_quantize(&p, (int64_t)up->n, (int64_t)up->k,
                                up->dtype, up->data,
                                up->has_bias ? up->data + wbytes : NULL, &q);
  }
  if (c->rc != 0)
    return;
  c->rc = ql__weight_create(up->name, q, up->policy, &c->place, &c->w);
  if (c->rc != 0) {
    ql_qweight_free(q);
  } else {
    c->w->placed = up->devices != 0;
    memcpy(c->w->source, c->source, QL_DIGEST_BYTES);
    c->w->has_source = 1;
  }
}

/* ------------------------------------------------------ persistent loads */

/* The write of a persistent weight's file, in the thread pool: the weight
 * is resident (and marked storing, so nothing removes it) while it runs. */
typedef struct store_work {
  uv_work_t work;
  ql__server *s;
  ql__weight *w; /* one reference */
  int shared;    /* the weight was already resident before this load */
  void *route;
  uint64_t request_id;
  int rc;
  char err[200];
  char devices[QL_STORE_DEVICES_MAX]; /* the named placement, or "" */
} store_work;

static void store_run(uv_work_t *work) {
  store_work *sw = work->data;
  sw->rc = ql__store_put(sw->s->store, sw->w->name, sw->w->q, sw->w->digest,
                         sw->w->policy, sw->devices, sw->err,
                         sizeof sw->err);
  /* The device layout too, so the next start maps it (a failure only
   * costs that start a repack). */
  if (sw->rc == 0)
    (void)ql__weight_cache_layout(sw->w, sw->s->store);
}

/* Replies to a LoadCommit that succeeded. */
static void reply_committed(ql__server *s, void *route, uint64_t request_id,
                            ql__weight *w, int shared) {
  ql__reply r;
  Qlinear__V1__LoadCommitResponse out;
  ql__info_buf ib;
  ql__reply_init(&r, request_id);
  qlinear__v1__load_commit_response__init(&out);
  ql__fill_info(s, &ib, w);
  out.weight = &ib.info;
  out.shared = shared != 0;
  r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_LOAD_COMMIT;
  r.resp.load_commit = &out;
  ql__reply_send(&s->replies, route, &r);
}

static void store_done(uv_work_t *work, int status) {
  store_work *sw = work->data;
  ql__server *s = sw->s;
  ql__weight *w = sw->w;
  s->commits_running--;
  w->storing = 0;
  if (status != 0 && sw->rc == 0)
    sw->rc = QL_EINTERNAL;
  if (sw->rc == 0) {
    /* Acknowledged only now: the file and its directory entry are on
     * disk, so a crash from here on loses nothing. */
    w->persistent = w->pinned = 1;
    s->persistent_count++;
    ql__notice("stored persistent weight %s (%zu bytes)", w->name, w->bytes);
    reply_committed(s, sw->route, sw->request_id, w, sw->shared);
  } else {
    ql__err("cannot store weight %s: %s", w->name,
            sw->err[0] ? sw->err : ql_strerror(sw->rc));
    ql__reply r;
    ql__reply_init(&r, sw->request_id);
    /* The store's explanation names files of the state directory: it
     * goes to the log only (replies never echo paths). */
    ql__reply_set_error(&r, sw->rc, "load: the weight could not be "
                        "stored (%s); nothing was kept, the daemon's log has "
                        "the details", ql_strerror(sw->rc));
    ql__reply_send(&s->replies, sw->route, &r);
    /* A load that fails changes nothing. */
    (void)ql__weight_store_drop_unheld(s->weights, w);
  }
  ql__weight_unref(w);
  free(sw);
}

/*
 * The admin socket's commit: the weight becomes resident without a session
 * holder and, when persistent, is written to the state directory before
 * the load is acknowledged. Returns 1 when the reply is left to the store
 * write, else 0 with r filled.
 */
static int commit_admin(ql__server *s, ql__upload *up, ql__weight *w,
                        int shared, void *route, uint64_t request_id,
                        ql__reply *r) {
  if (!up->persistent || w->persistent) {
    w->pinned = 1;
    ql__info("%s weight %s (%zu bytes) for the admin socket",
             shared ? "kept" : "loaded", w->name, w->bytes);
    return 0;
  }
  if (w->storing) {
    ql__reply_set_error(r, QL_EEXHAUSTED, "load: weight '%s' is being stored "
              "by another load; try again", w->name);
    return 0;
  }
  store_work *sw = calloc(1, sizeof *sw);
  if (sw == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "load: out of memory");
    return 0;
  }
  sw->s = s;
  sw->w = w;
  sw->shared = shared;
  /* By name (a GPU's UUID), not alias: aliases follow the enumeration
   * order, which another start may change. */
  size_t at = 0;
  for (unsigned d = 0; w->placed && d < s->n_dev; d++) {
    int n;
    if (!(w->devices >> d & 1))
      continue;
    n = snprintf(sw->devices + at, sizeof sw->devices - at, "%s%s",
                 at ? "," : "", s->dev[d].name);
    /* 16 names of at most 63 bytes always fit; never past the end. */
    if (n < 0 || (size_t)n >= sizeof sw->devices - at) {
      sw->devices[at] = '\0';
      break;
    }
    at += (size_t)n;
  }
  sw->route = route;
  sw->request_id = request_id;
  sw->work.data = sw;
  if (uv_queue_work(s->loop, &sw->work, store_run, store_done) != 0) {
    free(sw);
    ql__reply_set_error(r, QL_EINTERNAL, "load: cannot queue work");
    return 0;
  }
  ql__weight_ref(w);
  w->storing = 1;
  s->commits_running++;
  return 1;
}

static void commit_done(uv_work_t *work, int status) {
  commit_work *c = work->data;
  ql__server *s = c->s;
  ql__reply r;
  ql__reply_init(&r, c->request_id);
  ql__session *ss = c->admin ? NULL : ql__session_by_id(s, c->session_id);
  ql__weight *existing = NULL, *w = NULL;
  int rc, later = 0;
  s->commits_running--;
  if (status != 0 && c->rc == 0)
    c->rc = QL_EINTERNAL;
  if (c->rc != 0 && c->err[0] != '\0') {
    ql__reply_set_error(&r, c->rc, "load: %s", c->err);
  } else if (c->rc == QL_ENONFINITE) {
    ql__reply_set_error(&r, c->rc, "load: NaN or Inf in the weight or bias");
  } else if (c->rc != 0) {
    ql__reply_set_error(&r, c->rc, "load: cannot quantize: %s",
              ql_strerror(c->rc));
  } else if (!c->admin && ss == NULL) {
    /* Nobody would hold the weight: it is not stored. */
    ql__reply_set_error(&r, QL_ESESSION, "load: the session ended before the "
              "commit completed");
  } else if ((rc = ql__weight_store_insert(s->weights, c->w, &existing)) ==
             QL_EEXIST) {
    ql__reply_set_error(&r, rc, "load: a weight named '%s' with other "
              "content is resident", c->w->name);
  } else if (rc == QL_ENOMEM) {
    ql__reply_set_error(&r, rc, "load: %zu more bytes would exceed the cpu "
              "budget (%zu of %zu bytes in use), or its %zu bytes of device "
              "layouts a device's budget", c->w->bytes,
              ql__weight_store_bytes(s->weights),
              ql__weight_store_budget(s->weights), c->w->dev_bytes);
  } else if (rc != 0) {
    ql__reply_set_error(&r, rc, "load: %s", ql_strerror(rc));
  } else if (existing != NULL && (c->up->devices & ~existing->devices) != 0) {
    /* Shared loads keep the resident weight where it is (no copy is added
     * behind its holders' backs). */
    char on[256];
    ql__devices_list(s, existing->devices, on, sizeof on);
    ql__reply_set_error(&r, QL_EEXIST, "load: weight '%s' with this "
                        "content is resident on %s, not on every device the "
                        "load names; hold it there, or name those devices",
                        existing->name, on);
  } else if (c->admin) {
    w = existing ? existing : c->w;
    ql__calibrate_weight(s, w);
    later = commit_admin(s, c->up, w, existing != NULL, c->route,
                         c->request_id, &r);
    if (r.status.code != 0)
      (void)ql__weight_store_drop_unheld(s->weights, w);
  } else if ((rc = ql__session_hold(s, ss, existing ? existing : c->w)) !=
             0) {
    /* A weight this commit just stored has no other holder. */
    (void)ql__weight_store_drop_unheld(s->weights,
                                       existing ? existing : c->w);
    if (rc == QL_EEXHAUSTED)
      ql__reply_set_error(&r, rc, "load: the session already holds %d "
                "weights", QL_SESSION_MAX_WEIGHTS);
    else
      ql__reply_set_error(&r, rc, "load: out of memory");
  } else {
    w = existing ? existing : c->w;
    /* This uid sent content that is (or quantizes to exactly) w: it may
     * hold w by name from its other sessions. */
    ql__weight_add_loader(w, ql__session_uid(ss));
    if (!w->has_source) {
      memcpy(w->source, c->source, QL_DIGEST_BYTES);
      w->has_source = 1;
    }
    ql__calibrate_weight_by(s, w, ql__session_uid(ss));
    ql__info("%s weight %s (%llux%llu, %zu bytes) for session %llu",
             existing ? "shared" : "loaded", w->name,
             (unsigned long long)w->q->n, (unsigned long long)w->q->k,
             w->bytes, (unsigned long long)c->session_id);
  }
  if (!later) {
    if (r.status.code == 0)
      reply_committed(s, c->route, c->request_id, w, existing != NULL);
    else
      ql__reply_send(&s->replies, c->route, &r);
  }
  ql__weight_unref(c->w); /* the store holds its own reference */
  ql__uploads_remove(s->uploads, c->up);
  free(c);
}

int ql__serve_load_commit(ql__server *s, ql__session *ss, uint64_t id,
                          const Qlinear__V1__LoadCommitRequest *m, void *route,
                          ql__reply *r) {
  ql__upload *up = session_upload(s, ss, m->upload_id);
  if (up == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "load: no upload %llu",
              (unsigned long long)m->upload_id);
    return 0;
  }
  if (up->committing) {
    ql__reply_set_error(r, QL_ESEQUENCE, "load: already committing");
    return 0;
  }
  if (up->received != up->total) {
    ql__reply_set_error(r, QL_ESHAPE, "load: received %zu of %zu bytes",
              up->received, up->total);
    return 0;
  }
  commit_work *c = calloc(1, sizeof *c);
  if (c == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "load: out of memory");
    return 0;
  }
  char why[200];
  int rc = up->devices != 0
               ? ql__devices_placement_mask(s, up->devices, &c->place, why,
                                            sizeof why)
               : ql__devices_placement(s, &c->place);
  if (rc != 0) {
    free(c);
    if (up->devices != 0)
      ql__reply_set_error(r, rc, "load: %s", why);
    else
      ql__reply_set_error(r, rc, "load: every device is out of "
                          "service");
    return 0;
  }
  c->s = s;
  c->up = up;
  c->admin = ss == NULL;
  c->session_id = ss ? ql__session_id(ss) : 0;
  c->route = route;
  c->request_id = id;
  c->work.data = c;
  if (uv_queue_work(s->loop, &c->work, commit_run, commit_done) != 0) {
    free(c);
    ql__reply_set_error(r, QL_EINTERNAL, "load: cannot queue work");
    return 0;
  }
  up->committing = 1;
  s->commits_running++;
  return 1; /* answered later */
}

void ql__serve_load_abort(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadAbortRequest *m, ql__reply *r,
                          Qlinear__V1__LoadAbortResponse *out) {
  ql__upload *up = session_upload(s, ss, m->upload_id);
  if (up == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "load abort: no upload %llu",
              (unsigned long long)m->upload_id);
    return;
  }
  if (up->committing) {
    ql__reply_set_error(r, QL_ESEQUENCE, "load abort: upload is being committed");
    return;
  }
  ql__uploads_remove(s->uploads, up);
  qlinear__v1__load_abort_response__init(out);
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_LOAD_ABORT;
  r->resp.load_abort = out;
}

void ql__serve_expire_uploads(ql__server *s) {
  size_t n = ql__uploads_expire(s->uploads, ql__now_ns(),
                                s->cfg.upload_idle_ms * 1000000u);
  if (n > 0)
    ql__notice("dropped %zu idle upload%s", n, n == 1 ? "" : "s");
}

