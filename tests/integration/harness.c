/* harness.c - see harness.h. */
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "harness.h"
#include "testutil.h"

int td_fix_crossover = 1;

/* What td_hand_over() set for the next daemon: -1, none. */
static int hand_fd = -1;
static const char *hand_names;

void td_hand_over(int fd, const char *names) {
  hand_fd = fd;
  hand_names = names;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The daemon is ready once its socket accepts a connection. */
static int socket_accepts(const char *path) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path)
    return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0)
    return 0;
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

/* Forks and runs $QLINEARD on socket directory dir (NULL: a fresh private
 * one) with the harness's arguments and args, its stderr to d->log. */
static void spawn_daemon(td *d, const char *dir, const char *const *args) {
  const char *bin = getenv("QLINEARD");
  ck_assert_msg(bin != NULL, "QLINEARD is not set (run through make check)");
  memset(d, 0, sizeof *d);
  if (dir == NULL) {
    snprintf(d->dir, sizeof d->dir, "/tmp/ql-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->dir));
    chmod(d->dir, 0700);
    d->own_dir = 1;
  } else {
    ck_assert_uint_lt(strlen(dir), sizeof d->dir);
    snprintf(d->dir, sizeof d->dir, "%s", dir);
  }
  snprintf(d->address, sizeof d->address, "ipc://%s/qlineard.sock", d->dir);
  snprintf(d->session, sizeof d->session, "%s/session.sock", d->dir);
  snprintf(d->admin, sizeof d->admin, "ipc://%s/admin/admin.sock", d->dir);
  d->sess.fd = -1;
  /* beside the directory, never in it: a test may fill its file system */
  snprintf(d->log, sizeof d->log, "%s.log", d->dir);
  const char *argv[32];
  int n = 0;
  argv[n++] = bin;
  argv[n++] = "--socket-dir";
  argv[n++] = d->dir;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  /* No crossover measurement in the background of every test (it would
   * compete for the CPU with what a test times): tests of it pass
   * --crossover-rows 0, which comes later and wins, or clear
   * td_fix_crossover to set it in a config file (the command line would
   * win there, at reloads too). */
  if (td_fix_crossover) {
    argv[n++] = "--crossover-rows";
    argv[n++] = "16";
  }
  for (int i = 0; args && args[i] && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  int give = hand_fd;
  const char *give_names = hand_names;
  hand_fd = -1; /* for this daemon only */
  d->pid = fork();
  ck_assert_int_ge(d->pid, 0);
  if (d->pid == 0) {
    /* A failed test ends its process early: take the daemon with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* systemd's way (sd_listen_fds(3)): descriptor 3, and LISTEN_PID
     * naming the process that execs, before the log's descriptor is
     * opened (it could be 3). */
    if (give >= 0) {
      char pid[24];
      if (give == 3 ? fcntl(3, F_SETFD, 0) != 0 : dup2(give, 3) != 3)
        _exit(126);
      snprintf(pid, sizeof pid, "%ld", (long)getpid());
      setenv("LISTEN_PID", pid, 1);
      setenv("LISTEN_FDS", "1", 1);
      if (give_names != NULL)
        setenv("LISTEN_FDNAMES", give_names, 1);
      else
        unsetenv("LISTEN_FDNAMES");
    }
    int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
    execv(bin, (char *const *)argv);
    _exit(127);
  }
}

/* Waits until the daemon serves (0) or exits: then its exit status, -1
 * if by a signal; -1 too if it does neither within 20 s. */
static int wait_serving(td *d) {
  char path[300];
  snprintf(path, sizeof path, "%s/qlineard.sock", d->dir);
  for (int i = 0; i < 1000; i++) {
    /* session.sock comes right after qlineard.sock, admin.sock last. */
    if (socket_accepts(path) && access(d->admin + 6, F_OK) == 0 &&
        td_session_open(d, &d->sess) == 0)
      return 0;
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    sleep_ms(20);
  }
  return -1;
}

void td_start_in(td *d, const char *dir, const char *const *args) {
  spawn_daemon(d, dir, args);
  int rc = wait_serving(d);
  ck_assert_msg(rc == 0 || d->pid != 0, "qlineard exited at start (see %s)",
                d->log);
  ck_assert_msg(rc == 0, "qlineard did not start listening");
}

void td_start(td *d, const char *const *args) { td_start_in(d, NULL, args); }

int td_start_or_exit(td *d, const char *dir, const char *const *args,
                     char *log, size_t len) {
  spawn_daemon(d, dir, args);
  int rc = wait_serving(d);
  if (rc == 0)
    return 0;
  if (d->pid != 0) {
    /* neither served nor exited */
    int st;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &st, 0);
    d->pid = 0;
  }
  FILE *f = fopen(d->log, "r");
  size_t n = f ? fread(log, 1, len - 1, f) : 0;
  log[n] = '\0';
  if (f)
    fclose(f);
  unlink(d->log);
  if (d->own_dir)
    rmdir(d->dir);
  return rc;
}

int td_alive(td *d) {
  if (d->pid <= 0)
    return 0;
  int st;
  return waitpid(d->pid, &st, WNOHANG) == 0;
}

void td_kill(td *d, int sig) {
  if (d->pid > 0)
    kill(d->pid, sig);
}

int td_wait(td *d, int timeout_ms) {
  int status = -1, st;
  if (d->pid > 0) {
    for (int i = 0; i < timeout_ms / 10 + 1; i++) {
      pid_t r = waitpid(d->pid, &st, WNOHANG);
      if (r == d->pid) {
        status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        break;
      }
      sleep_ms(10);
    }
    if (status == -1 && kill(d->pid, SIGKILL) == 0)
      waitpid(d->pid, &st, 0);
    d->pid = 0;
  }
  td_session_close(&d->sess);
  char path[300];
  snprintf(path, sizeof path, "%s/qlineard.sock", d->dir);
  unlink(path);
  unlink(d->session);
  snprintf(path, sizeof path, "%s/admin/admin.sock", d->dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/admin", d->dir);
  rmdir(path);
  if (d->own_dir)
    rmdir(d->dir);
  if (status != 0) {
    /* Show the daemon's log when it did not stop cleanly. */
    FILE *f = fopen(d->log, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
      fputs(line, stderr);
    if (f)
      fclose(f);
  }
  unlink(d->log);
  return status;
}

int td_stop(td *d) {
  td_kill(d, SIGTERM);
  return td_wait(d, 20000);
}

static Qlinear__V1__Response *call_bytes_at(const char *address,
                                            const void *buf, size_t len,
                                            int timeout_ms) {
  int s = nn_socket(AF_SP, NN_REQ);
  ck_assert_int_ge(s, 0);
  int resend = 3600 * 1000;
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
  nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend);
  ck_assert_int_ge(nn_connect(s, address), 0);
  Qlinear__V1__Response *resp = NULL;
  if (nn_send(s, buf, len, 0) == (int)len) {
    void *msg = NULL;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    if (n >= 0) {
      resp = qlinear__v1__response__unpack(NULL, (size_t)n, msg);
      ck_assert_msg(resp != NULL, "daemon sent an undecodable reply");
      nn_freemsg(msg);
    }
  }
  nn_close(s);
  return resp;
}

Qlinear__V1__Response *td_call_bytes(const td *d, const void *buf, size_t len,
                                     int timeout_ms) {
  return call_bytes_at(d->address, buf, len, timeout_ms);
}

Qlinear__V1__Response *td_call_admin(const td *d,
                                     const Qlinear__V1__Request *req,
                                     int timeout_ms) {
  size_t len = qlinear__v1__request__get_packed_size(req);
  uint8_t *buf = tu_xmalloc(len ? len : 1);
  qlinear__v1__request__pack(req, buf);
  Qlinear__V1__Response *resp = call_bytes_at(d->admin, buf, len, timeout_ms);
  free(buf);
  return resp;
}

Qlinear__V1__Response *td_call_as(const td *d, const td_session *s,
                                  const Qlinear__V1__Request *req,
                                  int timeout_ms) {
  /* A shallow copy: packing only reads what it points to. */
  Qlinear__V1__Request r = *req;
  if (r.session_token.len == 0 && s != NULL && s->fd >= 0) {
    r.session_token.data = (uint8_t *)s->token;
    r.session_token.len = sizeof s->token;
  }
  size_t len = qlinear__v1__request__get_packed_size(&r);
  uint8_t *buf = tu_xmalloc(len ? len : 1);
  qlinear__v1__request__pack(&r, buf);
  Qlinear__V1__Response *resp = td_call_bytes(d, buf, len, timeout_ms);
  free(buf);
  return resp;
}

Qlinear__V1__Response *td_call(const td *d, const Qlinear__V1__Request *req,
                               int timeout_ms) {
  return td_call_as(d, &d->sess, req, timeout_ms);
}

/* ------------------------------------------------------------- sessions */

Qlinear__V1__SessionResponse *td_session_call(
    td_session *s, Qlinear__V1__SessionRequest *req, int *fd_out,
    int timeout_ms) {
  return td_session_call_fd(s, req, -1, fd_out, timeout_ms);
}

/* The exchange behind td_session_call_fd() and td_session_call_fds():
 * keeps the first nkeep descriptors of the reply in keep[]. */
static Qlinear__V1__SessionResponse *session_call_n(
    td_session *s, Qlinear__V1__SessionRequest *req, int send_fd, int *keep,
    int nkeep, int timeout_ms) {
  uint8_t buf[4096];
  int kept = 0;
  for (int i = 0; i < nkeep; i++)
    keep[i] = -1;
  req->request_id = ++s->next_id;
  size_t len = qlinear__v1__session_request__get_packed_size(req);
  ck_assert_uint_le(len, sizeof buf);
  qlinear__v1__session_request__pack(req, buf);
  struct iovec siov = {buf, len};
  struct msghdr smh;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } sctl;
  memset(&smh, 0, sizeof smh);
  smh.msg_iov = &siov;
  smh.msg_iovlen = 1;
  if (send_fd >= 0) {
    memset(&sctl, 0, sizeof sctl);
    smh.msg_control = sctl.buf;
    smh.msg_controllen = sizeof sctl.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&smh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &send_fd, sizeof send_fd);
  }
  /* A daemon that refused the connection (too many sessions) sent its
   * reason and closed: the send fails, the reason is still there. */
  if (sendmsg(s->fd, &smh, MSG_NOSIGNAL) != (ssize_t)len)
    timeout_ms = 100;
  struct pollfd p = {s->fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1)
    return NULL;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(4 * sizeof(int))];
  } ctl;
  struct iovec iov = {buf, sizeof buf};
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl.buf;
  mh.msg_controllen = sizeof ctl.buf;
  ssize_t n = recvmsg(s->fd, &mh, MSG_CMSG_CLOEXEC);
  /* A daemon that closed with our packet unread (a refused connection)
   * makes the kernel report ECONNRESET once, ahead of its reply. */
  if (n < 0 && errno == ECONNRESET)
    n = recvmsg(s->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n >= 0 && c != NULL;
       c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (kept < nkeep)
        keep[kept++] = fd;
      else
        close(fd);
    }
  }
  if (n <= 0)
    return NULL;
  Qlinear__V1__SessionResponse *r =
      qlinear__v1__session_response__unpack(NULL, (size_t)n, buf);
  ck_assert_msg(r != NULL, "daemon sent an undecodable session reply");
  return r;
}

Qlinear__V1__SessionResponse *td_session_call_fd(
    td_session *s, Qlinear__V1__SessionRequest *req, int send_fd,
    int *fd_out, int timeout_ms) {
  return session_call_n(s, req, send_fd, fd_out, fd_out != NULL ? 1 : 0,
                        timeout_ms);
}

Qlinear__V1__SessionResponse *td_session_call_fds(
    td_session *s, Qlinear__V1__SessionRequest *req, int fds[2],
    int timeout_ms) {
  return session_call_n(s, req, -1, fds, 2, timeout_ms);
}

int td_session_connect(const td *d) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  ck_assert_uint_lt(strlen(d->session), sizeof sa.sun_path);
  memcpy(sa.sun_path, d->session, strlen(d->session) + 1);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fd, 0);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int td_session_open(const td *d, td_session *s) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  int fd = td_session_connect(d);
  if (fd < 0)
    return QL_ECONNECT;
  s->fd = fd;
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__SessionOpenRequest op;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__session_open_request__init(&op);
  op.protocol_version = QL_PROTOCOL_VERSION;
  op.client_name = "harness";
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  req.open = &op;
  Qlinear__V1__SessionResponse *r = td_session_call(s, &req, NULL, 5000);
  int rc = r == NULL ? QL_ETIMEDOUT : r->status ? r->status->code : 0;
  if (rc == 0) {
    ck_assert_int_eq(r->body_case, QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN);
    ck_assert_uint_eq(r->open->token.len, sizeof s->token);
    memcpy(s->token, r->open->token.data, sizeof s->token);
    s->max_regions = r->open->max_regions;
    s->max_region_bytes = r->open->max_region_bytes;
  } else {
    td_session_close(s);
  }
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return rc;
}

void td_session_close(td_session *s) {
  if (s->fd >= 0)
    close(s->fd);
  s->fd = -1;
}

int td_region_create(td_session *s, uint64_t size, uint64_t *id, int *fd) {
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__CreateRegionRequest cr;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__create_region_request__init(&cr);
  cr.size = size;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
  req.create_region = &cr;
  *id = 0;
  *fd = -1;
  int rfd = -1;
  Qlinear__V1__SessionResponse *r = td_session_call(s, &req, &rfd, 5000);
  ck_assert_msg(r != NULL, "no reply to create_region");
  int rc = r->status ? r->status->code : 0;
  if (rc == 0) {
    ck_assert_int_eq(r->body_case,
                     QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION);
    ck_assert_uint_eq(r->create_region->size, size);
    ck_assert_int_ge(rfd, 0);
    *id = r->create_region->region_id;
    *fd = rfd;
    /* Its pages are the client's to populate, as libqlinear does: the
     * daemon refuses requests on pages nobody wrote. */
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
    ck_assert_ptr_ne(p, MAP_FAILED);
    ck_assert_int_eq(madvise(p, size, MADV_POPULATE_WRITE), 0);
    munmap(p, size);
  } else {
    ck_assert_msg(r->status->message && r->status->message[0],
                  "error reply without a message");
    ck_assert_int_lt(rfd, 0);
  }
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return rc;
}

int td_region_destroy(td_session *s, uint64_t id) {
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__DestroyRegionRequest dr;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__destroy_region_request__init(&dr);
  dr.region_id = id;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION;
  req.destroy_region = &dr;
  Qlinear__V1__SessionResponse *r = td_session_call(s, &req, NULL, 5000);
  ck_assert_msg(r != NULL, "no reply to destroy_region");
  int rc = r->status ? r->status->code : 0;
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return rc;
}

void td_randn(uint64_t *state, float *out, size_t n, float sigma) {
  for (size_t i = 0; i < n; i++)
    out[i] = (float)(sigma * tu_rng_gauss(state));
}

void td_layer_make(td_layer *l, uint64_t n, uint64_t k, uint64_t seed,
                   int with_bias) {
  l->n = n;
  l->k = k;
  l->w = tu_xmalloc(n * k * sizeof(float));
  l->b = with_bias ? tu_xmalloc(n * sizeof(float)) : NULL;
  td_randn(&seed, l->w, n * k, 0.05f);
  if (l->b)
    td_randn(&seed, l->b, n, 0.1f);
}

void td_layer_free(td_layer *l) {
  free(l->w);
  free(l->b);
}

ql_client *td_connect(const td *d) {
  ql_client *c = NULL;
  int rc = ql_connect(d->address, NULL, &c);
  ck_assert_msg(rc == 0, "connect: %s: %s", ql_strerror(rc), ql_errmsg());
  return c;
}

ql_client *td_connect_messages(const td *d) {
  ql_connect_opts o = {0};
  ql_client *c = NULL;
  o.no_ring = 1;
  int rc = ql_connect(d->address, &o, &c);
  ck_assert_msg(rc == 0, "connect: %s: %s", ql_strerror(rc), ql_errmsg());
  return c;
}

ql_client *td_connect_admin(const td *d) {
  ql_connect_opts o = {0};
  ql_client *c = NULL;
  o.admin = 1;
  int rc = ql_connect(d->admin, &o, &c);
  ck_assert_msg(rc == 0, "admin connect: %s: %s", ql_strerror(rc),
                ql_errmsg());
  return c;
}

int64_t td_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long td_daemon_rss_kib(const td *d) {
  char path[64], line[256];
  long kib = -1;
  snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

int td_daemon_fds(const td *d) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)d->pid);
  DIR *dd = opendir(path);
  ck_assert_ptr_nonnull(dd);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dd)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(dd);
  return n;
}

int td_daemon_fd_limit(const td *d, int spare) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)d->pid);
  enum { MAXFD = 1 << 16 };
  unsigned char *open_ = calloc(MAXFD, 1);
  ck_assert_ptr_nonnull(open_);
  DIR *dd = opendir(path);
  ck_assert_ptr_nonnull(dd);
  struct dirent *e;
  while ((e = readdir(dd)) != NULL) {
    long fd = strtol(e->d_name, NULL, 10);
    if (e->d_name[0] != '.' && fd >= 0 && fd < MAXFD)
      open_[fd] = 1;
  }
  closedir(dd);
  int fd = 0, free_ = 0;
  for (; fd < MAXFD && free_ < spare; fd++)
    free_ += !open_[fd];
  free(open_);
  return fd;
}

int td_sanitized(void) {
  const char *f = getenv("QL_SAN_FLAGS");
  return f != NULL && strstr(f, "sanitize") != NULL;
}

int td_load(ql_client *c, const char *name, const td_layer *l, ql_format f,
            uint32_t gs, int persistent, ql_weight_info *info, int *shared) {
  return td_load_on(c, name, l, f, gs, persistent, NULL, info, shared);
}

char *td_read_log(const td *d) {
  FILE *f = fopen(d->log, "r");
  ck_assert_ptr_nonnull(f);
  char *buf = tu_xmalloc(1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

int td_count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
    n++;
  return n;
}

void td_cuda_env(const char *devices, const char *fault) {
  const char *bin = getenv("QLINEARD_CUDAEMU");
  ck_assert_msg(bin != NULL, "QLINEARD_CUDAEMU is not set");
  setenv("QLINEARD", bin, 1);
  setenv("QL_EMU_CUDA_DEVICES", devices, 1);
  if (fault != NULL)
    setenv("QL_EMU_CUDA_FAULT", fault, 1);
  else
    unsetenv("QL_EMU_CUDA_FAULT");
}

int td_emu_mappings(pid_t pid, const char *kind, pid_t owner) {
  char path[64], want[96], line[512];
  int n = 0;
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  snprintf(want, sizeof want, "/memfd:%s:%d:", kind, (int)owner);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof line, f) != NULL)
    n += strstr(line, want) != NULL;
  fclose(f);
  return n;
}

/* Sets name to value, or unsets it when value is NULL. */
static void setenv_or_unset(const char *name, const char *value) {
  if (value != NULL)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

void td_ze_env(const char *driver, const char *devices, const char *mem,
               const char *fault) {
  setenv("ZE_ENABLE_ALT_DRIVERS", driver, 1);
  setenv("ZE_ENABLE_VALIDATION_LAYER", "1", 1);
  setenv("ZE_ENABLE_PARAMETER_VALIDATION", "1", 1);
  setenv("ZE_ENABLE_HANDLE_LIFETIME", "1", 1);
  setenv("QL_ZE_TEST_DEVICES", devices, 1);
  setenv_or_unset("QL_ZE_TEST_MEM", mem);
  setenv_or_unset("QL_ZE_TEST_FAULT", fault);
  unsetenv("QL_ZE_TEST_IPC");
}

void td_linear_request(Qlinear__V1__Request *req,
                       Qlinear__V1__LinearRequest *lin,
                       Qlinear__V1__Tensor *xt, uint64_t shape[2],
                       const char *weight, const char *device, ql_path path) {
  qlinear__v1__request__init(req);
  qlinear__v1__linear_request__init(lin);
  qlinear__v1__tensor__init(xt);
  xt->dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  xt->shape = shape;
  xt->n_shape = 2;
  lin->weight = (char *)weight;
  lin->x = xt;
  lin->device = (char *)(device ? device : "");
  lin->path = (Qlinear__V1__Path)path;
  req->body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  req->linear = lin;
}

Qlinear__V1__Response *td_linear_inline(const td *d, const char *weight,
                                        const char *device, ql_path path,
                                        const float *x, uint64_t m,
                                        uint64_t k, int timeout_ms) {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {m, k};
  td_linear_request(&req, &lin, &xt, shape, weight, device, path);
  xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
  xt.inline_data.data = (uint8_t *)x;
  xt.inline_data.len = m * k * sizeof(float);
  req.request_id = 77;
  Qlinear__V1__Response *r = td_call(d, &req, timeout_ms);
  ck_assert_ptr_nonnull(r);
  return r;
}

int td_linear(const td *d, const char *weight, const char *device,
              ql_path path, const float *x, uint64_t m, uint64_t k,
              uint64_t n, float *y, char *impl, char *msg, size_t msglen,
              int timeout_ms) {
  Qlinear__V1__Response *r = td_linear_inline(d, weight, device, path, x, m,
                                              k, timeout_ms);
  int rc = r->status->code;
  if (msg != NULL)
    snprintf(msg, msglen, "%s", r->status->message ? r->status->message : "");
  if (rc == 0) {
    ck_assert_uint_eq(r->linear->y->inline_data.len, m * n * sizeof(float));
    memcpy(y, r->linear->y->inline_data.data, m * n * sizeof(float));
    if (impl != NULL)
      snprintf(impl, 64, "%s", r->linear->impl);
  }
  qlinear__v1__response__free_unpacked(r, NULL);
  return rc;
}

int td_linear_backend(const td *d, const char *backend, const char *weight,
                      const char *device, ql_path path, const float *x,
                      uint64_t m, uint64_t k, uint64_t n, float *y, char *msg,
                      size_t msglen, int timeout_ms) {
  char impl[64], want[64];
  int rc = td_linear(d, weight, device, path, x, m, k, n, y, impl, msg,
                     msglen, timeout_ms);
  snprintf(want, sizeof want, "%s.%s", backend,
           path == QL_PATH_ACT_QUANT ? "linear_aq" : "linear_wo");
  if (rc == 0)
    ck_assert_str_eq(impl, want);
  return rc;
}

int td_child_floats(int (*fn)(void *arg, float *out), void *arg, float *y,
                    size_t n) {
  size_t bytes = n * sizeof(float);
  float *out = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ck_assert(out != MAP_FAILED);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0)
    _exit(fn(arg, out) ? 0 : 1);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  memcpy(y, out, bytes);
  munmap(out, bytes);
  return status;
}

/* Set in a td_spawn_self() child's environment to the uid it becomes. */
#define SELF_UID_ENV "QL_TEST_BECOME_UID"

pid_t td_spawn_self(char *const argv[], int as_other) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (as_other) {
      char v[16];
      snprintf(v, sizeof v, "%u", (unsigned)TD_OTHER_UID);
      if (setenv(SELF_UID_ENV, v, 1) != 0)
        _exit(3);
    } else {
      unsetenv(SELF_UID_ENV);
    }
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  return pid;
}

void td_self_init(void) {
  const char *v = getenv(SELF_UID_ENV);
  if (v == NULL)
    return;
  char *end;
  unsigned long uid = strtoul(v, &end, 10);
  if (*v == '\0' || *end != '\0' || uid != TD_OTHER_UID)
    _exit(3);
  unsetenv(SELF_UID_ENV); /* its own children are not marked */
  /* Groups first (they need root), then the uid: real, effective and
   * saved, so that nothing can take root back. */
  if (setgroups(0, NULL) != 0 || setgid(0) != 0 ||
      setuid((uid_t)uid) != 0 || getuid() != (uid_t)uid ||
      geteuid() != (uid_t)uid || setuid(0) == 0 || chdir("/") != 0)
    _exit(3);
}

int td_run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}

uint64_t td_serve_formats(const td *d, ql_client *c, const ql_hello_info *h,
                          const td_accel *a) {
  static const struct {
    ql_format f;
    uint32_t gs;
  } fmts[] = {{QL_FORMAT_Q4G, 64}, {QL_FORMAT_Q8C, 0}, {QL_FORMAT_Q8B, 32},
              {QL_FORMAT_F8R, 0}};
  const uint64_t m = 5;
  float *x = tu_xmalloc(m * a->k * sizeof(float));
  size_t ybytes = m * a->n * sizeof(float);
  float *y = tu_xmalloc(ybytes), *want = tu_xmalloc(ybytes);
  for (size_t i = 0; i < sizeof fmts / sizeof *fmts; i++) {
    td_layer l;
    char name[32];
    ql_weight_info info;
    td_layer_make(&l, a->n, a->k, 10 + i, 1);
    snprintf(name, sizeof name, "w%zu", i);
    ck_assert_int_eq(td_load(c, name, &l, fmts[i].f, fmts[i].gs, 0, &info,
                             NULL),
                     0);
    ck_assert_uint_eq(info.n_devices, 2);
    ck_assert_ptr_nonnull(strstr(info.devices, h->devices[0].name));
    ck_assert_ptr_nonnull(strstr(info.devices, h->devices[1].name));
    uint64_t seed = 100 + i;
    td_randn(&seed, x, m * a->k, 1.0f);
    a->expected(&l, fmts[i].f, fmts[i].gs, QL_PATH_WEIGHT_ONLY, x, m,
                want);
    /* Each device by alias and by name, and the scheduler's choice. */
    const char *on[] = {a->dev0, a->dev1, h->devices[1].name, NULL};
    for (size_t j = 0; j < 4; j++) {
      memset(y, 0, ybytes);
      ck_assert_int_eq(a->linear(d, name, on[j], QL_PATH_WEIGHT_ONLY, x, m,
                                 y, NULL, 0),
                       0);
      ck_assert_msg(memcmp(y, want, ybytes) == 0,
                    "%s on %s: not the in-process result", name,
                    on[j] ? on[j] : "(any)");
    }
    /* Activation-quantized, where the format has it. */
    if (fmts[i].f == QL_FORMAT_Q4G || fmts[i].f == QL_FORMAT_Q8C) {
      a->expected(&l, fmts[i].f, fmts[i].gs, QL_PATH_ACT_QUANT, x, m,
                  want);
      ck_assert_int_eq(a->linear(d, name, a->dev1, QL_PATH_ACT_QUANT, x, m,
                                 y, NULL, 0),
                       0);
      ck_assert_msg(memcmp(y, want, ybytes) == 0,
                    "%s AQ: not the in-process result", name);
    }
    if (a->each != NULL)
      a->each(d, name, x, m);
    /* The CPU does not hold it. */
    char msg[256];
    ck_assert_int_eq(a->linear(d, name, "cpu", QL_PATH_WEIGHT_ONLY, x, m, y,
                               msg, sizeof msg),
                     QL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(msg, a->dev0));
    td_layer_free(&l);
  }
  free(x);
  free(y);
  free(want);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->n_devices, 3);
  ck_assert_uint_gt(st->devices[0].bytes_resident, 0);
  ck_assert_uint_eq(st->devices[0].bytes_resident,
                    st->devices[1].bytes_resident);
  ck_assert_uint_gt(st->devices[0].budget_bytes, 0);
  /* Per (weight, device): two entries per weight, each with its own
   * counts. */
  ck_assert_uint_eq(st->n_per_weight, 8);
  uint64_t reqs = 0;
  for (size_t i = 0; i < st->n_per_weight; i++) {
    ck_assert_ptr_null(strstr(st->per_weight[i].device, "cpu"));
    reqs += st->per_weight[i].requests;
  }
  ql_stats_free(st);
  return reqs;
}

int td_load_on(ql_client *c, const char *name, const td_layer *l,
               ql_format f, uint32_t gs, int persistent, const char *devices,
               ql_weight_info *info, int *shared) {
  ql_load_desc d;
  memset(&d, 0, sizeof d);
  d.name = name;
  d.format = f;
  d.group_size = gs;
  d.n = l->n;
  d.k = l->k;
  d.dtype = QL_DTYPE_F32;
  d.data = l->w;
  d.bias = l->b;
  d.persistent = persistent;
  d.devices = devices;
  return ql_load_float(c, &d, info, shared);
}

int td_serve_until_error(const td *d, const td_accel *a, const char *weight,
                         const char *device, const float *x, uint64_t m,
                         const float *want, int *rc, char *msg, size_t msglen,
                         int64_t *t_fail) {
  size_t ybytes = m * a->n * sizeof(float);
  float *y = tu_xmalloc(ybytes);
  int served = 0;
  *rc = 0;
  if (t_fail != NULL)
    *t_fail = 0;
  for (int i = 0; i < 100 && *rc == 0; i++) {
    int64_t t0 = td_now_ms();
    *rc = a->linear(d, weight, device, QL_PATH_WEIGHT_ONLY, x, m, y, msg,
                    msglen);
    if (*rc == 0) {
      ck_assert_int_eq(memcmp(y, want, ybytes), 0);
      served++;
    } else if (t_fail != NULL) {
      *t_fail = td_now_ms() - t0;
    }
  }
  free(y);
  return served;
}

void td_device_fails(const td *d, const td_accel *a, const char *weight,
                     const char *device, const float *x, uint64_t m,
                     const float *want) {
  char msg[256], want_msg[128];
  int rc = 0;
  int served = td_serve_until_error(d, a, weight, device, x, m, want, &rc,
                                    msg, sizeof msg, NULL);
  ck_assert_int_gt(served, 0);
  ck_assert_int_eq(rc, QL_EDEVICE);
  ck_assert_ptr_nonnull(strstr(msg, "device"));
  /* Out of service: refused at once, by name. */
  float *y = tu_xmalloc(m * a->n * sizeof(float));
  ck_assert_int_eq(a->linear(d, weight, device, QL_PATH_WEIGHT_ONLY, x, m, y,
                             msg, sizeof msg),
                   QL_EDEVICE);
  free(y);
  snprintf(want_msg, sizeof want_msg, "%s is out of service", device);
  ck_assert_ptr_nonnull(strstr(msg, want_msg));
}
