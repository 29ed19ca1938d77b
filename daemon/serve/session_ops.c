/*
 * session_ops.c - what session.sock's packets do (DESIGN §7): SessionOpen,
 * regions, Level Zero imports, rings and MapWeight, for the session of the
 * connection each comes on.
 *
 * The listener (sessionsock.c) hands every packet up through the ops this
 * file opens it with; the state a packet changes is the registry's
 * (session.c) and, for a ring, net/ring.c's. This file pairs each
 * connection with its session and its ring: a connection that closes ends
 * its session, and a session that ends (whatever ended it) stops its ring
 * and closes its connection, through the end hook added here first.
 */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state/devices.h"
#include "net/ring.h"
#include "state/ipc.h"
#include "log.h"
#include "wire/protocol.h"
#include "ql_ring.h"
#include "serve/serve.h"
#include "state/session.h"
#include "net/sessionsock.h"

/* Heap a session message may make the unpacker use, beyond its size. */
#define SESSION_BUDGET_SLACK 16384

/* One connection's session, as this file sees it: from the connection's
 * accept to the session's end hook. */
typedef struct sess {
  ql__session *ss;
  ql__sconn *c;
  ql__dring *ring; /* its ring (net/ring.h), or NULL */
  struct sess *next;  /* every session of the plane */
} sess;

struct ql__session_plane {
  ql__server *s;
  ql__sessionsock *sock; /* session.sock */
  ql__drings *rings;  /* every session's ring */
  sess *list;
};

typedef struct ql__session_plane ql__session_plane;

/* ------------------------------------------------------------------ rings */

/* CreateRingRequest: one ring per session, its bytes counted with the
 * session's regions. */
static int ring_create(ql__session_plane *p, sess *e, uint32_t entries,
                       ql__dring **out, int *ring_fd, int *bell_fd,
                       char *err, size_t errlen) {
  ql__session *ss = e->ss;
  if (e->ring != NULL) {
    snprintf(err, errlen, "create_ring: the session has a ring already");
    return QL_EEXIST;
  }
  size_t size = ql__ring_size(entries ? entries : QL_RING_DEFAULT_ENTRIES);
  uint64_t used = ql__session_region_bytes(ss);
  if (size != 0 && size > QL_SESSION_MAX_REGION_BYTES - used) {
    snprintf(err, errlen, "create_ring: %zu more bytes exceed the session's "
             "%llu bytes of regions (%llu in use)", size,
             (unsigned long long)QL_SESSION_MAX_REGION_BYTES,
             (unsigned long long)used);
    return QL_EEXHAUSTED;
  }
  int rc = ql__dring_create(p->rings, ss, ql__session_id(ss), entries,
                               out, ring_fd, bell_fd, err, errlen);
  if (rc != 0)
    return rc;
  e->ring = *out;
  ql__session_charge(ss, ql__dring_bytes(*out));
  ql__debug("session %llu: ring of %u entries",
            (unsigned long long)ql__session_id(ss),
            entries ? entries : QL_RING_DEFAULT_ENTRIES);
  return 0;
}

/* The ring reads nothing more; replies still to come are dropped. */
static void ring_end(sess *e) {
  if (e->ring == NULL)
    return;
  ql__session_refund(e->ss, ql__dring_bytes(e->ring));
  ql__dring_end(e->ring);
  e->ring = NULL;
}

/* ---------------------------------------------------------------- imports */

/*
 * ImportZeIpcRequest: the packet's descriptor (rfd, taken over: closed
 * here on every path but success, where the import owns it) opened with
 * the client's handle on the device named.
 */
static int import_ze(ql__session_plane *p, ql__session *ss,
                     const Qlinear__V1__ImportZeIpcRequest *m, int rfd,
                     ql__ipc_mem **out, char *err, size_t errlen) {
  ql__device *d;
  if (rfd < 0) {
    snprintf(err, errlen, "import_ze_ipc: the packet carries no descriptor "
             "(SCM_RIGHTS)");
    return QL_EINVAL;
  }
  if ((d = ql__device_find(p->s, m->device)) == NULL) {
    close(rfd);
    snprintf(err, errlen, "import_ze_ipc: no device '%.64s'", m->device);
    return QL_ENOTFOUND;
  }
  if (d->failed) {
    close(rfd);
    snprintf(err, errlen, "import_ze_ipc: device %s is out of service",
             d->alias);
    return QL_EDEVICE;
  }
  char why[200];
  int rc = ql__ipc_import(ql__session_ipc(ss), d, ql__session_id(ss),
                          m->ipc_handle.data, m->ipc_handle.len, rfd, out,
                          why, sizeof why);
  if (rc != 0)
    snprintf(err, errlen, "import_ze_ipc: %s", why);
  return rc;
}

/* ------------------------------------------------------------ map_weight */

/*
 * MapWeightRequest: exports the layout of a weight the session holds on
 * one device (registry.h, export_layout) into *fd and out, and keeps a
 * reference to the weight until the session ends, so that its layout
 * outlives an unload or a replace for as long as the client may map it.
 */
static int map_weight(ql__session_plane *p, ql__session *ss,
                      const Qlinear__V1__MapWeightRequest *m,
                      Qlinear__V1__MapWeightResponse *out, int *fd, char *err,
                      size_t errlen) {
  ql__server *s = p->s;
  ql__weight *w = NULL;
  ql__device *d = NULL;
  ql_layout_export ex;
  uid_t uid = ql__session_uid(ss);
  int rc;

  *fd = -1;
  if (s->cfg.mapped_mode == QL_MAPPED_OFF) {
    snprintf(err, errlen, "map_weight: mapped_mode is off");
    return QL_ENOTSUP;
  }
  /* The importer sets its own access to the allocation (the descriptor
   * carries no access right): a mapping client could write the weight of
   * every client, so only as trusted a client as the daemon's own user
   * may map, unless the admin says any. */
  if (s->cfg.mapped_mode == QL_MAPPED_OWNER && uid != geteuid() &&
      uid != 0) {
    snprintf(err, errlen, "map_weight: mapped_mode = owner: uid %lu is "
             "not the daemon's", (unsigned long)uid);
    return QL_EPERM;
  }
  if ((w = ql__session_held(ss, m->name)) == NULL) {
    snprintf(err, errlen, "map_weight: the session holds no weight '%.100s' "
             "(load or hold it first)", m->name);
    return QL_ENOTFOUND;
  }
  if (m->device != NULL && m->device[0] != '\0') {
    if ((d = ql__device_find(s, m->device)) == NULL) {
      snprintf(err, errlen, "map_weight: no device '%.64s'", m->device);
      return QL_ENOTFOUND;
    }
    if (!(w->devices >> d->index & 1u)) {
      snprintf(err, errlen, "map_weight: weight '%.100s' is not resident on "
               "%s", w->name, d->alias);
      return QL_ENOTFOUND;
    }
  } else {
    for (unsigned i = 0; i < s->n_dev && d == NULL; i++)
      if ((w->devices >> i & 1u) && s->dev[i].b->export_layout != NULL &&
          w->lay[i].packed != NULL && !w->lay[i].host && !s->dev[i].failed)
        d = &s->dev[i];
    if (d == NULL) {
      snprintf(err, errlen, "map_weight: weight '%.100s' is on no device "
               "whose layouts can be mapped (a GPU)", w->name);
      return QL_ENOTSUP;
    }
  }
  if (d->failed) {
    snprintf(err, errlen, "map_weight: device %s is out of service",
             d->alias);
    return QL_EDEVICE;
  }
  if (d->b->export_layout == NULL || w->lay[d->index].packed == NULL ||
      w->lay[d->index].host) {
    snprintf(err, errlen, "map_weight: the layouts of %s cannot be mapped "
             "by another process", d->alias);
    return QL_ENOTSUP;
  }
  /* Room to keep the reference, before anything is exported. */
  if ((rc = ql__session_map_room(ss, w)) != 0) {
    if (rc == QL_EEXHAUSTED)
      snprintf(err, errlen, "map_weight: the session mapped %d weights "
               "already", QL_SESSION_MAX_WEIGHTS);
    return rc;
  }
  if ((rc = d->b->export_layout(w->lay[d->index].packed, &ex)) != 0) {
    snprintf(err, errlen, "map_weight: '%.100s' on %s: %s%s", w->name,
             d->alias, ql_strerror(rc),
             rc == QL_ENOTSUP ? " (not made exportable: no VMM, or "
                                "QL_CUDA_VMM=0)" : "");
    return rc;
  }
  ql__session_map_add(ss, w);
  *fd = ex.fd;
  out->layout = (char *)ex.layout;
  out->device = d->name;
  out->size = ex.size;
  out->format = (uint32_t)w->q->format;
  out->scale_dtype = (uint32_t)ex.scale_dtype;
  out->n = (uint64_t)w->q->n;
  out->k = (uint64_t)w->q->k;
  out->groups = (uint64_t)w->q->groups;
  out->group_size = w->q->group_size;
  out->ldq = (uint64_t)ex.ldq;
  out->q_offset = ex.q_offset;
  out->scale_offset = ex.scale_offset;
  out->has_zero = ex.zero_offset != UINT64_MAX;
  out->zero_offset = out->has_zero ? ex.zero_offset : 0;
  out->has_bias = ex.bias_offset != UINT64_MAX;
  out->bias_offset = out->has_bias ? ex.bias_offset : 0;
  out->sms = ex.sms;
  out->writable = !ex.readonly;
  out->digest.data = w->digest;
  out->digest.len = QL_DIGEST_BYTES;
  ql__info("session %llu (pid %ld) maps weight %s on %s (%llu bytes%s)",
           (unsigned long long)ql__session_id(ss),
           (long)ql__session_pid(ss), w->name, d->alias,
           (unsigned long long)ex.size, ex.readonly ? ", read-only" : "");
  return 0;
}

/* ---------------------------------------------------------------- packets */

/* SessionOpenRequest: the token becomes valid and goes to the client. */
static int open_session(ql__session *ss,
                        const Qlinear__V1__SessionOpenRequest *m,
                        Qlinear__V1__SessionOpenResponse *out, char *err,
                        size_t errlen) {
  if (ql__session_is_open(ss)) {
    snprintf(err, errlen, "open: the session is already open");
    return QL_EPROTO;
  }
  if (m->protocol_version != QL_PROTOCOL_VERSION) {
    snprintf(err, errlen, "open: client speaks protocol %u, daemon %u",
             m->protocol_version, QL_PROTOCOL_VERSION);
    return QL_EVERSION;
  }
  qlinear__v1__session_open_response__init(out);
  out->token.data = (uint8_t *)ql__session_begin(ss, m->client_name);
  out->token.len = QL_SESSION_TOKEN_BYTES;
  out->max_regions = QL_SESSION_MAX_REGIONS;
  out->max_region_bytes = QL_SESSION_MAX_REGION_BYTES;
  return 0;
}

/*
 * Answers one packet of e's connection; rfd is the descriptor it carried
 * (SCM_RIGHTS) or -1, taken over. Returns QL_ESESSION when the session
 * ended (its reply could not be sent; e is gone then), else 0.
 */
static int session_packet(ql__session_plane *p, sess *e, const uint8_t *buf,
                          size_t len, int rfd) {
  ql__session *ss = e->ss;
  char err[256] = "";
  ql__session_request *req = NULL;
  ql__msg_session_response resp;
  Qlinear__V1__Status st;
  Qlinear__V1__SessionOpenResponse open;
  Qlinear__V1__CreateRegionResponse created;
  Qlinear__V1__DestroyRegionResponse destroyed;
  Qlinear__V1__ImportZeIpcResponse imported;
  Qlinear__V1__ReleaseImportResponse released;
  Qlinear__V1__CreateRingResponse ringed;
  Qlinear__V1__MapWeightResponse mapped;
  int rc, fd = -1, fd2 = -1;
  ql__dring *fp = NULL;
  ql__region *r = NULL;
  ql__ipc_mem *im = NULL;

  rc = ql__session_request_decode(buf, len, len + SESSION_BUDGET_SLACK, &req,
                                  err, sizeof err);
  if (rc != 0) {
    if (rfd >= 0)
      close(rfd);
    /* Not a SessionRequest: answered under id 0, as on the request
     * socket. */
    if (ql__sessionsock_send_status(e->c, 0, rc, err) == 0)
      return 0;
    ql__session_end(ss, "a reply could not be sent");
    return QL_ESESSION;
  }
  const ql__msg_session_request *m = req->msg;
  qlinear__v1__session_response__init(&resp);
  qlinear__v1__status__init(&st);
  resp.request_id = m->request_id;
  resp.status = &st;
  st.message = err;
  /* Only an import takes a descriptor; any other is closed unread. */
  if (rfd >= 0 && m->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC) {
    close(rfd);
    rfd = -1;
  }
  if ((rc = ql__session_request_validate(m, err, sizeof err)) != 0)
    goto reply;
  if (m->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_OPEN &&
      !ql__session_is_open(ss)) {
    rc = QL_ESESSION;
    snprintf(err, sizeof err, "the session is not open yet (send open "
             "first)");
    goto reply;
  }
  switch (m->body_case) {
  case QLINEAR__V1__SESSION_REQUEST__BODY_OPEN:
    rc = open_session(ss, m->open, &open, err, sizeof err);
    if (rc != 0)
      break;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN;
    resp.open = &open;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION:
    rc = ql__session_region_create(ss, m->create_region->size, &r, &fd, err,
                                   sizeof err);
    if (rc != 0)
      break;
    qlinear__v1__create_region_response__init(&created);
    created.region_id = r->id;
    created.size = r->size;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION;
    resp.create_region = &created;
    ql__debug("session %llu: region %llu of %llu bytes",
              (unsigned long long)ql__session_id(ss),
              (unsigned long long)r->id, (unsigned long long)r->size);
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION:
    rc = ql__session_region_destroy(ss, m->destroy_region->region_id);
    if (rc != 0) {
      snprintf(err, sizeof err, "destroy_region: the session has no region "
               "%llu", (unsigned long long)m->destroy_region->region_id);
      break;
    }
    qlinear__v1__destroy_region_response__init(&destroyed);
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_DESTROY_REGION;
    resp.destroy_region = &destroyed;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC:
    rc = import_ze(p, ss, m->import_ze_ipc, rfd, &im, err, sizeof err);
    rfd = -1; /* taken over */
    if (rc != 0)
      break;
    qlinear__v1__import_ze_ipc_response__init(&imported);
    imported.import_id = im->id;
    imported.size = im->size;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_IMPORT_ZE_IPC;
    resp.import_ze_ipc = &imported;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT:
    rc = ql__ipc_release(*ql__session_ipc(ss),
                         m->release_import->import_id);
    if (rc != 0) {
      snprintf(err, sizeof err, "release_import: the session has no import "
               "%llu", (unsigned long long)m->release_import->import_id);
      break;
    }
    qlinear__v1__release_import_response__init(&released);
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_RELEASE_IMPORT;
    resp.release_import = &released;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING:
    rc = ring_create(p, e, m->create_ring->entries, &fp, &fd, &fd2, err,
                     sizeof err);
    if (rc != 0)
      break;
    qlinear__v1__create_ring_response__init(&ringed);
    ringed.entries = m->create_ring->entries ? m->create_ring->entries
                                             : QL_RING_DEFAULT_ENTRIES;
    ringed.size = ql__dring_bytes(fp);
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING;
    resp.create_ring = &ringed;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT:
    qlinear__v1__map_weight_response__init(&mapped);
    rc = map_weight(p, ss, m->map_weight, &mapped, &fd, err, sizeof err);
    if (rc != 0)
      break;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_MAP_WEIGHT;
    resp.map_weight = &mapped;
    break;
  default: /* validate refused it */
    rc = QL_EPROTO;
    break;
  }
reply:
  if (rfd >= 0)
    close(rfd); /* an import refused before it took the descriptor */
  if (rc != 0) {
    st.code = rc;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY__NOT_SET;
    if (err[0] == '\0')
      snprintf(err, sizeof err, "%s", ql_strerror(rc));
    ql__debug("session %llu: %s: %s", (unsigned long long)ql__session_id(ss),
              ql_err_name(rc), err);
  }
  int sent = ql__sessionsock_send(e->c, &resp, fd, fd2);
  if (fd >= 0)
    close(fd); /* the mapping stays; the client has its own descriptor */
  if (fd2 >= 0)
    close(fd2);
  ql__session_request_free(req);
  if (sent != 0) {
    /* A region the client never received is of no use to it. */
    if (r != NULL)
      ql__session_region_destroy(ss, r->id);
    if (fp != NULL)
      ring_end(e);
    if (im != NULL)
      ql__ipc_release(*ql__session_ipc(ss), im->id);
    ql__session_end(ss, "a reply could not be sent");
    return QL_ESESSION;
  }
  return 0;
}

/* ------------------------------------------------- session.sock's ops */

/* A connection within the listener's bounds: a session for it. */
static int on_accepted(void *arg, ql__sconn *c, const struct ucred *peer) {
  ql__session_plane *p = arg;
  sess *e = calloc(1, sizeof *e);
  if (e == NULL) {
    ql__err("session from pid %ld refused: out of memory", (long)peer->pid);
    return QL_ENOMEM;
  }
  int rc = ql__session_create(p->s, peer, &e->ss);
  if (rc != 0) {
    free(e);
    return rc;
  }
  e->c = c;
  e->next = p->list;
  p->list = e;
  ql__sconn_set_data(c, e);
  return 0;
}

static int on_packet(void *arg, ql__sconn *c, const void *buf, size_t len,
                     int fd) {
  sess *e = ql__sconn_get_data(c);
  ql__session_touch(e->ss); /* a session packet renews the lease */
  return session_packet(arg, e, buf, len, fd) != 0;
}

/* The client closed its socket (or it failed): its session ends. */
static void on_closed(void *arg, ql__sconn *c, const char *why) {
  sess *e = ql__sconn_get_data(c);
  (void)arg;
  if (e != NULL)
    ql__session_end(e->ss, why); /* the end hook frees e */
}

static const ql__sessionsock_ops sock_ops = {on_accepted, on_packet,
                                             on_closed};

/*
 * A session ended, whatever ended it (registered before the dispatcher's
 * hook, so this runs first): its ring reads nothing more and its
 * connection closes, before the registry releases what the session owned.
 */
static void on_session_ended(void *arg, uint64_t session_id) {
  ql__session_plane *p = arg;
  for (sess **pp = &p->list; *pp; pp = &(*pp)->next) {
    sess *e = *pp;
    if (ql__session_id(e->ss) != session_id)
      continue;
    *pp = e->next;
    ring_end(e);
    ql__sconn_set_data(e->c, NULL);
    ql__sconn_close(e->c);
    free(e);
    return;
  }
}

/* ----------------------------------------------------------------- life */

int ql__serve_sessions_open(ql__server *s, const ql__dring_ops *ring_ops,
                            void *ring_arg) {
  char path[PATH_MAX];
  int rc;
  ql__session_plane *p = calloc(1, sizeof *p);
  if (p == NULL) {
    ql__err("cannot open the session socket: out of memory");
    return QL_ENOMEM;
  }
  p->s = s;
  if ((rc = ql__sessions_open(s)) != 0) {
    free(p);
    return rc;
  }
  if (ql__drings_open(s->loop, &s->cfg.ring_spin_us, ring_ops, ring_arg,
                         &p->rings) != 0) {
    ql__err("cannot open the session socket: out of memory");
    rc = QL_ENOMEM;
    goto fail;
  }
  if ((rc = ql__sessions_add_end_hook(s, on_session_ended, p)) != 0)
    goto fail;
  if (snprintf(path, sizeof path, "%s/session.sock", s->cfg.socket_dir) >=
      (int)sizeof path) {
    ql__err("session socket path too long: %s/session.sock",
            s->cfg.socket_dir);
    rc = QL_EINVAL;
    goto fail;
  }
  /* Each session is one connection: the listener bounds them. */
  ql__sessionsock_limits lim = {QL_SESSIONS_MAX,
                                s->cfg.max_sessions_per_uid};
  if ((rc = ql__sessionsock_open(s->loop, path, &lim, &sock_ops, p,
                                 &p->sock)) != 0)
    goto fail;
  s->session_plane = p;
  return 0;
fail:
  ql__drings_close(p->rings);
  ql__sessions_close(s);
  free(p);
  return rc;
}

void ql__serve_sessions_close(ql__server *s) {
  ql__session_plane *p = s->session_plane;
  /* Ends every session: the hook above stops each ring and closes each
   * connection; the registry releases what they held. */
  ql__sessions_close(s);
  if (p == NULL)
    return;
  ql__drings_close(p->rings);
  ql__sessionsock_close(p->sock);
  s->session_plane = NULL;
  free(p);
}

void ql__serve_ring_counts(const ql__server *s, ql__dring_counts *out,
                           uint64_t *rings) {
  const ql__session_plane *p = s->session_plane;
  *rings = 0;
  if (p == NULL)
    return;
  ql__drings_counts(p->rings, out);
  for (const sess *e = p->list; e != NULL; e = e->next)
    *rings += e->ring != NULL;
}
