/* transport.c - see transport.h. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "ql_errno.h"
#include "wire/route.h"
#include "wire/spframe.h"
#include "net/transport.h"

/* The loop-wide read buffer: a request that fits is parsed and handed to
 * its handler where read() put it. */
#define SCRATCH_BYTES (64 * 1024)
/* read() calls for one connection per wake-up, so one busy peer cannot
 * hold the loop (the poll is level-triggered: the rest comes next turn). */
#define READS_PER_WAKE 8
#define ACCEPT_BURST 64
#define ACCEPT_RETRY_MS 100
/* nanomsg's NN_RCVMAXSIZE counted the backtrace too; the daemon kept that
 * much room above the announced body cap. */
#define FRAME_SLACK 64

/* A reply waiting for the peer to read: data[off..len) is still to go. */
typedef struct outbuf {
  struct outbuf *next;
  size_t len, off;
  uint8_t data[];
} outbuf;

/* Connections per peer uid. */
typedef struct uid_count {
  struct uid_count *next;
  uid_t uid;
  unsigned n;
  size_t buffered; /* partial frames and queued replies of its connections */
} uid_count;

/*
 * One accepted connection. It lives until its poll handle is closed and
 * no route points at it any more: refs counts the handle (until its close
 * callback) and every route in flight. A closed connection is out of the
 * transport's lists and accounts, and never touches the transport again.
 */
typedef struct conn {
  ql__transport *t;
  int fd;
  uv_poll_t poll;
  int events; /* what poll watches now (0: stopped) */
  int closed;
  int refs;
  uint64_t id; /* for logs */
  pid_t pid;
  uid_t uid;
  uid_count *u; /* its uid's count; NULL once closed */
  ql__sp_parser parser;
  /* A frame that spans reads: in[0..in_len) of in_cap, and the bytes it
   * must reach before it parses further (in_need). NULL when none. */
  uint8_t *in;
  size_t in_len, in_cap, in_need;
  uint64_t rx_ms; /* loop time of the last bytes read */
  uint64_t tx_ms; /* of the last bytes written (or queued first) */
  outbuf *out_head, *out_tail;
  size_t out_bytes; /* queued reply bytes not yet written */
  struct conn *prev, *next;
} conn;

struct ql__transport {
  uv_loop_t *loop;
  int fd; /* listening */
  uv_poll_t poll;
  uv_timer_t retry; /* accepting again after EMFILE and the like */
  uv_timer_t sweep; /* frame_timeout_ms */
  int handles;      /* not yet closed; the memory goes with the last */
  int accepting;    /* poll on fd started */
  int paused;       /* accepting paused by a lack of descriptors */
  int stopped;      /* no new messages */
  int closing;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  ql__transport_limits lim;
  size_t max_out; /* queued reply bytes per connection */
  ql__on_message cb;
  void *arg;
  conn *conns;
  uid_count *uids;
  size_t buffered; /* partial frames and queued replies, all connections */
  uint64_t next_id;
  struct {
    uint64_t accepted;   /* connections accepted */
    uint64_t refused;    /* closed at once: a cap was reached */
    uint64_t malformed;  /* closed for a malformed stream */
    uint64_t timed_out;  /* closed by frame_timeout_ms */
    uint64_t overflowed; /* closed: reply or buffer bounds */
    unsigned open;       /* connections open now */
  } stats;
  uint8_t scratch[SCRATCH_BYTES];
};

/* A request's way back: its connection and its backtrace. */
typedef struct route {
  ql__route base; /* first: handlers see a ql__route */
  conn *c;
  size_t len;
  uint8_t bt[QL__SP_MAX_ROUTE];
} route;

/* ------------------------------------------------------------ lifetime */

static void conn_free(conn *c) {
  free(c->in);
  free(c);
}

static void conn_unref(conn *c) {
  if (--c->refs == 0)
    conn_free(c);
}

static void on_conn_closed(uv_handle_t *h) {
  conn *c = h->data;
  close(c->fd);
  conn_unref(c);
}

/* The most one uid's connections may buffer: uid_share of the total (all
 * of it without a share), at least the largest message. */
static size_t uid_bound(const ql__transport *t) {
  unsigned pct = t->lim.uid_share;
  if (pct == 0 || pct >= 100)
    return t->lim.max_buffered;
  size_t b = t->lim.max_buffered / 100 * pct +
             t->lim.max_buffered % 100 * pct / 100;
  return b > t->max_out ? b : t->max_out;
}

static uid_count *uid_find(ql__transport *t, uid_t uid) {
  for (uid_count *u = t->uids; u != NULL; u = u->next)
    if (u->uid == uid)
      return u;
  return NULL;
}

static void uid_release(ql__transport *t, uid_t uid) {
  for (uid_count **pu = &t->uids; *pu != NULL; pu = &(*pu)->next) {
    if ((*pu)->uid == uid) {
      if (--(*pu)->n == 0) {
        uid_count *u = *pu;
        *pu = u->next;
        free(u);
      }
      return;
    }
  }
}

/*
 * Takes c out of service: out of the lists and accounts, its queued
 * replies freed, its descriptor closed with its handle. The input buffer
 * stays until the last reference goes, since a caller up the stack may be
 * parsing it. Safe twice.
 */
static void conn_close(conn *c) {
  if (c->closed)
    return;
  ql__transport *t = c->t;
  c->closed = 1;
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    t->conns = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  t->stats.open--;
  t->buffered -= c->out_bytes + c->in_cap;
  c->u->buffered -= c->out_bytes + c->in_cap;
  c->u = NULL;
  uid_release(t, c->uid);
  for (outbuf *o = c->out_head, *next; o != NULL; o = next) {
    next = o->next;
    free(o);
  }
  c->out_head = c->out_tail = NULL;
  c->out_bytes = 0;
  c->in_cap = 0; /* no longer counted; freed with c */
  c->t = NULL;
  uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

/* Closes c for a reason logged at debug, counted in *counter. */
static void conn_fail(conn *c, uint64_t *counter, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void conn_fail(conn *c, uint64_t *counter, const char *fmt, ...) {
  char why[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  ql__debug("%s: connection %llu (pid %ld, uid %lu) closed: %s",
            c->t->path, (unsigned long long)c->id, (long)c->pid,
            (unsigned long)c->uid, why);
  if (counter != NULL)
    (*counter)++;
  conn_close(c);
}

static void on_conn(uv_poll_t *p, int status, int events);

/* Watches what c needs now: input unless the transport is stopped, the
 * socket's room while replies wait. */
static void conn_watch(conn *c) {
  int want = 0;
  if (!c->t->stopped)
    want |= UV_READABLE | UV_DISCONNECT;
  if (c->out_head != NULL)
    want |= UV_WRITABLE;
  if (want == c->events)
    return;
  c->events = want;
  if (want == 0)
    uv_poll_stop(&c->poll);
  else if (uv_poll_start(&c->poll, want, on_conn) != 0)
    conn_fail(c, NULL, "cannot poll its descriptor");
}

/* ------------------------------------------------------------- replies */

/* Writes what the socket takes of c's queue; 0, or -1 when c closed. */
static int conn_flush(conn *c) {
  while (c->out_head != NULL) {
    outbuf *o = c->out_head;
    ssize_t n = send(c->fd, o->data + o->off, o->len - o->off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      conn_fail(c, NULL, "send: %s", strerror(errno));
      return -1;
    }
    o->off += (size_t)n;
    c->out_bytes -= (size_t)n;
    c->t->buffered -= (size_t)n;
    c->u->buffered -= (size_t)n;
    c->tx_ms = uv_now(c->t->loop);
    if (o->off < o->len)
      break;
    c->out_head = o->next;
    if (c->out_head == NULL)
      c->out_tail = NULL;
    free(o);
  }
  conn_watch(c);
  return c->closed ? -1 : 0;
}

/*
 * Sends o (taken over) on c: at once when nothing waits before it, the
 * rest queued within the bounds, past which c is closed.
 */
static int conn_send(conn *c, outbuf *o) {
  ql__transport *t = c->t;
  if (c->out_head == NULL) {
    for (;;) {
      ssize_t n = send(c->fd, o->data, o->len, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        o->off = (size_t)n;
        break;
      }
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        break;
      conn_fail(c, NULL, "send: %s", strerror(errno));
      free(o);
      return QL_EIO;
    }
    if (o->off == o->len) {
      free(o);
      return 0;
    }
    c->tx_ms = uv_now(t->loop);
  }
  size_t left = o->len - o->off;
  if (c->out_bytes + left > t->max_out ||
      t->buffered + left > t->lim.max_buffered) {
    conn_fail(c, &t->stats.overflowed,
              "%zu reply bytes not read (bounds: %zu for a connection, %zu "
              "for all)", c->out_bytes + left, t->max_out,
              t->lim.max_buffered);
    free(o);
    return QL_EEXHAUSTED;
  }
  if (c->u->buffered + left > uid_bound(t)) {
    ql__notice("%s: uid %lu reached its share of the buffered bytes "
               "(uid_share): a reply of %zu bytes not queued",
               t->path, (unsigned long)c->uid, left);
    conn_fail(c, &t->stats.overflowed,
              "%zu reply bytes would pass uid %lu's share (%zu bytes) of "
              "the buffered bytes", left, (unsigned long)c->uid,
              uid_bound(t));
    free(o);
    return QL_EEXHAUSTED;
  }
  o->next = NULL;
  if (c->out_tail != NULL)
    c->out_tail->next = o;
  else
    c->out_head = o;
  c->out_tail = o;
  c->out_bytes += left;
  t->buffered += left;
  c->u->buffered += left;
  conn_watch(c);
  return 0;
}

static void route_free(route *rt) {
  conn_unref(rt->c);
  free(rt);
}

int ql__transport_reply(void *route_, const ql__msg_response *resp,
                        size_t *bytes_out) {
  route *rt = route_;
  conn *c = rt->c;
  int rc;
  if (c->closed) {
    ql__debug("reply dropped: its connection closed");
    rc = QL_ESHUTDOWN;
    goto done;
  }
  size_t body = qlinear__v1__response__get_packed_size(resp);
  size_t payload = rt->len + body;
  outbuf *o = malloc(sizeof *o + QL__SP_FRAME_BYTES + payload);
  if (o == NULL) {
    rc = QL_ENOMEM;
    goto done;
  }
  o->len = QL__SP_FRAME_BYTES + payload;
  o->off = 0;
  ql__sp_frame_header(o->data, payload);
  memcpy(o->data + QL__SP_FRAME_BYTES, rt->bt, rt->len);
  qlinear__v1__response__pack(resp, o->data + QL__SP_FRAME_BYTES + rt->len);
  if ((rc = conn_send(c, o)) == 0 && bytes_out != NULL)
    *bytes_out += body;
done:
  route_free(rt);
  return rc;
}

void ql__transport_drop(void *rt) {
  if (rt != NULL)
    route_free(rt);
}

static int route_reply(ql__route *rt, const ql__msg_response *resp,
                       size_t *bytes_out) {
  return ql__transport_reply(rt, resp, bytes_out);
}

static void route_drop(ql__route *rt) { ql__transport_drop(rt); }

static const ql__route_ops route_ops = {route_reply, route_drop, NULL, NULL,
                                        NULL};

/* -------------------------------------------------------------- input */

/* Hands one message to the callback with a route holding c. */
static void deliver(conn *c, const ql__sp_msg *m) {
  route *rt = malloc(sizeof *rt);
  if (rt == NULL) {
    /* Nowhere to answer from: the peer's REQ resends after its
     * interval. */
    ql__warn("request dropped: out of memory");
    return;
  }
  rt->base.ops = &route_ops;
  rt->c = c;
  rt->len = m->route_len;
  memcpy(rt->bt, m->route, m->route_len);
  c->refs++;
  c->t->cb(c->t->arg, m->body, m->body_len, rt);
}

/*
 * Makes c->in hold c->in_need bytes as they arrive: doubling from the
 * scratch size, never past the frame the parser accepted, within the
 * transport's total. -1 when c was closed instead.
 */
static int conn_grow(conn *c, size_t least) {
  ql__transport *t = c->t;
  if (c->in_cap >= least && c->in_cap > c->in_len)
    return 0;
  size_t cap = c->in_cap ? c->in_cap * 2 : SCRATCH_BYTES;
  if (cap < least)
    cap = least;
  if (cap > c->in_need && c->in_need >= least)
    cap = c->in_need;
  if (t->buffered - c->in_cap + cap > t->lim.max_buffered) {
    conn_fail(c, &t->stats.overflowed,
              "a frame of %zu bytes would pass the %zu bytes buffered for "
              "all connections", c->in_need, t->lim.max_buffered);
    return -1;
  }
  /* One user's half-sent frames cannot take what the others need. */
  if (c->u->buffered - c->in_cap + cap > uid_bound(t)) {
    ql__notice("%s: uid %lu reached its share of the buffered bytes "
               "(uid_share): a connection closed", t->path,
               (unsigned long)c->uid);
    conn_fail(c, &t->stats.overflowed,
              "a frame of %zu bytes would pass uid %lu's share (%zu bytes) "
              "of the bytes buffered for all connections", c->in_need,
              (unsigned long)c->uid, uid_bound(t));
    return -1;
  }
  uint8_t *in = realloc(c->in, cap);
  if (in == NULL) {
    conn_fail(c, &t->stats.overflowed, "no memory for a %zu-byte frame",
              c->in_need);
    return -1;
  }
  t->buffered = t->buffered - c->in_cap + cap;
  c->u->buffered = c->u->buffered - c->in_cap + cap;
  c->in = in;
  c->in_cap = cap;
  return 0;
}

static void conn_drop_input(conn *c) {
  c->t->buffered -= c->in_cap;
  if (c->u != NULL) /* (closed: in_cap is 0 already) */
    c->u->buffered -= c->in_cap;
  free(c->in);
  c->in = NULL;
  c->in_len = c->in_cap = 0;
}

/*
 * Parses buf[0..len) (the scratch buffer, or c->in) and delivers every
 * whole message in it; what is left of a frame moves to (or stays at the
 * front of) c->in. -1 when c closed or the transport stopped reading.
 */
static int consume(conn *c, const uint8_t *buf, size_t len) {
  ql__transport *t = c->t;
  size_t off = 0;
  for (;;) {
    ql__sp_msg m;
    size_t used, need;
    const char *why;
    int rc = ql__sp_parse(&c->parser, buf + off, len - off, &m, &used, &need,
                          &why);
    if (rc < 0) {
      conn_fail(c, &t->stats.malformed, "%s", why);
      return -1;
    }
    off += used;
    if (rc == QL__SP_MORE) {
      c->in_need = need;
      break;
    }
    deliver(c, &m);
    if (c->closed || t->stopped)
      return -1;
  }
  size_t left = len - off;
  if (buf != c->in) {
    if (left > 0) {
      if (conn_grow(c, left) != 0)
        return -1;
      memcpy(c->in, buf + off, left);
      c->in_len = left;
    }
  } else if (left == 0) {
    /* Idle connections hold no buffer. */
    conn_drop_input(c);
  } else if (off > 0) {
    memmove(c->in, c->in + off, left);
    c->in_len = left;
  }
  return 0;
}

static void conn_read(conn *c) {
  ql__transport *t = c->t;
  for (int i = 0; i < READS_PER_WAKE; i++) {
    uint8_t *dst = t->scratch;
    size_t room = sizeof t->scratch;
    if (c->in_len > 0) {
      if (conn_grow(c, c->in_len + 1) != 0)
        return;
      dst = c->in + c->in_len;
      room = c->in_cap - c->in_len;
    }
    ssize_t n = read(c->fd, dst, room);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        conn_fail(c, NULL, "read: %s", strerror(errno));
      return;
    }
    if (n == 0) {
      conn_fail(c, NULL, "closed by the peer");
      return;
    }
    c->rx_ms = uv_now(t->loop);
    int rc;
    if (dst == t->scratch) {
      rc = consume(c, t->scratch, (size_t)n);
    } else {
      c->in_len += (size_t)n;
      rc = consume(c, c->in, c->in_len);
    }
    if (rc != 0 || (size_t)n < room)
      return;
  }
}

static void on_conn(uv_poll_t *p, int status, int events) {
  conn *c = p->data;
  if (status < 0) {
    conn_fail(c, NULL, "poll: %s", uv_strerror(status));
    return;
  }
  if ((events & UV_WRITABLE) && conn_flush(c) != 0)
    return;
  if (events & (UV_READABLE | UV_DISCONNECT))
    conn_read(c);
}

/* ------------------------------------------------------------- accept */

/* A new connection: who it is, whether a cap refuses it, our protocol
 * header, then reading. */
static void conn_accept(ql__transport *t, int fd) {
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
      clen != sizeof cred) {
    ql__debug("%s: no peer credentials: %s", t->path, strerror(errno));
    close(fd);
    return;
  }
  uid_count *u = uid_find(t, cred.uid);
  if (t->stats.open >= t->lim.max_conns ||
      (u != NULL && u->n >= t->lim.max_conns_per_uid)) {
    ql__debug("%s: connection from pid %ld (uid %lu) refused: %u open, %u "
              "of that uid", t->path, (long)cred.pid,
              (unsigned long)cred.uid, t->stats.open, u ? u->n : 0);
    t->stats.refused++;
    close(fd);
    return;
  }
  conn *c = calloc(1, sizeof *c);
  if (c != NULL && u == NULL && (u = calloc(1, sizeof *u)) != NULL) {
    u->uid = cred.uid;
    u->next = t->uids;
    t->uids = u;
  }
  if (c == NULL || u == NULL || uv_poll_init(t->loop, &c->poll, fd) != 0) {
    ql__warn("%s: connection from pid %ld refused: out of memory", t->path,
             (long)cred.pid);
    free(c);
    close(fd);
    /* A count made for it alone goes again. */
    if (u != NULL && u->n == 0) {
      u->n = 1;
      uid_release(t, cred.uid);
    }
    return;
  }
  u->n++;
  c->t = t;
  c->fd = fd;
  c->refs = 1;
  c->id = ++t->next_id;
  c->pid = cred.pid;
  c->uid = cred.uid;
  c->u = u;
  c->poll.data = c;
  c->rx_ms = c->tx_ms = uv_now(t->loop);
  ql__sp_parser_init(&c->parser, QL__SP_PROTO_REQ,
                     (uint64_t)t->lim.max_msg + FRAME_SLACK);
  c->next = t->conns;
  if (t->conns != NULL)
    t->conns->prev = c;
  t->conns = c;
  t->stats.open++;
  t->stats.accepted++;
  ql__debug("%s: connection %llu from pid %ld (uid %lu)", t->path,
            (unsigned long long)c->id, (long)cred.pid,
            (unsigned long)cred.uid);
  outbuf *o = malloc(sizeof *o + QL__SP_HELLO_BYTES);
  if (o == NULL) {
    conn_fail(c, NULL, "out of memory");
    return;
  }
  o->len = QL__SP_HELLO_BYTES;
  o->off = 0;
  ql__sp_hello(o->data, QL__SP_PROTO_REP);
  if (conn_send(c, o) == 0 && !c->closed)
    conn_watch(c);
}

static void on_listen(uv_poll_t *p, int status, int events);

static void on_retry(uv_timer_t *tm) {
  ql__transport *t = tm->data;
  if (t->stopped || t->closing)
    return;
  if (uv_poll_start(&t->poll, UV_READABLE, on_listen) == 0)
    t->accepting = 1;
}

static void on_listen(uv_poll_t *p, int status, int events) {
  ql__transport *t = p->data;
  (void)events;
  if (status < 0) {
    ql__err("%s: poll failed: %s", t->path, uv_strerror(status));
    return;
  }
  for (int i = 0; i < ACCEPT_BURST; i++) {
    int fd = accept4(t->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (t->paused) {
        ql__notice("%s: accepting connections again", t->path);
        t->paused = 0;
      }
      conn_accept(t, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return;
    /* Out of descriptors or memory: the poll is level-triggered, so pause
     * rather than spin, and try again while connections come and go. */
    if (!t->paused)
      ql__warn("%s: cannot accept connections: %s; retrying every %d ms",
               t->path, strerror(errno), ACCEPT_RETRY_MS);
    t->paused = 1;
    uv_poll_stop(&t->poll);
    t->accepting = 0;
    uv_timer_start(&t->retry, on_retry, ACCEPT_RETRY_MS, 0);
    return;
  }
}

/* Closes the connections whose partial frame, protocol header or unread
 * reply has waited past frame_timeout_ms. */
static void on_sweep(uv_timer_t *tm) {
  ql__transport *t = tm->data;
  uint64_t now = uv_now(t->loop), lim = t->lim.frame_timeout_ms;
  for (conn *c = t->conns, *next; c != NULL; c = next) {
    next = c->next;
    if ((c->in_len > 0 || !c->parser.greeted) && now - c->rx_ms > lim)
      conn_fail(c, &t->stats.timed_out, "%s incomplete for %llu ms",
                c->parser.greeted ? "a frame" : "the protocol header",
                (unsigned long long)lim);
    else if (c->out_head != NULL && now - c->tx_ms > lim)
      conn_fail(c, &t->stats.timed_out, "%zu reply bytes unread for %llu ms",
                c->out_bytes, (unsigned long long)lim);
  }
}

/* ---------------------------------------------------------- the socket */

static void on_handle_closed(uv_handle_t *h) {
  ql__transport *t = h->data;
  if (--t->handles == 0)
    free(t);
}

int ql__transport_open(uv_loop_t *loop, const char *address,
                       const ql__transport_limits *lim, ql__on_message cb,
                       void *arg, ql__transport **out) {
  int rc;
  *out = NULL;
  const char *path = strncmp(address, "ipc://", 6) == 0 ? address + 6 : address;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path || lim->max_conns == 0 ||
      lim->max_conns_per_uid == 0 || lim->frame_timeout_ms == 0) {
    ql__err("cannot listen at %s: %s", path,
            strlen(path) >= sizeof sa.sun_path ? "path too long"
                                               : "invalid limits");
    return QL_EINVAL;
  }
  strcpy(sa.sun_path, path);
  ql__transport *t = calloc(1, sizeof *t);
  if (t == NULL)
    return QL_ENOMEM;
  t->loop = loop;
  t->lim = *lim;
  t->max_out = 2 * (lim->max_msg + FRAME_SLACK + QL__SP_FRAME_BYTES +
                    QL__SP_MAX_ROUTE);
  if (t->lim.max_buffered < t->max_out)
    t->lim.max_buffered = t->max_out;
  t->cb = cb;
  t->arg = arg;
  strcpy(t->path, path);
  int bound = 0;
  t->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (t->fd >= 0 && bind(t->fd, (struct sockaddr *)&sa, sizeof sa) == 0)
    bound = 1;
  if (!bound || listen(t->fd, SOMAXCONN) != 0) {
    int e = errno;
    rc = ql__errno_from_sys(e);
    ql__err("cannot listen at %s: %s", path, strerror(e));
    goto fail;
  }
  if (uv_poll_init(loop, &t->poll, t->fd) != 0) {
    ql__err("cannot listen at %s: cannot poll its descriptor", path);
    rc = QL_EINTERNAL;
    goto fail;
  }
  /* From here the handles free t in their close callbacks. */
  uv_timer_init(loop, &t->retry);
  uv_timer_init(loop, &t->sweep);
  t->poll.data = t->retry.data = t->sweep.data = t;
  t->handles = 3;
  uint64_t every = t->lim.frame_timeout_ms / 4;
  every = every < 10 ? 10 : every > 1000 ? 1000 : every;
  if (uv_poll_start(&t->poll, UV_READABLE, on_listen) != 0 ||
      uv_timer_start(&t->sweep, on_sweep, every, every) != 0) {
    ql__err("cannot listen at %s: cannot poll its descriptor", path);
    ql__transport_close(t);
    return QL_EINTERNAL;
  }
  /* The sweep must not keep the loop alive on its own. */
  uv_unref((uv_handle_t *)&t->sweep);
  t->accepting = 1;
  *out = t;
  return 0;
fail:
  if (t->fd >= 0)
    close(t->fd);
  if (bound)
    unlink(path);
  free(t);
  return rc;
}

void ql__transport_stop(ql__transport *t) {
  if (t == NULL || t->stopped)
    return;
  t->stopped = 1;
  if (t->accepting)
    uv_poll_stop(&t->poll);
  t->accepting = 0;
  uv_timer_stop(&t->retry);
  for (conn *c = t->conns, *next; c != NULL; c = next) {
    next = c->next;
    conn_watch(c);
  }
}

void ql__transport_counts_get(const ql__transport *t,
                              ql__transport_counts *out) {
  memset(out, 0, sizeof *out);
  if (t == NULL)
    return;
  out->accepted = t->stats.accepted;
  out->refused = t->stats.refused;
  out->malformed = t->stats.malformed;
  out->timed_out = t->stats.timed_out;
  out->overflowed = t->stats.overflowed;
  out->open = t->stats.open;
}

void ql__transport_close(ql__transport *t) {
  if (t == NULL || t->closing)
    return;
  ql__transport_stop(t);
  t->closing = 1;
  if (t->stats.refused + t->stats.malformed + t->stats.timed_out +
          t->stats.overflowed > 0)
    ql__notice("%s: %llu connections; closed: %llu past a cap, %llu "
               "malformed, %llu timed out, %llu past a buffer bound",
               t->path, (unsigned long long)t->stats.accepted,
               (unsigned long long)t->stats.refused,
               (unsigned long long)t->stats.malformed,
               (unsigned long long)t->stats.timed_out,
               (unsigned long long)t->stats.overflowed);
  while (t->conns != NULL)
    conn_close(t->conns);
  while (t->uids != NULL) {
    uid_count *u = t->uids;
    t->uids = u->next;
    free(u);
  }
  /* The handles first: the poll watches the descriptor. */
  uv_close((uv_handle_t *)&t->poll, on_handle_closed);
  uv_close((uv_handle_t *)&t->retry, on_handle_closed);
  uv_close((uv_handle_t *)&t->sweep, on_handle_closed);
  close(t->fd);
  unlink(t->path);
}
