/* session.c - see session.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "devices.h"
#include "fastpath.h"
#include "ipc.h"
#include "log.h"
#include "protocol.h"
#include "ql_ring.h"
#include "session.h"

#define TOKEN_BUCKETS 256 /* indexed by the token's first byte */
#define HOLD_BUCKETS 256
/* Packets handled per wake-up of one session, so that a chatty client
 * does not starve the others (the poll is level-triggered). */
#define BURST 32
/* Heap a session message may make the unpacker use, beyond its size. */
#define SESSION_BUDGET_SLACK 16384
/* After EMFILE the listener pauses this long instead of spinning. */
#define ACCEPT_RETRY_MS 100

/* One held weight, shared by all its holders (counted in w->holders): one
 * weight reference, which keeps the pointer valid while any session holds
 * it whatever happens to the store. */
typedef struct hold {
  ql__weight *w;
  struct hold *next; /* bucket chain */
} hold;

struct ql__session {
  uint64_t id;
  int fd;
  uv_poll_t poll;
  struct ql__sessions *owner;
  pid_t pid; /* SO_PEERCRED at accept */
  uid_t uid;
  gid_t gid;
  char client_name[64]; /* printable, for logs */
  uint8_t token[QL_SESSION_TOKEN_BYTES];
  int open;  /* SessionOpen answered: the token is valid */
  int ended; /* removed from every table; the handle is closing */
  ql__region *regions;
  size_t n_regions;
  uint64_t region_bytes;
  hold **held; /* weights this session holds */
  size_t n_held, cap_held;
  ql__ipc_table *ipc;    /* IPC imports (ipc.h), NULL until the first */
  ql__fastpath *ring;    /* its ring (fastpath.h), or NULL */
  ql__weight **mapped;   /* weights it mapped (one reference each): their
                            layouts stay until the session ends */
  size_t n_mapped, cap_mapped;
  uint64_t last_ns;      /* its last request or session packet (lease) */
  ql__session *next;     /* every session */
  ql__session *tok_next; /* open sessions by token */
};

/* What may run when a session ends (ql__sessions_add_end_hook). */
#define MAX_END_HOOKS 4

struct ql__sessions {
  ql__server *s;
  int fd; /* the listening socket */
  uv_poll_t poll;
  uv_timer_t retry;
  char path[PATH_MAX];
  ql__session *list;
  size_t count;
  ql__session *by_token[TOKEN_BUCKETS];
  hold *holds[HOLD_BUCKETS];
  ql__fastpaths *rings; /* every session's ring (fastpath.h) */
  struct {
    void (*fn)(void *arg, uint64_t session_id);
    void *arg;
  } end_hooks[MAX_END_HOOKS]; /* ql__sessions_add_end_hook */
  size_t n_end_hooks;
  uint64_t next_session_id, next_region_id;
  uint64_t regions, region_bytes; /* over every session */
  int closing_handles;            /* close callbacks still to come */
};

typedef struct ql__sessions ql__sessions;

/* ---------------------------------------------------------------- regions */

void ql__region_ref(ql__region *r) { r->refs++; }

/* Region bytes page-locked for devices, over every session (loop thread
 * only): bounded by max_pinned_bytes, since locking faults in and holds
 * every page in the daemon's own memory, whatever the client touches. */
static uint64_t pinned_total;

void ql__region_unref(ql__region *r) {
  if (r == NULL || --r->refs > 0)
    return;
  /* No job uses it any more: no DMA can be in flight. */
  ql__devices_host_unregister(r->base, r->pinned, r->n_pinned);
  if (r->n_pinned > 0)
    pinned_total -= r->size;
  munmap(r->base, (size_t)r->size);
  free(r);
}

static int map_errno(int e) {
  switch (e) {
  case EMFILE:
  case ENFILE:
    return QL_EEXHAUSTED;
  case ENOMEM:
  case ENOSPC:
  case EFBIG:
    return QL_ENOMEM;
  default:
    return QL_EIO;
  }
}

/*
 * Makes a sealed memfd of size bytes and the daemon's mapping of it. The
 * seals are what make the mapping safe: nobody (the client included) can
 * shrink the file under it, which would turn the daemon's next access into
 * SIGBUS, nor grow it, nor change the seals. On success *fd_out is the
 * descriptor to pass to the client (the caller closes it).
 */
static int region_create(ql__sessions *o, ql__session *ss, uint64_t size,
                         ql__region **out, int *fd_out, char *err,
                         size_t errlen) {
  int fd = -1, rc;
  void *base = MAP_FAILED;
  if (ss->n_regions >= QL_SESSION_MAX_REGIONS) {
    snprintf(err, errlen, "create_region: the session already has %d "
             "regions", QL_SESSION_MAX_REGIONS);
    return QL_EEXHAUSTED;
  }
  if (size > QL_SESSION_MAX_REGION_BYTES - ss->region_bytes ||
      size > (uint64_t)SIZE_MAX) {
    snprintf(err, errlen, "create_region: %llu more bytes exceed the "
             "session's %llu bytes of regions (%llu in use)",
             (unsigned long long)size,
             (unsigned long long)QL_SESSION_MAX_REGION_BYTES,
             (unsigned long long)ss->region_bytes);
    return QL_EEXHAUSTED;
  }
  fd = memfd_create("qlinear-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    rc = map_errno(errno);
    snprintf(err, errlen, "create_region: memfd_create: %s", strerror(errno));
    return rc;
  }
  if (ftruncate(fd, (off_t)size) != 0) {
    rc = map_errno(errno);
    snprintf(err, errlen, "create_region: cannot size it: %s",
             strerror(errno));
    goto fail;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    rc = QL_EINTERNAL;
    snprintf(err, errlen, "create_region: cannot seal it: %s",
             strerror(errno));
    goto fail;
  }
  base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    rc = map_errno(errno);
    snprintf(err, errlen, "create_region: cannot map it: %s",
             strerror(errno));
    goto fail;
  }
  ql__region *r = calloc(1, sizeof *r);
  if (r == NULL) {
    rc = QL_ENOMEM;
    snprintf(err, errlen, "create_region: out of memory");
    goto fail;
  }
  r->id = ++o->next_region_id;
  r->size = size;
  r->base = base;
  r->refs = 1; /* the session's */
  /* Pinned for the devices' DMA, within max_pinned_bytes; where refused,
   * tensors in it are staged. */
  uint64_t cap = o->s->cfg.max_pinned_bytes;
  if (size <= cap && pinned_total <= cap - size) {
    r->n_pinned = ql__devices_host_register(o->s, base, (size_t)size,
                                            r->pinned, QL__REGION_BACKENDS);
    if (r->n_pinned > 0)
      pinned_total += size;
  } else {
    ql__debug("session %llu: region %llu of %llu bytes not page-locked: "
             "locked regions would pass max_pinned_bytes (%llu); its "
             "tensors are staged", (unsigned long long)ss->id,
             (unsigned long long)r->id, (unsigned long long)size,
             (unsigned long long)cap);
  }
  r->next = ss->regions;
  ss->regions = r;
  ss->n_regions++;
  ss->region_bytes += size;
  o->regions++;
  o->region_bytes += size;
  *out = r;
  *fd_out = fd;
  return 0;
fail:
  if (base != MAP_FAILED)
    munmap(base, (size_t)size);
  close(fd);
  return rc;
}

/* Unlinks region id from its session and drops the session's reference;
 * jobs still using it keep it mapped. */
static int region_destroy(ql__sessions *o, ql__session *ss, uint64_t id) {
  for (ql__region **pp = &ss->regions; *pp; pp = &(*pp)->next) {
    ql__region *r = *pp;
    if (r->id != id)
      continue;
    *pp = r->next;
    r->next = NULL;
    ss->n_regions--;
    ss->region_bytes -= r->size;
    o->regions--;
    o->region_bytes -= r->size;
    ql__region_unref(r);
    return 0;
  }
  return QL_ENOTFOUND;
}

struct ql__ipc_table **ql__session_ipc(ql__session *ss) { return &ss->ipc; }

ql__region *ql__session_region(ql__session *ss, uint64_t id) {
  for (ql__region *r = ss->regions; r; r = r->next)
    if (r->id == id)
      return r;
  return NULL;
}

/* ---------------------------------------------------------------- weights */

static size_t hold_bucket(const ql__weight *w) {
  return (size_t)(((uintptr_t)w >> 4) % HOLD_BUCKETS);
}

/*
 * One holder less. The last one takes the weight out of the store if it is
 * still the one stored under its name; queued jobs keep their own
 * references, so the memory goes when the last of them finishes.
 */
static void hold_drop(ql__server *s, hold *h) {
  ql__sessions *o = s->sessions;
  if (--h->w->holders > 0)
    return;
  for (hold **pp = &o->holds[hold_bucket(h->w)]; *pp; pp = &(*pp)->next) {
    if (*pp == h) {
      *pp = h->next;
      break;
    }
  }
  ql__weight *w = h->w;
  if (ql__weight_store_drop_unheld(s->weights, w))
    ql__info("weight %s released by its last session", w->name);
  ql__weight_unref(w);
  free(h);
}

int ql__session_hold(ql__server *s, ql__session *ss, ql__weight *w) {
  ql__sessions *o = s->sessions;
  for (size_t i = 0; i < ss->n_held; i++)
    if (ss->held[i]->w == w)
      return 0;
  if (ss->n_held >= QL_SESSION_MAX_WEIGHTS)
    return QL_EEXHAUSTED;
  if (ss->n_held == ss->cap_held) {
    size_t cap = ss->cap_held ? ss->cap_held * 2 : 8;
    hold **a = realloc(ss->held, cap * sizeof *a);
    if (a == NULL)
      return QL_ENOMEM;
    ss->held = a;
    ss->cap_held = cap;
  }
  hold *h = o->holds[hold_bucket(w)];
  while (h != NULL && h->w != w)
    h = h->next;
  if (h == NULL) {
    if ((h = calloc(1, sizeof *h)) == NULL)
      return QL_ENOMEM;
    h->w = w;
    ql__weight_ref(w);
    h->next = o->holds[hold_bucket(w)];
    o->holds[hold_bucket(w)] = h;
  }
  w->holders++;
  ss->held[ss->n_held++] = h;
  return 0;
}

/* The index in ss->held of the weight called name, or SIZE_MAX. A name
 * may be held twice if its first weight left the store (only a later
 * admin unload can do that): the stored one is taken. */
static size_t held_by_name(const ql__session *ss, const char *name) {
  size_t pick = SIZE_MAX;
  for (size_t i = 0; i < ss->n_held; i++) {
    const ql__weight *w = ss->held[i]->w;
    if (strcmp(w->name, name) == 0 && (pick == SIZE_MAX || w->in_store))
      pick = i;
  }
  return pick;
}

int ql__session_release(ql__server *s, ql__session *ss, const char *name) {
  size_t pick = held_by_name(ss, name);
  if (pick == SIZE_MAX)
    return QL_ENOTFOUND;
  /* A weight this session mapped stays held (and counted in the budgets)
   * until the session ends: its layout cannot go while mapped. */
  for (size_t i = 0; i < ss->n_mapped; i++)
    if (ss->mapped[i] == ss->held[pick]->w)
      return QL_EPERM;
  hold *h = ss->held[pick];
  ss->held[pick] = ss->held[--ss->n_held];
  hold_drop(s, h);
  return 0;
}

/* --------------------------------------------------------------- sessions */

uid_t ql__session_uid(const ql__session *ss) { return ss->uid; }

uint64_t ql__session_id(const ql__session *ss) { return ss->id; }

ql__session *ql__session_by_id(ql__server *s, uint64_t id) {
  if (s->sessions == NULL)
    return NULL;
  for (ql__session *ss = s->sessions->list; ss; ss = ss->next)
    if (ss->id == id)
      return ss;
  return NULL;
}

ql__session *ql__session_find(ql__server *s, const uint8_t *token,
                              size_t len) {
  if (s->sessions == NULL || token == NULL || len != QL_SESSION_TOKEN_BYTES)
    return NULL;
  for (ql__session *ss = s->sessions->by_token[token[0]]; ss;
       ss = ss->tok_next)
    if (CRYPTO_memcmp(ss->token, token, QL_SESSION_TOKEN_BYTES) == 0) {
      ss->last_ns = ql__now_ns(); /* a request renews the lease */
      return ss;
    }
  return NULL;
}

static void session_end(ql__session *ss, const char *why);
static void ring_destroy(ql__session *ss);

void ql__sessions_expire(ql__server *s, uint64_t lease_ns) {
  ql__sessions *o = s->sessions;
  uint64_t now = ql__now_ns();
  if (o == NULL || lease_ns == 0)
    return;
  for (ql__session *ss = o->list, *next; ss != NULL; ss = next) {
    next = ss->next; /* session_end unlinks ss */
    if (now - ss->last_ns > lease_ns) {
      ql__notice("session %llu (pid %ld): no request for %llu ms; its lease "
                 "expired", (unsigned long long)ss->id, (long)ss->pid,
                 (unsigned long long)((now - ss->last_ns) / 1000000u));
      session_end(ss, "its lease expired");
    }
  }
}

int ql__sessions_add_end_hook(ql__server *s,
                              void (*fn)(void *arg, uint64_t session_id),
                              void *arg) {
  ql__sessions *o = s->sessions;
  if (o == NULL || o->n_end_hooks >= MAX_END_HOOKS)
    return QL_EEXHAUSTED;
  o->end_hooks[o->n_end_hooks].fn = fn;
  o->end_hooks[o->n_end_hooks].arg = arg;
  o->n_end_hooks++;
  return 0;
}

void ql__sessions_ring_counts(const ql__server *s, ql__fastpath_counts *out) {
  if (s->sessions != NULL)
    ql__fastpaths_counts(s->sessions->rings, out);
}

uint64_t ql__sessions_rings(const ql__server *s) {
  uint64_t n = 0;
  for (const ql__session *ss = s->sessions ? s->sessions->list : NULL;
       ss != NULL; ss = ss->next)
    n += ss->ring != NULL;
  return n;
}

void ql__sessions_counts(const ql__server *s, uint64_t *sessions,
                         uint64_t *regions, uint64_t *region_bytes) {
  const ql__sessions *o = s->sessions;
  *sessions = o ? o->count : 0;
  *regions = o ? o->regions : 0;
  *region_bytes = o ? o->region_bytes : 0;
}

void ql__session_end(ql__session *ss, const char *why) { session_end(ss, why); }

void ql__session_touch(ql__session *ss) { ss->last_ns = ql__now_ns(); }

static void on_session_closed(uv_handle_t *h) {
  ql__session *ss = h->data;
  close(ss->fd);
  free(ss->held);
  free(ss->mapped);
  free(ss);
}

/*
 * The end of a session, whatever its cause: it leaves every table at once,
 * so its token stops working; its regions, holds and uploads (those not
 * being committed: a commit finds the session gone when it completes) are
 * released now. Only the memory of the session itself waits for libuv.
 */
static void session_end(ql__session *ss, const char *why) {
  ql__sessions *o = ss->owner;
  ql__server *s = o->s;
  if (ss->ended)
    return;
  ss->ended = 1;
  for (ql__session **pp = &o->list; *pp; pp = &(*pp)->next) {
    if (*pp == ss) {
      *pp = ss->next;
      break;
    }
  }
  if (ss->open) {
    for (ql__session **pp = &o->by_token[ss->token[0]]; *pp;
         pp = &(*pp)->tok_next) {
      if (*pp == ss) {
        *pp = ss->tok_next;
        break;
      }
    }
  }
  o->count--;
  /* Its ring reads nothing more; replies still to come are dropped. */
  ring_destroy(ss);
  /* Its waiting requests go first (the dispatcher's hook): their replies
   * go nowhere now. */
  for (size_t i = 0; i < o->n_end_hooks; i++)
    o->end_hooks[i].fn(o->end_hooks[i].arg, ss->id);
  size_t nreg = ss->n_regions, nheld = ss->n_held;
  /* Imports that requests still use close when the last one ends. */
  size_t nipc = ql__ipc_table_free(ss->ipc);
  ss->ipc = NULL;
  while (ss->regions != NULL)
    region_destroy(o, ss, ss->regions->id);
  while (ss->n_held > 0)
    hold_drop(s, ss->held[--ss->n_held]);
  /* The client's mappings died with it (or will when it exits): the
   * layouts it mapped may go now. */
  while (ss->n_mapped > 0)
    ql__weight_unref(ss->mapped[--ss->n_mapped]);
  /* (One being committed finds its session gone when it completes.) */
  (void)ql__uploads_drop_owner(s->uploads, ss->id);
  OPENSSL_cleanse(ss->token, sizeof ss->token);
  ql__info("session %llu (pid %ld) ended: %s; %zu region%s destroyed, %zu "
           "weight%s released, %zu IPC allocation%s let go",
           (unsigned long long)ss->id, (long)ss->pid, why, nreg,
           nreg == 1 ? "" : "s", nheld, nheld == 1 ? "" : "s", nipc,
           nipc == 1 ? "" : "s");
  uv_close((uv_handle_t *)&ss->poll, on_session_closed);
}

/*
 * Sends one SessionResponse, with fd as SCM_RIGHTS when fd >= 0. Never
 * blocks: a client that does not read its replies until its socket buffer
 * is full has its session ended by the caller.
 */
static int send_response2(int sock, const ql__msg_session_response *resp,
                          int fd, int fd2) {
  uint8_t buf[QL_SESSION_MSG_MAX];
  size_t len = qlinear__v1__session_response__get_packed_size(resp);
  if (len > sizeof buf)
    return -1; /* cannot happen: every field is bounded */
  qlinear__v1__session_response__pack(resp, buf);
  struct iovec iov = {buf, len};
  struct msghdr mh;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(2 * sizeof(int))];
  } ctl;
  int fds[2] = {fd, fd2};
  size_t nfd = fd < 0 ? 0 : fd2 < 0 ? 1 : 2;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfd > 0) {
    memset(&ctl, 0, sizeof ctl);
    mh.msg_control = ctl.buf;
    mh.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
  }
  ssize_t n;
  do
    n = sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)len ? 0 : -1;
}

static int send_response(int sock, const ql__msg_session_response *resp,
                         int fd) {
  return send_response2(sock, resp, fd, -1);
}

/* A response with a status and no body. */
static int send_error(int sock, uint64_t request_id, int code,
                      const char *msg) {
  ql__msg_session_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__session_response__init(&resp);
  qlinear__v1__status__init(&st);
  st.code = code;
  st.message = (char *)(msg && *msg ? msg : ql_strerror(code));
  resp.request_id = request_id;
  resp.status = &st;
  return send_response(sock, &resp, -1);
}

static void copy_printable(char *dst, size_t len, const char *src) {
  size_t i = 0;
  for (; src != NULL && src[i] != '\0' && i + 1 < len; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[i] = ch < 0x20 || ch >= 0x7f ? '?' : (char)ch;
  }
  dst[i] = '\0';
}

/* CreateRingRequest: one ring per session, its bytes counted with the
 * session's regions. */
static int ring_create(ql__session *ss, uint32_t entries, ql__fastpath **out,
                       int *ring_fd, int *bell_fd, char *err, size_t errlen) {
  ql__sessions *o = ss->owner;
  if (ss->ring != NULL) {
    snprintf(err, errlen, "create_ring: the session has a ring already");
    return QL_EEXIST;
  }
  size_t size = ql__ring_size(entries ? entries : QL_RING_DEFAULT_ENTRIES);
  if (size != 0 && size > QL_SESSION_MAX_REGION_BYTES - ss->region_bytes) {
    snprintf(err, errlen, "create_ring: %zu more bytes exceed the session's "
             "%llu bytes of regions (%llu in use)", size,
             (unsigned long long)QL_SESSION_MAX_REGION_BYTES,
             (unsigned long long)ss->region_bytes);
    return QL_EEXHAUSTED;
  }
  int rc = ql__fastpath_create(o->rings, ss, ss->id, entries, out, ring_fd,
                               bell_fd, err, errlen);
  if (rc != 0)
    return rc;
  ss->ring = *out;
  ss->region_bytes += ql__fastpath_bytes(*out);
  o->region_bytes += ql__fastpath_bytes(*out);
  ql__debug("session %llu: ring of %u entries", (unsigned long long)ss->id,
            entries ? entries : QL_RING_DEFAULT_ENTRIES);
  return 0;
}

static void ring_destroy(ql__session *ss) {
  if (ss->ring == NULL)
    return;
  ss->region_bytes -= ql__fastpath_bytes(ss->ring);
  ss->owner->region_bytes -= ql__fastpath_bytes(ss->ring);
  ql__fastpath_end(ss->ring);
  ss->ring = NULL;
}

/*
 * ImportZeIpcRequest: the packet's descriptor (rfd, taken over: closed
 * here on every path but success, where the import owns it) opened with
 * the client's handle on the device named.
 */
static int import_ze(ql__session *ss, const Qlinear__V1__ImportZeIpcRequest *m,
                     int rfd, ql__ipc_mem **out, char *err, size_t errlen) {
  ql__device *d;
  if (rfd < 0) {
    snprintf(err, errlen, "import_ze_ipc: the packet carries no descriptor "
             "(SCM_RIGHTS)");
    return QL_EINVAL;
  }
  if ((d = ql__device_find(ss->owner->s, m->device)) == NULL) {
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
  int rc = ql__ipc_import(&ss->ipc, d, ss->id, m->ipc_handle.data,
                          m->ipc_handle.len, rfd, out, why, sizeof why);
  if (rc != 0)
    snprintf(err, errlen, "import_ze_ipc: %s", why);
  return rc;
}

/*
 * MapWeightRequest: exports the layout of a weight the session holds on
 * one device (registry.h, export_layout) into *fd and out, and keeps a
 * reference to the weight until the session ends, so that its layout
 * outlives an unload or a replace for as long as the client may map it.
 */
static int map_weight(ql__session *ss, const Qlinear__V1__MapWeightRequest *m,
                      Qlinear__V1__MapWeightResponse *out, int *fd, char *err,
                      size_t errlen) {
  ql__server *s = ss->owner->s;
  ql__weight *w = NULL;
  ql__device *d = NULL;
  ql_layout_export ex;
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
  if (s->cfg.mapped_mode == QL_MAPPED_OWNER && ss->uid != geteuid() &&
      ss->uid != 0) {
    snprintf(err, errlen, "map_weight: mapped_mode = owner: uid %lu is "
             "not the daemon's", (unsigned long)ss->uid);
    return QL_EPERM;
  }
  size_t pick = held_by_name(ss, m->name);
  if (pick != SIZE_MAX)
    w = ss->held[pick]->w;
  if (w == NULL) {
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
  size_t at = 0;
  while (at < ss->n_mapped && ss->mapped[at] != w)
    at++;
  if (at == ss->n_mapped && ss->n_mapped == ss->cap_mapped) {
    if (ss->n_mapped >= QL_SESSION_MAX_WEIGHTS) {
      snprintf(err, errlen, "map_weight: the session mapped %d weights "
               "already", QL_SESSION_MAX_WEIGHTS);
      return QL_EEXHAUSTED;
    }
    size_t cap = ss->cap_mapped ? 2 * ss->cap_mapped : 8;
    ql__weight **a = realloc(ss->mapped, cap * sizeof *a);
    if (a == NULL)
      return QL_ENOMEM;
    ss->mapped = a;
    ss->cap_mapped = cap;
  }
  if ((rc = d->b->export_layout(w->lay[d->index].packed, &ex)) != 0) {
    snprintf(err, errlen, "map_weight: '%.100s' on %s: %s%s", w->name,
             d->alias, ql_strerror(rc),
             rc == QL_ENOTSUP ? " (not made exportable: no VMM, or "
                                "QL_CUDA_VMM=0)" : "");
    return rc;
  }
  /* One reference per session and weight: mapping again adds none. */
  if (at == ss->n_mapped) {
    ql__weight_ref(w);
    ss->mapped[ss->n_mapped++] = w;
  }
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
           (unsigned long long)ss->id, (long)ss->pid, w->name, d->alias,
           (unsigned long long)ex.size, ex.readonly ? ", read-only" : "");
  return 0;
}

/*
 * Answers one packet; rfd is the descriptor it carried (SCM_RIGHTS) or -1,
 * taken over. Returns -1 when the session ended (its reply could not be
 * sent), else 0.
 */
static int session_packet(ql__session *ss, const uint8_t *buf, size_t len,
                          int rfd) {
  ql__sessions *o = ss->owner;
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
  ql__fastpath *fp = NULL;
  ql__region *r = NULL;
  ql__ipc_mem *im = NULL;

  rc = ql__session_request_decode(buf, len, len + SESSION_BUDGET_SLACK, &req,
                                  err, sizeof err);
  if (rc != 0) {
    if (rfd >= 0)
      close(rfd);
    /* Not a SessionRequest: answered under id 0, as on the request
     * socket. */
    if (send_error(ss->fd, 0, rc, err) == 0)
      return 0;
    session_end(ss, "a reply could not be sent");
    return -1;
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
  if (m->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_OPEN && !ss->open) {
    rc = QL_ESESSION;
    snprintf(err, sizeof err, "the session is not open yet (send open "
             "first)");
    goto reply;
  }
  switch (m->body_case) {
  case QLINEAR__V1__SESSION_REQUEST__BODY_OPEN:
    if (ss->open) {
      rc = QL_EPROTO;
      snprintf(err, sizeof err, "open: the session is already open");
      break;
    }
    if (m->open->protocol_version != QL_PROTOCOL_VERSION) {
      rc = QL_EVERSION;
      snprintf(err, sizeof err, "open: client speaks protocol %u, daemon %u",
               m->open->protocol_version, QL_PROTOCOL_VERSION);
      break;
    }
    ss->open = 1;
    ss->tok_next = o->by_token[ss->token[0]];
    o->by_token[ss->token[0]] = ss;
    copy_printable(ss->client_name, sizeof ss->client_name,
                   m->open->client_name);
    ql__info("session %llu opened by pid %ld (uid %lu, gid %lu, %s)",
             (unsigned long long)ss->id, (long)ss->pid,
             (unsigned long)ss->uid, (unsigned long)ss->gid,
             ss->client_name[0] ? ss->client_name : "unnamed");
    qlinear__v1__session_open_response__init(&open);
    open.token.data = ss->token;
    open.token.len = sizeof ss->token;
    open.max_regions = QL_SESSION_MAX_REGIONS;
    open.max_region_bytes = QL_SESSION_MAX_REGION_BYTES;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN;
    resp.open = &open;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION:
    rc = region_create(o, ss, m->create_region->size, &r, &fd, err,
                       sizeof err);
    if (rc != 0)
      break;
    qlinear__v1__create_region_response__init(&created);
    created.region_id = r->id;
    created.size = r->size;
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION;
    resp.create_region = &created;
    ql__debug("session %llu: region %llu of %llu bytes",
              (unsigned long long)ss->id, (unsigned long long)r->id,
              (unsigned long long)r->size);
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION:
    rc = region_destroy(o, ss, m->destroy_region->region_id);
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
    rc = import_ze(ss, m->import_ze_ipc, rfd, &im, err, sizeof err);
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
    rc = ql__ipc_release(ss->ipc, m->release_import->import_id);
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
    rc = ring_create(ss, m->create_ring->entries, &fp, &fd, &fd2, err,
                     sizeof err);
    if (rc != 0)
      break;
    qlinear__v1__create_ring_response__init(&ringed);
    ringed.entries = m->create_ring->entries ? m->create_ring->entries
                                             : QL_RING_DEFAULT_ENTRIES;
    ringed.size = ql__fastpath_bytes(fp);
    resp.body_case = QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING;
    resp.create_ring = &ringed;
    break;
  case QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT:
    qlinear__v1__map_weight_response__init(&mapped);
    rc = map_weight(ss, m->map_weight, &mapped, &fd, err, sizeof err);
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
    ql__debug("session %llu: %s: %s", (unsigned long long)ss->id,
              ql_err_name(rc), err);
  }
  int sent = send_response2(ss->fd, &resp, fd, fd2);
  if (fd >= 0)
    close(fd); /* the mapping stays; the client has its own descriptor */
  if (fd2 >= 0)
    close(fd2);
  ql__session_request_free(req);
  if (sent != 0) {
    /* A region the client never received is of no use to it. */
    if (r != NULL)
      region_destroy(o, ss, r->id);
    if (fp != NULL)
      ring_destroy(ss);
    if (im != NULL)
      ql__ipc_release(ss->ipc, im->id);
    session_end(ss, "a reply could not be sent");
    return -1;
  }
  return 0;
}

/* The one descriptor a received packet carried, or -1. Anything else in
 * its control data (more descriptors than fit are closed by the kernel)
 * is closed here, so a packet never leaves a descriptor behind. */
static int take_fd(struct msghdr *mh) {
  int fd = -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c != NULL;
       c = CMSG_NXTHDR(mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len < CMSG_LEN(sizeof(int)))
      continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      if (fd < 0)
        fd = f;
      else
        close(f);
    }
  }
  return fd;
}

static void on_session(uv_poll_t *p, int status, int events) {
  ql__session *ss = p->data;
  if (status < 0) {
    session_end(ss, uv_strerror(status));
    return;
  }
  if (events & UV_READABLE) {
    for (int i = 0; i < BURST; i++) {
      /* One byte more than the largest packet, so that MSG_TRUNC or the
       * length tells an oversized one. Room for one descriptor (an
       * import's): the kernel closes any more (MSG_CTRUNC). */
      uint8_t buf[QL_SESSION_MSG_MAX + 1];
      union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
      } ctl;
      struct iovec iov = {buf, sizeof buf};
      struct msghdr mh;
      int rfd = -1;
      memset(&mh, 0, sizeof mh);
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = ctl.buf;
      mh.msg_controllen = sizeof ctl.buf;
      ssize_t n = recvmsg(ss->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n >= 0)
        rfd = take_fd(&mh);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      if (n < 0) {
        session_end(ss, strerror(errno));
        return;
      }
      if (n == 0) { /* also what an empty packet looks like */
        if (rfd >= 0)
          close(rfd);
        session_end(ss, "the client closed its socket");
        return;
      }
      if ((mh.msg_flags & MSG_TRUNC) || (size_t)n > QL_SESSION_MSG_MAX) {
        if (rfd >= 0)
          close(rfd);
        if (send_error(ss->fd, 0, QL_ETOOBIG, "session packet larger than "
                       "4096 bytes") != 0) {
          session_end(ss, "a reply could not be sent");
          return;
        }
        continue;
      }
      ss->last_ns = ql__now_ns();
      if (session_packet(ss, buf, (size_t)n, rfd) != 0)
        return;
    }
  }
  if (events & UV_DISCONNECT)
    session_end(ss, "the client closed its socket");
}

/* A new connection: record who it is, give it a token and start reading.
 * Over the limit it gets one error packet and is closed. */
static void session_accept(ql__sessions *o, int fd) {
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
      clen != sizeof cred) {
    ql__warn("session: no peer credentials: %s", strerror(errno));
    close(fd);
    return;
  }
  if (o->count >= QL_SESSIONS_MAX) {
    ql__warn("session from pid %ld refused: %d sessions are open",
             (long)cred.pid, QL_SESSIONS_MAX);
    send_error(fd, 0, QL_EEXHAUSTED, "too many sessions are open");
    close(fd);
    return;
  }
  /* One user cannot take every session from the others. */
  unsigned mine = 0;
  for (const ql__session *it = o->list; it != NULL; it = it->next)
    mine += it->uid == cred.uid;
  if (mine >= o->s->cfg.max_sessions_per_uid) {
    ql__warn("session from pid %ld refused: uid %lu has %u sessions open",
             (long)cred.pid, (unsigned long)cred.uid, mine);
    send_error(fd, 0, QL_EEXHAUSTED,
               "too many sessions are open for this user");
    close(fd);
    return;
  }
  ql__session *ss = calloc(1, sizeof *ss);
  if (ss == NULL ||
      getrandom(ss->token, sizeof ss->token, 0) != (ssize_t)sizeof ss->token) {
    ql__err("session from pid %ld refused: %s", (long)cred.pid,
            ss == NULL ? "out of memory" : "getrandom failed");
    send_error(fd, 0, ss == NULL ? QL_ENOMEM : QL_EINTERNAL, NULL);
    free(ss);
    close(fd);
    return;
  }
  ss->fd = fd;
  ss->owner = o;
  ss->pid = cred.pid;
  ss->uid = cred.uid;
  ss->gid = cred.gid;
  ss->poll.data = ss;
  if (uv_poll_init(o->s->loop, &ss->poll, fd) != 0) {
    free(ss);
    close(fd);
    return;
  }
  if (uv_poll_start(&ss->poll, UV_READABLE | UV_DISCONNECT, on_session) !=
      0) {
    uv_close((uv_handle_t *)&ss->poll, on_session_closed);
    return;
  }
  ss->id = ++o->next_session_id;
  ss->last_ns = ql__now_ns();
  ss->next = o->list;
  o->list = ss;
  o->count++;
  ql__debug("session %llu: connection from pid %ld uid %lu gid %lu",
            (unsigned long long)ss->id, (long)cred.pid,
            (unsigned long)cred.uid, (unsigned long)cred.gid);
}

static void on_retry(uv_timer_t *t);

static void on_listen(uv_poll_t *p, int status, int events) {
  ql__sessions *o = p->data;
  (void)events;
  if (status < 0) {
    ql__err("session socket poll failed: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < BURST; i++) {
    int fd = accept4(o->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      session_accept(o, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
        errno == ENOMEM) {
      /* The poll is level-triggered: pause rather than spin. */
      ql__warn("cannot accept sessions: %s", strerror(errno));
      uv_poll_stop(&o->poll);
      uv_timer_start(&o->retry, on_retry, ACCEPT_RETRY_MS, 0);
    }
    return;
  }
}

static void on_retry(uv_timer_t *t) {
  ql__sessions *o = t->data;
  uv_poll_start(&o->poll, UV_READABLE, on_listen);
}

static void on_listener_closed(uv_handle_t *h) {
  ql__sessions *o = h->data;
  if (--o->closing_handles > 0)
    return;
  if (o->fd >= 0)
    close(o->fd);
  free(o);
}

int ql__sessions_open(ql__server *s, const ql__fastpath_ops *ring_ops,
                      void *ring_arg) {
  struct sockaddr_un sa;
  int rc = QL_EIO;
  ql__sessions *o = calloc(1, sizeof *o);
  if (o == NULL) {
    ql__err("cannot open the session socket: out of memory");
    return QL_ENOMEM;
  }
  o->s = s;
  o->fd = -1;
  if (ql__fastpaths_open(s->loop, &s->cfg.ring_spin_us, ring_ops, ring_arg,
                         &o->rings) != 0) {
    ql__err("cannot open the session socket: out of memory");
    free(o);
    return QL_ENOMEM;
  }
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (snprintf(o->path, sizeof o->path, "%s/session.sock",
               s->cfg.socket_dir) >= (int)sizeof sa.sun_path) {
    ql__err("session socket path too long: %s/session.sock",
            s->cfg.socket_dir);
    ql__fastpaths_close(o->rings);
    free(o);
    return QL_EINVAL;
  }
  strcpy(sa.sun_path, o->path);
  o->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (o->fd < 0)
    goto fail;
  /* The caller owns the directory now (the request socket is bound), so
   * a file here is a leftover of a daemon that died. */
  unlink(o->path);
  mode_t um = umask(0117); /* born 0660, as the request socket */
  int bound = bind(o->fd, (struct sockaddr *)&sa, sizeof sa);
  umask(um);
  if (bound != 0 || listen(o->fd, 128) != 0)
    goto fail;
  /* As for the request socket: the directory's group is the access
   * boundary, so the socket is group-writable whatever the umask. */
  if (chmod(o->path, 0660) != 0)
    ql__warn("chmod %s: %s", o->path, strerror(errno));
  if (uv_poll_init(s->loop, &o->poll, o->fd) != 0) {
    rc = QL_EINTERNAL;
    goto fail;
  }
  uv_timer_init(s->loop, &o->retry);
  o->poll.data = o->retry.data = o;
  if (uv_poll_start(&o->poll, UV_READABLE, on_listen) != 0) {
    ql__err("cannot poll %s", o->path);
    unlink(o->path);
    o->closing_handles = 2;
    ql__fastpaths_close(o->rings);
    uv_close((uv_handle_t *)&o->poll, on_listener_closed);
    uv_close((uv_handle_t *)&o->retry, on_listener_closed);
    return QL_EINTERNAL;
  }
  s->sessions = o;
  ql__notice("sessions at %s", o->path);
  return 0;
fail:
  ql__err("cannot listen at %s: %s", o->path, strerror(errno));
  if (o->fd >= 0) {
    close(o->fd);
    unlink(o->path);
  }
  ql__fastpaths_close(o->rings);
  free(o);
  return rc;
}

void ql__sessions_close(ql__server *s) {
  ql__sessions *o = s->sessions;
  if (o == NULL)
    return;
  while (o->list != NULL)
    session_end(o->list, "the daemon is stopping");
  ql__fastpaths_close(o->rings);
  o->rings = NULL;
  /* Holds live only in sessions: none can be left. */
  s->sessions = NULL;
  unlink(o->path);
  o->closing_handles = 2;
  uv_close((uv_handle_t *)&o->poll, on_listener_closed);
  uv_close((uv_handle_t *)&o->retry, on_listener_closed);
}
