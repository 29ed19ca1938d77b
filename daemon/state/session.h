/*
 * session.h - the session registry (DESIGN §7, §8): sessions, their
 * tokens, the weights they hold, their shared-memory regions and their
 * lease.
 *
 * A session is a client's connection to session.sock (sessionsock.h) as
 * the daemon keeps it: the peer's uid, gid and pid (SO_PEERCRED), a random
 * 128-bit token that every nanomsg request carries once SessionOpen has
 * made it valid, and what the session owns. Its regions are memfds the
 * daemon makes, seals (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so no
 * client can truncate one under the daemon's mapping) and maps, and that
 * the client gets as SCM_RIGHTS descriptors. What the session packets mean
 * (SessionOpen, regions, imports, rings, MapWeight) is session_ops.c's;
 * this file only keeps the state.
 *
 * The session lives exactly as long as its connection: when the socket
 * closes (exit, crash, kill -9), its regions are destroyed, its uploads in
 * progress dropped and its hold on every weight released at once; a weight
 * no session holds any more leaves the store. Requests still queued keep
 * what they use alive through references, so nothing is freed under them.
 * What lives above this file and ends with a session (its connection and
 * ring, its waiting requests) hears of it through the end hooks.
 *
 * Everything here runs on the loop thread; workers only read and write the
 * mapping of a region a job holds a reference to.
 */
#ifndef QL_SESSION_H
#define QL_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "conf.h"
#include "qlineard.h"

/* Limits, in one place until they become config options. */
/* QL_SESSIONS_MAX, sessions open at once: conf.h (an option bounds by it) */
#define QL_SESSION_MAX_REGIONS 64     /* regions of one session */
#define QL_SESSION_MAX_REGION_BYTES ((uint64_t)4 << 30) /* their sizes */
#define QL_SESSION_MAX_WEIGHTS 1024   /* weights one session holds */
#define QL_SESSION_MAX_UPLOADS 16     /* its uploads in progress */
#define QL__REGION_BACKENDS 4         /* backends a region is pinned by */

/* A shared-memory region: the daemon's mapping of a sealed memfd. */
typedef struct ql__region {
  uint64_t id;    /* unique for the daemon's lifetime, never 0 */
  uint64_t size;  /* bytes; the memfd is sealed at this size */
  uint8_t *base;  /* MAP_SHARED, read-write */
  int refs;       /* its session's (until destroyed) + one per job */
  struct ql__region *next; /* in its session's list */
  /* Backends it is registered with (host_register), unregistered before
   * it is unmapped. */
  const ql_backend *pinned[QL__REGION_BACKENDS];
  unsigned n_pinned; /* > 0: its size counts in the daemon's pinned total
                        and in its uid's (tenant) until it is
                        unregistered, after its last job */
  struct ql__tenant *tenant;   /* with n_pinned > 0: the uid it counts in */
  struct ql__tenants *tenants; /* and their table, to release it */
} ql__region;

typedef struct ql__session ql__session;

/* --------------------------------------------------------- the registry */

/* Makes the registry, empty; s->sessions is set on success. Returns 0 or
 * QL_ENOMEM (logged). */
int ql__sessions_open(ql__server *s);

/*
 * Adds fn to what runs when a session ends (its connection closed, its
 * lease expired, ql__session_end, or the daemon stopping), before its
 * regions and holds are released; fn gets arg and the session's id. Hooks
 * run in the order they were added (the one that stops a session's ring
 * comes first). At most a few (QL_EEXHAUSTED past that), each added once,
 * on the loop thread, before the loop runs.
 */
int ql__sessions_add_end_hook(ql__server *s,
                              void (*fn)(void *arg, uint64_t session_id),
                              void *arg);

/*
 * Ends every session (releasing what they hold, as if each client had
 * closed its socket) and frees the registry; s->sessions is NULL after.
 * Sessions' memory is freed once libuv has closed their handles. Safe on a
 * server without sessions and when called twice.
 */
void ql__sessions_close(ql__server *s);

/* The lease, a backstop for a peer that keeps its socket open but is gone
 * (stopped, or its descriptor leaked into a process that never exits):
 * ends every session with no request and no session packet for longer
 * than lease_ns. 0: no lease. */
void ql__sessions_expire(ql__server *s, uint64_t lease_ns);

/* Counts for Stats (ring bytes are counted in region_bytes). */
void ql__sessions_counts(const ql__server *s, uint64_t *sessions,
                         uint64_t *regions, uint64_t *region_bytes);

/* ----------------------------------------------------------- a session */

/*
 * A new session for a connection from peer, with a fresh random token
 * that is not valid until ql__session_begin. On success *out is the
 * registry's: it goes when the session ends. QL_ENOMEM, or QL_EINTERNAL
 * when no random token could be had (logged).
 */
int ql__session_create(ql__server *s, const struct ucred *peer,
                       ql__session **out);

/* SessionOpen accepted: the token becomes valid (ql__session_find), the
 * client's name (made printable) is kept for the log. Returns the token,
 * QL_SESSION_TOKEN_BYTES bytes, valid while the session is open. */
const uint8_t *ql__session_begin(ql__session *ss, const char *client_name);

/* Whether ql__session_begin was called. */
int ql__session_is_open(const ql__session *ss);

/* The open session whose token is token[0..len), or NULL (wrong length,
 * unknown, or ended). Compares in constant time; renews the lease. */
ql__session *ql__session_find(ql__server *s, const uint8_t *token,
                              size_t len);

/* A session's number (for logs and for work that outlives a callback),
 * and the session of that number if it is still open, else NULL. */
uint64_t ql__session_id(const ql__session *ss);
ql__session *ql__session_by_id(ql__server *s, uint64_t id);

/* Ends the session now, as if its client had closed its socket (why is
 * logged): it leaves every table, the end hooks run, what it owns is
 * released. The session's memory stays valid until the loop's next turn.
 * Safe on a session that ended already. */
void ql__session_end(ql__session *ss, const char *why);

/* Records activity for the lease (a session packet, a ring's requests). */
void ql__session_touch(ql__session *ss);

/* The peer's uid and pid (SO_PEERCRED at accept). */
uid_t ql__session_uid(const ql__session *ss);

/* Its uid's tenant (tenants.h), or NULL when it is not counted. */
struct ql__tenant *ql__session_tenant(const ql__session *ss);
pid_t ql__session_pid(const ql__session *ss);

/* ------------------------------------------------------------- regions */

/*
 * Makes a region of size bytes for the session: a sealed memfd and the
 * daemon's mapping of it, page-locked for the devices within
 * max_pinned_bytes. On success *out is the session's and *fd_out is the
 * descriptor to pass to the client (the caller closes it). QL_EEXHAUSTED
 * past the session's bounds, QL_ENOMEM / QL_EEXHAUSTED / QL_EIO from the
 * system, with err set.
 */
int ql__session_region_create(ql__session *ss, uint64_t size,
                              ql__region **out, int *fd_out, char *err,
                              size_t errlen);

/* Drops the session's region id (jobs still using it keep it mapped).
 * QL_ENOTFOUND if the session has no such region. */
int ql__session_region_destroy(ql__session *ss, uint64_t id);

/* The session's region of that id, or NULL: another session's region is
 * not found. No reference is taken. */
ql__region *ql__session_region(ql__session *ss, uint64_t id);

/*
 * 1 when every page of reg's bytes [off, off + len) (which fit it) is in
 * memory, else 0. A region's pages are its client's to populate (libqlinear
 * does when it makes one): a page the daemon touched first would be
 * allocated to, and charged against, the daemon's memory, so requests on
 * pages nobody wrote are refused instead (docs/security.md).
 */
int ql__region_populated(const ql__region *reg, uint64_t off, uint64_t len);

/* A job's reference to a region; the last unref unmaps it. Loop thread. */
void ql__region_ref(ql__region *r);
void ql__region_unref(ql__region *r);

/* Bytes the session has mapped by the daemon, regions and ring together,
 * bounded by QL_SESSION_MAX_REGION_BYTES; ql__session_charge adds those of
 * something other than a region (a ring), ql__session_refund takes them
 * back. The caller checks the bound. */
uint64_t ql__session_region_bytes(const ql__session *ss);
void ql__session_charge(ql__session *ss, uint64_t bytes);
void ql__session_refund(ql__session *ss, uint64_t bytes);

/* The session's table of IPC imports (ipc.h), for ql__ipc_get(),
 * ql__ipc_import() and ql__ipc_find(); the session frees it when it ends. */
struct ql__ipc_table **ql__session_ipc(ql__session *ss);

/* ------------------------------------------------------------- weights */

/*
 * Makes the session a holder of w (a weight in the store). Holding twice
 * is holding once. QL_EEXHAUSTED past QL_SESSION_MAX_WEIGHTS, QL_ENOMEM;
 * nothing changes on failure.
 */
int ql__session_hold(ql__server *s, ql__session *ss, ql__weight *w);

/*
 * Drops the session's hold on the weight called name; a weight no session
 * holds any more is removed from the store (jobs using it keep it alive
 * until they finish). QL_ENOTFOUND if the session holds no such weight,
 * QL_EPERM if it mapped it (ql__session_map_add): that hold ends with the
 * session.
 */
int ql__session_release(ql__server *s, ql__session *ss, const char *name);

/* The weight called name that the session holds, or NULL. A name may be
 * held twice if its first weight left the store (only an admin unload can
 * do that): the stored one is taken. No reference is taken. */
ql__weight *ql__session_held(const ql__session *ss, const char *name);

/*
 * MapWeight: the session keeps one reference to each weight it mapped
 * until it ends, so that a layout outlives an unload or a replace for as
 * long as the client may map it. ql__session_map_room makes room to record
 * w (0 when w is recorded already; QL_EEXHAUSTED past
 * QL_SESSION_MAX_WEIGHTS weights, QL_ENOMEM), so that the export can be
 * refused before anything is exported; ql__session_map_add then records
 * it, once, taking the reference.
 */
int ql__session_map_room(ql__session *ss, const ql__weight *w);
void ql__session_map_add(ql__session *ss, ql__weight *w);

#endif /* QL_SESSION_H */
