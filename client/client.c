/*
 * client.c - libqlinear: the client side of the request protocol (DESIGN §7).
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
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "fastpath.h"
#include "ql_ring.h"
#include "qlinear.pb-c.h"
#include "qlinear/qlinear.h"

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
/* Session socket: token size and largest packet (as the daemon's). */
#define TOKEN_BYTES 16
#define SESSION_MSG_MAX 4096
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
  int timeout_ms; /* -1 waits forever */
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
  uint8_t token[TOKEN_BYTES];
  bool has_token;
  ql__cring *ring;   /* the session's fast path, or NULL: messages only */
  stage stages[STAGE_SLOTS]; /* (lock) */
  struct ql_client *all_prev, *all_next; /* every client (all_lock) */
};

/* Every client of the process, for the fork handler. */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static ql_client *all_clients;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------ errors */

static _Thread_local char errbuf[ERRBUF_SIZE];

static void err_clear(void) { errbuf[0] = '\0'; }

__attribute__((format(printf, 2, 3))) static int err_set(int code,
                                                         const char *fmt,
                                                         ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  return code;
}

/* Copies text that came from the daemon, replacing control characters so
 * that printing ql_errmsg() cannot drive the caller's terminal. */
static void copy_sanitized(char *dst, size_t len, const char *src) {
  size_t i = 0;
  if (len == 0)
    return;
  for (; src != NULL && src[i] != '\0' && i + 1 < len; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[i] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
  }
  dst[i] = '\0';
}

/* Maps the errno of a failed nanomsg (or socket) call into our space. */
static int map_errno(int e) {
  switch (e) {
  case ETIMEDOUT:
  case EAGAIN:
    return QL_ETIMEDOUT;
  case ECONNREFUSED:
  case ECONNRESET:
  case ECONNABORTED:
  case ENOENT:
  case ENOTCONN:
  case EPIPE:
  case EHOSTUNREACH:
  case ENETUNREACH:
  case EADDRNOTAVAIL:
    return QL_ECONNECT;
  case EACCES:
  case EPERM:
    return QL_EPERM;
  case EINVAL:
  case ENAMETOOLONG:
  case EPROTONOSUPPORT:
  case ENODEV:
    return QL_EINVAL;
  case ENOMEM:
  case ENOBUFS:
    return QL_ENOMEM;
  case EMFILE:
  case ENFILE:
    return QL_EEXHAUSTED;
  case EMSGSIZE:
    return QL_ETOOBIG;
  default:
    return QL_EIO;
  }
}

static int nn_fail(const char *what) {
  int e = nn_errno();
  return err_set(map_errno(e), "%s: %s", what, nn_strerror(e));
}

/* A Status from the daemon: its code is returned as is if it is one of
 * ours, anything else is a protocol violation. */
static int status_error(const Qlinear__V1__Status *st) {
  char msg[ERRBUF_SIZE];
  copy_sanitized(msg, sizeof msg, st->message);
  if (st->code < 0 && st->code > QL_ERRNO_MIN_)
    return err_set(st->code, "%s", msg);
  return err_set(QL_EPROTO, "daemon answered with unknown error code %d: %s",
                 (int)st->code, msg);
}

/* ------------------------------------------------------------ request ids */

static pthread_once_t id_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t next_id;

/* Seeded from random bytes so that ids of two processes (or of one process
 * before and after a restart) rarely meet. */
static void id_seed(void) {
  uint64_t seed;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
           ((uint64_t)getpid() * 0x9E3779B97F4A7C15u);
  }
  atomic_store(&next_id, seed);
}

/* 0 is proto3's "not set", so it is skipped. */
static uint64_t request_id_new(void) {
  uint64_t id;
  pthread_once(&id_once, id_seed);
  do
    id = atomic_fetch_add(&next_id, 1);
  while (id == 0);
  return id;
}

/* ------------------------------------------------------------ sockets */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void client_limits(ql_client *c, uint64_t *cap, uint64_t *max_chunk) {
  pthread_mutex_lock(&c->lock);
  *cap = c->cap;
  if (max_chunk != NULL)
    *max_chunk = c->max_chunk;
  pthread_mutex_unlock(&c->lock);
}

static int sock_open(ql_client *c, int *out) {
  int s, rv;
  /* Resend only after the call has given up, and never more often than
   * hourly: a resent request may be one the daemon is still running. */
  int64_t ivl = c->timeout_ms < 0 ? INT_MAX : (int64_t)c->timeout_ms + 1000;
  if (ivl < RESEND_IVL_MS)
    ivl = RESEND_IVL_MS;
  if (ivl > INT_MAX)
    ivl = INT_MAX;
  int ivl_opt = (int)ivl;

  if ((s = nn_socket(AF_SP, NN_REQ)) < 0)
    return nn_fail("nn_socket");
  if (nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &ivl_opt, sizeof ivl_opt) <
      0) {
    rv = nn_fail("nn_setsockopt(NN_REQ_RESEND_IVL)");
    goto fail;
  }
  if (nn_connect(s, c->address) < 0) {
    int e = nn_errno();
    rv = err_set(map_errno(e), "cannot connect to %s: %s", c->address,
                 nn_strerror(e));
    goto fail;
  }
  *out = s;
  return 0;

fail:
  nn_close(s);
  return rv;
}

/* Takes an idle socket or opens a new one. */
static int pool_take(ql_client *c, int *out) {
  pthread_mutex_lock(&c->lock);
  if (c->n_idle > 0) {
    *out = c->idle[--c->n_idle];
    pthread_mutex_unlock(&c->lock);
    return 0;
  }
  pthread_mutex_unlock(&c->lock);
  return sock_open(c, out);
}

/* Gives back a socket whose last exchange completed. */
static void pool_put(ql_client *c, int s) {
  pthread_mutex_lock(&c->lock);
  if (c->n_idle < POOL_MAX) {
    c->idle[c->n_idle++] = s;
    s = -1;
  }
  pthread_mutex_unlock(&c->lock);
  if (s >= 0)
    nn_close(s);
}

static int set_int_opt(int s, int level, int opt, int64_t v,
                       const char *name) {
  int iv = v > INT_MAX ? INT_MAX : (int)v;
  if (nn_setsockopt(s, level, opt, &iv, sizeof iv) < 0)
    return nn_fail(name);
  return 0;
}

/*
 * One round trip: gives req a fresh request_id, packs it, sends it on a
 * pooled socket and waits up to timeout_ms (-1: forever) for the reply,
 * which must carry the same request_id, a zero status and the body want.
 * On success *out owns the decoded Response (free it with
 * qlinear__v1__response__free_unpacked); on failure *out is NULL and
 * ql_errmsg() says why. req stays owned by the caller.
 */
/*
 * The checks every reply passes, whatever carried it: it answers req (a
 * request the daemon could not decode is answered under id 0, since it
 * could not read ours), its status is zero and its body is want.
 */
static int reply_check(const Request *req, const Response *resp,
                       BodyCase want) {
  if (resp->request_id != req->request_id &&
      !(resp->request_id == 0 && resp->status != NULL &&
        resp->status->code != 0))
    return err_set(QL_EPROTO, "reply carries request id %llu, expected %llu",
                   (unsigned long long)resp->request_id,
                   (unsigned long long)req->request_id);
  if (resp->status != NULL && resp->status->code != 0)
    return status_error(resp->status);
  if (resp->body_case != want || resp->hello == NULL)
    /* Every body of the oneof is a message pointer, so checking one member
     * of the union checks them all. */
    return err_set(QL_EPROTO, "reply has body %d, expected %d",
                   (int)resp->body_case, (int)want);
  return 0;
}

static int call(ql_client *c, Request *req, BodyCase want, int timeout_ms,
                Response **out) {
  void *msg = NULL, *buf = NULL;
  Response *resp = NULL;
  int s = -1, rv, n;
  bool keep = false; /* the socket's exchange completed: reusable */
  uint64_t cap;
  int64_t deadline = 0, rcvmax;

  *out = NULL;
  req->request_id = request_id_new();
  if (c->has_token) {
    req->session_token.data = c->token;
    req->session_token.len = TOKEN_BYTES;
  }
  client_limits(c, &cap, NULL);

  /* The daemon drops oversized messages unread and nanomsg would resend
   * them forever: refuse them here. */
  size_t size = qlinear__v1__request__get_packed_size(req);
  if (cap != 0 && (cap <= TRANSPORT_ROOM || size > cap - TRANSPORT_ROOM))
    return err_set(QL_ETOOBIG,
                   "request of %zu bytes does not fit the daemon's cap of "
                   "%llu bytes (less %u bytes of transport header)",
                   size, (unsigned long long)cap, TRANSPORT_ROOM);
  /* Packing straight into a nanomsg buffer saves a copy in nn_send. */
  if ((msg = nn_allocmsg(size > 0 ? size : 1, 0)) == NULL) {
    rv = nn_fail("nn_allocmsg");
    goto fail;
  }
  qlinear__v1__request__pack(req, msg);

  if ((rv = pool_take(c, &s)) != 0)
    goto fail;
  rcvmax = (int64_t)(cap != 0 ? cap : PRE_HELLO_MAX) + TRANSPORT_ROOM;
  if ((rv = set_int_opt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, rcvmax,
                        "nn_setsockopt(NN_RCVMAXSIZE)")) != 0 ||
      (rv = set_int_opt(s, NN_SOL_SOCKET, NN_SNDTIMEO, timeout_ms,
                        "nn_setsockopt(NN_SNDTIMEO)")) != 0 ||
      (rv = set_int_opt(s, NN_SOL_SOCKET, NN_RCVTIMEO, timeout_ms,
                        "nn_setsockopt(NN_RCVTIMEO)")) != 0)
    goto fail;
  if (timeout_ms >= 0)
    deadline = now_ms() + timeout_ms;

  /* On success nn_send owns msg; on failure it is still ours. */
  while (nn_send(s, &msg, NN_MSG, 0) < 0) {
    if (nn_errno() != EINTR) {
      rv = nn_fail("sending the request");
      goto fail;
    }
  }
  msg = NULL;

  /* A signal interrupts nn_recv; wait again for what is left of the
   * timeout. */
  while ((n = nn_recv(s, &buf, NN_MSG, 0)) < 0) {
    int e = nn_errno();
    if (e == ETIMEDOUT || e == EAGAIN) {
      rv = err_set(QL_ETIMEDOUT, "no reply within %d ms", timeout_ms);
      goto fail;
    }
    if (e != EINTR) {
      rv = nn_fail("waiting for the reply");
      goto fail;
    }
    if (timeout_ms >= 0) {
      int64_t left = deadline - now_ms();
      if (left <= 0) {
        rv = err_set(QL_ETIMEDOUT, "no reply within %d ms", timeout_ms);
        goto fail;
      }
      if ((rv = set_int_opt(s, NN_SOL_SOCKET, NN_RCVTIMEO, left,
                            "nn_setsockopt(NN_RCVTIMEO)")) != 0)
        goto fail;
    }
  }

  resp = qlinear__v1__response__unpack(NULL, (size_t)n, buf);
  nn_freemsg(buf);
  buf = NULL;
  if (resp == NULL) {
    rv = err_set(QL_EPROTO, "cannot decode the daemon's reply (%d bytes)", n);
    goto fail;
  }
  /* REQ already matched the reply to this request: the socket is clean. */
  keep = resp->request_id == req->request_id ||
         (resp->request_id == 0 && resp->status != NULL &&
          resp->status->code != 0);
  if ((rv = reply_check(req, resp, want)) != 0)
    goto fail;
  pool_put(c, s);
  *out = resp;
  return 0;

fail:
  if (msg != NULL)
    nn_freemsg(msg);
  if (buf != NULL)
    nn_freemsg(buf);
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  if (s >= 0) {
    if (keep)
      pool_put(c, s);
    else
      nn_close(s);
  }
  return rv;
}

/* ------------------------------------------------------------ fast path */

/*
 * A staging region of at least need bytes, marked busy, or NULL (no slot
 * free, or the daemon refused a region): the caller then uses the message
 * path, so this never changes ql_errmsg().
 */
static stage *stage_take(ql_client *c, size_t need) {
  stage *best = NULL, *empty = NULL, *victim = NULL;
  ql_region *old = NULL, *reg = NULL;
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < STAGE_SLOTS; i++) {
    stage *st = &c->stages[i];
    if (st->reg == NULL) {
      /* (busy with no region: another call is making one there) */
      if (empty == NULL && !st->busy)
        empty = st;
    } else if (!st->busy && st->reg->size >= need &&
               (best == NULL || st->reg->size < best->reg->size)) {
      best = st;
    } else if (!st->busy && victim == NULL) {
      victim = st;
    }
  }
  if (best != NULL) {
    best->busy = true;
    pthread_mutex_unlock(&c->lock);
    return best;
  }
  /* A new one, in an empty slot or instead of a free one too small. */
  stage *st = empty != NULL ? empty : victim;
  if (st == NULL) {
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  old = st->reg;
  st->reg = NULL;
  st->busy = true; /* reserved while the region is made */
  pthread_mutex_unlock(&c->lock);
  char saved[ERRBUF_SIZE];
  memcpy(saved, errbuf, sizeof saved);
  if (old != NULL)
    ql_region_destroy(c, old);
  size_t size = STAGE_MIN_BYTES;
  while (size < need)
    size *= 2;
  int rv = ql_region_create(c, size, &reg);
  memcpy(errbuf, saved, sizeof saved);
  pthread_mutex_lock(&c->lock);
  st->c = c;
  st->reg = rv == 0 ? reg : NULL;
  st->busy = rv == 0;
  pthread_mutex_unlock(&c->lock);
  return rv == 0 ? st : NULL;
}

static void stage_put(stage *st) {
  if (st == NULL)
    return;
  pthread_mutex_lock(&st->c->lock);
  st->busy = false;
  pthread_mutex_unlock(&st->c->lock);
}

/* The ring's late callback: the reply of an abandoned request came, so
 * nothing writes to its stage any more. */
static void stage_late(void *arg) { stage_put(arg); }

/* A stage a request may still write (it timed out on the message path,
 * where no late reply is ever seen): never used again. */
static void stage_poison(stage *st) {
  pthread_mutex_lock(&st->c->lock);
  ql_region *reg = st->reg;
  st->reg = NULL;
  st->busy = false;
  pthread_mutex_unlock(&st->c->lock);
  char saved[ERRBUF_SIZE];
  memcpy(saved, errbuf, sizeof saved);
  /* The daemon keeps its mapping while the request runs. */
  ql_region_destroy(st->c, reg);
  memcpy(errbuf, saved, sizeof saved);
}

/* Whether req can travel on the ring: a linear request whose results go
 * to regions or device memory (a completion carries no tensor data). */
static bool ring_carries(const Request *req) {
  if (req->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR)
    return req->linear->y_out != NULL || req->linear->y_out_cuda != NULL ||
           req->linear->y_out_ze != NULL;
  if (req->body_case == QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI)
    return req->linear_multi->n_y_out != 0 ||
           req->linear_multi->n_y_out_cuda != 0 ||
           req->linear_multi->n_y_out_ze != 0;
  return false;
}

/*
 * One request and its checked reply, on the session's ring when it can
 * carry it, else over a request socket (call()). st is the staging region
 * the request writes, or NULL. On success *out is the caller's, and so is
 * st. On failure st is disposed of here: back in the pool, or kept by a
 * request still in flight until its reply comes, or never used again.
 */
static int exchange(ql_client *c, Request *req, BodyCase want, int timeout_ms,
                    stage *st, Response **out) {
  int rv;
  *out = NULL;
  if (c->ring != NULL && ring_carries(req)) {
    char why[256];
    Response *resp = NULL;
    req->request_id = request_id_new();
    /* The ring is the session's: no token travels. */
    req->session_token.data = NULL;
    req->session_token.len = 0;
    rv = ql__cring_call(c->ring, req, timeout_ms, c->sess_fd,
                        st != NULL ? stage_late : NULL, st, &resp, why,
                        sizeof why);
    if (rv != QL__CRING_FALLBACK) {
      if (rv != 0) {
        /* A timed-out request keeps st until its reply: stage_late. */
        if (rv != QL_ETIMEDOUT)
          stage_put(st);
        return err_set(rv, "%s", why);
      }
      if ((rv = reply_check(req, resp, want)) != 0) {
        qlinear__v1__response__free_unpacked(resp, NULL);
        stage_put(st);
        return rv;
      }
      *out = resp;
      return 0;
    }
  }
  rv = call(c, req, want, timeout_ms, out);
  if (rv == QL_ETIMEDOUT && st != NULL)
    stage_poison(st);
  else if (rv != 0)
    stage_put(st);
  return rv;
}

/* ------------------------------------------------------------ addresses */

/* The system service's request socket (deploy/qlineard.service). */
#define SYSTEM_ADDRESS "ipc:///run/qlinear/qlineard.sock"

static const char *system_address(void) {
  const char *env = getenv("QLINEAR_SYSTEM_ADDRESS");
  return env != NULL && env[0] != '\0' ? env : SYSTEM_ADDRESS;
}

/* Whether an ipc:// address names an existing socket file. */
static int ipc_socket_exists(const char *address) {
  struct stat st;
  return strncmp(address, "ipc://", 6) == 0 &&
         stat(address + 6, &st) == 0 && S_ISSOCK(st.st_mode);
}

/* ql_default_address(), and whether it fell back to the system service's
 * socket (*system). */
static int default_address(char *buf, size_t len, int *system) {
  const char *env, *rt;
  int n;

  *system = 0;
  if (buf == NULL || len == 0)
    return err_set(QL_EINVAL, "no buffer for the address");
  env = getenv("QLINEAR_ADDRESS");
  rt = getenv("XDG_RUNTIME_DIR");
  if (env != NULL && env[0] != '\0')
    n = snprintf(buf, len, "%s", env);
  else if (rt != NULL && rt[0] == '/')
    n = snprintf(buf, len, "ipc://%s/qlinear/qlineard.sock", rt);
  else
    n = snprintf(buf, len, "ipc:///tmp/qlinear-%lu/qlineard.sock",
                 (unsigned long)getuid());
  if (n < 0 || (size_t)n >= len) {
    buf[0] = '\0';
    return err_set(QL_EINVAL, "the address does not fit %zu bytes", len);
  }
  /* No per-user daemon, but the system service runs: that one. */
  if ((env == NULL || env[0] == '\0') && !ipc_socket_exists(buf) &&
      ipc_socket_exists(system_address())) {
    n = snprintf(buf, len, "%s", system_address());
    if (n < 0 || (size_t)n >= len) {
      buf[0] = '\0';
      return err_set(QL_EINVAL, "the address does not fit %zu bytes", len);
    }
    *system = 1;
  }
  return 0;
}

QL_EXPORT int ql_default_address(char *buf, size_t len) {
  int system;
  err_clear();
  return default_address(buf, len, &system);
}

QL_EXPORT int ql_default_admin_address(char *buf, size_t len) {
  const char *env = getenv("QLINEAR_ADMIN_ADDRESS");
  char base[QL_ADDRESS_MAX + 64];
  int n;

  err_clear();
  if (buf == NULL || len == 0)
    return err_set(QL_EINVAL, "no buffer for the address");
  if (env != NULL && env[0] != '\0') {
    n = snprintf(buf, len, "%s", env);
  } else {
    char *slash;
    int system;
    if (default_address(base, sizeof base, &system) != 0 ||
        (slash = strrchr(base, '/')) == NULL) {
      buf[0] = '\0';
      return err_set(QL_EINVAL, "no default address to put the admin "
                                "socket beside");
    }
    *slash = '\0';
    /* The system service keeps it apart: <socket dir>-admin/admin.sock. */
    n = snprintf(buf, len, system ? "%s-admin/admin.sock"
                                  : "%s/admin/admin.sock", base);
  }
  if (n < 0 || (size_t)n >= len) {
    buf[0] = '\0';
    return err_set(QL_EINVAL, "the address does not fit %zu bytes", len);
  }
  return 0;
}

/*
 * For an ipc:// address, tells "no daemon" apart from "slow daemon" before
 * anything waits: nanomsg's nn_connect succeeds on a missing path and
 * retries in the background, so without this a missing daemon would only
 * show as a timeout. A plain connect() also catches the socket file a dead
 * daemon left behind; nanomsg on the daemon side just sees a peer that
 * went away during the handshake.
 */
static int probe_ipc(const char *address) {
  struct sockaddr_un sa;
  struct stat st;
  const char *path;
  int fd, rv = 0;

  if (strncmp(address, "ipc://", 6) != 0)
    return 0;
  path = address + 6;
  if (strlen(path) >= sizeof sa.sun_path)
    return err_set(QL_EINVAL, "socket path %s is longer than %zu bytes", path,
                   sizeof sa.sun_path - 1);
  if (stat(path, &st) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return err_set(QL_ECONNECT, "no daemon socket at %s (is qlineard "
                                  "running?)", path);
    return err_set(e == EACCES ? QL_EPERM : QL_ECONNECT, "%s: %s", path,
                   strerror(e));
  }
  if (!S_ISSOCK(st.st_mode))
    return err_set(QL_ECONNECT, "%s is not a socket", path);

  /* Non-blocking, so that a full listen backlog does not block us: that
   * daemon exists and the request will wait for it. */
  if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) <
      0)
    return 0; /* cannot probe; let the request find out */
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    if (e == ECONNREFUSED)
      rv = err_set(QL_ECONNECT, "nothing listens on %s (a stopped daemon's "
                                "socket?)", path);
    else if (e == EACCES || e == EPERM)
      rv = err_set(QL_EPERM, "%s: %s", path, strerror(e));
    /* EAGAIN/EINPROGRESS and the rest: someone is there. */
  }
  close(fd);
  return rv;
}

/* ------------------------------------------------------------ hello */

static void copy_str(char *dst, size_t len, const char *src) {
  copy_sanitized(dst, len, src != NULL ? src : "");
}

/* Copies a weight name, which the protocol limits to 255 bytes. */
static int copy_name(char *dst, const char *src, const char *what) {
  size_t len = src != NULL ? strlen(src) : 0;
  if (len == 0 || len >= QL_NAME_MAX)
    return err_set(QL_EPROTO, "daemon sent a %s name of %zu bytes", what, len);
  copy_sanitized(dst, QL_NAME_MAX, src);
  return 0;
}

static int do_hello(ql_client *c, ql_hello_info *out) {
  Qlinear__V1__HelloRequest hr = QLINEAR__V1__HELLO_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  ql_hello_info info;
  int rv;

  hr.protocol_version = QL_PROTOCOL_VERSION;
  hr.client_name = c->client_name;
  req.body_case = QLINEAR__V1__REQUEST__BODY_HELLO;
  req.hello = &hr;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_HELLO, c->timeout_ms,
                 &resp)) != 0)
    goto fail;

  const Qlinear__V1__HelloResponse *h = resp->hello;
  if (h->protocol_version != QL_PROTOCOL_VERSION) {
    rv = err_set(QL_EVERSION, "daemon speaks protocol %u, this library %u",
                 h->protocol_version, QL_PROTOCOL_VERSION);
    goto fail;
  }
  if (h->instance_id.len != QL_INSTANCE_ID_BYTES) {
    rv = err_set(QL_EPROTO, "instance id of %zu bytes, expected %d",
                 h->instance_id.len, QL_INSTANCE_ID_BYTES);
    goto fail;
  }
  /* Without a cap the client cannot keep messages small enough. */
  if (h->max_message_bytes == 0) {
    rv = err_set(QL_EPROTO, "daemon announced no message cap");
    goto fail;
  }

  memset(&info, 0, sizeof info);
  info.protocol_version = h->protocol_version;
  copy_str(info.daemon_version, sizeof info.daemon_version,
           h->daemon_version);
  memcpy(info.instance_id, h->instance_id.data, QL_INSTANCE_ID_BYTES);
  info.max_message_bytes = h->max_message_bytes;
  info.max_chunk_bytes = h->max_chunk_bytes;
  info.quantizer_version = h->quantizer_version ? h->quantizer_version : 1;
  info.n_devices_total = h->n_devices;
  for (size_t i = 0; i < h->n_devices && info.n_devices < QL_MAX_DEVICES;
       i++) {
    const Qlinear__V1__Device *d = h->devices[i];
    ql_device_info *o = &info.devices[info.n_devices++];
    if (d == NULL)
      continue;
    copy_str(o->name, sizeof o->name, d->name);
    copy_str(o->kind, sizeof o->kind, d->kind);
    copy_str(o->alias, sizeof o->alias, d->alias);
  }

  pthread_mutex_lock(&c->lock);
  c->cap = info.max_message_bytes;
  c->max_chunk = info.max_chunk_bytes;
  c->hello = info;
  pthread_mutex_unlock(&c->lock);
  if (out != NULL)
    *out = info;
  rv = 0;

fail:
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

/* ------------------------------------------------------------ session */

/*
 * In a child made by fork() the parent's sessions must not live on: the
 * child's copy of a session socket would keep the session open after the
 * parent died, and with it every weight and region it holds. The child
 * closes its copies and forgets the tokens; the parent is unaffected.
 */
static void atfork_prepare(void) { pthread_mutex_lock(&all_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&all_lock); }
/* Set in a child forked after this process made a client: nanomsg's
 * worker threads are not in the child, so a new connection would hang. */
static bool forked_child;

static void atfork_child(void) {
  forked_child = true;
  for (ql_client *c = all_clients; c != NULL; c = c->all_next) {
    if (c->sess_fd >= 0)
      close(c->sess_fd);
    c->sess_fd = -1;
    c->has_token = false;
    memset(c->token, 0, sizeof c->token);
    ql__cring_disable(c->ring);
  }
  pthread_mutex_unlock(&all_lock);
}
static void atfork_register(void) {
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void clients_add(ql_client *c) {
  pthread_once(&atfork_once, atfork_register);
  pthread_mutex_lock(&all_lock);
  c->all_prev = NULL;
  c->all_next = all_clients;
  if (all_clients != NULL)
    all_clients->all_prev = c;
  all_clients = c;
  pthread_mutex_unlock(&all_lock);
}

static void clients_remove(ql_client *c) {
  pthread_mutex_lock(&all_lock);
  if (c->all_prev != NULL)
    c->all_prev->all_next = c->all_next;
  else if (all_clients == c)
    all_clients = c->all_next;
  if (c->all_next != NULL)
    c->all_next->all_prev = c->all_prev;
  c->all_prev = c->all_next = NULL;
  pthread_mutex_unlock(&all_lock);
}

/* The session socket beside the request socket: ipc://DIR/x -> DIR/
 * session.sock. */
static int session_path(const char *address, struct sockaddr_un *sa) {
  const char *path, *slash;
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (strncmp(address, "ipc://", 6) != 0)
    return err_set(QL_EINVAL, "sessions need an ipc:// address, not %s",
                   address);
  path = address + 6;
  slash = strrchr(path, '/');
  size_t dirlen = slash != NULL ? (size_t)(slash - path) + 1 : 0;
  if (dirlen + sizeof "session.sock" > sizeof sa->sun_path)
    return err_set(QL_EINVAL, "the session socket path beside %s is longer "
                              "than %zu bytes",
                   path, sizeof sa->sun_path - 1);
  memcpy(sa->sun_path, path, dirlen);
  memcpy(sa->sun_path + dirlen, "session.sock", sizeof "session.sock");
  return 0;
}

/* Waits for events on fd until the deadline (timeout_ms < 0: forever). */
static int wait_fd(int fd, short events, int timeout_ms, int64_t deadline) {
  for (;;) {
    int left = -1;
    if (timeout_ms >= 0) {
      int64_t l = deadline - now_ms();
      if (l <= 0)
        return err_set(QL_ETIMEDOUT, "no session reply within %d ms",
                       timeout_ms);
      left = l > INT_MAX ? INT_MAX : (int)l;
    }
    struct pollfd p = {fd, events, 0};
    int n = poll(&p, 1, left);
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return err_set(map_errno(errno), "poll: %s", strerror(errno));
  }
}

/* Closes every descriptor of the SCM_RIGHTS messages in mh except the
 * first nkeep, which are stored in keep[] (-1 where none came). */
static int take_fds(struct msghdr *mh, int *keep, int nkeep) {
  int n = 0, kept = 0;
  for (int i = 0; i < nkeep; i++)
    keep[i] = -1;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL;
       cm = CMSG_NXTHDR(mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
      continue;
    size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      if (kept < nkeep)
        keep[kept++] = fd;
      else
        close(fd);
      n++;
    }
  }
  return n;
}

static void close_fds(int fd[2]) {
  for (int i = 0; i < 2; i++)
    if (fd[i] >= 0)
      close(fd[i]);
  fd[0] = fd[1] = -1;
}

/*
 * Receives the next packet from the session socket. A reply to an earlier
 * exchange that timed out is skipped (its descriptor closed). Returns 0
 * with *out the decoded response and *fd_out its descriptor (or -1).
 */
static int session_recv(ql_client *c, uint64_t id, int timeout_ms,
                        int64_t deadline, Qlinear__V1__SessionResponse **out,
                        int fd_out[2]) {
  uint8_t buf[SESSION_MSG_MAX];
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
  } ctl;
  bool reset = false;
  for (;;) {
    int rv = wait_fd(c->sess_fd, POLLIN, timeout_ms, deadline);
    if (rv != 0)
      return rv;
    struct iovec iov = {buf, sizeof buf};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof ctl.buf;
    ssize_t n = recvmsg(c->sess_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    /* A daemon that closes with our request unread in its queue (it
     * refused the connection) makes the kernel report ECONNRESET once,
     * ahead of the reply it queued before closing: read on. */
    if (n < 0 && errno == ECONNRESET && !reset) {
      reset = true;
      continue;
    }
    if (n < 0)
      return err_set(map_errno(errno), "session socket: %s", strerror(errno));
    int fd[2];
    take_fds(&mh, fd, 2);
    if (n == 0) {
      close_fds(fd);
      return err_set(QL_ECONNECT, "the daemon closed the session");
    }
    Qlinear__V1__SessionResponse *r = NULL;
    if (!(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
      r = qlinear__v1__session_response__unpack(NULL, (size_t)n, buf);
    if (r == NULL) {
      close_fds(fd);
      return err_set(QL_EPROTO, "cannot decode the daemon's session reply "
                                "(%zd bytes)", n);
    }
    /* Id 0 with an error: the daemon could not read the request (or
     * refused the connection before reading anything). */
    bool mine = r->request_id == id ||
                (r->request_id == 0 && r->status != NULL &&
                 r->status->code != 0);
    if (mine) {
      *out = r;
      fd_out[0] = fd[0];
      fd_out[1] = fd[1];
      return 0;
    }
    close_fds(fd);
    qlinear__v1__session_response__free_unpacked(r, NULL);
  }
}

/*
 * One exchange on the session socket: req gets the next id, its reply must
 * carry it, a zero status and the body want. On success *out is the
 * caller's (free with qlinear__v1__session_response__free_unpacked) and, if
 * fd_out is not NULL, *fd_out holds the descriptor that came with it (or
 * -1); a descriptor nobody asked for is closed.
 */
static int session_exchange(ql_client *c, Qlinear__V1__SessionRequest *req,
                            Qlinear__V1__SessionResponse__BodyCase want,
                            Qlinear__V1__SessionResponse **out,
                            int fd_out[2], int send_fd);

/* session_call(), with send_fd (when >= 0) passed along with the request
 * as SCM_RIGHTS; the caller keeps its descriptor. */
static int session_call_fd(ql_client *c, Qlinear__V1__SessionRequest *req,
                           Qlinear__V1__SessionResponse__BodyCase want,
                           Qlinear__V1__SessionResponse **out, int *fd_out,
                           int send_fd) {
  int fds[2];
  int rv = session_exchange(c, req, want, out, fds, send_fd);
  if (fd_out != NULL) {
    *fd_out = fds[0];
    fds[0] = -1;
  }
  close_fds(fds);
  return rv;
}

static int session_call(ql_client *c, Qlinear__V1__SessionRequest *req,
                        Qlinear__V1__SessionResponse__BodyCase want,
                        Qlinear__V1__SessionResponse **out, int *fd_out) {
  return session_call_fd(c, req, want, out, fd_out, -1);
}

/* The same, keeping the first two descriptors of the reply in fds[]. */
static int session_call2(ql_client *c, Qlinear__V1__SessionRequest *req,
                         Qlinear__V1__SessionResponse__BodyCase want,
                         Qlinear__V1__SessionResponse **out, int fds[2]) {
  return session_exchange(c, req, want, out, fds, -1);
}

static int session_exchange(ql_client *c, Qlinear__V1__SessionRequest *req,
                            Qlinear__V1__SessionResponse__BodyCase want,
                            Qlinear__V1__SessionResponse **out,
                            int fd_out[2], int send_fd) {
  uint8_t buf[SESSION_MSG_MAX];
  Qlinear__V1__SessionResponse *r = NULL;
  int fd[2] = {-1, -1}, rv;
  int64_t deadline = c->timeout_ms >= 0 ? now_ms() + c->timeout_ms : 0;

  *out = NULL;
  fd_out[0] = fd_out[1] = -1;
  pthread_mutex_lock(&c->sess_lock);
  if (c->sess_fd < 0) {
    rv = err_set(QL_ESESSION, "this client has no session (it was opened "
                              "by the parent of this process?)");
    goto done;
  }
  req->request_id = ++c->sess_next_id;
  size_t len = qlinear__v1__session_request__get_packed_size(req);
  if (len > sizeof buf) {
    rv = err_set(QL_EINVAL, "session request of %zu bytes", len);
    goto done;
  }
  qlinear__v1__session_request__pack(req, buf);
  for (;;) {
    struct iovec iov = {buf, len};
    struct msghdr mh;
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (send_fd >= 0) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = sizeof ctl.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &send_fd, sizeof send_fd);
    }
    ssize_t n = sendmsg(c->sess_fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)len)
      break;
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      if ((rv = wait_fd(c->sess_fd, POLLOUT, c->timeout_ms, deadline)) != 0)
        goto done;
      continue;
    }
    /* The daemon may have said why before it closed the socket (too many
     * sessions): read that, else report the failed send. */
    int e = n < 0 ? errno : EIO;
    if (session_recv(c, req->request_id, 0, now_ms() + 100, &r, fd) == 0 &&
        r->status != NULL && r->status->code != 0) {
      rv = status_error(r->status);
      goto done;
    }
    rv = err_set(map_errno(e), "session socket: %s", strerror(e));
    goto done;
  }
  if ((rv = session_recv(c, req->request_id, c->timeout_ms, deadline, &r,
                         fd)) != 0)
    goto done;
  if (r->status != NULL && r->status->code != 0) {
    rv = status_error(r->status);
    goto done;
  }
  if (r->body_case != want || r->open == NULL) {
    /* Every body of the oneof is a message pointer (as in call()). */
    rv = err_set(QL_EPROTO, "session reply has body %d, expected %d",
                 (int)r->body_case, (int)want);
    goto done;
  }
  *out = r;
  r = NULL;
  fd_out[0] = fd[0];
  fd_out[1] = fd[1];
  fd[0] = fd[1] = -1;
  rv = 0;
done:
  pthread_mutex_unlock(&c->sess_lock);
  close_fds(fd);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}

/* Connects session.sock and performs SessionOpen: the token. */
static int session_open(ql_client *c) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__SessionOpenRequest op = QLINEAR__V1__SESSION_OPEN_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  struct sockaddr_un sa;
  int rv, fd;

  if ((rv = session_path(c->address, &sa)) != 0)
    return rv;
  if ((fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0)
    return err_set(map_errno(errno), "socket: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    close(fd);
    if (e == ENOENT || e == ECONNREFUSED)
      return err_set(QL_ECONNECT, "no session socket at %s (is qlineard "
                                  "running?)", sa.sun_path);
    return err_set(map_errno(e), "%s: %s", sa.sun_path, strerror(e));
  }
  c->sess_fd = fd;
  op.protocol_version = QL_PROTOCOL_VERSION;
  op.client_name = c->client_name;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  req.open = &op;
  if ((rv = session_call(c, &req, QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN,
                         &r, NULL)) != 0)
    return rv;
  if (r->open->token.len != TOKEN_BYTES) {
    qlinear__v1__session_response__free_unpacked(r, NULL);
    return err_set(QL_EPROTO, "session token of %zu bytes, expected %d",
                   r->open->token.len, TOKEN_BYTES);
  }
  memcpy(c->token, r->open->token.data, TOKEN_BYTES);
  c->has_token = true;
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return 0;
}

/* Asks the daemon for the session's ring and maps it; on failure the
 * client goes on without one (an older daemon, or no memory for it). */
static void ring_open(ql_client *c) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRingRequest cr = QLINEAR__V1__CREATE_RING_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  int fds[2] = {-1, -1};
  char saved[ERRBUF_SIZE];
  memcpy(saved, errbuf, sizeof saved);
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING;
  req.create_ring = &cr;
  if (session_call2(c, &req, QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_RING,
                    &r, fds) == 0 &&
      fds[0] >= 0 && fds[1] >= 0) {
    uint64_t spin = RING_SPIN_US;
    const char *e = getenv("QLINEAR_RING_SPIN_US");
    if (e != NULL && *e != '\0')
      spin = strtoull(e, NULL, 10);
    if (spin > 1000000)
      spin = 1000000;
    ql__cring_open(fds[0], fds[1], r->create_ring->size, spin * 1000u,
                   &c->ring);
    fds[0] = fds[1] = -1; /* taken over */
  }
  if (fds[0] >= 0)
    close(fds[0]);
  if (fds[1] >= 0)
    close(fds[1]);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  memcpy(errbuf, saved, sizeof saved);
}

/* ------------------------------------------------------------ lifecycle */

QL_EXPORT int ql_connect(const char *address, const ql_connect_opts *opts,
                         ql_client **out) {
  char defaddr[QL_ADDRESS_MAX];
  ql_client *c = NULL;
  int rv;

  err_clear();
  if (out == NULL)
    return err_set(QL_EINVAL, "out is NULL");
  *out = NULL;
  if (forked_child)
    return err_set(QL_ENOTSUP, "this process was forked from one that had "
                               "used libqlinear, and nanomsg does not "
                               "survive fork(): exec a new program to "
                               "connect");
  if (address == NULL) {
    if (ql_default_address(defaddr, sizeof defaddr) != 0)
      return err_set(QL_EINVAL, "the default address does not fit in %zu "
                                "bytes", sizeof defaddr);
    address = defaddr;
  }
  if (address[0] == '\0')
    return err_set(QL_EINVAL, "empty address");
  /* The daemon serves local sockets only: another transport would wait
   * for a connection that never comes. */
  if (strncmp(address, "ipc://", 6) != 0)
    return err_set(QL_EINVAL, "address %.200s: qlineard serves ipc:// "
                              "addresses only (it has no network "
                              "listener)", address);

  if ((c = calloc(1, sizeof *c)) == NULL)
    return err_set(QL_ENOMEM, "allocating the client");
  c->sess_fd = -1;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return err_set(QL_ENOMEM, "initialising a mutex");
  }
  if (pthread_mutex_init(&c->sess_lock, NULL) != 0) {
    pthread_mutex_destroy(&c->lock);
    free(c);
    return err_set(QL_ENOMEM, "initialising a mutex");
  }
  clients_add(c);
  c->timeout_ms = QL_DEFAULT_TIMEOUT_MS;
  if (opts != NULL && opts->timeout_ms != 0)
    c->timeout_ms = opts->timeout_ms < 0 ? -1 : opts->timeout_ms;
  c->address = strdup(address);
  c->client_name = strdup(opts != NULL && opts->client_name != NULL
                              ? opts->client_name
                              : "libqlinear");
  if (c->address == NULL || c->client_name == NULL) {
    rv = err_set(QL_ENOMEM, "allocating the client");
    goto fail;
  }

  if ((rv = probe_ipc(c->address)) != 0)
    goto fail;
  if ((rv = do_hello(c, NULL)) != 0) {
    /* The daemon may have gone away while we waited: say so if it did. */
    if (rv == QL_ETIMEDOUT) {
      char saved[ERRBUF_SIZE];
      memcpy(saved, errbuf, sizeof saved);
      int prv = probe_ipc(c->address);
      if (prv != 0)
        rv = prv;
      else
        memcpy(errbuf, saved, sizeof saved);
    }
    goto fail;
  }
  /* Hello first: the daemon answers it only once its loop runs, and by
   * then session.sock is there too. The admin socket has no sessions. */
  if ((opts == NULL || !opts->admin) && (rv = session_open(c)) != 0)
    goto fail;
  /* The fast path, unless refused here or in the environment. */
  const char *env_ring = getenv("QLINEAR_RING");
  if ((opts == NULL || (!opts->admin && !opts->no_ring)) &&
      !(env_ring != NULL && strcmp(env_ring, "0") == 0))
    ring_open(c);
  *out = c;
  return 0;

fail:
  ql_close(c);
  return rv;
}

QL_EXPORT void ql_close(ql_client *c) {
  if (c == NULL)
    return;
  clients_remove(c);
  ql__cring_free(c->ring);
  /* Closing the session socket ends the session in the daemon. */
  if (c->sess_fd >= 0)
    close(c->sess_fd);
  while (c->regions != NULL) {
    region_node *r = c->regions;
    c->regions = r->next;
    munmap(r->pub.data, r->pub.size);
    free(r);
  }
  for (size_t i = 0; i < c->n_idle; i++)
    nn_close(c->idle[i]);
  pthread_mutex_destroy(&c->sess_lock);
  pthread_mutex_destroy(&c->lock);
  free(c->address);
  free(c->client_name);
  free(c);
}

QL_EXPORT int ql_hello(ql_client *c, ql_hello_info *out) {
  err_clear();
  if (c == NULL || out == NULL)
    return err_set(QL_EINVAL, "client or output is NULL");
  return do_hello(c, out);
}

QL_EXPORT void ql_free(void *p) { free(p); }

QL_EXPORT void ql_stats_free(ql_stats_info *s) { free(s); }

QL_EXPORT const char *ql_errmsg(void) { return errbuf; }

/* ------------------------------------------------------------ weights */

/* Checks a name the caller gives before it travels; the daemon checks the
 * character rules (QL_ENAME), here only what makes the message absurd. */
static int check_name(const char *name) {
  if (name == NULL)
    return err_set(QL_EINVAL, "weight name is NULL");
  size_t len = strlen(name);
  if (len == 0 || len >= QL_NAME_MAX)
    return err_set(QL_ENAME, "weight name of %zu bytes (1 to %d allowed)", len,
                   QL_NAME_MAX - 1);
  return 0;
}

/* Fills *out from a WeightInfo of the daemon. */
static int weight_info_from(const Qlinear__V1__WeightInfo *w,
                            ql_weight_info *out) {
  int rv;
  memset(out, 0, sizeof *out);
  if (w == NULL || w->spec == NULL)
    return err_set(QL_EPROTO, "weight description without spec");
  const Qlinear__V1__WeightSpec *sp = w->spec;
  if ((rv = copy_name(out->name, sp->name, "weight")) != 0)
    return rv;
  if (w->digest.len != QL_DIGEST_BYTES)
    return err_set(QL_EPROTO, "digest of %zu bytes for %s, expected %d",
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
  out->bytes_resident = w->bytes_resident;
  out->crossover_rows = w->crossover_rows;
  out->crossover_measured = w->crossover_measured ? 1 : 0;
  out->n_devices = w->n_devices;

  /* Join the device names. Until the last one, keep room for "...\0" so
   * that a list that does not fit can say so. */
  size_t used = 0, cap = sizeof out->devices;
  for (size_t i = 0; i < w->n_devices; i++) {
    char dev[QL_DEVICE_NAME_MAX];
    copy_str(dev, sizeof dev, w->devices[i]);
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
  memcpy(saved, errbuf, sizeof saved);
  ar.upload_id = upload_id;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_ABORT;
  req.load_abort = &ar;
  if (call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_ABORT, timeout, &resp) ==
      0)
    qlinear__v1__response__free_unpacked(resp, NULL);
  memcpy(errbuf, saved, sizeof saved);
}

/* a * b unless it overflows uint64_t or size_t. */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
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
      return err_set(QL_ETOOBIG, "upload too large");
    total += segs[i].len;
  }
  /* Chunk payloads must fit the daemon's two limits with room for the
   * envelope. */
  client_limits(c, &cap, &max_chunk);
  lim = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
  if (max_chunk != 0 && max_chunk < lim)
    lim = max_chunk;
  if (lim > CHUNK_CEILING)
    lim = CHUNK_CEILING;
  if (lim == 0)
    return err_set(QL_ETOOBIG, "the daemon's cap of %llu bytes leaves no room "
                               "for chunk data", (unsigned long long)cap);

  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN;
  req.load_begin = br;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_BEGIN,
                 c->timeout_ms, &resp)) != 0)
    goto fail;
  upload_id = resp->load_begin->upload_id;
  begun = true;
  if (resp->load_begin->total_bytes != total) {
    rv = err_set(QL_EPROTO, "daemon expects %llu bytes, the upload has %llu",
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
      if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_CHUNK,
                     c->timeout_ms, &resp)) != 0)
        goto fail;
      if (resp->load_chunk->received_bytes != off + len) {
        rv = err_set(QL_EPROTO,
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
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_LOAD_COMMIT,
                 commit_timeout, &resp)) != 0)
    goto fail;
  /* Committed: from here on the weight exists, so no abort. */
  begun = false;
  if ((rv = weight_info_from(resp->load_commit->weight, &info)) != 0)
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
static int check_load_common(const char *name, ql_format format,
                             ql_path policy, int scale_dtype, uint64_t n,
                             uint64_t k) {
  int rv;
  if ((rv = check_name(name)) != 0)
    return rv;
  if (scale_dtype != 0 && !ql_dtype_valid(scale_dtype))
    return err_set(QL_EDTYPE, "scale data type %d is not f32, f16 or bf16",
                   scale_dtype);
  if (!ql_format_valid(format))
    return err_set(QL_EFORMAT, "format %d is unknown", (int)format);
  if (!ql_path_valid(policy))
    return err_set(QL_EINVAL, "policy %d is unknown", (int)policy);
  if (n == 0 || k == 0)
    return err_set(QL_ESHAPE, "weight of shape [%llu, %llu]",
                   (unsigned long long)n, (unsigned long long)k);
  return 0;
}

/* A load's placement: the comma-separated list (NULL or blank: none), its
 * items trimmed of blanks, copied into buf (DEVICES_BUF bytes) and pointed
 * to by names. The daemon decides which devices exist. */
#define DEVICES_MAX 16
#define DEVICES_BUF (DEVICES_MAX * 64 + 16)
static int split_devices(const char *list, char *buf, char **names,
                         size_t *n) {
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
      return err_set(QL_EINVAL, "devices: an empty item in the list");
    if (len > 63)
      return err_set(QL_EINVAL, "devices: a name of %zu bytes", len);
    if (*n == DEVICES_MAX)
      return err_set(QL_EINVAL, "devices: more than %d", DEVICES_MAX);
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

  err_clear();
  if (c == NULL || d == NULL || d->data == NULL)
    return err_set(QL_EINVAL, "client, descriptor or data is NULL");
  if ((rv = check_load_common(d->name, d->format, d->policy, d->scale_dtype,
                              d->n, d->k)) != 0)
    return rv;
  if (!ql_dtype_valid(d->dtype))
    return err_set(QL_EDTYPE, "data type %d is not f32, f16 or bf16",
                   (int)d->dtype);
  esz = ql_dtype_size(d->dtype);
  if (!mul_ok(d->n, d->k, &nk) || !mul_ok(nk, esz, &wbytes) ||
      !mul_ok(d->bias != NULL ? d->n : 0, esz, &bbytes) ||
      wbytes > SIZE_MAX - bbytes)
    return err_set(QL_ETOOBIG, "weight of shape [%llu, %llu] is too large",
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
    return err_set(QL_EDTYPE, "%s: array dtype %d is unknown", what, a->dtype);
  if (a->ndim < 1 || a->ndim > 2)
    return err_set(QL_ESHAPE, "%s: %d dims (1 or 2 allowed)", what, a->ndim);
  if (!mul_ok(a->shape[0], a->ndim == 2 ? a->shape[1] : 1, &n1) ||
      !mul_ok(n1, es, &bytes) || n1 == 0)
    return err_set(QL_ESHAPE, "%s: empty or too large", what);
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

  err_clear();
  if (c == NULL || d == NULL || d->qdata.data == NULL || d->scale.data == NULL)
    return err_set(QL_EINVAL, "client, descriptor, qdata or scale is NULL");
  if ((rv = check_load_common(d->name, d->format, d->policy, 0, d->n, d->k)) !=
      0)
    return rv;
  if (d->zero_kind != QL_ZERO_FLOAT && d->zero_kind != QL_ZERO_INT)
    return err_set(QL_EINVAL, "zero kind %d is unknown", (int)d->zero_kind);
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
  Qlinear__V1__UnloadWeightRequest ur = QLINEAR__V1__UNLOAD_WEIGHT_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  err_clear();
  if (c == NULL)
    return err_set(QL_EINVAL, "client is NULL");
  if ((rv = check_name(name)) != 0)
    return rv;
  ur.name = (char *)name; /* pack only reads it */
  req.body_case = QLINEAR__V1__REQUEST__BODY_UNLOAD;
  req.unload = &ur;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_UNLOAD, c->timeout_ms,
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

  err_clear();
  if (c == NULL)
    return err_set(QL_EINVAL, "client is NULL");
  if ((rv = check_name(name)) != 0)
    return rv;
  hr.name = (char *)name; /* pack only reads it */
  if (digest != NULL) {
    hr.digest.data = (uint8_t *)digest;
    hr.digest.len = QL_DIGEST_BYTES;
  }
  req.body_case = QLINEAR__V1__REQUEST__BODY_HOLD;
  req.hold = &hr;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_HOLD, c->timeout_ms,
                 &resp)) != 0)
    return rv;
  if (out != NULL)
    rv = weight_info_from(resp->hold->weight, out);
  qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

QL_EXPORT int ql_reload_config(ql_client *c, char *report, size_t len) {
  Qlinear__V1__ReloadConfigRequest rr =
      QLINEAR__V1__RELOAD_CONFIG_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  err_clear();
  if (report != NULL && len > 0)
    report[0] = '\0';
  if (c == NULL)
    return err_set(QL_EINVAL, "client is NULL");
  req.body_case = QLINEAR__V1__REQUEST__BODY_RELOAD;
  req.reload = &rr;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_RELOAD, c->timeout_ms,
                 &resp)) != 0)
    return rv;
  if (report != NULL && len > 0)
    copy_str(report, len, resp->reload->report);
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

  err_clear();
  if (out != NULL)
    *out = NULL;
  if (count != NULL)
    *count = 0;
  if (c == NULL || out == NULL || count == NULL)
    return err_set(QL_EINVAL, "client or output is NULL");
  req.body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  req.list = &lr;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_LIST, c->timeout_ms,
                 &resp)) != 0)
    goto fail;
  n = resp->list->n_weights;
  if (n > 0) {
    /* n is bounded by the received message size, calloc checks n * size. */
    if ((arr = calloc(n, sizeof *arr)) == NULL) {
      rv = err_set(QL_ENOMEM, "allocating %zu weight descriptions", n);
      goto fail;
    }
    for (size_t i = 0; i < n; i++)
      if ((rv = weight_info_from(resp->list->weights[i], &arr[i])) != 0)
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

  err_clear();
  if (out == NULL)
    return err_set(QL_EINVAL, "output is NULL");
  if ((rv = check_name(name)) != 0)
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
    err_set(rv, "no weight named %s is resident", name);
  free(arr);
  return rv;
}

/* ------------------------------------------------------------ linear */

/* Checks what every linear call shares before anything is sent. */
static int check_linear_args(ql_client *c, const char *weight, ql_path path,
                             ql_dtype dtype, uint64_t m, uint64_t k,
                             uint64_t n) {
  int rv;
  if (c == NULL)
    return err_set(QL_EINVAL, "client is NULL");
  if ((rv = check_name(weight)) != 0)
    return rv;
  if (!ql_dtype_valid(dtype))
    return err_set(QL_EDTYPE, "data type %d is not f32, f16 or bf16",
                   (int)dtype);
  if (!ql_path_valid(path))
    return err_set(QL_EINVAL, "path %d is unknown", (int)path);
  if (m == 0 || k == 0 || n == 0)
    return err_set(QL_ESHAPE, "x [%llu, %llu], y [%llu, %llu]: every "
                              "dimension must be at least 1",
                   (unsigned long long)m, (unsigned long long)k,
                   (unsigned long long)m, (unsigned long long)n);
  return 0;
}

/*
 * Sends a prepared Linear request and checks its reply: y must be [m, n]
 * in dtype, inline with ybytes bytes when neither ys nor yc is given
 * (copied to y), else naming exactly the region slice ys or the CUDA IPC
 * slice yc (its offset and length: the reply carries no handle). st, when
 * not NULL, is the staging region ys lies in: on success y receives the
 * result from there. st is consumed (exchange()).
 */
static int linear_call(ql_client *c, Qlinear__V1__LinearRequest *lr,
                       ql_dtype dtype, uint64_t m, uint64_t n,
                       uint64_t ybytes, const Qlinear__V1__RegionSlice *ys,
                       const Qlinear__V1__CudaIpcSlice *yc, void *y,
                       ql_linear_result *res, stage *st) {
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  int rv;

  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  req.linear = lr;
  if ((rv = exchange(c, &req, QLINEAR__V1__RESPONSE__BODY_LINEAR,
                     c->timeout_ms, st, &resp)) != 0)
    return rv;

  const Qlinear__V1__LinearResponse *lp = resp->linear;
  const Qlinear__V1__Tensor *yt = lp->y;
  if (yt == NULL) {
    rv = err_set(QL_EPROTO, "reply without y");
    goto fail;
  }
  if ((int)yt->dtype != (int)dtype) {
    rv = err_set(QL_EDTYPE, "reply y has data type %d, expected %d",
                 (int)yt->dtype, (int)dtype);
    goto fail;
  }
  if (yt->n_shape != 2 || yt->shape[0] != m || yt->shape[1] != n) {
    rv = err_set(QL_ESHAPE, "reply y has %zu dimensions [%llu, %llu%s], "
                            "expected [%llu, %llu]",
                 yt->n_shape,
                 (unsigned long long)(yt->n_shape > 0 ? yt->shape[0] : 0),
                 (unsigned long long)(yt->n_shape > 1 ? yt->shape[1] : 0),
                 yt->n_shape > 2 ? ", ..." : "", (unsigned long long)m,
                 (unsigned long long)n);
    goto fail;
  }
  if (ys != NULL) {
    const Qlinear__V1__RegionSlice *got =
        yt->data_case == QLINEAR__V1__TENSOR__DATA_REGION ? yt->region : NULL;
    if (got == NULL || got->region_id != ys->region_id ||
        got->offset != ys->offset || got->length != ys->length) {
      rv = err_set(QL_EPROTO, "reply y is not the slice asked for");
      goto fail;
    }
  } else if (lr->y_out_ze != NULL) {
    const Qlinear__V1__ZeIpcSlice *got =
        yt->data_case == QLINEAR__V1__TENSOR__DATA_ZE_IPC ? yt->ze_ipc : NULL;
    if (got == NULL || got->import_id != lr->y_out_ze->import_id ||
        got->offset != lr->y_out_ze->offset ||
        got->length != lr->y_out_ze->length) {
      rv = err_set(QL_EPROTO, "reply y is not the Level Zero slice asked "
                              "for");
      goto fail;
    }
  } else if (yc != NULL) {
    const Qlinear__V1__CudaIpcSlice *got =
        yt->data_case == QLINEAR__V1__TENSOR__DATA_CUDA_IPC ? yt->cuda_ipc
                                                            : NULL;
    if (got == NULL || got->offset != yc->offset ||
        got->length != yc->length) {
      rv = err_set(QL_EPROTO, "reply y is not the CUDA slice asked for");
      goto fail;
    }
  } else if (yt->data_case != QLINEAR__V1__TENSOR__DATA_INLINE_DATA ||
             yt->inline_data.len != ybytes) {
    rv = err_set(QL_EPROTO, "reply y carries %zu bytes of data, [%llu, %llu] "
                            "needs %llu",
                 yt->data_case == QLINEAR__V1__TENSOR__DATA_INLINE_DATA
                     ? yt->inline_data.len
                     : 0,
                 (unsigned long long)m, (unsigned long long)n,
                 (unsigned long long)ybytes);
    goto fail;
  }
  /* Strict here, unlike listings: the path that ran is part of the answer
   * and this protocol version knows every path. */
  if (!ql_path_valid(lp->path)) {
    rv = err_set(QL_EPROTO, "reply names unknown path %d", (int)lp->path);
    goto fail;
  }
  if (ys == NULL && yc == NULL && lr->y_out_ze == NULL)
    memcpy(y, yt->inline_data.data, (size_t)ybytes);
  if (st != NULL)
    memcpy(y, (const uint8_t *)st->reg->data + ys->offset, (size_t)ybytes);
  if (res != NULL) {
    res->path = (ql_path)lp->path;
    copy_str(res->impl, sizeof res->impl, lp->impl);
  }
  rv = 0;

fail:
  stage_put(st);
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

QL_EXPORT int ql_linear(ql_client *c, const char *weight, ql_path path,
                        ql_dtype dtype, uint64_t m, uint64_t k, const void *x,
                        uint64_t n, void *y, ql_linear_result *res) {
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {m, k}, mk, mn, xbytes, ybytes, cap, room;
  size_t esz;
  int rv;

  err_clear();
  if (c == NULL || x == NULL || y == NULL)
    return err_set(QL_EINVAL, "client, x or y is NULL");
  if ((rv = check_linear_args(c, weight, path, dtype, m, k, n)) != 0)
    return rv;
  esz = ql_dtype_size(dtype);
  client_limits(c, &cap, NULL);
  room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
  /* Both directions must fit the cap: the daemon cannot send a larger y
   * and our receive limit would drop it. Checked before anything is
   * packed, so a huge x costs no copy. */
  if (!mul_ok(m, k, &mk) || !mul_ok(mk, esz, &xbytes) || xbytes > room)
    return err_set(QL_ETOOBIG, "x [%llu, %llu] does not fit the daemon's cap "
                               "of %llu bytes",
                   (unsigned long long)m, (unsigned long long)k,
                   (unsigned long long)cap);
  if (!mul_ok(m, n, &mn) || !mul_ok(mn, esz, &ybytes) || ybytes > room)
    return err_set(QL_ETOOBIG, "y [%llu, %llu] does not fit the daemon's cap "
                               "of %llu bytes",
                   (unsigned long long)m, (unsigned long long)n,
                   (unsigned long long)cap);

  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  lr.weight = (char *)weight;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  /* On the ring, x and y go through a staging region: one copy each way,
   * which costs less than packing them into messages. */
  uint64_t yoff = (xbytes + 63) & ~(uint64_t)63;
  stage *st = c->ring != NULL && yoff + ybytes <= STAGE_MAX_BYTES
                  ? stage_take(c, (size_t)(yoff + ybytes))
                  : NULL;
  if (st != NULL) {
    Qlinear__V1__RegionSlice xs, ys;
    memcpy(st->reg->data, x, (size_t)xbytes);
    qlinear__v1__region_slice__init(&xs);
    qlinear__v1__region_slice__init(&ys);
    xs.region_id = ys.region_id = st->reg->id;
    xs.offset = 0;
    xs.length = xbytes;
    ys.offset = yoff;
    ys.length = ybytes;
    xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    xt.region = &xs;
    lr.y_out = &ys;
    return linear_call(c, &lr, dtype, m, n, ybytes, &ys, NULL, y, res, st);
  }
  xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  xt.inline_data.data = (uint8_t *)x; /* pack only reads it */
  xt.inline_data.len = (size_t)xbytes;
  return linear_call(c, &lr, dtype, m, n, ybytes, NULL, NULL, y, res, NULL);
}

QL_EXPORT int ql_linear_multi(ql_client *c, size_t count,
                              const char *const *weights, ql_path path,
                              ql_dtype dtype, uint64_t m, uint64_t k,
                              const void *x, const uint64_t *n,
                              void *const *y, ql_linear_result *res) {
  Qlinear__V1__LinearMultiRequest lr = QLINEAR__V1__LINEAR_MULTI_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {m, k}, mk, xbytes, cap, room, ytotal = 0;
  uint64_t ybytes[QL_MULTI_MAX];
  size_t esz;
  int rv;

  err_clear();
  if (c == NULL || x == NULL || weights == NULL || n == NULL || y == NULL)
    return err_set(QL_EINVAL, "client, weights, x, n or y is NULL");
  if (count == 0 || count > QL_MULTI_MAX)
    return err_set(QL_EINVAL, "%zu weights, expected 1 to %d", count,
                   QL_MULTI_MAX);
  esz = ql_dtype_size(dtype);
  client_limits(c, &cap, NULL);
  room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
  for (size_t i = 0; i < count; i++) {
    uint64_t mn;
    if ((rv = check_linear_args(c, weights[i], path, dtype, m, k, n[i])) != 0)
      return rv;
    if (y[i] == NULL)
      return err_set(QL_EINVAL, "y[%zu] is NULL", i);
    if (!mul_ok(m, n[i], &mn) || !mul_ok(mn, esz, &ybytes[i]) ||
        ybytes[i] > room - ytotal)
      return err_set(QL_ETOOBIG, "the results do not fit the daemon's cap of "
                                 "%llu bytes", (unsigned long long)cap);
    ytotal += ybytes[i];
  }
  if (!mul_ok(m, k, &mk) || !mul_ok(mk, esz, &xbytes) || xbytes > room)
    return err_set(QL_ETOOBIG, "x [%llu, %llu] does not fit the daemon's cap "
                               "of %llu bytes",
                   (unsigned long long)m, (unsigned long long)k,
                   (unsigned long long)cap);
  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  lr.weights = (char **)weights; /* pack only reads them */
  lr.n_weights = count;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI;
  req.linear_multi = &lr;
  /* On the ring, through a staging region (as ql_linear()): x, then each
   * y at a 64-byte boundary. */
  uint64_t yoff[QL_MULTI_MAX], end = (xbytes + 63) & ~(uint64_t)63;
  for (size_t i = 0; i < count; i++) {
    yoff[i] = end;
    end = (end + ybytes[i] + 63) & ~(uint64_t)63;
  }
  stage *st = c->ring != NULL && end <= STAGE_MAX_BYTES
                  ? stage_take(c, (size_t)end)
                  : NULL;
  Qlinear__V1__RegionSlice xs, ys[QL_MULTI_MAX], *pys[QL_MULTI_MAX];
  if (st != NULL) {
    memcpy(st->reg->data, x, (size_t)xbytes);
    qlinear__v1__region_slice__init(&xs);
    xs.region_id = st->reg->id;
    xs.length = xbytes;
    xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    xt.region = &xs;
    for (size_t i = 0; i < count; i++) {
      qlinear__v1__region_slice__init(&ys[i]);
      ys[i].region_id = st->reg->id;
      ys[i].offset = yoff[i];
      ys[i].length = ybytes[i];
      pys[i] = &ys[i];
    }
    lr.y_out = pys;
    lr.n_y_out = count;
  } else {
    xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
    xt.inline_data.data = (uint8_t *)x; /* pack only reads it */
    xt.inline_data.len = (size_t)xbytes;
  }
  if ((rv = exchange(c, &req, QLINEAR__V1__RESPONSE__BODY_LINEAR_MULTI,
                     c->timeout_ms, st, &resp)) != 0)
    return rv;
  const Qlinear__V1__LinearMultiResponse *mp = resp->linear_multi;
  if (mp->n_results != count) {
    rv = err_set(QL_EPROTO, "%zu results for %zu weights", mp->n_results,
                 count);
    goto done;
  }
  /* Everything is checked before anything is copied out. */
  for (size_t i = 0; i < count; i++) {
    const Qlinear__V1__LinearResponse *lp = mp->results[i];
    const Qlinear__V1__Tensor *yt = lp ? lp->y : NULL;
    bool where_asked =
        st != NULL
            ? yt != NULL && yt->data_case == QLINEAR__V1__TENSOR__DATA_REGION &&
                  yt->region->region_id == ys[i].region_id &&
                  yt->region->offset == ys[i].offset &&
                  yt->region->length == ys[i].length
            : yt != NULL &&
                  yt->data_case == QLINEAR__V1__TENSOR__DATA_INLINE_DATA &&
                  yt->inline_data.len == ybytes[i];
    if (yt == NULL || (int)yt->dtype != (int)dtype || yt->n_shape != 2 ||
        yt->shape[0] != m || yt->shape[1] != n[i] || !where_asked ||
        !ql_path_valid(lp->path)) {
      rv = err_set(QL_EPROTO, "result %zu is not a [%llu, %llu] y of the "
                              "request's data type", i,
                   (unsigned long long)m, (unsigned long long)n[i]);
      goto done;
    }
  }
  for (size_t i = 0; i < count; i++) {
    const Qlinear__V1__LinearResponse *lp = mp->results[i];
    memcpy(y[i],
           st != NULL ? (const uint8_t *)st->reg->data + yoff[i]
                      : lp->y->inline_data.data,
           (size_t)ybytes[i]);
    if (res != NULL) {
      res[i].path = (ql_path)lp->path;
      copy_str(res[i].impl, sizeof res[i].impl, lp->impl);
    }
  }
  rv = 0;
done:
  stage_put(st);
  qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}

/* True if r is a live region of c. */
static bool region_of(ql_client *c, const ql_region *r) {
  bool found = false;
  pthread_mutex_lock(&c->lock);
  for (region_node *p = c->regions; p != NULL && !found; p = p->next)
    found = &p->pub == r;
  pthread_mutex_unlock(&c->lock);
  return found;
}

/* Checks a slice of this client for what, holding bytes, and describes it
 * on the wire. */
static int slice_msg(ql_client *c, const char *what, const ql_slice *sl,
                     uint64_t bytes, size_t esz,
                     Qlinear__V1__RegionSlice *out) {
  if (sl->region == NULL || !region_of(c, sl->region))
    return err_set(QL_EINVAL, "%s: not a region of this client", what);
  /* off <= size && len <= size - off: no sum that could wrap. */
  uint64_t size = sl->region->size;
  if (!(sl->offset <= size && sl->length <= size - sl->offset))
    return err_set(QL_EINVAL, "%s: %llu bytes at offset %llu do not fit the "
                              "region's %llu bytes",
                   what, (unsigned long long)sl->length,
                   (unsigned long long)sl->offset, (unsigned long long)size);
  if (sl->offset % esz != 0)
    return err_set(QL_EINVAL, "%s: offset %llu is not a multiple of the "
                              "%zu-byte element size",
                   what, (unsigned long long)sl->offset, esz);
  if (sl->length != bytes)
    return err_set(QL_ESHAPE, "%s: the slice holds %llu bytes, %llu needed",
                   what, (unsigned long long)sl->length,
                   (unsigned long long)bytes);
  qlinear__v1__region_slice__init(out);
  out->region_id = sl->region->id;
  out->offset = sl->offset;
  out->length = sl->length;
  return 0;
}

QL_EXPORT int ql_linear_region(ql_client *c, const char *weight, ql_path path,
                               ql_dtype dtype, uint64_t m, uint64_t k,
                               const ql_slice *x, uint64_t n,
                               const ql_slice *y, void *y_inline,
                               ql_linear_result *res) {
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt;
  Qlinear__V1__RegionSlice xs, ys;
  uint64_t shape[2] = {m, k}, mk, mn, xbytes, ybytes, cap, room;
  size_t esz;
  int rv;

  err_clear();
  if (c == NULL || x == NULL || (y == NULL) == (y_inline == NULL))
    return err_set(QL_EINVAL, "client or x is NULL, or not exactly one of y "
                              "and y_inline is given");
  if ((rv = check_linear_args(c, weight, path, dtype, m, k, n)) != 0)
    return rv;
  esz = ql_dtype_size(dtype);
  if (!mul_ok(m, k, &mk) || !mul_ok(mk, esz, &xbytes) || !mul_ok(m, n, &mn) ||
      !mul_ok(mn, esz, &ybytes))
    return err_set(QL_ETOOBIG, "x [%llu, %llu] or y [%llu, %llu] is too large",
                   (unsigned long long)m, (unsigned long long)k,
                   (unsigned long long)m, (unsigned long long)n);
  if ((rv = slice_msg(c, "x", x, xbytes, esz, &xs)) != 0)
    return rv;
  if (y != NULL) {
    if ((rv = slice_msg(c, "y", y, ybytes, esz, &ys)) != 0)
      return rv;
    if (x->region == y->region && x->offset < y->offset + y->length &&
        y->offset < x->offset + x->length)
      return err_set(QL_EINVAL, "the x and y slices overlap");
  } else {
    client_limits(c, &cap, NULL);
    room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
    if (ybytes > room)
      return err_set(QL_ETOOBIG, "y [%llu, %llu] does not fit the daemon's "
                                 "cap of %llu bytes: give a region slice",
                     (unsigned long long)m, (unsigned long long)n,
                     (unsigned long long)cap);
  }

  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  xt.region = &xs;
  lr.weight = (char *)weight;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  lr.y_out = y != NULL ? &ys : NULL;
  return linear_call(c, &lr, dtype, m, n, ybytes, lr.y_out, NULL, y_inline,
                     res, NULL);
}

/* A CUDA slice into its message (out points into sl: no copy), after the
 * checks that need no daemon. */
static int cuda_msg(const char *what, const ql_cuda_slice *sl, uint64_t bytes,
                    size_t esz, int with_event,
                    Qlinear__V1__CudaIpcSlice *out) {
  if (memchr(sl->device, '\0', sizeof sl->device) == NULL ||
      sl->device[0] == '\0')
    return err_set(QL_EINVAL, "%s: the CUDA slice names no device, or an "
                              "unterminated one",
                   what);
  if (sl->offset % esz != 0)
    return err_set(QL_EINVAL, "%s: offset %llu is not a multiple of the "
                              "%zu-byte element size",
                   what, (unsigned long long)sl->offset, esz);
  if (sl->length != bytes)
    return err_set(QL_ESHAPE, "%s: the slice holds %llu bytes, %llu needed",
                   what, (unsigned long long)sl->length,
                   (unsigned long long)bytes);
  qlinear__v1__cuda_ipc_slice__init(out);
  out->mem_handle.data = (uint8_t *)sl->mem_handle; /* pack only reads it */
  out->mem_handle.len = sizeof sl->mem_handle;
  out->offset = sl->offset;
  out->length = sl->length;
  out->device = (char *)sl->device;
  if (with_event && sl->has_ready_event) {
    out->ready_event.data = (uint8_t *)sl->ready_event;
    out->ready_event.len = sizeof sl->ready_event;
  }
  return 0;
}

/*
 * The checks of a Linear call on device tensors that need no daemon: the
 * arguments, *esz and the bytes of x and y, and, for an inline y
 * (inline_y), that it fits the daemon's message cap (kind names the
 * slices to give instead).
 */
static int device_linear_args(ql_client *c, const char *weight, ql_path path,
                              ql_dtype dtype, uint64_t m, uint64_t k,
                              uint64_t n, int inline_y, const char *kind,
                              size_t *esz, uint64_t *xbytes,
                              uint64_t *ybytes) {
  uint64_t mk, mn, cap, room;
  int rv;
  if ((rv = check_linear_args(c, weight, path, dtype, m, k, n)) != 0)
    return rv;
  *esz = ql_dtype_size(dtype);
  if (!mul_ok(m, k, &mk) || !mul_ok(mk, *esz, xbytes) || !mul_ok(m, n, &mn) ||
      !mul_ok(mn, *esz, ybytes))
    return err_set(QL_ETOOBIG, "x [%llu, %llu] or y [%llu, %llu] is too large",
                   (unsigned long long)m, (unsigned long long)k,
                   (unsigned long long)m, (unsigned long long)n);
  if (inline_y) {
    client_limits(c, &cap, NULL);
    room = cap > ENVELOPE_ROOM ? cap - ENVELOPE_ROOM : 0;
    if (*ybytes > room)
      return err_set(QL_ETOOBIG, "y [%llu, %llu] does not fit the daemon's "
                                 "cap of %llu bytes: give a %s slice",
                     (unsigned long long)m, (unsigned long long)n,
                     (unsigned long long)cap, kind);
  }
  return 0;
}

QL_EXPORT int ql_linear_cuda(ql_client *c, const char *weight, ql_path path,
                             ql_dtype dtype, uint64_t m, uint64_t k,
                             const ql_cuda_slice *x, uint64_t n,
                             const ql_cuda_slice *y, void *y_inline,
                             ql_linear_result *res) {
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt;
  Qlinear__V1__CudaIpcSlice xs, ys;
  uint64_t shape[2] = {m, k}, xbytes, ybytes;
  size_t esz;
  int rv;

  err_clear();
  if (c == NULL || x == NULL || (y == NULL) == (y_inline == NULL))
    return err_set(QL_EINVAL, "client or x is NULL, or not exactly one of y "
                              "and y_inline is given");
  if ((rv = device_linear_args(c, weight, path, dtype, m, k, n, y == NULL,
                               "CUDA", &esz, &xbytes, &ybytes)) != 0 ||
      (rv = cuda_msg("x", x, xbytes, esz, 1, &xs)) != 0)
    return rv;
  if (y != NULL) {
    if ((rv = cuda_msg("y", y, ybytes, esz, 0, &ys)) != 0)
      return rv;
    if (strcmp(x->device, y->device) != 0)
      return err_set(QL_EINVAL, "x is on %s, y on %s: one request runs on "
                                "one device",
                     x->device, y->device);
  }

  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  xt.data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
  xt.cuda_ipc = &xs;
  lr.weight = (char *)weight;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  lr.y_out_cuda = y != NULL ? &ys : NULL;
  return linear_call(c, &lr, dtype, m, n, ybytes, NULL, lr.y_out_cuda,
                     y_inline, res, NULL);
}

/* ------------------------------------------------------ Level Zero IPC */

QL_EXPORT int ql_ze_import(ql_client *c, int fd,
                           const unsigned char handle[QL_ZE_IPC_HANDLE_BYTES],
                           const char *device, uint64_t *import_id,
                           uint64_t *size) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__ImportZeIpcRequest ir = QLINEAR__V1__IMPORT_ZE_IPC_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  int rv;

  err_clear();
  if (import_id != NULL)
    *import_id = 0;
  if (c == NULL || handle == NULL || device == NULL || import_id == NULL ||
      fd < 0)
    return err_set(QL_EINVAL, "client, handle, device or output is NULL, or "
                              "the descriptor is negative");
  if (device[0] == '\0' || strlen(device) >= QL_DEVICE_NAME_MAX)
    return err_set(QL_EINVAL, "device name empty or too long");
  ir.ipc_handle.data = (uint8_t *)handle; /* pack only reads it */
  ir.ipc_handle.len = QL_ZE_IPC_HANDLE_BYTES;
  ir.device = (char *)device;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC;
  req.import_ze_ipc = &ir;
  if ((rv = session_call_fd(c, &req,
                            QLINEAR__V1__SESSION_RESPONSE__BODY_IMPORT_ZE_IPC,
                            &r, NULL, fd)) != 0)
    return rv;
  if (r->import_ze_ipc->import_id == 0) {
    qlinear__v1__session_response__free_unpacked(r, NULL);
    return err_set(QL_EPROTO, "the daemon sent import id 0");
  }
  *import_id = r->import_ze_ipc->import_id;
  if (size != NULL)
    *size = r->import_ze_ipc->size;
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return 0;
}

QL_EXPORT int ql_ze_release(ql_client *c, uint64_t import_id) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__ReleaseImportRequest rr =
      QLINEAR__V1__RELEASE_IMPORT_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  int rv;

  err_clear();
  if (c == NULL || import_id == 0)
    return err_set(QL_EINVAL, "client is NULL or import id 0");
  rr.import_id = import_id;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT;
  req.release_import = &rr;
  rv = session_call(c, &req,
                    QLINEAR__V1__SESSION_RESPONSE__BODY_RELEASE_IMPORT, &r,
                    NULL);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}

/* A Level Zero slice into its message, after the checks that need no
 * daemon. */
static int ze_msg(const char *what, const ql_ze_slice *sl, uint64_t bytes,
                  size_t esz, Qlinear__V1__ZeIpcSlice *out) {
  if (sl->import_id == 0)
    return err_set(QL_EINVAL, "%s: the slice names no import", what);
  if (sl->offset % esz != 0)
    return err_set(QL_EINVAL, "%s: offset %llu is not a multiple of the "
                              "%zu-byte element size",
                   what, (unsigned long long)sl->offset, esz);
  if (sl->length != bytes)
    return err_set(QL_ESHAPE, "%s: the slice holds %llu bytes, %llu needed",
                   what, (unsigned long long)sl->length,
                   (unsigned long long)bytes);
  qlinear__v1__ze_ipc_slice__init(out);
  out->import_id = sl->import_id;
  out->offset = sl->offset;
  out->length = sl->length;
  return 0;
}

QL_EXPORT int ql_linear_ze(ql_client *c, const char *weight, ql_path path,
                           ql_dtype dtype, uint64_t m, uint64_t k,
                           const ql_ze_slice *x, uint64_t n,
                           const ql_ze_slice *y, void *y_inline,
                           ql_linear_result *res) {
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt;
  Qlinear__V1__ZeIpcSlice xs, ys;
  uint64_t shape[2] = {m, k}, xbytes, ybytes;
  size_t esz;
  int rv;

  err_clear();
  if (c == NULL || x == NULL || (y == NULL) == (y_inline == NULL))
    return err_set(QL_EINVAL, "client or x is NULL, or not exactly one of y "
                              "and y_inline is given");
  if ((rv = device_linear_args(c, weight, path, dtype, m, k, n, y == NULL,
                               "Level Zero", &esz, &xbytes, &ybytes)) != 0 ||
      (rv = ze_msg("x", x, xbytes, esz, &xs)) != 0 ||
      (y != NULL && (rv = ze_msg("y", y, ybytes, esz, &ys)) != 0))
    return rv;
  qlinear__v1__tensor__init(&xt);
  xt.dtype = (Qlinear__V1__DType)dtype;
  xt.n_shape = 2;
  xt.shape = shape;
  xt.data_case = QLINEAR__V1__TENSOR__DATA_ZE_IPC;
  xt.ze_ipc = &xs;
  lr.weight = (char *)weight;
  lr.x = &xt;
  lr.path = (Qlinear__V1__Path)path;
  lr.y_out_ze = y != NULL ? &ys : NULL;
  return linear_call(c, &lr, dtype, m, n, ybytes, NULL, NULL, y_inline, res,
                     NULL);
}

/* ------------------------------------------------------------ mapped mode */

QL_EXPORT int ql_map_weight(ql_client *c, const char *name,
                            const char *device, ql_weight_map *out) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__MapWeightRequest mr = QLINEAR__V1__MAP_WEIGHT_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  const Qlinear__V1__MapWeightResponse *mw;
  int fd = -1, rv;

  err_clear();
  if (out != NULL) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
  }
  if (c == NULL || name == NULL || out == NULL)
    return err_set(QL_EINVAL, "client, name or output is NULL");
  mr.name = (char *)name;
  mr.device = (char *)(device != NULL ? device : "");
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT;
  req.map_weight = &mr;
  if ((rv = session_call(c, &req,
                         QLINEAR__V1__SESSION_RESPONSE__BODY_MAP_WEIGHT, &r,
                         &fd)) != 0)
    return rv;
  mw = r->map_weight;
  /* What the caller maps and reads at: an answer that does not add up is
   * refused here rather than mapped. */
  if (fd < 0 || mw->size == 0 || mw->layout == NULL || mw->device == NULL ||
      strlen(mw->layout) >= sizeof out->layout ||
      strlen(mw->device) >= sizeof out->device ||
      mw->digest.len != QL_DIGEST_BYTES || mw->n == 0 || mw->k == 0 ||
      mw->groups == 0 || mw->ldq == 0 || mw->q_offset >= mw->size ||
      mw->scale_offset >= mw->size ||
      (mw->has_zero && mw->zero_offset >= mw->size) ||
      (mw->has_bias && mw->bias_offset >= mw->size)) {
    rv = err_set(QL_EPROTO, "the daemon's layout of '%s' does not add up%s",
                 name, fd < 0 ? " (no descriptor)" : "");
    goto done;
  }
  out->fd = fd;
  fd = -1;
  out->size = mw->size;
  copy_str(out->layout, sizeof out->layout, mw->layout);
  copy_str(out->device, sizeof out->device, mw->device);
  out->format = (ql_format)mw->format;
  out->scale_dtype = (ql_dtype)mw->scale_dtype;
  out->n = mw->n;
  out->k = mw->k;
  out->groups = mw->groups;
  out->group_size = mw->group_size;
  out->ldq = mw->ldq;
  out->q_offset = mw->q_offset;
  out->scale_offset = mw->scale_offset;
  out->zero_offset = mw->has_zero ? mw->zero_offset : UINT64_MAX;
  out->bias_offset = mw->has_bias ? mw->bias_offset : UINT64_MAX;
  out->sms = mw->sms;
  out->writable = mw->writable ? 1 : 0;
  memcpy(out->digest, mw->digest.data, QL_DIGEST_BYTES);
  rv = 0;
done:
  if (fd >= 0)
    close(fd);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}

/* ------------------------------------------------------------ regions */

/* Tells the daemon to forget region id; best effort when cleaning up. */
static int destroy_remote(ql_client *c, uint64_t id) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__DestroyRegionRequest dr =
      QLINEAR__V1__DESTROY_REGION_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  dr.region_id = id;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION;
  req.destroy_region = &dr;
  int rv = session_call(c, &req,
                        QLINEAR__V1__SESSION_RESPONSE__BODY_DESTROY_REGION, &r,
                        NULL);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}

QL_EXPORT int ql_region_create(ql_client *c, size_t size, ql_region **out) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRegionRequest cr = QLINEAR__V1__CREATE_REGION_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  region_node *node = NULL;
  void *base = MAP_FAILED;
  uint64_t id = 0;
  int fd = -1, rv;

  err_clear();
  if (out != NULL)
    *out = NULL;
  if (c == NULL || out == NULL)
    return err_set(QL_EINVAL, "client or output is NULL");
  if (size == 0)
    return err_set(QL_EINVAL, "a region of 0 bytes");
  cr.size = size;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
  req.create_region = &cr;
  if ((rv = session_call(c, &req,
                         QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION, &r,
                         &fd)) != 0)
    return rv;
  id = r->create_region->region_id;
  if (id == 0 || r->create_region->size != size || fd < 0) {
    rv = err_set(QL_EPROTO, "the daemon sent region %llu of %llu bytes%s",
                 (unsigned long long)id,
                 (unsigned long long)r->create_region->size,
                 fd < 0 ? " without a descriptor" : "");
    goto fail;
  }
  /* Mapping a file that could shrink would expose us to SIGBUS: accept
   * only what the daemon promises, a memfd of this size sealed against
   * shrinking and growing. */
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
          (F_SEAL_SHRINK | F_SEAL_GROW)) {
    rv = err_set(QL_EPROTO, "the region's descriptor is not a sealed memfd of "
                            "%zu bytes", size);
    goto fail;
  }
  base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    rv = err_set(map_errno(errno), "mapping the region: %s", strerror(errno));
    goto fail;
  }
  if ((node = calloc(1, sizeof *node)) == NULL) {
    rv = err_set(QL_ENOMEM, "allocating the region");
    goto fail;
  }
  close(fd);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  node->pub.id = id;
  node->pub.size = size;
  node->pub.data = base;
  pthread_mutex_lock(&c->lock);
  node->next = c->regions;
  if (c->regions != NULL)
    c->regions->prev = node;
  c->regions = node;
  pthread_mutex_unlock(&c->lock);
  *out = &node->pub;
  return 0;

fail:
  if (base != MAP_FAILED)
    munmap(base, size);
  if (fd >= 0)
    close(fd);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  if (id != 0) {
    char saved[ERRBUF_SIZE];
    memcpy(saved, errbuf, sizeof saved);
    destroy_remote(c, id);
    memcpy(errbuf, saved, sizeof saved);
  }
  return rv;
}

QL_EXPORT int ql_region_destroy(ql_client *c, ql_region *r) {
  err_clear();
  if (r == NULL)
    return 0;
  if (c == NULL)
    return err_set(QL_EINVAL, "client is NULL");
  region_node *node = (region_node *)r, *p;
  pthread_mutex_lock(&c->lock);
  for (p = c->regions; p != NULL && p != node; p = p->next)
    ;
  if (p != NULL) {
    if (node->prev != NULL)
      node->prev->next = node->next;
    else
      c->regions = node->next;
    if (node->next != NULL)
      node->next->prev = node->prev;
  }
  pthread_mutex_unlock(&c->lock);
  if (p == NULL)
    return err_set(QL_EINVAL, "not a region of this client");
  int rv = destroy_remote(c, node->pub.id);
  munmap(node->pub.data, node->pub.size);
  free(node);
  return rv;
}

/* ------------------------------------------------------------ stats */

/* ql_stats_info and its per-weight array in one allocation, so that one free()
 * releases both. */
struct stats_block {
  ql_stats_info s;
  ql_weight_stats w[];
};

QL_EXPORT int ql_stats(ql_client *c, ql_stats_info **out) {
  Qlinear__V1__StatsRequest sr = QLINEAR__V1__STATS_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  struct stats_block *b = NULL;
  int rv;

  err_clear();
  if (out != NULL)
    *out = NULL;
  if (c == NULL || out == NULL)
    return err_set(QL_EINVAL, "client or output is NULL");
  req.body_case = QLINEAR__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  if ((rv = call(c, &req, QLINEAR__V1__RESPONSE__BODY_STATS, c->timeout_ms,
                 &resp)) != 0)
    goto fail;

  const Qlinear__V1__StatsResponse *st = resp->stats;
  size_t n = st->n_per_weight;
  if (n > (SIZE_MAX - sizeof *b) / sizeof b->w[0]) {
    rv = err_set(QL_EPROTO, "%zu per-weight entries", n);
    goto fail;
  }
  if ((b = calloc(1, sizeof *b + n * sizeof b->w[0])) == NULL) {
    rv = err_set(QL_ENOMEM, "allocating statistics of %zu weights", n);
    goto fail;
  }
  b->s.uptime_ns = st->uptime_ns;
  b->s.requests = st->requests;
  b->s.errors = st->errors;
  b->s.bytes_in = st->bytes_in;
  b->s.bytes_out = st->bytes_out;
  b->s.weights = st->weights;
  b->s.uploads_in_progress = st->uploads_in_progress;
  b->s.n_per_weight = n;
  b->s.per_weight = n > 0 ? b->w : NULL;
  b->s.sessions = st->sessions;
  b->s.regions = st->regions;
  b->s.region_bytes = st->region_bytes;
  b->s.persistent_weights = st->persistent_weights;
  b->s.rings = st->rings;
  b->s.ring_requests = st->ring_requests;
  b->s.n_devices_total = st->n_devices;
  for (size_t i = 0; i < st->n_devices && i < QL_MAX_DEVICES; i++) {
    const Qlinear__V1__DeviceStats *ds = st->devices[i];
    if (ds == NULL) {
      rv = err_set(QL_EPROTO, "empty device entry");
      goto fail;
    }
    copy_str(b->s.devices[i].device, sizeof b->s.devices[i].device,
             ds->device);
    b->s.devices[i].bytes_resident = ds->bytes_resident;
    b->s.devices[i].budget_bytes = ds->budget_bytes;
    b->s.n_devices = i + 1;
  }
  for (size_t i = 0; i < n; i++) {
    const Qlinear__V1__WeightStats *ws = st->per_weight[i];
    ql_weight_stats *o = &b->w[i];
    if (ws == NULL) {
      rv = err_set(QL_EPROTO, "empty per-weight entry");
      goto fail;
    }
    if ((rv = copy_name(o->weight, ws->weight, "weight")) != 0)
      goto fail;
    copy_str(o->device, sizeof o->device, ws->device);
    o->requests = ws->requests;
    o->rows = ws->rows;
    o->batches = ws->batches;
    o->wo_batches = ws->wo_batches;
    o->aq_batches = ws->aq_batches;
    o->queue_ns = ws->queue_ns;
    o->kernel_ns = ws->kernel_ns;
    copy_str(o->impl, sizeof o->impl, ws->impl);
    o->bytes_resident = ws->bytes_resident;
    o->expired = ws->expired;
    o->crossover_rows = ws->crossover_rows;
    o->crossover_measured = ws->crossover_measured ? 1 : 0;
    for (size_t b = 0; b < ws->n_queue_hist && b < QL_HIST_BUCKETS; b++)
      o->queue_hist[b] = ws->queue_hist[b];
    for (size_t b = 0; b < ws->n_kernel_hist && b < QL_HIST_BUCKETS; b++)
      o->kernel_hist[b] = ws->kernel_hist[b];
  }
  qlinear__v1__response__free_unpacked(resp, NULL);
  *out = &b->s;
  return 0;

fail:
  free(b);
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}
