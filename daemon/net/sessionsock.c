/* sessionsock.c - see sessionsock.h. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "wire/protocol.h"
#include "net/sessionsock.h"

/* Packets handled per wake-up of one connection, so that a chatty client
 * does not starve the others (the poll is level-triggered); also the
 * connections accepted per wake-up of the listener. */
#define BURST 32
/* After EMFILE the listener pauses this long instead of spinning. */
#define ACCEPT_RETRY_MS 100

struct ql__sconn {
  int fd;
  uv_poll_t poll;
  ql__sessionsock *ls;
  uid_t uid;    /* SO_PEERCRED at accept, for the per-uid bound */
  int closing;  /* out of the list; the handle is closing */
  void *data;   /* the caller's (ql__sconn_set_data) */
  ql__sconn *next; /* every open connection */
};

struct ql__sessionsock {
  uv_loop_t *loop;
  const ql__sessionsock_ops *ops;
  void *arg;
  ql__sessionsock_limits lim;
  int fd; /* the listening socket */
  uv_poll_t poll;
  uv_timer_t retry;
  char path[PATH_MAX];
  ql__sconn *list;
  size_t count;
  int closing_handles; /* close callbacks still to come */
};

/*
 * Sends one SessionResponse on sock, with fd and fd2 as SCM_RIGHTS where
 * >= 0. Never blocks: a client that does not read its replies until its
 * socket buffer is full has its connection ended by the caller.
 */
static int send_packet(int sock, const ql__msg_session_response *resp,
                       int fd, int fd2) {
  uint8_t buf[QL_SESSION_MSG_MAX];
  size_t len = qlinear__v1__session_response__get_packed_size(resp);
  if (len > sizeof buf)
    return QL_EIO; /* cannot happen: every field is bounded */
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
  return n == (ssize_t)len ? 0 : QL_EIO;
}

/* A response with a status and no body. */
static int send_status(int sock, uint64_t request_id, int code,
                       const char *msg) {
  ql__msg_session_response resp;
  Qlinear__V1__Status st;
  qlinear__v1__session_response__init(&resp);
  qlinear__v1__status__init(&st);
  st.code = code;
  st.message = (char *)(msg && *msg ? msg : ql_strerror(code));
  resp.request_id = request_id;
  resp.status = &st;
  return send_packet(sock, &resp, -1, -1);
}

int ql__sessionsock_send(ql__sconn *c, const ql__msg_session_response *resp,
                         int fd, int fd2) {
  if (c->closing)
    return QL_EIO;
  return send_packet(c->fd, resp, fd, fd2);
}

int ql__sessionsock_send_status(ql__sconn *c, uint64_t request_id, int code,
                                const char *msg) {
  if (c->closing)
    return QL_EIO;
  return send_status(c->fd, request_id, code, msg);
}

void ql__sconn_set_data(ql__sconn *c, void *data) { c->data = data; }

void *ql__sconn_get_data(const ql__sconn *c) { return c->data; }

static void on_conn_closed(uv_handle_t *h) {
  ql__sconn *c = h->data;
  close(c->fd);
  free(c);
}

/* Takes c out of the list and closes its handle; the descriptor and the
 * memory go in the close callback. */
static void conn_close(ql__sconn *c) {
  ql__sessionsock *ls = c->ls;
  if (c->closing)
    return;
  c->closing = 1;
  for (ql__sconn **pp = &ls->list; *pp; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  }
  ls->count--;
  uv_close((uv_handle_t *)&c->poll, on_conn_closed);
}

void ql__sconn_close(ql__sconn *c) { conn_close(c); }

/* c ended by itself: it closes, then the caller hears of it (c's memory
 * stays until the close callback). */
static void conn_end(ql__sconn *c, const char *why) {
  ql__sessionsock *ls = c->ls;
  if (c->closing)
    return;
  conn_close(c);
  ls->ops->closed(ls->arg, c, why);
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

static void on_conn(uv_poll_t *p, int status, int events) {
  ql__sconn *c = p->data;
  ql__sessionsock *ls = c->ls;
  if (status < 0) {
    conn_end(c, uv_strerror(status));
    return;
  }
  if (events & UV_READABLE) {
    for (int i = 0; i < BURST && !c->closing; i++) {
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
      ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
      if (n >= 0)
        rfd = take_fd(&mh);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        break;
      if (n < 0) {
        conn_end(c, strerror(errno));
        return;
      }
      if (n == 0) { /* also what an empty packet looks like */
        if (rfd >= 0)
          close(rfd);
        conn_end(c, "the client closed its socket");
        return;
      }
      if ((mh.msg_flags & MSG_TRUNC) || (size_t)n > QL_SESSION_MSG_MAX) {
        if (rfd >= 0)
          close(rfd);
        if (send_status(c->fd, 0, QL_ETOOBIG, "session packet larger than "
                        "4096 bytes") != 0) {
          conn_end(c, "a reply could not be sent");
          return;
        }
        continue;
      }
      if (ls->ops->packet(ls->arg, c, buf, (size_t)n, rfd) != 0)
        return;
    }
  }
  if ((events & UV_DISCONNECT) && !c->closing)
    conn_end(c, "the client closed its socket");
}

/* A new connection: record who it is, check the bounds, start reading and
 * hand it up. Over a bound it gets one error packet and is closed. */
static void conn_accept(ql__sessionsock *ls, int fd) {
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
      clen != sizeof cred) {
    ql__warn("session: no peer credentials: %s", strerror(errno));
    close(fd);
    return;
  }
  if (ls->count >= ls->lim.max_conns) {
    ql__warn("session from pid %ld refused: %u sessions are open",
             (long)cred.pid, ls->lim.max_conns);
    send_status(fd, 0, QL_EEXHAUSTED, "too many sessions are open");
    close(fd);
    return;
  }
  /* One user cannot take every session from the others. */
  unsigned mine = 0;
  for (const ql__sconn *it = ls->list; it != NULL; it = it->next)
    mine += it->uid == cred.uid;
  if (mine >= ls->lim.max_conns_per_uid) {
    ql__warn("session from pid %ld refused: uid %lu has %u sessions open",
             (long)cred.pid, (unsigned long)cred.uid, mine);
    send_status(fd, 0, QL_EEXHAUSTED,
                "too many sessions are open for this user");
    close(fd);
    return;
  }
  ql__sconn *c = calloc(1, sizeof *c);
  if (c == NULL) {
    ql__err("session from pid %ld refused: out of memory", (long)cred.pid);
    send_status(fd, 0, QL_ENOMEM, NULL);
    close(fd);
    return;
  }
  c->fd = fd;
  c->ls = ls;
  c->uid = cred.uid;
  c->poll.data = c;
  if (uv_poll_init(ls->loop, &c->poll, fd) != 0) {
    free(c);
    close(fd);
    return;
  }
  /* Closing from here on goes through conn_close, which unlinks it. */
  c->next = ls->list;
  ls->list = c;
  ls->count++;
  if (uv_poll_start(&c->poll, UV_READABLE | UV_DISCONNECT, on_conn) != 0) {
    conn_close(c);
    return;
  }
  int rc = ls->ops->accepted(ls->arg, c, &cred);
  if (rc != 0) {
    send_status(fd, 0, rc, NULL);
    conn_close(c);
  }
}

static void on_retry(uv_timer_t *t);

static void on_listen(uv_poll_t *p, int status, int events) {
  ql__sessionsock *ls = p->data;
  (void)events;
  if (status < 0) {
    ql__err("session socket poll failed: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < BURST; i++) {
    int fd = accept4(ls->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      conn_accept(ls, fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED)
      continue;
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
        errno == ENOMEM) {
      /* The poll is level-triggered: pause rather than spin. */
      ql__warn("cannot accept sessions: %s", strerror(errno));
      uv_poll_stop(&ls->poll);
      uv_timer_start(&ls->retry, on_retry, ACCEPT_RETRY_MS, 0);
    }
    return;
  }
}

static void on_retry(uv_timer_t *t) {
  ql__sessionsock *ls = t->data;
  uv_poll_start(&ls->poll, UV_READABLE, on_listen);
}

static void on_listener_closed(uv_handle_t *h) {
  ql__sessionsock *ls = h->data;
  if (--ls->closing_handles > 0)
    return;
  if (ls->fd >= 0)
    close(ls->fd);
  free(ls);
}

int ql__sessionsock_open(uv_loop_t *loop, const char *path,
                         const ql__sessionsock_limits *lim,
                         const ql__sessionsock_ops *ops, void *arg,
                         ql__sessionsock **out) {
  struct sockaddr_un sa;
  int rc = QL_EIO;
  if (strlen(path) >= sizeof sa.sun_path) {
    ql__err("session socket path too long: %s", path);
    return QL_EINVAL;
  }
  ql__sessionsock *ls = calloc(1, sizeof *ls);
  if (ls == NULL) {
    ql__err("cannot open the session socket: out of memory");
    return QL_ENOMEM;
  }
  ls->loop = loop;
  ls->ops = ops;
  ls->arg = arg;
  ls->lim = *lim;
  ls->fd = -1;
  snprintf(ls->path, sizeof ls->path, "%s", path);
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  strcpy(sa.sun_path, ls->path);
  ls->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ls->fd < 0)
    goto fail;
  /* The caller owns the directory now (the request socket is bound), so
   * a file here is a leftover of a daemon that died. */
  unlink(ls->path);
  mode_t um = umask(0117); /* born 0660, as the request socket */
  int bound = bind(ls->fd, (struct sockaddr *)&sa, sizeof sa);
  umask(um);
  if (bound != 0 || listen(ls->fd, 128) != 0)
    goto fail;
  /* As for the request socket: the directory's group is the access
   * boundary, so the socket is group-writable whatever the umask. */
  if (chmod(ls->path, 0660) != 0)
    ql__warn("chmod %s: %s", ls->path, strerror(errno));
  if (uv_poll_init(loop, &ls->poll, ls->fd) != 0) {
    rc = QL_EINTERNAL;
    goto fail;
  }
  uv_timer_init(loop, &ls->retry);
  ls->poll.data = ls->retry.data = ls;
  if (uv_poll_start(&ls->poll, UV_READABLE, on_listen) != 0) {
    ql__err("cannot poll %s", ls->path);
    unlink(ls->path);
    ls->closing_handles = 2;
    uv_close((uv_handle_t *)&ls->poll, on_listener_closed);
    uv_close((uv_handle_t *)&ls->retry, on_listener_closed);
    return QL_EINTERNAL;
  }
  *out = ls;
  ql__notice("sessions at %s", ls->path);
  return 0;
fail:
  ql__err("cannot listen at %s: %s", ls->path, strerror(errno));
  if (ls->fd >= 0) {
    close(ls->fd);
    unlink(ls->path);
  }
  free(ls);
  return rc;
}

void ql__sessionsock_close(ql__sessionsock *ls) {
  if (ls == NULL)
    return;
  while (ls->list != NULL)
    conn_end(ls->list, "the daemon is stopping");
  unlink(ls->path);
  ls->closing_handles = 2;
  uv_close((uv_handle_t *)&ls->poll, on_listener_closed);
  uv_close((uv_handle_t *)&ls->retry, on_listener_closed);
}
