/*
 * internal.h - libqlinear's private header: struct ql_client, the limits
 * every part of the library shares, and the functions one file of
 * client/lib/ offers the others (ql__ names). Not installed.
 *
 * libqlinear: the client side of the request protocol (DESIGN §7).
 *
 * Every call is one or more round trips of a Request/Response pair over a
 * nanomsg REQ socket. The daemon's raw REP socket drops a reply to a
 * connection that is still busy with an earlier one, so each request in
 * flight gets its own REQ socket: a client keeps a small pool of idle
 * connected sockets, a call takes one (or opens one) and gives it back when
 * the exchange completed cleanly. After a timeout or a transport error the
 * socket is closed instead, because a late reply could still arrive on it.
 *
 * Messages are checked rather than trusted: the reply must decode, carry the
 * request's request_id and the matching body, and every size or shape it
 * states is checked before anything is copied to the caller.
 *
 * The session is a second connection, a SOCK_SEQPACKET socket to
 * session.sock beside the request socket: one exchange at a time (a mutex),
 * one packet each way, descriptors of new regions as SCM_RIGHTS. Its token
 * goes into every request. A fork() handler closes the child's copy of
 * every session socket, so a session ends with the process that opened it
 * even when children outlive it.
 */
#ifndef QL_CLIENT_INTERNAL_H
#define QL_CLIENT_INTERNAL_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include <openssl/evp.h>
#include "ql_errno.h" /* ql__errno_from_sys: errno at the boundary */
#include "ql_ring.h"
#include "ql_source.h"
#include "qlinear.pb-c.h"
#include "qlinear/qlinear.h"
#include "ring.h"

typedef Qlinear__V1__Request Request;
typedef Qlinear__V1__Response Response;
typedef Qlinear__V1__Response__BodyCase BodyCase;

/* Idle sockets kept per client; more concurrent calls still work, their
 * sockets are just closed afterwards. */
#define POOL_MAX 64
/* Receive limit until Hello announced the real cap. */
#define PRE_HELLO_MAX (1u << 20)
/* Room kept free for the envelope around a payload (request id, field tags,
 * shape, impl name, status) when sizing chunks and checking Linear sizes;
 * the daemon keeps the same room. */
#define ENVELOPE_ROOM QL_ENVELOPE_BYTES
/* nanomsg counts its own protocol header (the 4-byte REQ request id, more
 * through devices) in the size it checks against NN_RCVMAXSIZE: requests
 * stay this far below the cap, and our receive limit is this far above. */
#define TRANSPORT_ROOM 64u
/* Upper bound of one LoadChunk payload even if the daemon allows more: it
 * bounds the copy nanomsg makes and keeps the progress callback moving. */
#define CHUNK_CEILING (8u << 20)
/* REQ resends a request that got no reply after this long; we never want
 * that within a call (the call times out first), only as a backstop. */
#define RESEND_IVL_MS 3600000
/* LoadCommit waits at least this long: quantization runs on commit. */
#define COMMIT_TIMEOUT_MS 600000
/* LoadAbort after a failure is best effort and must not double the wait. */
#define ABORT_TIMEOUT_MS 2000
#define ERRBUF_SIZE 1024
/* Descriptors accepted in one session reply (one is expected; more are
 * closed). */
#define MAX_FDS 4

/* Staging regions: where ql_linear() and ql_linear_multi() put tensors
 * that are not in a region, so that the ring (which carries no tensor
 * data) can serve them. One per call in flight, up to STAGE_SLOTS. */
#define STAGE_SLOTS 8
#define STAGE_MIN_BYTES ((size_t)256 << 10)
#define STAGE_MAX_BYTES ((size_t)64 << 20)
/* How long a caller of the ring spins before it sleeps (QLINEAR_RING_SPIN_US
 * overrides). */
#define RING_SPIN_US 50

struct ql_client;
typedef struct stage {
  struct ql_client *c;
  ql_region *reg; /* NULL: the slot is empty */
  bool busy;      /* a call uses it (or a request abandoned on the ring) */
} stage;

/* A region and its place in its client's list. */
typedef struct region_node {
  ql_region pub; /* first: the caller's ql_region * is this node */
  struct region_node *prev, *next;
} region_node;

struct ql_client {
  char *address;
  char *client_name;
  int timeout_ms;       /* -1 waits forever */
  pthread_mutex_t lock; /* guards everything below */
  int idle[POOL_MAX];   /* connected REQ sockets with no request pending */
  size_t n_idle;
  uint64_t cap;       /* max_message_bytes from Hello; 0 before it */
  uint64_t max_chunk; /* max_chunk_bytes from Hello; 0 if none set */
  ql_hello_info hello;
  region_node *regions; /* live regions (lock) */
  /* The session. sess_lock serialises exchanges on sess_fd; the token is
   * written by ql_connect() (and the fork handler) only. */
  pthread_mutex_t sess_lock;
  int sess_fd;           /* -1: none (never opened, or a forked child) */
  uint64_t sess_next_id; /* SessionRequest.request_id (sess_lock) */
  uint8_t token[QL_SESSION_TOKEN_BYTES];
  bool has_token;
  ql__cring *ring; /* the session's fast path, or NULL: messages only */
  stage stages[STAGE_SLOTS];             /* (lock) */
  struct ql_client *all_prev, *all_next; /* every client (all_lock) */
};

/* ---- conn.c: errors, request ids, the REQ socket pool, addresses ---- */

/* ql_errmsg()'s text: per thread, cleared at the start of each call. */
extern _Thread_local char ql__errbuf[ERRBUF_SIZE];
void ql__err_clear(void);
/* Formats the message and returns code, so a failure is one statement. */
__attribute__((format(printf, 2, 3))) int ql__err_set(int code, const char *fmt,
                                                      ...);
/* Daemon text with control characters replaced (see conn.c). */
void ql__copy_sanitized(char *dst, size_t len, const char *src);
/* A daemon Status as our error (QL_EPROTO for a code not ours). */
int ql__status_error(const Qlinear__V1__Status *st);
uint64_t ql__request_id_new(void);
int64_t ql__now_ms(void);
/* The message cap and chunk size Hello announced. */
void ql__client_limits(ql_client *c, uint64_t *cap, uint64_t *max_chunk);
/* 0 when the reply answers req with a body of case want, else an error. */
int ql__reply_check(const Request *req, const Response *resp, BodyCase want);
/* One round trip over a pooled REQ socket: on success *out is the
 * caller's (free with qlinear__v1__response__free_unpacked). */
int ql__call(ql_client *c, Request *req, BodyCase want, int timeout_ms,
             Response **out);
/* Whether an ipc:// address has a socket file (QL_ECONNECT if not). */
int ql__probe_ipc(const char *address);

/* ---- stage.c: staging regions, the ring or a message ---- */

/* A free staging slot of at least need bytes, or NULL (then the request
 * travels as a message); ql__stage_put() gives it back. */
stage *ql__stage_take(ql_client *c, size_t need);
void ql__stage_put(stage *st);
/* ql__call(), over the session's ring when the request fits it. */
int ql__exchange(ql_client *c, Request *req, BodyCase want, int timeout_ms,
                 stage *st, Response **out);

/* ---- session.c: Hello, the session socket, connect and close ---- */

void ql__copy_str(char *dst, size_t len, const char *src);
/* Copies a name the caller gave into a fixed array; QL_ENAME if too long. */
int ql__copy_name(char *dst, const char *src, const char *what);
/* One exchange on the session socket; *fd_out gets a descriptor the reply
 * carried (the caller's), or -1. */
int ql__session_call(ql_client *c, Qlinear__V1__SessionRequest *req,
                     Qlinear__V1__SessionResponse__BodyCase want,
                     Qlinear__V1__SessionResponse **out, int *fd_out);
/* The same, sending send_fd (still the caller's) with the request. */
int ql__session_call_fd(ql_client *c, Qlinear__V1__SessionRequest *req,
                        Qlinear__V1__SessionResponse__BodyCase want,
                        Qlinear__V1__SessionResponse **out, int *fd_out,
                        int send_fd);

/* ---- load.c: uploads, holds, list ---- */

/* QL_ENAME unless name is 1 .. QL_NAME_MAX - 1 bytes. */
int ql__check_name(const char *name);
/* *out = a * b; false on overflow. */
bool ql__mul_ok(uint64_t a, uint64_t b, uint64_t *out);
/* Fills *out from a WeightInfo of the daemon; QL_EPROTO when it is not
 * whole (error text set). */
int ql__weight_info_from(const Qlinear__V1__WeightInfo *w,
                         ql_weight_info *out);

#endif /* QL_CLIENT_INTERNAL_H */
