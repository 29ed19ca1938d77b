/* handlers.c - see handlers.h. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "handlers.h"
#include "log.h"
#include "import.h"
#include "calibrate.h"
#include "linear.h"
#include "registry.h"
#include "protocol.h"
#include "reload.h"
#include "reply.h"
#include "session.h"
#include "store.h"

#define DAEMON_VERSION PACKAGE_VERSION


/* ------------------------------------------------------------ weight info */

/* A WeightInfo and the storage its pointers refer to. */
typedef struct info_buf {
  Qlinear__V1__WeightInfo info;
  Qlinear__V1__WeightSpec spec;
  char *devices[QL__MAX_DEVICES];
  Qlinear__V1__DeviceCrossover xo[QL__MAX_DEVICES];
  Qlinear__V1__DeviceCrossover *xos[QL__MAX_DEVICES];
} info_buf;

/* The crossover AUTO requests of w use on device dev (dev < 0: the first
 * that holds it), under the config's fixed and default values. */
static uint32_t crossover_rows(const ql__server *s, const ql__weight *w,
                               int dev, int *measured) {
  return ql__weight_crossover_rows(w, dev, s->cfg.crossover_rows,
                                   s->cfg.crossover_default_rows, measured);
}

static void fill_info(const ql__server *s, info_buf *b, ql__weight *w) {
  qlinear__v1__weight_info__init(&b->info);
  qlinear__v1__weight_spec__init(&b->spec);
  b->spec.name = w->name;
  b->spec.format = (Qlinear__V1__Format)w->q->format;
  b->spec.group_size =
      w->q->format == QL_FORMAT_Q4G || w->q->format == QL_FORMAT_Q8B
          ? w->q->group_size
          : 0;
  b->spec.asymmetric = w->q->zero != NULL && w->q->format == QL_FORMAT_Q8B;
  b->spec.persistent = w->persistent != 0;
  b->spec.n = (uint64_t)w->q->n;
  b->spec.k = (uint64_t)w->q->k;
  b->spec.has_bias = w->q->bias != NULL;
  b->spec.policy = (Qlinear__V1__Path)w->policy;
  b->spec.scale_dtype = (Qlinear__V1__DType)w->q->scale_dtype;
  b->info.spec = &b->spec;
  b->info.digest.data = w->digest;
  b->info.digest.len = QL_DIGEST_BYTES;
  b->info.bytes_resident = w->bytes + w->dev_bytes;
  int measured;
  b->info.crossover_rows = crossover_rows(s, w, -1, &measured);
  b->info.crossover_measured = measured != 0;
  b->info.n_devices = 0;
  for (unsigned d = 0; d < s->n_dev; d++) {
    if (!(w->devices >> d & 1))
      continue;
    Qlinear__V1__DeviceCrossover *x = &b->xo[b->info.n_devices];
    qlinear__v1__device_crossover__init(x);
    x->device = (char *)s->dev[d].name;
    x->rows = crossover_rows(s, w, (int)d, &measured);
    x->measured = measured != 0;
    b->xos[b->info.n_devices] = x;
    b->devices[b->info.n_devices++] = (char *)s->dev[d].name;
  }
  b->info.devices = b->devices;
  b->info.crossovers = b->xos;
  b->info.n_crossovers = b->info.n_devices;
}

/* ------------------------------------------------------------------ hello */

typedef struct hello_buf {
  Qlinear__V1__HelloResponse hr;
  Qlinear__V1__Device dev[QL__MAX_DEVICES];
  Qlinear__V1__Device *devs[QL__MAX_DEVICES];
} hello_buf;

static void on_hello(ql__server *s, const Qlinear__V1__HelloRequest *h,
                     ql__reply *r, hello_buf *b) {
  static char version[] = DAEMON_VERSION;
  Qlinear__V1__HelloResponse *hr = &b->hr;
  qlinear__v1__hello_response__init(hr);
  for (unsigned d = 0; d < s->n_dev; d++) {
    qlinear__v1__device__init(&b->dev[d]);
    b->dev[d].name = (char *)s->dev[d].name;
    b->dev[d].alias = (char *)s->dev[d].alias;
    b->dev[d].kind = (char *)s->dev[d].b->name;
    b->devs[d] = &b->dev[d];
  }
  hr->protocol_version = QL_PROTOCOL_VERSION;
  hr->daemon_version = version;
  hr->instance_id.data = s->instance_id;
  hr->instance_id.len = sizeof s->instance_id;
  hr->max_message_bytes = s->cfg.max_message_bytes;
  hr->max_chunk_bytes = s->cfg.max_chunk_bytes;
  hr->quantizer_version = QL_QUANTIZER_VERSION;
  hr->devices = b->devs;
  hr->n_devices = s->n_dev;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_HELLO;
  r->resp.hello = hr;
  /* The body is sent even on a version mismatch so the client can say
   * which versions met. */
  if (h->protocol_version != QL_PROTOCOL_VERSION) {
    r->status.code = QL_EVERSION;
    snprintf(r->msg, sizeof r->msg, "client speaks protocol %u, daemon %u",
             h->protocol_version, QL_PROTOCOL_VERSION);
  }
}

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

static void on_load_begin(ql__server *s, ql__session *ss,
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
    ql__reply_set_error(r, rc, "load_begin: %llux%llu is not a valid %s weight",
              (unsigned long long)sp->n, (unsigned long long)sp->k,
              ql__format_name((int)sp->format));
    return;
  }
  if (b->packed != NULL) {
    if (packed_template(b->packed, &tmpl, &tmpl.total) != 0) {
      ql__reply_set_error(r, QL_ESHAPE, "load_begin: packed arrays overflow");
      return;
    }
  } else {
    size_t es = ql_dtype_size((int)sp->dtype), wbytes, bbytes = 0;
    if (ql__mul_size(sp->n, sp->k, es, &wbytes) != 0 ||
        (sp->has_bias && ql__mul_size(sp->n, 1, es, &bbytes) != 0) ||
        wbytes > SIZE_MAX - bbytes) {
      ql__reply_set_error(r, QL_ESHAPE, "load_begin: weight size overflows");
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
  tmpl.last_ns = ql__now_ns();
  if (sp->persistent && ss != NULL) {
    ql__reply_set_error(r, QL_EPERM, "load_begin: persistent loads go through the "
              "admin socket");
    return;
  }
  if (sp->persistent && s->store == NULL) {
    ql__reply_set_error(r, QL_ENOTSUP, "load_begin: the daemon has no state "
              "directory (state_dir) to store persistent weights in");
    return;
  }
  /* The placement is checked now, before any byte is uploaded, and again
   * at commit (a device may fail in between). */
  char why[300];
  if (b->n_devices > 0 &&
      (rc = ql__devices_resolve(s, b->devices, b->n_devices, &tmpl.devices,
                                why, sizeof why)) != 0) {
    ql__reply_set_error(r, rc, "load_begin: %s", why);
    return;
  }
  if (ss != NULL && ql__uploads_count_owned(s->uploads, tmpl.owner) >=
                        QL_SESSION_MAX_UPLOADS) {
    ql__reply_set_error(r, QL_EEXHAUSTED, "load_begin: the session already has %d "
              "uploads in progress", QL_SESSION_MAX_UPLOADS);
    return;
  }
  ql__upload *up;
  if ((rc = ql__uploads_begin(s->uploads, &tmpl, &up)) != 0) {
    if (rc == QL_EEXHAUSTED)
      ql__reply_set_error(r, rc, "load_begin: the upload budget cannot hold %zu more "
                "bytes (or too many uploads are in progress)", tmpl.total);
    else
      ql__reply_set_error(r, rc, "load_begin: cannot allocate %zu bytes", tmpl.total);
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

static void on_load_chunk(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadChunkRequest *c, ql__reply *r,
                          Qlinear__V1__LoadChunkResponse *out) {
  ql__upload *up = session_upload(s, ss, c->upload_id);
  if (up == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "load_chunk: no upload %llu",
              (unsigned long long)c->upload_id);
    return;
  }
  if (c->data.len > s->cfg.max_chunk_bytes) {
    ql__reply_set_error(r, QL_ETOOBIG, "load_chunk: %zu bytes, the limit is %zu",
              c->data.len, s->cfg.max_chunk_bytes);
    return;
  }
  int rc = ql__upload_append(up, c->offset, c->data.data, c->data.len,
                             ql__now_ns());
  if (rc == QL_ESEQUENCE)
    ql__reply_set_error(r, rc, "load_chunk: offset %llu, expected %zu",
              (unsigned long long)c->offset, up->received);
  else if (rc == QL_ESHAPE)
    ql__reply_set_error(r, rc, "load_chunk: %zu bytes at %zu exceed the %zu expected",
              c->data.len, up->received, up->total);
  else if (rc != 0)
    ql__reply_set_error(r, QL_ESEQUENCE, "load_chunk: upload is being committed");
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
} commit_work;

/* Builds the canonical weight of an upload: quantizes float data, or
 * checks and imports packed arrays. Thread-pool thread; reads only the
 * upload, which nobody changes while it commits. */
static void commit_run(uv_work_t *work) {
  commit_work *c = work->data;
  ql__upload *up = c->up;
  ql_qweight *q = NULL;
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
  if (c->rc != 0)
    ql_qweight_free(q);
  else
    c->w->placed = up->devices != 0;
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
  info_buf ib;
  ql__reply_init(&r, request_id);
  qlinear__v1__load_commit_response__init(&out);
  fill_info(s, &ib, w);
  out.weight = &ib.info;
  out.shared = shared != 0;
  r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_LOAD_COMMIT;
  r.resp.load_commit = &out;
  ql__reply_send(s, route, &r);
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
    ql__reply_set_error(&r, sw->rc, "load_commit: the weight could not be "
                        "stored (%s); nothing was kept, the daemon's log has "
                        "the details", ql_strerror(sw->rc));
    ql__reply_send(s, sw->route, &r);
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
    ql__reply_set_error(r, QL_EEXHAUSTED, "load_commit: weight '%s' is being stored "
              "by another load; try again", w->name);
    return 0;
  }
  store_work *sw = calloc(1, sizeof *sw);
  if (sw == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "load_commit: out of memory");
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
    ql__reply_set_error(r, QL_EINTERNAL, "load_commit: cannot queue work");
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
    ql__reply_set_error(&r, c->rc, "load_commit: %s", c->err);
  } else if (c->rc == QL_ENONFINITE) {
    ql__reply_set_error(&r, c->rc, "load_commit: NaN or Inf in the weight or bias");
  } else if (c->rc != 0) {
    ql__reply_set_error(&r, c->rc, "load_commit: cannot quantize: %s",
              ql_strerror(c->rc));
  } else if (!c->admin && ss == NULL) {
    /* Nobody would hold the weight: it is not stored. */
    ql__reply_set_error(&r, QL_ESESSION, "load_commit: the session ended before the "
              "commit completed");
  } else if ((rc = ql__weight_store_insert(s->weights, c->w, &existing)) ==
             QL_EEXIST) {
    ql__reply_set_error(&r, rc, "load_commit: a weight named '%s' with other "
              "content is resident", c->w->name);
  } else if (rc == QL_ENOMEM) {
    ql__reply_set_error(&r, rc, "load_commit: %zu more bytes would exceed the cpu "
              "budget (%zu of %zu bytes in use), or its %zu bytes of device "
              "layouts a device's budget", c->w->bytes,
              ql__weight_store_bytes(s->weights),
              ql__weight_store_budget(s->weights), c->w->dev_bytes);
  } else if (rc != 0) {
    ql__reply_set_error(&r, rc, "load_commit: %s", ql_strerror(rc));
  } else if (existing != NULL && (c->up->devices & ~existing->devices) != 0) {
    /* Shared loads keep the resident weight where it is (no copy is added
     * behind its holders' backs). */
    char on[256];
    ql__devices_list(s, existing->devices, on, sizeof on);
    ql__reply_set_error(&r, QL_EEXIST, "load_commit: weight '%s' with this "
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
      ql__reply_set_error(&r, rc, "load_commit: the session already holds %d "
                "weights", QL_SESSION_MAX_WEIGHTS);
    else
      ql__reply_set_error(&r, rc, "load_commit: out of memory");
  } else {
    w = existing ? existing : c->w;
    ql__calibrate_weight(s, w);
    ql__info("%s weight %s (%llux%llu, %zu bytes) for session %llu",
             existing ? "shared" : "loaded", w->name,
             (unsigned long long)w->q->n, (unsigned long long)w->q->k,
             w->bytes, (unsigned long long)c->session_id);
  }
  if (!later) {
    if (r.status.code == 0)
      reply_committed(s, c->route, c->request_id, w, existing != NULL);
    else
      ql__reply_send(s, c->route, &r);
  }
  ql__weight_unref(c->w); /* the store holds its own reference */
  ql__uploads_remove(s->uploads, c->up);
  free(c);
}

static int on_load_commit(ql__server *s, ql__session *ss, uint64_t id,
                          const Qlinear__V1__LoadCommitRequest *m, void *route,
                          ql__reply *r) {
  ql__upload *up = session_upload(s, ss, m->upload_id);
  if (up == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "load_commit: no upload %llu",
              (unsigned long long)m->upload_id);
    return 0;
  }
  if (up->committing) {
    ql__reply_set_error(r, QL_ESEQUENCE, "load_commit: already committing");
    return 0;
  }
  if (up->received != up->total) {
    ql__reply_set_error(r, QL_ESHAPE, "load_commit: received %zu of %zu bytes",
              up->received, up->total);
    return 0;
  }
  commit_work *c = calloc(1, sizeof *c);
  if (c == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "load_commit: out of memory");
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
      ql__reply_set_error(r, rc, "load_commit: %s", why);
    else
      ql__reply_set_error(r, rc, "load_commit: every device is out of "
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
    ql__reply_set_error(r, QL_EINTERNAL, "load_commit: cannot queue work");
    return 0;
  }
  up->committing = 1;
  s->commits_running++;
  return 1; /* answered later */
}

static void on_load_abort(ql__server *s, ql__session *ss,
                          const Qlinear__V1__LoadAbortRequest *m, ql__reply *r,
                          Qlinear__V1__LoadAbortResponse *out) {
  ql__upload *up = session_upload(s, ss, m->upload_id);
  if (up == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "load_abort: no upload %llu",
              (unsigned long long)m->upload_id);
    return;
  }
  if (up->committing) {
    ql__reply_set_error(r, QL_ESEQUENCE, "load_abort: upload is being committed");
    return;
  }
  ql__uploads_remove(s->uploads, up);
  qlinear__v1__load_abort_response__init(out);
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_LOAD_ABORT;
  r->resp.load_abort = out;
}

void ql__handlers_expire_uploads(ql__server *s) {
  size_t n = ql__uploads_expire(s->uploads, ql__now_ns(),
                                s->cfg.upload_idle_ms * 1000000u);
  if (n > 0)
    ql__notice("dropped %zu idle upload%s", n, n == 1 ? "" : "s");
}

/* ------------------------------------------------------- unload, list */

/*
 * On the request socket, unload drops this session's hold; the weight goes
 * when nobody holds it (DESIGN §8). Weights held only by other sessions,
 * or kept by the admin socket, are not the session's to remove: on the
 * admin socket, unload removes the weight whoever holds it, and its file
 * first when it is persistent (if that fails, nothing changes). Requests
 * queued on it keep their references and complete.
 */
static void on_unload(ql__server *s, ql__session *ss,
                      const Qlinear__V1__UnloadWeightRequest *m, ql__reply *r,
                      Qlinear__V1__UnloadWeightResponse *out) {
  ql__weight *w = ql__weight_store_get(s->weights, m->name);
  int rc;
  if (ss == NULL) {
    if (w != NULL && w->storing) {
      ql__reply_set_error(r, QL_EEXHAUSTED, "unload: weight '%s' is being stored; "
                "try again", m->name);
      return;
    }
    /* A stored file goes whether or not its weight is resident, and
     * whether or not the resident one came from it: one that failed to
     * load at start (kept for the admin, server.c) has no other way out. */
    int removed = 0;
    if (s->store != NULL) {
      rc = ql__store_remove(s->store, m->name);
      if (rc != 0 && rc != QL_ENOTFOUND && rc != QL_ENAME) {
        ql__reply_set_error(r, rc, "unload: cannot remove the stored file of '%s': %s",
                  m->name, ql_strerror(rc));
        return;
      }
      removed = rc == 0;
    }
    if (w == NULL) {
      if (!removed) {
        ql__reply_set_error(r, QL_ENOTFOUND, "unload: no weight named '%s'",
                            m->name);
        return;
      }
      ql__notice("admin removed the stored file of weight %s (not resident)",
                 m->name);
      goto done;
    }
    ql__notice("admin unloaded weight %s%s (%d session%s held it)", m->name,
               removed ? " and its stored file" : "", w->holders,
               w->holders == 1 ? "" : "s");
    if (w->persistent)
      s->persistent_count--;
    w->pinned = w->persistent = 0;
    ql__weight_store_remove(s->weights, m->name);
  } else if ((rc = ql__session_release(s, ss, m->name)) != 0) {
    if (rc == QL_EPERM)
      ql__reply_set_error(r, QL_EPERM, "unload: this session mapped '%s' "
                          "(mapped mode): it holds it until it ends",
                          m->name);
    else if (w != NULL)
      ql__reply_set_error(r, QL_EPERM, "unload: this session does not hold '%s' (%s)",
                m->name, w->pinned ? "the admin socket keeps it"
                                   : "other sessions do");
    else
      ql__reply_set_error(r, QL_ENOTFOUND, "unload: no weight named '%s'", m->name);
    return;
  } else {
    ql__info("session %llu unloaded weight %s",
             (unsigned long long)ql__session_id(ss), m->name);
  }
done:
  qlinear__v1__unload_weight_response__init(out);
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_UNLOAD;
  r->resp.unload = out;
}

/*
 * Hold: the session becomes a holder of a resident weight without an
 * upload (a second process of a model another one loaded). Only a session
 * holds; the admin socket keeps weights by loading them persistent.
 */
static void on_hold(ql__server *s, ql__session *ss,
                    const Qlinear__V1__HoldWeightRequest *m, ql__reply *r,
                    info_buf *b, Qlinear__V1__HoldWeightResponse *out) {
  ql__weight *w;
  int rc;
  if (ss == NULL) {
    ql__reply_set_error(r, QL_EPERM, "hold: only a session holds weights "
                        "(the admin socket loads them persistent)");
    return;
  }
  if ((w = ql__weight_store_get(s->weights, m->name)) == NULL) {
    ql__reply_set_error(r, QL_ENOTFOUND, "hold: no weight named '%s'",
                        m->name);
    return;
  }
  if (m->digest.len == QL_DIGEST_BYTES &&
      memcmp(m->digest.data, w->digest, QL_DIGEST_BYTES) != 0) {
    ql__reply_set_error(r, QL_EEXIST, "hold: weight '%s' holds another "
                        "content than the digest given", m->name);
    return;
  }
  if ((rc = ql__session_hold(s, ss, w)) != 0) {
    ql__reply_set_error(r, rc, "hold: '%s': %s", m->name, ql_strerror(rc));
    return;
  }
  ql__info("session %llu holds weight %s",
           (unsigned long long)ql__session_id(ss), m->name);
  fill_info(s, b, w);
  qlinear__v1__hold_weight_response__init(out);
  out->weight = &b->info;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_HOLD;
  r->resp.hold = out;
}

typedef struct list_ctx {
  const ql__server *s;
  info_buf *bufs;
  Qlinear__V1__WeightInfo **ptrs;
  size_t n;
} list_ctx;

static void list_one(ql__weight *w, void *arg) {
  list_ctx *l = arg;
  fill_info(l->s, &l->bufs[l->n], w);
  l->ptrs[l->n] = &l->bufs[l->n].info;
  l->n++;
}

/* ------------------------------------------------------------------ stats */

typedef struct stats_ctx {
  const ql__server *s;
  Qlinear__V1__WeightStats *st;
  uint64_t (*hist)[2][32]; /* queue and kernel histograms per entry */
  Qlinear__V1__WeightStats **ptrs;
  size_t n;
} stats_ctx;

/* One entry per device that holds w. */
static void stats_one(ql__weight *w, void *arg) {
  stats_ctx *c = arg;
  for (unsigned d = 0; d < c->s->n_dev; d++) {
    const ql__weight_stats *ws = &w->stats[d];
    if (!(w->devices >> d & 1))
      continue;
    Qlinear__V1__WeightStats *st = &c->st[c->n];
    qlinear__v1__weight_stats__init(st);
    st->weight = w->name;
    st->device = (char *)c->s->dev[d].name;
    st->requests = ws->requests;
    st->rows = ws->rows;
    st->batches = ws->batches;
    st->wo_batches = ws->wo_batches;
    st->aq_batches = ws->aq_batches;
    st->queue_ns = ws->queue_ns;
    st->kernel_ns = ws->kernel_ns;
    st->impl = (char *)ws->impl;
    st->bytes_resident = c->s->dev[d].host ? w->bytes
                                           : w->lay[d].packed_bytes;
    int measured;
    st->crossover_rows = crossover_rows(c->s, w, (int)d, &measured);
    st->crossover_measured = measured != 0;
    ql__linear_stats(c->s, w, d, st, c->hist[c->n][0], c->hist[c->n][1]);
    c->ptrs[c->n] = st;
    c->n++;
  }
}

/* -------------------------------------------------------------- dispatch */

size_t ql__handlers_in_flight(const ql__server *s) {
  return s->commits_running + ql__linear_in_flight(s) +
         (size_t)ql__calibrate_busy(s);
}

/*
 * Answers a Stats request (ql__linear_when_settled's callback: every
 * launch answered so far is accounted). Consumes req and route.
 */
static void stats_reply(ql__server *s, ql__request *req, void *route,
                        uint64_t arg) {
  ql__reply r;
  Qlinear__V1__DeviceStats dev_stats[QL__MAX_DEVICES];
  Qlinear__V1__DeviceStats *devs[QL__MAX_DEVICES];
  Qlinear__V1__StatsResponse stats;
  stats_ctx sc = {s, NULL, NULL, NULL, 0};
  (void)arg;
  ql__reply_init(&r, req->msg->request_id);
  do {
    size_t n = ql__weight_store_count(s->weights);
    size_t entries = n * s->n_dev + 1; /* (weight, device) pairs at most */
    sc.st = calloc(entries, sizeof *sc.st);
    sc.ptrs = calloc(entries, sizeof *sc.ptrs);
    sc.hist = calloc(entries, sizeof *sc.hist);
    if (sc.st == NULL || sc.ptrs == NULL || sc.hist == NULL) {
      ql__reply_set_error(&r, QL_ENOMEM, "stats: out of memory");
      break;
    }
    ql__weight_store_foreach(s->weights, stats_one, &sc);
    qlinear__v1__stats_response__init(&stats);
    stats.uptime_ns = ql__now_ns() - s->start_ns;
    /* Requests a ring answered itself (a slot it could not read) never
     * reached handle(): they count here. */
    ql__fastpath_counts rings = {0, 0, 0};
    ql__sessions_ring_counts(s, &rings);
    stats.requests = s->counters.requests + rings.answered;
    stats.errors = s->counters.errors + rings.answered;
    stats.bytes_in = s->counters.bytes_in;
    stats.bytes_out = s->counters.bytes_out + rings.bytes_out;
    stats.weights = n;
    stats.uploads_in_progress = ql__uploads_count(s->uploads);
    stats.per_weight = sc.ptrs;
    stats.n_per_weight = sc.n;
    ql__sessions_counts(s, &stats.sessions, &stats.regions,
                        &stats.region_bytes);
    for (unsigned d = 0; d < s->n_dev; d++) {
      Qlinear__V1__DeviceStats *ds = &dev_stats[d];
      qlinear__v1__device_stats__init(ds);
      ds->device = (char *)s->dev[d].name;
      /* The host's share is the canonical arrays and host layouts of
       * every weight; an accelerator's, its own layouts. */
      ds->bytes_resident =
          s->dev[d].host ? ql__weight_store_bytes(s->weights)
                         : ql__weight_store_device_bytes(s->weights, d);
      ds->budget_bytes = s->dev[d].host ? ql__weight_store_budget(s->weights)
                                        : s->dev[d].budget;
      devs[d] = ds;
    }
    stats.devices = devs;
    stats.n_devices = s->n_dev;
    stats.persistent_weights = s->persistent_count;
    stats.rings = ql__sessions_rings(s);
    stats.ring_requests = rings.taken;
    r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_STATS;
    r.resp.stats = &stats;
  } while (0);
  ql__reply_send(s, route, &r);
  free(sc.st);
  free(sc.ptrs);
  free(sc.hist);
  ql__request_free(req);
}

/*
 * What a ring carries (fastpath.h): Linear and LinearMulti whose results
 * go where the client can read them without a reply body (its regions or
 * device memory); a completion slot carries no tensor data.
 */
static int ring_body(const ql__msg_request *m, char *err, size_t errlen) {
  if (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR) {
    const Qlinear__V1__LinearRequest *l = m->linear;
    if (l->y_out == NULL && l->y_out_cuda == NULL && l->y_out_ze == NULL) {
      snprintf(err, errlen, "linear: on the ring, y_out must name a region "
               "or device slice (a completion carries no tensor data)");
      return QL_EINVAL;
    }
    return 0;
  }
  if (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI) {
    const Qlinear__V1__LinearMultiRequest *l = m->linear_multi;
    if (l->n_y_out == 0 && l->n_y_out_cuda == 0 && l->n_y_out_ze == 0) {
      snprintf(err, errlen, "linear_multi: on the ring, y_out must name "
               "region or device slices (a completion carries no tensor "
               "data)");
      return QL_EINVAL;
    }
    return 0;
  }
  snprintf(err, errlen, "the ring carries linear and linear_multi requests "
           "only; the rest goes to the request socket");
  return QL_EPROTO;
}

/*
 * Both sockets' requests, and a ring's (ring_ss: the ring's session, whose
 * requests need no token). admin: from admin.sock, whose directory is the
 * access check (only the admin group may enter it); its requests carry no
 * session token and act for the admin socket as a whole.
 */
static void handle(ql__server *s, int admin, ql__session *ring_ss,
                   const void *buf, size_t len, void *route) {
  char err[256] = "";
  ql__request *req = NULL;
  s->counters.requests++;
  s->counters.bytes_in += len;

  /* The budget bounds what a message may make the unpacker allocate: the
   * bytes it carries plus room for its structure. */
  int rc = ql__request_decode(buf, len, len + (1u << 20), &req, err,
                              sizeof err);
  if (rc != 0) {
    ql__reply_error(s, route, 0, rc, err);
    return;
  }
  const ql__msg_request *m = req->msg;
  /* Every body but Hello (discovery) runs in a session: its token comes
   * first, before anything else about the request is looked at. */
  ql__session *ss = ring_ss;
  if (ss == NULL && !admin &&
      m->body_case != QLINEAR__V1__REQUEST__BODY_HELLO &&
      (ss = ql__session_find(s, m->session_token.data,
                             m->session_token.len)) == NULL) {
    ql__reply_error(s, route, m->request_id, QL_ESESSION,
                m->session_token.len == 0
                    ? "the request carries no session token (open a session "
                      "on session.sock first)"
                    : "unknown session token (the session ended, or the "
                      "daemon restarted)");
    ql__request_free(req);
    return;
  }
  if ((rc = ql__request_check_strings(buf, len, err, sizeof err)) != 0 ||
      (rc = ql__request_validate(m, err, sizeof err)) != 0) {
    ql__reply_error(s, route, m->request_id, rc, err);
    ql__request_free(req);
    return;
  }
  if (s->stopping) {
    ql__reply_error(s, route, m->request_id, QL_ESHUTDOWN, "daemon is stopping");
    ql__request_free(req);
    return;
  }
  /* Each socket has its own work: computing runs in sessions, which own
   * regions and quotas; administration only where the admin group is. */
  const char *refused = NULL;
  if (admin && (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR ||
                m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI))
    refused = "linear requests go to the request socket, in a session";
  else if (!admin && m->body_case == QLINEAR__V1__REQUEST__BODY_RELOAD)
    refused = "reload_config goes through the admin socket";
  if (ring_ss != NULL && refused == NULL && (rc = ring_body(m, err,
                                                            sizeof err))) {
    ql__reply_error(s, route, m->request_id, rc, err);
    ql__request_free(req);
    return;
  }
  if (refused != NULL) {
    ql__reply_error(s, route, m->request_id, QL_EPERM, refused);
    ql__request_free(req);
    return;
  }

  ql__reply r;
  ql__reply_init(&r, m->request_id);
  /* Bodies referenced by r live in this frame until send_reply below. */
  union {
    Qlinear__V1__LoadBeginResponse begin;
    Qlinear__V1__LoadChunkResponse chunk;
    Qlinear__V1__LoadAbortResponse abort;
    Qlinear__V1__UnloadWeightResponse unload;
    Qlinear__V1__ReloadConfigResponse reload;
    Qlinear__V1__HoldWeightResponse hold;
    hello_buf hello;
  } body;
  info_buf hold_info;
  char report[1024];
  Qlinear__V1__ListWeightsResponse list;
  list_ctx lc = {s, NULL, NULL, 0};

  switch (m->body_case) {
  case QLINEAR__V1__REQUEST__BODY_HELLO:
    on_hello(s, m->hello, &r, &body.hello);
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN:
    on_load_begin(s, ss, m->load_begin, &r, &body.begin);
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK:
    on_load_chunk(s, ss, m->load_chunk, &r, &body.chunk);
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT:
    if (on_load_commit(s, ss, m->request_id, m->load_commit, route, &r)) {
      ql__request_free(req);
      return;
    }
    break;
  case QLINEAR__V1__REQUEST__BODY_LOAD_ABORT:
    on_load_abort(s, ss, m->load_abort, &r, &body.abort);
    break;
  case QLINEAR__V1__REQUEST__BODY_UNLOAD:
    on_unload(s, ss, m->unload, &r, &body.unload);
    break;
  case QLINEAR__V1__REQUEST__BODY_HOLD:
    on_hold(s, ss, m->hold, &r, &hold_info, &body.hold);
    break;
  case QLINEAR__V1__REQUEST__BODY_LIST: {
    size_t n = ql__weight_store_count(s->weights);
    lc.bufs = calloc(n + 1, sizeof *lc.bufs);
    lc.ptrs = calloc(n + 1, sizeof *lc.ptrs);
    if (lc.bufs == NULL || lc.ptrs == NULL) {
      ql__reply_set_error(&r, QL_ENOMEM, "list: out of memory");
      break;
    }
    ql__weight_store_foreach(s->weights, list_one, &lc);
    qlinear__v1__list_weights_response__init(&list);
    list.weights = lc.ptrs;
    list.n_weights = lc.n;
    r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_LIST;
    r.resp.list = &list;
    break;
  }
  case QLINEAR__V1__REQUEST__BODY_LINEAR:
  case QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI:
    if (ql__linear_quota_waits(s, ss)) {
      ql__linear_when_settled(s, ql__linear_resubmit, req, route,
                              ql__session_id(ss));
      return; /* the wait owns req and route now */
    }
    if (m->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI
            ? ql__linear_submit_multi(s, ss, req, route, &r)
            : ql__linear_submit(s, ss, req, route, &r))
      return; /* the job owns req and route now */
    break;
  case QLINEAR__V1__REQUEST__BODY_STATS:
    /* After the loop has accounted every launch whose reply a worker
     * sent itself: what a client was answered is in what it reads. */
    ql__linear_when_settled(s, stats_reply, req, route, 0);
    return; /* the reply owns req and route now */
  case QLINEAR__V1__REQUEST__BODY_RELOAD:
    if ((rc = ql__server_reload(s, report, sizeof report)) != 0) {
      ql__reply_set_error(&r, rc, "reload: %s", report);
      break;
    }
    qlinear__v1__reload_config_response__init(&body.reload);
    body.reload.report = report;
    r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_RELOAD;
    r.resp.reload = &body.reload;
    break;
  default:
    ql__reply_set_error(&r, QL_EPROTO, "request has no known body");
    break;
  }
  ql__reply_send(s, route, &r);
  free(lc.bufs);
  free(lc.ptrs);
  ql__request_free(req);
}

void ql__handle_message(void *arg, const void *buf, size_t len, void *route) {
  handle(arg, 0, NULL, buf, len, route);
}

void ql__handle_admin_message(void *arg, const void *buf, size_t len,
                              void *route) {
  handle(arg, 1, NULL, buf, len, route);
}

static void ring_message(void *arg, void *owner, const void *buf, size_t len,
                         void *route) {
  ql__session *ss = owner;
  ql__session_touch(ss);
  handle(arg, 0, ss, buf, len, route);
}

static void ring_violation(void *arg, void *owner, const char *why) {
  (void)arg;
  ql__session_end(owner, why);
}

const ql__fastpath_ops ql__handlers_ring_ops = {ring_message, ring_violation};
