/*
 * session.h - sessions and their shared-memory regions (DESIGN §7, §8).
 *
 * A client opens a session by connecting to session.sock (AF_UNIX,
 * SOCK_SEQPACKET) beside the request socket: the daemon records the peer's
 * uid, gid and pid (SO_PEERCRED) and answers SessionOpen with a random
 * 128-bit token that every nanomsg request then carries. Over the same
 * socket the client creates and destroys regions: memfds the daemon makes,
 * seals (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so no client can
 * truncate one under the daemon's mapping) and maps, and passes to the
 * client as SCM_RIGHTS descriptors.
 *
 * The session lives exactly as long as its connection: when the socket
 * closes (exit, crash, kill -9), its regions are destroyed, its uploads in
 * progress dropped and its hold on every weight released at once; a weight
 * no session holds any more leaves the store. Requests still queued keep
 * what they use alive through references, so nothing is freed under them.
 *
 * Everything here runs on the loop thread; workers only read and write the
 * mapping of a region a job holds a reference to.
 */
#ifndef QL_SESSION_H
#define QL_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conf.h"
#include "fastpath.h"
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
                        until it is unregistered, after its last job */
} ql__region;

typedef struct ql__session ql__session;

/*
 * Binds <socket_dir>/session.sock (replacing a file left there: the caller
 * has made sure no other daemon owns the directory) and starts accepting
 * sessions on s->loop; s->sessions is set on success. Sessions' rings
 * (fastpath.h) call up through ring_ops (kept, not copied) with ring_arg,
 * each with the ring's session as its owner. Returns 0 or a QL_E* code
 * (logged); on failure nothing is left open.
 */
int ql__sessions_open(ql__server *s, const ql__fastpath_ops *ring_ops,
                      void *ring_arg);

/*
 * Adds fn to what runs when a session ends (its socket closed, its lease
 * expired, ql__session_end, or the daemon stopping), after its ring has
 * stopped reading and before its regions and holds are released; fn gets
 * arg and the session's id. At most a few (QL_EEXHAUSTED past that), each
 * added once, on the loop thread, before the loop runs.
 */
int ql__sessions_add_end_hook(ql__server *s,
                              void (*fn)(void *arg, uint64_t session_id),
                              void *arg);

/* Adds what the sessions' rings counted themselves to *out (Stats). */
void ql__sessions_ring_counts(const ql__server *s, ql__fastpath_counts *out);

/*
 * Ends every session (releasing what they hold, as if each client had
 * closed its socket), stops listening and removes session.sock. Memory is
 * freed once libuv has closed the handles. Safe on a server without
 * sessions and when called twice.
 */
void ql__sessions_close(ql__server *s);

/* The open session whose token is token[0..len), or NULL (wrong length,
 * unknown, or ended). Compares in constant time. */
ql__session *ql__session_find(ql__server *s, const uint8_t *token,
                              size_t len);

/* A session's number (for logs and for work that outlives a callback),
 * and the session of that number if it is still open, else NULL. */
uint64_t ql__session_id(const ql__session *ss);

/* Ends the session now, as if its client had closed its socket (why is
 * logged). The session's memory stays valid until the loop's next turn. */
void ql__session_end(ql__session *ss, const char *why);

/* Records activity for the lease (a ring's requests). */
void ql__session_touch(ql__session *ss);

/* The peer's uid (SO_PEERCRED at accept). */
uid_t ql__session_uid(const ql__session *ss);
ql__session *ql__session_by_id(ql__server *s, uint64_t id);

/* The session's region of that id, or NULL: another session's region is
 * not found. No reference is taken. */
ql__region *ql__session_region(ql__session *ss, uint64_t id);

/* The session's table of IPC imports (ipc.h), for ql__ipc_get() and
 * ql__ipc_find(); the session frees it when it ends. */
struct ql__ipc_table **ql__session_ipc(ql__session *ss);

/* A job's reference to a region; the last unref unmaps it. Loop thread. */
void ql__region_ref(ql__region *r);
void ql__region_unref(ql__region *r);

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
 * QL_EPERM if it mapped it (MapWeight): that hold ends with the session.
 */
int ql__session_release(ql__server *s, ql__session *ss, const char *name);

/* The lease, a backstop for a peer that keeps its socket open but is gone
 * (stopped, or its descriptor leaked into a process that never exits):
 * ends every session with no request and no session packet for longer
 * than lease_ns. 0: no lease. */
void ql__sessions_expire(ql__server *s, uint64_t lease_ns);

/* Sessions with a ring, for Stats. */
uint64_t ql__sessions_rings(const ql__server *s);

/* Counts for Stats. */
void ql__sessions_counts(const ql__server *s, uint64_t *sessions,
                         uint64_t *regions, uint64_t *region_bytes);

#endif /* QL_SESSION_H */
