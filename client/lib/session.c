/*
 * session.c - libqlinear: Hello, the session socket and its fork handler,
 * ql_connect/ql_close/ql_hello.
 */
#include "internal.h"

/* Every client of the process, for the fork handler. */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static ql_client *all_clients;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------ hello */

void ql__copy_str(char *dst, size_t len, const char *src) {
  ql__copy_sanitized(dst, len, src != NULL ? src : "");
}

/* Copies a weight name, which the protocol limits to 255 bytes. */
int ql__copy_name(char *dst, const char *src, const char *what) {
  size_t len = src != NULL ? strlen(src) : 0;
  if (len == 0 || len >= QL_NAME_MAX)
    return ql__err_set(QL_EPROTO, "daemon sent a %s name of %zu bytes", what,
                       len);
  ql__copy_sanitized(dst, QL_NAME_MAX, src);
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
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_HELLO, c->timeout_ms,
                     &resp)) != 0)
    goto fail;

  const Qlinear__V1__HelloResponse *h = resp->hello;
  if (h->protocol_version != QL_PROTOCOL_VERSION) {
    rv = ql__err_set(QL_EVERSION, "daemon speaks protocol %u, this library %u",
                     h->protocol_version, QL_PROTOCOL_VERSION);
    goto fail;
  }
  if (h->instance_id.len != QL_INSTANCE_ID_BYTES) {
    rv = ql__err_set(QL_EPROTO, "instance id of %zu bytes, expected %d",
                     h->instance_id.len, QL_INSTANCE_ID_BYTES);
    goto fail;
  }
  /* Without a cap the client cannot keep messages small enough. */
  if (h->max_message_bytes == 0) {
    rv = ql__err_set(QL_EPROTO, "daemon announced no message cap");
    goto fail;
  }

  memset(&info, 0, sizeof info);
  info.protocol_version = h->protocol_version;
  ql__copy_str(info.daemon_version, sizeof info.daemon_version,
               h->daemon_version);
  memcpy(info.instance_id, h->instance_id.data, QL_INSTANCE_ID_BYTES);
  info.max_message_bytes = h->max_message_bytes;
  info.max_chunk_bytes = h->max_chunk_bytes;
  info.quantizer_version = h->quantizer_version ? h->quantizer_version : 1;
  info.n_devices_total = h->n_devices;
  for (size_t i = 0; i < h->n_devices && info.n_devices < QL_MAX_DEVICES; i++) {
    const Qlinear__V1__Device *d = h->devices[i];
    ql_device_info *o = &info.devices[info.n_devices++];
    if (d == NULL)
      continue;
    ql__copy_str(o->name, sizeof o->name, d->name);
    ql__copy_str(o->kind, sizeof o->kind, d->kind);
    ql__copy_str(o->alias, sizeof o->alias, d->alias);
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
    return ql__err_set(QL_EINVAL, "sessions need an ipc:// address, not %s",
                       address);
  path = address + 6;
  slash = strrchr(path, '/');
  size_t dirlen = slash != NULL ? (size_t)(slash - path) + 1 : 0;
  if (dirlen + sizeof "session.sock" > sizeof sa->sun_path)
    return ql__err_set(QL_EINVAL,
                       "the session socket path beside %s is longer "
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
      int64_t l = deadline - ql__now_ms();
      if (l <= 0)
        return ql__err_set(QL_ETIMEDOUT, "no session reply within %d ms",
                           timeout_ms);
      left = l > INT_MAX ? INT_MAX : (int)l;
    }
    struct pollfd p = {fd, events, 0};
    int n = poll(&p, 1, left);
    if (n > 0)
      return 0;
    if (n < 0 && errno != EINTR)
      return ql__err_set(ql__errno_from_sys(errno), "poll: %s", strerror(errno));
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
  uint8_t buf[QL_SESSION_MSG_MAX];
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
      return ql__err_set(ql__errno_from_sys(errno), "session socket: %s",
                         strerror(errno));
    int fd[2];
    take_fds(&mh, fd, 2);
    if (n == 0) {
      close_fds(fd);
      return ql__err_set(QL_ECONNECT, "the daemon closed the session");
    }
    Qlinear__V1__SessionResponse *r = NULL;
    if (!(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
      r = qlinear__v1__session_response__unpack(NULL, (size_t)n, buf);
    if (r == NULL) {
      close_fds(fd);
      return ql__err_set(QL_EPROTO,
                         "cannot decode the daemon's session reply "
                         "(%zd bytes)",
                         n);
    }
    /* Id 0 with an error: the daemon could not read the request (or
     * refused the connection before reading anything). */
    bool mine =
        r->request_id == id ||
        (r->request_id == 0 && r->status != NULL && r->status->code != 0);
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
                            Qlinear__V1__SessionResponse **out, int fd_out[2],
                            int send_fd);

/* ql__session_call(), with send_fd (when >= 0) passed along with the request
 * as SCM_RIGHTS; the caller keeps its descriptor. */
int ql__session_call_fd(ql_client *c, Qlinear__V1__SessionRequest *req,
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

int ql__session_call(ql_client *c, Qlinear__V1__SessionRequest *req,
                     Qlinear__V1__SessionResponse__BodyCase want,
                     Qlinear__V1__SessionResponse **out, int *fd_out) {
  return ql__session_call_fd(c, req, want, out, fd_out, -1);
}

/* The same, keeping the first two descriptors of the reply in fds[]. */
static int session_call2(ql_client *c, Qlinear__V1__SessionRequest *req,
                         Qlinear__V1__SessionResponse__BodyCase want,
                         Qlinear__V1__SessionResponse **out, int fds[2]) {
  return session_exchange(c, req, want, out, fds, -1);
}

static int session_exchange(ql_client *c, Qlinear__V1__SessionRequest *req,
                            Qlinear__V1__SessionResponse__BodyCase want,
                            Qlinear__V1__SessionResponse **out, int fd_out[2],
                            int send_fd) {
  uint8_t buf[QL_SESSION_MSG_MAX];
  Qlinear__V1__SessionResponse *r = NULL;
  int fd[2] = {-1, -1}, rv;
  int64_t deadline = c->timeout_ms >= 0 ? ql__now_ms() + c->timeout_ms : 0;

  *out = NULL;
  fd_out[0] = fd_out[1] = -1;
  pthread_mutex_lock(&c->sess_lock);
  if (c->sess_fd < 0) {
    rv = ql__err_set(QL_ESESSION, "this client has no session (it was opened "
                                  "by the parent of this process?)");
    goto done;
  }
  req->request_id = ++c->sess_next_id;
  size_t len = qlinear__v1__session_request__get_packed_size(req);
  if (len > sizeof buf) {
    rv = ql__err_set(QL_EINVAL, "session request of %zu bytes", len);
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
    if (session_recv(c, req->request_id, 0, ql__now_ms() + 100, &r, fd) == 0 &&
        r->status != NULL && r->status->code != 0) {
      rv = ql__status_error(r->status);
      goto done;
    }
    rv = ql__err_set(ql__errno_from_sys(e), "session socket: %s", strerror(e));
    goto done;
  }
  if ((rv = session_recv(c, req->request_id, c->timeout_ms, deadline, &r,
                         fd)) != 0)
    goto done;
  if (r->status != NULL && r->status->code != 0) {
    rv = ql__status_error(r->status);
    goto done;
  }
  if (r->body_case != want || r->open == NULL) {
    /* Every body of the oneof is a message pointer (as in ql__call()). */
    rv = ql__err_set(QL_EPROTO, "session reply has body %d, expected %d",
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
    return ql__err_set(ql__errno_from_sys(errno), "socket: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    close(fd);
    if (e == ENOENT || e == ECONNREFUSED)
      return ql__err_set(QL_ECONNECT,
                         "no session socket at %s (is qlineard "
                         "running?)",
                         sa.sun_path);
    return ql__err_set(ql__errno_from_sys(e), "%s: %s", sa.sun_path, strerror(e));
  }
  c->sess_fd = fd;
  op.protocol_version = QL_PROTOCOL_VERSION;
  op.client_name = c->client_name;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  req.open = &op;
  if ((rv = ql__session_call(c, &req, QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN,
                             &r, NULL)) != 0)
    return rv;
  if (r->open->token.len != QL_SESSION_TOKEN_BYTES) {
    qlinear__v1__session_response__free_unpacked(r, NULL);
    return ql__err_set(QL_EPROTO, "session token of %zu bytes, expected %d",
                       r->open->token.len, QL_SESSION_TOKEN_BYTES);
  }
  memcpy(c->token, r->open->token.data, QL_SESSION_TOKEN_BYTES);
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
  memcpy(saved, ql__errbuf, sizeof saved);
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
  memcpy(ql__errbuf, saved, sizeof saved);
}

/* ------------------------------------------------------------ lifecycle */

QL_EXPORT int ql_connect(const char *address, const ql_connect_opts *opts,
                         ql_client **out) {
  char defaddr[QL_ADDRESS_MAX];
  ql_client *c = NULL;
  int rv;

  ql__err_clear();
  if (out == NULL)
    return ql__err_set(QL_EINVAL, "out is NULL");
  *out = NULL;
  if (forked_child)
    return ql__err_set(QL_ENOTSUP, "this process was forked from one that had "
                                   "used libqlinear, and nanomsg does not "
                                   "survive fork(): exec a new program to "
                                   "connect");
  if (address == NULL) {
    if (ql_default_address(defaddr, sizeof defaddr) != 0)
      return ql__err_set(QL_EINVAL,
                         "the default address does not fit in %zu "
                         "bytes",
                         sizeof defaddr);
    address = defaddr;
  }
  if (address[0] == '\0')
    return ql__err_set(QL_EINVAL, "empty address");
  /* The daemon serves local sockets only: another transport would wait
   * for a connection that never comes. */
  if (strncmp(address, "ipc://", 6) != 0)
    return ql__err_set(QL_EINVAL,
                       "address %.200s: qlineard serves ipc:// "
                       "addresses only (it has no network "
                       "listener)",
                       address);

  if ((c = calloc(1, sizeof *c)) == NULL)
    return ql__err_set(QL_ENOMEM, "allocating the client");
  c->sess_fd = -1;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return ql__err_set(QL_ENOMEM, "initialising a mutex");
  }
  if (pthread_mutex_init(&c->sess_lock, NULL) != 0) {
    pthread_mutex_destroy(&c->lock);
    free(c);
    return ql__err_set(QL_ENOMEM, "initialising a mutex");
  }
  clients_add(c);
  c->timeout_ms = QL_DEFAULT_TIMEOUT_MS;
  if (opts != NULL && opts->timeout_ms != 0)
    c->timeout_ms = opts->timeout_ms < 0 ? -1 : opts->timeout_ms;
  c->address = strdup(address);
  c->client_name =
      strdup(opts != NULL && opts->client_name != NULL ? opts->client_name
                                                       : "libqlinear");
  if (c->address == NULL || c->client_name == NULL) {
    rv = ql__err_set(QL_ENOMEM, "allocating the client");
    goto fail;
  }

  if ((rv = ql__probe_ipc(c->address)) != 0)
    goto fail;
  if ((rv = do_hello(c, NULL)) != 0) {
    /* The daemon may have gone away while we waited: say so if it did. */
    if (rv == QL_ETIMEDOUT) {
      char saved[ERRBUF_SIZE];
      memcpy(saved, ql__errbuf, sizeof saved);
      int prv = ql__probe_ipc(c->address);
      if (prv != 0)
        rv = prv;
      else
        memcpy(ql__errbuf, saved, sizeof saved);
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
  ql__err_clear();
  if (c == NULL || out == NULL)
    return ql__err_set(QL_EINVAL, "client or output is NULL");
  return do_hello(c, out);
}

QL_EXPORT void ql_free(void *p) { free(p); }

QL_EXPORT void ql_stats_free(ql_stats_info *s) { free(s); }

QL_EXPORT const char *ql_errmsg(void) { return ql__errbuf; }
