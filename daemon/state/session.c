/* session.c - see session.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include <uv.h>

#include "state/devices.h"
#include "state/ipc.h"
#include "log.h"
#include "ql_errno.h"
#include "wire/protocol.h"
#include "state/session.h"

#define TOKEN_BUCKETS 256 /* indexed by the token's first byte */
#define HOLD_BUCKETS 256

/* One held weight, shared by all its holders (counted in w->holders): one
 * weight reference, which keeps the pointer valid while any session holds
 * it whatever happens to the store. */
typedef struct hold {
  ql__weight *w;
  struct hold *next; /* bucket chain */
} hold;

struct ql__session {
  uint64_t id;
  struct ql__sessions *owner;
  pid_t pid; /* SO_PEERCRED at accept */
  uid_t uid;
  gid_t gid;
  ql__tenant *tenant;   /* its uid's, counted from SessionOpen on (NULL:
                           none could be made: not counted) */
  char client_name[64]; /* printable, for logs */
  uint8_t token[QL_SESSION_TOKEN_BYTES];
  int open;  /* SessionOpen answered: the token is valid */
  int ended; /* removed from every table; its memory goes next turn */
  ql__region *regions;
  size_t n_regions;
  uint64_t region_bytes; /* its regions' and its ring's */
  hold **held; /* weights this session holds */
  size_t n_held, cap_held;
  ql__ipc_table *ipc;    /* IPC imports (ipc.h), NULL until the first */
  ql__weight **mapped;   /* weights it mapped (one reference each): their
                            layouts stay until the session ends */
  size_t n_mapped, cap_mapped;
  uint64_t last_ns;      /* its last request or session packet (lease) */
  /* Never started: closed when the session ends, so that its close
   * callback frees the session on the loop's next turn, after whatever
   * called ql__session_end has stopped using it. */
  uv_idle_t gone;
  ql__session *next;     /* every session */
  ql__session *tok_next; /* open sessions by token */
};

/* What may run when a session ends (ql__sessions_add_end_hook). */
#define MAX_END_HOOKS 4

struct ql__sessions {
  ql__server *s;
  ql__session *list;
  size_t count;
  ql__session *by_token[TOKEN_BUCKETS];
  hold *holds[HOLD_BUCKETS];
  struct {
    void (*fn)(void *arg, uint64_t session_id);
    void *arg;
  } end_hooks[MAX_END_HOOKS]; /* ql__sessions_add_end_hook */
  size_t n_end_hooks;
  uint64_t next_session_id, next_region_id;
  uint64_t regions, region_bytes; /* over every session */
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
  if (r->n_pinned > 0) {
    pinned_total -= r->size;
    if (r->tenant != NULL) {
      r->tenant->pinned_bytes -= r->size;
      ql__tenant_release(r->tenants, r->tenant);
    }
  }
  munmap(r->base, (size_t)r->size);
  free(r);
}

/*
 * Makes a sealed memfd of size bytes and the daemon's mapping of it. The
 * seals are what make the mapping safe: nobody (the client included) can
 * shrink the file under it, which would turn the daemon's next access into
 * SIGBUS, nor grow it, nor change the seals. On success *fd_out is the
 * descriptor to pass to the client (the caller closes it).
 */
int ql__session_region_create(ql__session *ss, uint64_t size,
                              ql__region **out, int *fd_out, char *err,
                              size_t errlen) {
  ql__sessions *o = ss->owner;
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
    rc = ql__errno_from_sys(errno);
    snprintf(err, errlen, "create_region: memfd_create: %s", strerror(errno));
    return rc;
  }
  if (ftruncate(fd, (off_t)size) != 0) {
    rc = ql__errno_from_sys(errno);
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
    rc = ql__errno_from_sys(errno);
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
  /* Pinned for the devices' DMA, within max_pinned_bytes and the uid's
   * share of it (uid_share, always: a region is held for as long as its
   * client likes); where refused, tensors in it are staged, with the same
   * bytes. */
  uint64_t cap = o->s->cfg.max_pinned_bytes;
  ql__tenant *tn = ss->tenant;
  uint64_t share = ql__tenant_share(cap, o->s->cfg.uid_share);
  int in_share = tn == NULL || (tn->pinned_bytes <= share &&
                                size <= share - tn->pinned_bytes);
  if (size <= cap && pinned_total <= cap - size && in_share) {
    r->n_pinned = ql__devices_host_register(o->s, base, (size_t)size,
                                            r->pinned, QL__REGION_BACKENDS);
    if (r->n_pinned > 0) {
      pinned_total += size;
      if (tn != NULL) {
        tn->pinned_bytes += size;
        r->tenant = tn;
        r->tenants = &o->s->tenants;
      }
    }
  } else {
    if (!in_share && size <= cap && ql__devices_host_register_wanted(o->s))
      ql__tenant_refused(&o->s->tenants, ss->uid,
                         "page-locked region memory");
    ql__debug("session %llu: region %llu of %llu bytes not page-locked: "
             "locked regions would pass max_pinned_bytes (%llu) or uid "
             "%u's share of it; its tensors are staged",
             (unsigned long long)ss->id, (unsigned long long)r->id,
             (unsigned long long)size, (unsigned long long)cap,
             (unsigned)ss->uid);
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
int ql__session_region_destroy(ql__session *ss, uint64_t id) {
  ql__sessions *o = ss->owner;
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

int ql__region_populated(const ql__region *reg, uint64_t off, uint64_t len) {
  static long page;
  if (page == 0)
    page = sysconf(_SC_PAGESIZE);
  if (len == 0)
    return 1;
  uint64_t pg = (uint64_t)page;
  uint64_t first = off / pg, last = (off + len - 1) / pg;
  unsigned char vec[1024];
  for (uint64_t p = first; p <= last;) {
    uint64_t n = last - p + 1;
    if (n > sizeof vec)
      n = sizeof vec;
    if (mincore(reg->base + p * pg, (size_t)(n * pg), vec) != 0)
      return 0;
    for (uint64_t i = 0; i < n; i++)
      if (!(vec[i] & 1))
        return 0;
    p += n;
  }
  return 1;
}

ql__region *ql__session_region(ql__session *ss, uint64_t id) {
  for (ql__region *r = ss->regions; r; r = r->next)
    if (r->id == id)
      return r;
  return NULL;
}

uint64_t ql__session_region_bytes(const ql__session *ss) {
  return ss->region_bytes;
}

void ql__session_charge(ql__session *ss, uint64_t bytes) {
  ss->region_bytes += bytes;
  ss->owner->region_bytes += bytes;
}

void ql__session_refund(ql__session *ss, uint64_t bytes) {
  ss->region_bytes -= bytes;
  ss->owner->region_bytes -= bytes;
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

ql__weight *ql__session_held(const ql__session *ss, const char *name) {
  size_t pick = held_by_name(ss, name);
  return pick == SIZE_MAX ? NULL : ss->held[pick]->w;
}

int ql__session_map_room(ql__session *ss, const ql__weight *w) {
  size_t at = 0;
  while (at < ss->n_mapped && ss->mapped[at] != w)
    at++;
  if (at < ss->n_mapped || ss->n_mapped < ss->cap_mapped)
    return 0;
  if (ss->n_mapped >= QL_SESSION_MAX_WEIGHTS)
    return QL_EEXHAUSTED;
  size_t cap = ss->cap_mapped ? 2 * ss->cap_mapped : 8;
  ql__weight **a = realloc(ss->mapped, cap * sizeof *a);
  if (a == NULL)
    return QL_ENOMEM;
  ss->mapped = a;
  ss->cap_mapped = cap;
  return 0;
}

void ql__session_map_add(ql__session *ss, ql__weight *w) {
  /* One reference per session and weight: mapping again adds none. */
  for (size_t i = 0; i < ss->n_mapped; i++)
    if (ss->mapped[i] == w)
      return;
  if (ss->n_mapped == ss->cap_mapped)
    return; /* cannot happen after ql__session_map_room */
  ql__weight_ref(w);
  ss->mapped[ss->n_mapped++] = w;
}

/* --------------------------------------------------------------- sessions */

uid_t ql__session_uid(const ql__session *ss) { return ss->uid; }

ql__tenant *ql__session_tenant(const ql__session *ss) { return ss->tenant; }

pid_t ql__session_pid(const ql__session *ss) { return ss->pid; }

uint64_t ql__session_id(const ql__session *ss) { return ss->id; }

int ql__session_is_open(const ql__session *ss) { return ss->open; }

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

void ql__sessions_expire(ql__server *s, uint64_t lease_ns) {
  ql__sessions *o = s->sessions;
  uint64_t now = ql__now_ns();
  if (o == NULL || lease_ns == 0)
    return;
  for (ql__session *ss = o->list, *next; ss != NULL; ss = next) {
    next = ss->next; /* ql__session_end unlinks ss */
    if (now - ss->last_ns > lease_ns) {
      ql__notice("session %llu (pid %ld): no request for %llu ms; its lease "
                 "expired", (unsigned long long)ss->id, (long)ss->pid,
                 (unsigned long long)((now - ss->last_ns) / 1000000u));
      ql__session_end(ss, "its lease expired");
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

void ql__sessions_counts(const ql__server *s, uint64_t *sessions,
                         uint64_t *regions, uint64_t *region_bytes) {
  const ql__sessions *o = s->sessions;
  *sessions = o ? o->count : 0;
  *regions = o ? o->regions : 0;
  *region_bytes = o ? o->region_bytes : 0;
}

void ql__session_touch(ql__session *ss) { ss->last_ns = ql__now_ns(); }

static void on_session_gone(uv_handle_t *h) {
  ql__session *ss = h->data;
  free(ss->held);
  free(ss->mapped);
  free(ss);
}

int ql__session_create(ql__server *s, const struct ucred *peer,
                       ql__session **out) {
  ql__sessions *o = s->sessions;
  ql__session *ss = calloc(1, sizeof *ss);
  if (ss == NULL ||
      getrandom(ss->token, sizeof ss->token, 0) != (ssize_t)sizeof ss->token) {
    int rc = ss == NULL ? QL_ENOMEM : QL_EINTERNAL;
    ql__err("session from pid %ld refused: %s", (long)peer->pid,
            ss == NULL ? "out of memory" : "getrandom failed");
    free(ss);
    return rc;
  }
  if (uv_idle_init(s->loop, &ss->gone) != 0) {
    free(ss);
    return QL_EINTERNAL;
  }
  ss->gone.data = ss;
  ss->owner = o;
  ss->pid = peer->pid;
  ss->uid = peer->uid;
  ss->gid = peer->gid;
  ss->id = ++o->next_session_id;
  ss->last_ns = ql__now_ns();
  ss->next = o->list;
  o->list = ss;
  o->count++;
  ql__debug("session %llu: connection from pid %ld uid %lu gid %lu",
            (unsigned long long)ss->id, (long)peer->pid,
            (unsigned long)peer->uid, (unsigned long)peer->gid);
  *out = ss;
  return 0;
}

static void copy_printable(char *dst, size_t len, const char *src) {
  size_t i = 0;
  for (; src != NULL && src[i] != '\0' && i + 1 < len; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[i] = ch < 0x20 || ch >= 0x7f ? '?' : (char)ch;
  }
  dst[i] = '\0';
}

const uint8_t *ql__session_begin(ql__session *ss, const char *client_name) {
  ql__sessions *o = ss->owner;
  ss->open = 1;
  if ((ss->tenant = ql__tenant_get(&o->s->tenants, ss->uid)) != NULL)
    ql__tenant_session_open(&o->s->tenants, ss->tenant);
  ss->tok_next = o->by_token[ss->token[0]];
  o->by_token[ss->token[0]] = ss;
  copy_printable(ss->client_name, sizeof ss->client_name, client_name);
  ql__info("session %llu opened by pid %ld (uid %lu, gid %lu, %s)",
           (unsigned long long)ss->id, (long)ss->pid, (unsigned long)ss->uid,
           (unsigned long)ss->gid,
           ss->client_name[0] ? ss->client_name : "unnamed");
  return ss->token;
}

/*
 * The end of a session, whatever its cause: it leaves every table at once,
 * so its token stops working; the end hooks stop its ring, close its
 * connection and drop its waiting requests; its regions, holds and uploads
 * (those not being committed: a commit finds the session gone when it
 * completes) are released now. Only the memory of the session itself waits
 * for libuv.
 */
void ql__session_end(ql__session *ss, const char *why) {
  if (ss->ended)
    return;
  ql__sessions *o = ss->owner;
  ql__server *s = o->s;
  ss->ended = 1;
  for (ql__session **pp = &o->list; *pp; pp = &(*pp)->next) {
    if (*pp == ss) {
      *pp = ss->next;
      break;
    }
  }
  if (ss->open && ss->tenant != NULL) {
    ql__tenant_session_end(&s->tenants, ss->tenant);
    ss->tenant = NULL;
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
  /* The session plane's hook first (its ring reads nothing more, replies
   * still to come are dropped; its connection closes), then the
   * dispatcher's (its waiting requests go: their replies go nowhere now). */
  for (size_t i = 0; i < o->n_end_hooks; i++)
    o->end_hooks[i].fn(o->end_hooks[i].arg, ss->id);
  size_t nreg = ss->n_regions, nheld = ss->n_held;
  /* Imports that requests still use close when the last one ends. */
  size_t nipc = ql__ipc_table_free(ss->ipc);
  ss->ipc = NULL;
  while (ss->regions != NULL)
    ql__session_region_destroy(ss, ss->regions->id);
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
  uv_close((uv_handle_t *)&ss->gone, on_session_gone);
}

int ql__sessions_open(ql__server *s) {
  ql__sessions *o = calloc(1, sizeof *o);
  if (o == NULL) {
    ql__err("cannot open the session socket: out of memory");
    return QL_ENOMEM;
  }
  o->s = s;
  s->sessions = o;
  return 0;
}

void ql__sessions_close(ql__server *s) {
  ql__sessions *o = s->sessions;
  if (o == NULL)
    return;
  while (o->list != NULL)
    ql__session_end(o->list, "the daemon is stopping");
  /* Holds live only in sessions: none can be left. */
  s->sessions = NULL;
  free(o);
}
