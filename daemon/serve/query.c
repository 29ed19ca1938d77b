/* query.c - see serve.h: Hello, Unload, Hold, List and Stats, and the
 * WeightInfo they answer with. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/linear.h"
#include "log.h"
#include "serve/serve.h"
#include "state/store.h"

#define DAEMON_VERSION PACKAGE_VERSION

/* ------------------------------------------------------------ weight info */

/* The crossover AUTO requests of w use on device dev (dev < 0: the first
 * that holds it), under the config's fixed and default values. */
static uint32_t crossover_rows(const ql__server *s, const ql__weight *w,
                               int dev, int *measured) {
  return ql__weight_crossover_rows(w, dev, s->cfg.crossover_rows,
                                   s->cfg.crossover_default_rows, measured);
}

void ql__fill_info(const ql__server *s, ql__info_buf *b, ql__weight *w) {
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
  b->info.source_digest.data = w->has_source ? w->source : NULL;
  b->info.source_digest.len = w->has_source ? QL_DIGEST_BYTES : 0;
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

void ql__serve_hello(ql__server *s, const Qlinear__V1__HelloRequest *h,
                     ql__reply *r, ql__hello_buf *b) {
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

/* ------------------------------------------------------- unload, list */

/*
 * On the request socket, unload drops this session's hold; the weight goes
 * when nobody holds it (DESIGN §8). Weights held only by other sessions,
 * or kept by the admin socket, are not the session's to remove: on the
 * admin socket, unload removes the weight whoever holds it, and its file
 * first when it is persistent (if that fails, nothing changes). Requests
 * queued on it keep their references and complete.
 */
void ql__serve_unload(ql__server *s, ql__session *ss,
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
void ql__serve_hold(ql__server *s, ql__session *ss,
                    const Qlinear__V1__HoldWeightRequest *m, ql__reply *r,
                    ql__info_buf *b, Qlinear__V1__HoldWeightResponse *out) {
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
  /* A digest given is the canonical form's or the source's; either binds
   * the hold to that content. */
  if (m->digest.len == QL_DIGEST_BYTES &&
      memcmp(m->digest.data, w->digest, QL_DIGEST_BYTES) != 0 &&
      !(w->has_source &&
        memcmp(m->digest.data, w->source, QL_DIGEST_BYTES) == 0)) {
    ql__reply_set_error(r, QL_EEXIST, "hold: weight '%s' holds another "
                        "content than the digest given", m->name);
    return;
  }
  if (m->digest.len == 0 && !ql__weight_holdable(w, ql__session_uid(ss))) {
    ql__reply_set_error(r, QL_EPERM, "hold: weight '%s' was loaded by "
                        "another user under a plain name: hold it with its "
                        "digest, or name it by its content", m->name);
    ql__info("session %llu (uid %u) refused weight %s of another user",
             (unsigned long long)ql__session_id(ss),
             (unsigned)ql__session_uid(ss), m->name);
    return;
  }
  if ((rc = ql__session_hold(s, ss, w)) != 0) {
    ql__reply_set_error(r, rc, "hold: '%s': %s", m->name, ql_strerror(rc));
    return;
  }
  ql__info("session %llu holds weight %s",
           (unsigned long long)ql__session_id(ss), m->name);
  ql__fill_info(s, b, w);
  qlinear__v1__hold_weight_response__init(out);
  out->weight = &b->info;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_HOLD;
  r->resp.hold = out;
}

static void list_one(ql__weight *w, void *arg) {
  ql__list_buf *l = arg;
  ql__fill_info(l->s, &l->bufs[l->n], w);
  l->ptrs[l->n] = &l->bufs[l->n].info;
  l->n++;
}


void ql__serve_list(ql__server *s, ql__reply *r, ql__list_buf *lb) {
  size_t n = ql__weight_store_count(s->weights);
  lb->s = s;
  lb->n = 0;
  lb->bufs = calloc(n + 1, sizeof *lb->bufs);
  lb->ptrs = calloc(n + 1, sizeof *lb->ptrs);
  if (lb->bufs == NULL || lb->ptrs == NULL) {
    ql__reply_set_error(r, QL_ENOMEM, "list: out of memory");
    return;
  }
  ql__weight_store_foreach(s->weights, list_one, lb);
  qlinear__v1__list_weights_response__init(&lb->list);
  lb->list.weights = lb->ptrs;
  lb->list.n_weights = lb->n;
  r->resp.body_case = QLINEAR__V1__RESPONSE__BODY_LIST;
  r->resp.list = &lb->list;
}

void ql__list_buf_free(ql__list_buf *lb) {
  free(lb->bufs);
  free(lb->ptrs);
  lb->bufs = NULL;
  lb->ptrs = NULL;
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

/*
 * Answers a Stats request (ql__linear_when_settled's callback: every
 * launch answered so far is accounted). Consumes req and route.
 */
void ql__serve_stats(ql__server *s, ql__request *req, void *route,
                        uint64_t arg) {
  ql__reply r;
  Qlinear__V1__DeviceStats dev_stats[QL__MAX_DEVICES];
  Qlinear__V1__DeviceStats *devs[QL__MAX_DEVICES];
  Qlinear__V1__StatsResponse stats;
  stats_ctx sc = {s, NULL, NULL, NULL, 0};
  Qlinear__V1__UserStats *users = NULL, **uptrs = NULL;
  size_t n_users = 0;
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
    ql__dring_counts rings = {0};
    uint64_t n_rings = 0;
    ql__serve_ring_counts(s, &rings, &n_rings);
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
    stats.rings = n_rings;
    stats.ring_requests = rings.taken;
    /* The users (arg: one uid + 1, or 0 for all). */
    size_t cap = 0;
    for (ql__tenant *tn = s->tenants.head; tn != NULL; tn = tn->next)
      cap++;
    if (cap > 0 && ((users = calloc(cap, sizeof *users)) == NULL ||
                    (uptrs = calloc(cap, sizeof *uptrs)) == NULL)) {
      ql__reply_set_error(&r, QL_ENOMEM, "stats: out of memory");
      break;
    }
    for (ql__tenant *tn = s->tenants.head; tn != NULL; tn = tn->next) {
      if (arg != 0 && (uint64_t)tn->uid + 1 != arg)
        continue;
      Qlinear__V1__UserStats *u = &users[n_users];
      size_t ub, un;
      qlinear__v1__user_stats__init(u);
      u->uid = (uint32_t)tn->uid;
      u->sessions = tn->sessions;
      u->queued_requests = tn->queued_jobs;
      u->queued_bytes = tn->queued_bytes;
      ql__uploads_of_uid(s->uploads, tn->uid, &ub, &un);
      u->uploads = un;
      u->upload_bytes = ub;
      u->refused = tn->refused;
      uptrs[n_users++] = u;
    }
    stats.users = uptrs;
    stats.n_users = n_users;
    r.resp.body_case = QLINEAR__V1__RESPONSE__BODY_STATS;
    r.resp.stats = &stats;
  } while (0);
  ql__reply_send(&s->replies, route, &r);
  free(sc.st);
  free(sc.ptrs);
  free(sc.hist);
  free(users);
  free(uptrs);
  ql__request_free(req);
}
