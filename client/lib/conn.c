/*
 * conn.c - libqlinear: errors (ql_errmsg's buffer, errno mapping), request ids,
 * the REQ socket pool and one exchange over it, addresses.
 */
#include "internal.h"

/* ------------------------------------------------------------ errors */

_Thread_local char ql__errbuf[ERRBUF_SIZE];

void ql__err_clear(void) { ql__errbuf[0] = '\0'; }

__attribute__((format(printf, 2, 3))) int ql__err_set(int code, const char *fmt,
                                                      ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ql__errbuf, sizeof ql__errbuf, fmt, ap);
  va_end(ap);
  return code;
}

/* Copies text that came from the daemon, replacing control characters so
 * that printing ql_errmsg() cannot drive the caller's terminal. */
void ql__copy_sanitized(char *dst, size_t len, const char *src) {
  size_t i = 0;
  if (len == 0)
    return;
  for (; src != NULL && src[i] != '\0' && i + 1 < len; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[i] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
  }
  dst[i] = '\0';
}

static int nn_fail(const char *what) {
  int e = nn_errno();
  return ql__err_set(ql__errno_from_sys(e), "%s: %s", what, nn_strerror(e));
}

/* A Status from the daemon: its code is returned as is if it is one of
 * ours, anything else is a protocol violation. */
int ql__status_error(const Qlinear__V1__Status *st) {
  char msg[ERRBUF_SIZE];
  ql__copy_sanitized(msg, sizeof msg, st->message);
  if (st->code < 0 && st->code > QL_ERRNO_MIN_)
    return ql__err_set(st->code, "%s", msg);
  return ql__err_set(QL_EPROTO,
                     "daemon answered with unknown error code %d: %s",
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
uint64_t ql__request_id_new(void) {
  uint64_t id;
  pthread_once(&id_once, id_seed);
  do
    id = atomic_fetch_add(&next_id, 1);
  while (id == 0);
  return id;
}

/* ------------------------------------------------------------ sockets */

int64_t ql__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ql__client_limits(ql_client *c, uint64_t *cap, uint64_t *max_chunk) {
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
    rv = ql__err_set(ql__errno_from_sys(e), "cannot connect to %s: %s", c->address,
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

static int set_int_opt(int s, int level, int opt, int64_t v, const char *name) {
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
int ql__reply_check(const Request *req, const Response *resp, BodyCase want) {
  if (resp->request_id != req->request_id &&
      !(resp->request_id == 0 && resp->status != NULL &&
        resp->status->code != 0))
    return ql__err_set(QL_EPROTO,
                       "reply carries request id %llu, expected %llu",
                       (unsigned long long)resp->request_id,
                       (unsigned long long)req->request_id);
  if (resp->status != NULL && resp->status->code != 0)
    return ql__status_error(resp->status);
  if (resp->body_case != want || resp->hello == NULL)
    /* Every body of the oneof is a message pointer, so checking one member
     * of the union checks them all. */
    return ql__err_set(QL_EPROTO, "reply has body %d, expected %d",
                       (int)resp->body_case, (int)want);
  return 0;
}

int ql__call(ql_client *c, Request *req, BodyCase want, int timeout_ms,
             Response **out) {
  void *msg = NULL, *buf = NULL;
  Response *resp = NULL;
  int s = -1, rv, n;
  bool keep = false; /* the socket's exchange completed: reusable */
  uint64_t cap;
  int64_t deadline = 0, rcvmax;

  *out = NULL;
  req->request_id = ql__request_id_new();
  if (c->has_token) {
    req->session_token.data = c->token;
    req->session_token.len = QL_SESSION_TOKEN_BYTES;
  }
  ql__client_limits(c, &cap, NULL);

  /* The daemon drops oversized messages unread and nanomsg would resend
   * them forever: refuse them here. */
  size_t size = qlinear__v1__request__get_packed_size(req);
  if (cap != 0 && (cap <= TRANSPORT_ROOM || size > cap - TRANSPORT_ROOM))
    return ql__err_set(QL_ETOOBIG,
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
    deadline = ql__now_ms() + timeout_ms;

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
      rv = ql__err_set(QL_ETIMEDOUT, "no reply within %d ms", timeout_ms);
      goto fail;
    }
    if (e != EINTR) {
      rv = nn_fail("waiting for the reply");
      goto fail;
    }
    if (timeout_ms >= 0) {
      int64_t left = deadline - ql__now_ms();
      if (left <= 0) {
        rv = ql__err_set(QL_ETIMEDOUT, "no reply within %d ms", timeout_ms);
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
    rv = ql__err_set(QL_EPROTO, "cannot decode the daemon's reply (%d bytes)",
                     n);
    goto fail;
  }
  /* REQ already matched the reply to this request: the socket is clean. */
  keep = resp->request_id == req->request_id ||
         (resp->request_id == 0 && resp->status != NULL &&
          resp->status->code != 0);
  if ((rv = ql__reply_check(req, resp, want)) != 0)
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
  return strncmp(address, "ipc://", 6) == 0 && stat(address + 6, &st) == 0 &&
         S_ISSOCK(st.st_mode);
}

/* ql_default_address(), and whether it fell back to the system service's
 * socket (*system). */
static int default_address(char *buf, size_t len, int *system) {
  const char *env, *rt;
  int n;

  *system = 0;
  if (buf == NULL || len == 0)
    return ql__err_set(QL_EINVAL, "no buffer for the address");
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
    return ql__err_set(QL_EINVAL, "the address does not fit %zu bytes", len);
  }
  /* No per-user daemon, but the system service runs: that one. */
  if ((env == NULL || env[0] == '\0') && !ipc_socket_exists(buf) &&
      ipc_socket_exists(system_address())) {
    n = snprintf(buf, len, "%s", system_address());
    if (n < 0 || (size_t)n >= len) {
      buf[0] = '\0';
      return ql__err_set(QL_EINVAL, "the address does not fit %zu bytes", len);
    }
    *system = 1;
  }
  return 0;
}

QL_EXPORT int ql_default_address(char *buf, size_t len) {
  int system;
  ql__err_clear();
  return default_address(buf, len, &system);
}

QL_EXPORT int ql_default_admin_address(char *buf, size_t len) {
  const char *env = getenv("QLINEAR_ADMIN_ADDRESS");
  char base[QL_ADDRESS_MAX + 64];
  int n;

  ql__err_clear();
  if (buf == NULL || len == 0)
    return ql__err_set(QL_EINVAL, "no buffer for the address");
  if (env != NULL && env[0] != '\0') {
    n = snprintf(buf, len, "%s", env);
  } else {
    char *slash;
    int system;
    if (default_address(base, sizeof base, &system) != 0 ||
        (slash = strrchr(base, '/')) == NULL) {
      buf[0] = '\0';
      return ql__err_set(QL_EINVAL, "no default address to put the admin "
                                    "socket beside");
    }
    *slash = '\0';
    /* The system service keeps it apart: <socket dir>-admin/admin.sock. */
    n = snprintf(buf, len,
                 system ? "%s-admin/admin.sock" : "%s/admin/admin.sock", base);
  }
  if (n < 0 || (size_t)n >= len) {
    buf[0] = '\0';
    return ql__err_set(QL_EINVAL, "the address does not fit %zu bytes", len);
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
int ql__probe_ipc(const char *address) {
  struct sockaddr_un sa;
  struct stat st;
  const char *path;
  int fd, rv = 0;

  if (strncmp(address, "ipc://", 6) != 0)
    return 0;
  path = address + 6;
  if (strlen(path) >= sizeof sa.sun_path)
    return ql__err_set(QL_EINVAL, "socket path %s is longer than %zu bytes",
                       path, sizeof sa.sun_path - 1);
  if (stat(path, &st) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return ql__err_set(QL_ECONNECT,
                         "no daemon socket at %s (is qlineard "
                         "running?)",
                         path);
    return ql__err_set(e == EACCES ? QL_EPERM : QL_ECONNECT, "%s: %s", path,
                       strerror(e));
  }
  if (!S_ISSOCK(st.st_mode))
    return ql__err_set(QL_ECONNECT, "%s is not a socket", path);

  /* Non-blocking, so that a full listen backlog does not block us: that
   * daemon exists and the request will wait for it. */
  if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
    return 0; /* cannot probe; let the request find out */
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    if (e == ECONNREFUSED)
      rv = ql__err_set(QL_ECONNECT,
                       "nothing listens on %s (a stopped daemon's "
                       "socket?)",
                       path);
    else if (e == EACCES || e == EPERM)
      rv = ql__err_set(QL_EPERM, "%s: %s", path, strerror(e));
    /* EAGAIN/EINPROGRESS and the rest: someone is there. */
  }
  close(fd);
  return rv;
}
