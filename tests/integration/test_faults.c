/*
 * test_faults.c - faults a daemon must survive with nothing lost (issue 8):
 * client processes killed with SIGKILL in the middle of requests, uploads
 * and region use, many times (the daemon's RSS and descriptors before and
 * after, every session freed); a client that forks after connecting (the
 * child cannot reach the parent's session); the daemon itself killed with
 * SIGKILL during persistent loads and while serving (every acknowledged
 * weight back, bit-identical, nothing half-written); a full file system
 * under the state directory, and under the runtime (socket) directory; a
 * kernel that hangs (the systemd watchdog pings stop, and resume when it
 * returns).
 *
 * Client processes run this program again (/proc/self/exe with a role as
 * argv[1]): nanomsg does not survive fork(), so a process that has used it
 * cannot fork clients, and every client here starts with a fresh library.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

#define TMO 20000

/* ------------------------------------------------------------- helpers */

static int load(ql_client *c, const char *name, const td_layer *l,
                ql_format f, uint32_t gs, int persistent,
                ql_weight_info *info) {
  return td_load(c, name, l, f, gs, persistent, info, NULL);
}

/* y of m rows through the daemon (weight-only) equals the in-process
 * reference for layer l in format f, byte for byte. */
static int matches(ql_client *c, const char *name, const td_layer *l,
                   ql_format f, uint32_t gs, uint64_t seed) {
  const uint64_t m = 3;
  float *x = tu_xmalloc(m * l->k * sizeof(float));
  float *y = tu_xmalloc(m * l->n * sizeof(float));
  float *ref = tu_xmalloc(m * l->n * sizeof(float));
  ql_qweight *q = NULL;
  ql_quant_params p = {f, gs, 0, (ql_dtype)0};
  td_randn(&seed, x, m * l->k, 1.0f);
  ck_assert_int_eq(ql_qweight_quantize(&p, (int64_t)l->n, (int64_t)l->k,
                                       QL_DTYPE_F32, l->w, l->b, &q),
                   0);
  int rc = ql_linear(c, name, QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, m, l->k, x,
                     l->n, y, NULL);
  int same = rc == 0 &&
             ql_linear_wo_ref(q, QL_DTYPE_F32, x, (int64_t)m, ref) == 0 &&
             memcmp(y, ref, m * l->n * sizeof(float)) == 0;
  ql_qweight_free(q);
  free(x);
  free(y);
  free(ref);
  return same;
}

static ql_stats_info *stats(ql_client *c) {
  ql_stats_info *st = NULL;
  int rc = ql_stats(c, &st);
  ck_assert_msg(rc == 0, "stats: %s", ql_errmsg());
  return st;
}

/* Waits until the daemon reports exactly these sessions, regions, uploads
 * and weights; returns 1, or 0 after 10 s. */
static int settle(ql_client *c, uint64_t sessions, uint64_t weights) {
  for (int64_t t0 = td_now_ms(); td_now_ms() - t0 < 10000; usleep(5000)) {
    ql_stats_info *st = stats(c);
    int ok = st->sessions == sessions && st->regions == 0 &&
             st->region_bytes == 0 && st->uploads_in_progress == 0 &&
             st->weights == weights;
    ql_stats_free(st);
    if (ok)
      return 1;
  }
  return 0;
}

/*
 * Runs this program as role with arguments (NULL-terminated), its stdout
 * a pipe whose read end is returned in *out. The child dies with us.
 */
static pid_t spawn(const char *role, const char *const *args, int *out) {
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    const char *argv[16];
    int n = 0;
    argv[n++] = "/proc/self/exe";
    argv[n++] = role;
    for (int i = 0; args && args[i] && n < 15; i++)
      argv[n++] = args[i];
    argv[n] = NULL;
    execv("/proc/self/exe", (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  *out = p[0];
  return pid;
}

/* Reads one line from fd (at most len - 1 bytes) within timeout_ms;
 * returns its length, or -1 at end of file or timeout. */
static int read_line(int fd, char *buf, size_t len, int timeout_ms) {
  size_t n = 0;
  int64_t t0 = td_now_ms();
  while (n + 1 < len) {
    struct pollfd p = {fd, POLLIN, 0};
    int left = timeout_ms - (int)(td_now_ms() - t0);
    if (left <= 0 || poll(&p, 1, left) != 1)
      return -1;
    if (read(fd, buf + n, 1) != 1)
      return -1;
    if (buf[n] == '\n')
      break;
    n++;
  }
  buf[n] = '\0';
  return (int)n;
}

static void kill_wait(pid_t pid) {
  int st;
  kill(pid, SIGKILL);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

static uint64_t rng = 0x5eed;

/* ------------------------------------------------------------- roles */

/*
 * The roles run outside any check test: no ck_* call may happen there (a
 * passing assertion reports progress to a runner that is not there), so
 * they make layers, sessions and raw calls with these.
 */
static void role_layer(td_layer *l, uint64_t n, uint64_t k, uint64_t seed,
                       int with_bias) {
  l->n = n;
  l->k = k;
  l->w = malloc(n * k * sizeof(float));
  l->b = with_bias ? malloc(n * sizeof(float)) : NULL;
  if (l->w == NULL || (with_bias && l->b == NULL))
    _exit(9);
  td_randn(&seed, l->w, n * k, 0.05f);
  if (l->b)
    td_randn(&seed, l->b, n, 0.1f);
}

/* Opens a session on path; returns its socket (token in tok) or -1. */
static int role_session(const char *path, uint8_t tok[16]) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    return -1;
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__SessionOpenRequest op;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__session_open_request__init(&op);
  op.protocol_version = QL_PROTOCOL_VERSION;
  req.request_id = 1;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  req.open = &op;
  uint8_t buf[4096];
  size_t len = qlinear__v1__session_request__pack(&req, buf);
  if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
    return -1;
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  Qlinear__V1__SessionResponse *r =
      n > 0 ? qlinear__v1__session_response__unpack(NULL, (size_t)n, buf)
            : NULL;
  int ok = r && (!r->status || r->status->code == 0) &&
           r->body_case == QLINEAR__V1__SESSION_RESPONSE__BODY_OPEN &&
           r->open->token.len == 16;
  if (ok)
    memcpy(tok, r->open->token.data, 16);
  if (r)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return ok ? fd : -1;
}

/* DestroyRegion on a raw session socket: the status code, 1 if none. */
static int role_destroy(int fd, uint64_t id) {
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__DestroyRegionRequest dr;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__destroy_region_request__init(&dr);
  dr.region_id = id;
  req.request_id = 2;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION;
  req.destroy_region = &dr;
  uint8_t buf[4096];
  size_t len = qlinear__v1__session_request__pack(&req, buf);
  if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
    return 1;
  ssize_t n = recv(fd, buf, sizeof buf, 0);
  Qlinear__V1__SessionResponse *r =
      n > 0 ? qlinear__v1__session_response__unpack(NULL, (size_t)n, buf)
            : NULL;
  int code = r ? (r->status ? r->status->code : 0) : 1;
  if (r)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return code;
}

/* One raw request with token tok; returns the status code, or 1 when no
 * reply came. */
static int role_call(const char *address, const uint8_t tok[16],
                     Qlinear__V1__Request *req) {
  req->session_token.data = (uint8_t *)tok;
  req->session_token.len = 16;
  size_t len = qlinear__v1__request__get_packed_size(req);
  uint8_t *buf = malloc(len);
  if (buf == NULL)
    return 1;
  qlinear__v1__request__pack(req, buf);
  int s = nn_socket(AF_SP, NN_REQ), tmo = TMO, code = 1;
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &tmo, sizeof tmo);
  if (s >= 0 && nn_connect(s, address) >= 0 &&
      nn_send(s, buf, len, 0) == (int)len) {
    void *msg = NULL;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    Qlinear__V1__Response *r =
        n >= 0 ? qlinear__v1__response__unpack(NULL, (size_t)n, msg) : NULL;
    if (r != NULL)
      code = r->status ? r->status->code : 0;
    if (r)
      qlinear__v1__response__free_unpacked(r, NULL);
    if (msg)
      nn_freemsg(msg);
  }
  nn_close(s);
  free(buf);
  return code;
}


/*
 * "victim ADDRESS SEED": a client that connects, makes a 1 MiB region and
 * writes it, loads a weight of its own and the shared one, begins an
 * upload it never finishes, prints "ready", then sends Linear requests
 * (inline and from its region) until it is killed.
 */
static int role_victim(const char *address, uint64_t seed) {
  ql_client *c = NULL;
  ql_region *r = NULL;
  char name[64];
  td_layer own, shared;
  if (ql_connect(address, NULL, &c) != 0 ||
      ql_region_create(c, 1 << 20, &r) != 0) {
    fprintf(stderr, "victim: %s\n", ql_errmsg());
    return 2;
  }
  memset(r->data, 0x3c, r->size);
  role_layer(&own, 64, 256, seed, 1);
  role_layer(&shared, 32, 256, 7, 0);
  snprintf(name, sizeof name, "victim/%llu", (unsigned long long)seed);
  if (load(c, name, &own, QL_FORMAT_Q4G, 32, 0, NULL) != 0 ||
      load(c, "victim/shared", &shared, QL_FORMAT_Q8C, 0, 0, NULL) != 0)
    return 3;
  printf("ready\n");
  fflush(stdout);
  float *x = (float *)r->data;
  uint64_t s = seed;
  td_randn(&s, x, 16 * 256, 1.0f);
  ql_slice xs = {r, 0, 16 * 256 * 4}, ys = {r, 16 * 256 * 4, 16 * 64 * 4};
  float y[16 * 64];
  for (unsigned i = 0;; i++) {
    uint64_t m = 1 + i % 16;
    xs.length = m * 256 * 4;
    ys.length = m * 64 * 4;
    if (i % 3 == 0)
      (void)ql_linear(c, name, QL_PATH_AUTO, QL_DTYPE_F32, m, 256, x, 64, y,
                      NULL);
    else if (i % 3 == 1)
      (void)ql_linear_region(c, name, QL_PATH_AUTO, QL_DTYPE_F32, m, 256,
                             &xs, 64, &ys, NULL, NULL);
    else
      (void)ql_linear(c, "victim/shared", QL_PATH_ACT_QUANT, QL_DTYPE_F32,
                      m, 256, x, 32, y, NULL);
    if (i % 50 == 49) {
      /* An upload of a big weight, often cut by the kill. */
      td_layer big;
      char bn[80];
      role_layer(&big, 256, 1024, seed + i, 0);
      snprintf(bn, sizeof bn, "%s/big%u", name, i);
      (void)load(c, bn, &big, QL_FORMAT_Q8C, 0, 0, NULL);
      (void)ql_unload(c, bn);
      td_layer_free(&big);
    }
  }
}

/*
 * "loader ADMIN_ADDRESS FIRST": persistent loads on the admin socket of
 * weights "p/<i>" for i = FIRST, FIRST + 1, ..., printing "<i>" after each
 * acknowledgement, until a load fails (the daemon was killed).
 */
static int role_loader(const char *admin, int first) {
  ql_connect_opts o = {0};
  ql_client *a = NULL;
  o.admin = 1;
  o.timeout_ms = 20000;
  if (ql_connect(admin, &o, &a) != 0)
    return 2;
  for (int i = first;; i++) {
    td_layer l;
    char name[32];
    role_layer(&l, 96 + (uint64_t)(i % 4) * 32, 512, 1000 + (uint64_t)i,
               i % 2);
    snprintf(name, sizeof name, "p/%d", i);
    int rc = load(a, name, &l, i % 2 ? QL_FORMAT_Q4G : QL_FORMAT_Q8C,
                  i % 2 ? 64 : 0, 1, NULL);
    td_layer_free(&l);
    if (rc != 0)
      return 0;
    printf("%d\n", i);
    fflush(stdout);
  }
}

/* The layer role_loader stores as "p/<i>", and its format. */
static void loader_layer(int i, td_layer *l, ql_format *f, uint32_t *gs) {
  td_layer_make(l, 96 + (uint64_t)(i % 4) * 32, 512, 1000 + (uint64_t)i,
                i % 2);
  *f = i % 2 ? QL_FORMAT_Q4G : QL_FORMAT_Q8C;
  *gs = i % 2 ? 64 : 0;
}

/* --------------------------------------------------------------- tests */

/*
 * Client processes killed with SIGKILL at random points of their work,
 * many times: each time, every session of theirs ends at once (regions,
 * uploads, holds), the shared weight stays while anyone holds it, and the
 * daemon's descriptors return to what they were and its RSS does not
 * grow with the number of kills.
 */
START_TEST(kill9_clients) {
  enum { ROUNDS = 6, PER_ROUND = 8, WARMUP = 4 };
  const long RSS_BOUND_KIB = 24 * 1024;
  td d;
  td_start(&d, NULL);
  char seed[32];
  const char *args[] = {d.address, seed, NULL};
  int killed = 0;
  /* The observer: its session and its weight are the baseline. */
  ql_client *o = td_connect_messages(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 3, 1);
  ck_assert_int_eq(load(o, "obs/w", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ql_stats_info *st = stats(o);
  uint64_t base_sessions = st->sessions, base_weights = st->weights;
  ql_stats_free(st);

  long rss0 = 0, rss1 = 0;
  int fd0 = 0, fd1 = 0;
  for (int round = -1; round < ROUNDS; round++) {
    int n = round < 0 ? WARMUP : PER_ROUND;
    pid_t pid[PER_ROUND];
    int out[PER_ROUND];
    for (int i = 0; i < n; i++) {
      snprintf(seed, sizeof seed, "%d", 100 * (round + 2) + i);
      pid[i] = spawn("victim", args, &out[i]);
    }
    for (int i = 0; i < n; i++) {
      char line[32];
      ck_assert_msg(read_line(out[i], line, sizeof line, TMO) > 0 &&
                        strcmp(line, "ready") == 0,
                    "victim %d did not start", i);
    }
    for (int i = 0; i < n; i++) {
      usleep((useconds_t)(tu_rng_next(&rng) % 30000));
      kill_wait(pid[i]);
      close(out[i]);
      killed++;
    }
    ck_assert_msg(settle(o, base_sessions, base_weights),
                  "round %d: the killed clients' sessions were not freed",
                  round);
    if (round < 0) {
      /* After a first round the allocator and nanomsg have their pools. */
      rss0 = td_daemon_rss_kib(&d);
      /* the fewest over a second: a closed nanomsg pipe may linger a
       * moment in the daemon */
      fd0 = td_daemon_fds(&d);
      for (int64_t t0 = td_now_ms(); td_now_ms() - t0 < 1000; usleep(10000)) {
        int f = td_daemon_fds(&d);
        fd0 = f < fd0 ? f : fd0;
      }
    }
  }
  for (int64_t t0 = td_now_ms(); td_now_ms() - t0 < 5000; usleep(10000))
    if ((fd1 = td_daemon_fds(&d)) <= fd0)
      break;
  rss1 = td_daemon_rss_kib(&d);
  printf("kill -9 of %d clients: daemon RSS %ld -> %ld KiB, fds %d -> %d\n",
         killed, rss0, rss1, fd0, fd1);
  ck_assert_int_le(fd1, fd0);
  /* Under ASan freed memory waits in a quarantine of up to 256 MiB, so RSS
   * says nothing about leaks there: LeakSanitizer checks them when the
   * daemon exits (td_stop() must return 0). */
  if (!td_sanitized())
    ck_assert_msg(rss1 - rss0 < RSS_BOUND_KIB, "RSS grew by %ld KiB",
                  rss1 - rss0);
  ck_assert(matches(o, "obs/w", &l, QL_FORMAT_Q8C, 0, 5));
  ql_weight_info wi;
  ck_assert_int_eq(ql_lookup(o, "victim/shared", &wi), QL_ENOTFOUND);
  ql_close(o);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* An AF_UNIX SOCK_SEQPACKET socket: what a session socket is. */
static int is_seqpacket(int fd) {
  int type = 0, dom = 0;
  socklen_t len = sizeof type, dl = sizeof dom;
  return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
         getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &dl) == 0 &&
         type == SOCK_SEQPACKET && dom == AF_UNIX;
}

/*
 * A client forks after connecting, with a region, an upload in progress
 * and a weight. The child holds no copy of the session socket; with a
 * session of its own it cannot destroy the parent's region, nor (run
 * anew, since nanomsg does not survive fork) name the parent's region,
 * upload or weight in requests; its death (SIGKILL) leaves the parent's
 * session whole.
 */
START_TEST(fork_after_connect) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 4, 1);
  ck_assert_int_eq(load(c, "fork/w", &l, QL_FORMAT_Q4G, 32, 0, NULL), 0);
  ql_region *r = NULL;
  ck_assert_int_eq(ql_region_create(c, 8192, &r), 0);
  /* The parent's session sockets (the harness's raw one aside). */
  int sess_fds[64], n_sess = 0;
  for (int fd = 0; fd < 1024 && n_sess < 64; fd++)
    if (fd != d.sess.fd && is_seqpacket(fd))
      sess_fds[n_sess++] = fd;
  ck_assert_int_ge(n_sess, 1);

  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* No nanomsg here: only plain sockets, then a fresh program. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(p[0]);
    int bad = 0;
    for (int i = 0; i < n_sess; i++)
      if (fcntl(sess_fds[i], F_GETFD) >= 0 && is_seqpacket(sess_fds[i]))
        bad |= 1;
    uint8_t tok[16];
    int own = role_session(d.session, tok);
    if (own < 0)
      bad |= 2;
    else if (role_destroy(own, r->id) != QL_ENOTFOUND)
      bad |= 4;
    /* libqlinear refuses at once rather than hang in nanomsg */
    ql_client *cc = NULL;
    if (ql_connect(d.address, NULL, &cc) != QL_ENOTSUP || cc != NULL)
      bad |= 8;
    char rid[32];
    snprintf(rid, sizeof rid, "%llu", (unsigned long long)r->id);
    const char *argv[] = {"/proc/self/exe", "intruder", d.address, rid, NULL};
    char st = (char)('0' + bad);
    if (write(p[1], &st, 1) != 1)
      _exit(1);
    dup2(p[1], 1);
    execv("/proc/self/exe", (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  char st = 0, line[64];
  ck_assert_int_eq(read(p[0], &st, 1), 1);
  ck_assert_msg(st == '0', "forked child: %c (1: it kept a session socket, "
                "2: no session of its own, 4: it destroyed the parent's "
                "region, 8: it could call ql_connect())", st);
  ck_assert_int_gt(read_line(p[0], line, sizeof line, TMO), 0);
  ck_assert_str_eq(line, "refused");
  kill_wait(pid);
  close(p[0]);

  /* The parent's session is whole: its region computes, its weight is
   * there and holds, and it can still unload it. */
  float *x = r->data;
  uint64_t seed = 8;
  td_randn(&seed, x, 2 * 64, 1.0f);
  ql_slice xs = {r, 0, 2 * 64 * 4}, ys = {r, 4096, 2 * 16 * 4};
  ck_assert_int_eq(ql_linear_region(c, "fork/w", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, 2, 64, &xs, 16, &ys, NULL,
                                    NULL),
                   0);
  /* (before matches(), whose inline tensors the ring stages in a region
   * of the library's own) */
  ql_stats_info *s = stats(c);
  ck_assert_uint_eq(s->regions, 1);
  ck_assert_uint_eq(s->weights, 1);
  ql_stats_free(s);
  ck_assert(matches(c, "fork/w", &l, QL_FORMAT_Q4G, 32, 9));
  ck_assert_int_eq(ql_unload(c, "fork/w"), 0);
  ql_close(c);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* "intruder ADDRESS REGION": the forked child, run anew: with a session
 * of its own it tries the parent's region and weight; prints "refused"
 * when every attempt was refused as it must be. */
static int role_intruder(const char *address, uint64_t rid) {
  ql_client *c = NULL;
  if (ql_connect(address, NULL, &c) != 0)
    return 2;
  int ok = ql_unload(c, "fork/w") == QL_EPERM;
  /* Raw, with a session of its own: x in the parent's region. */
  char path[300];
  const char *slash = strrchr(address, '/');
  uint8_t tok[16];
  snprintf(path, sizeof path, "%.*s/session.sock",
           (int)(slash - (address + 6)), address + 6);
  if (role_session(path, tok) < 0)
    return 3;
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor t;
  Qlinear__V1__RegionSlice xs;
  uint64_t shape[2] = {1, 64};
  qlinear__v1__request__init(&req);
  qlinear__v1__linear_request__init(&lin);
  qlinear__v1__tensor__init(&t);
  qlinear__v1__region_slice__init(&xs);
  req.request_id = 77;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  req.linear = &lin;
  lin.weight = "fork/w";
  lin.x = &t;
  t.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  t.shape = shape;
  t.n_shape = 2;
  t.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  t.region = &xs;
  xs.region_id = rid;
  xs.length = 64 * 4;
  ok = ok && role_call(address, tok, &req) == QL_ENOTFOUND;
  printf("%s\n", ok ? "refused" : "accepted");
  fflush(stdout);
  for (;;)
    pause();
}

/* A fresh state directory's parent; the daemon makes the directory. */
static void state_dir(char *buf, size_t len, char *parent, size_t plen) {
  snprintf(parent, plen, "/tmp/ql-faults-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(parent));
  snprintf(buf, len, "%s/store", parent);
}

static void rm_tree(const char *dir) {
  DIR *dd = opendir(dir);
  struct dirent *e;
  char path[600];
  while (dd && (e = readdir(dd)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && errno == EISDIR)
      rm_tree(path);
  }
  if (dd)
    closedir(dd);
  rmdir(dir);
}

/* Files of dir whose names contain needle. */
static int count_files(const char *dir, const char *needle) {
  DIR *dd = opendir(dir);
  struct dirent *e;
  int n = 0;
  ck_assert_ptr_nonnull(dd);
  while ((e = readdir(dd)) != NULL)
    if (e->d_name[0] != '.' && strstr(e->d_name, needle) != NULL)
      n++;
  closedir(dd);
  return n;
}

/*
 * The daemon killed with SIGKILL while an admin client stores weights one
 * after the other and a victim client computes, three times over the same
 * state directory: after each restart every acknowledged weight is
 * resident and computes bit-identical results, every weight listed at all
 * is whole (the one whose store was cut is either complete or absent), and
 * no temporary file is left.
 */
START_TEST(kill9_daemon_during_loads) {
  char st[256], parent[64];
  state_dir(st, sizeof st, parent, sizeof parent);
  const char *args[] = {"--state-dir", st, NULL};
  int acked = -1, next = 0, kills = 0;
  td d;
  for (int cycle = 0; cycle < 3; cycle++) {
    td_start(&d, args);
    char first[16], seed[16];
    snprintf(first, sizeof first, "%d", next);
    snprintf(seed, sizeof seed, "%d", 900 + cycle);
    const char *la[] = {d.admin, first, NULL};
    const char *va[] = {d.address, seed, NULL};
    int lout, vout;
    pid_t loader = spawn("loader", la, &lout);
    pid_t victim = spawn("victim", va, &vout);
    char line[32];
    ck_assert_int_gt(read_line(vout, line, sizeof line, TMO), 0);
    /* A few acknowledgements, then the kill at a random moment. */
    for (int i = 0; i < 3; i++) {
      ck_assert_int_gt(read_line(lout, line, sizeof line, TMO), 0);
      acked = atoi(line);
    }
    usleep((useconds_t)(tu_rng_next(&rng) % 40000));
    td_kill(&d, SIGKILL);
    kills++;
    /* What was acknowledged before the daemon died. A load cut in its
     * commit would wait out the client's commit timeout (minutes): the
     * loader is killed once its acknowledgements stop. */
    while (read_line(lout, line, sizeof line, 1000) > 0)
      acked = atoi(line);
    kill_wait(loader);
    kill_wait(victim);
    close(lout);
    close(vout);
    td_wait(&d, 5000);

    td_start(&d, args);
    ql_client *u = td_connect(&d);
    for (int i = 0; i <= acked; i++) {
      td_layer l;
      ql_format f;
      uint32_t gs;
      char name[32];
      loader_layer(i, &l, &f, &gs);
      snprintf(name, sizeof name, "p/%d", i);
      ql_weight_info wi;
      ck_assert_msg(ql_lookup(u, name, &wi) == 0,
                    "acknowledged weight %s is gone", name);
      ck_assert_int_eq(wi.persistent, 1);
      ck_assert_msg(matches(u, name, &l, f, gs, (uint64_t)i),
                    "%s computes something else after the restart", name);
      td_layer_free(&l);
    }
    /* Anything else listed is the load that was cut: whole, or absent. */
    ql_weight_info *list = NULL;
    size_t n = 0;
    ck_assert_int_eq(ql_list(u, &list, &n), 0);
    ck_assert_uint_ge(n, (size_t)acked + 1);
    ck_assert_uint_le(n, (size_t)acked + 2);
    if (n == (size_t)acked + 2) {
      td_layer l;
      ql_format f;
      uint32_t gs;
      char name[32];
      loader_layer(acked + 1, &l, &f, &gs);
      snprintf(name, sizeof name, "p/%d", acked + 1);
      ck_assert(matches(u, name, &l, f, gs, 1));
      td_layer_free(&l);
      acked++;
    }
    ql_free(list);
    ql_close(u);
    /* The temporary file of a cut store is gone after the start. */
    ck_assert_int_eq(count_files(st, ".tmp-"), 0);
    ck_assert_int_eq(count_files(st, ".safetensors"), acked + 1);
    next = acked + 1;
    ck_assert_int_eq(td_stop(&d), 0);
  }
  printf("daemon killed %d times during loads: %d weights, all back\n", kills,
         acked + 1);
  rm_tree(parent);
}
END_TEST

/*
 * A full file system under the state directory. As root with mount
 * rights (CI), a 512 KiB tmpfs: writes fail with ENOSPC. Elsewhere a
 * file-size limit on the daemon (RLIMIT_FSIZE, SIGXFSZ ignored): writes
 * fail with EFBIG (QL_TEST_FSIZE=1 chooses this path). Either way a persistent load that does not fit is
 * refused with QL_EEXHAUSTED, leaves no file and no resident weight, the
 * daemon keeps serving, and a restart finds exactly what was acknowledged.
 */
START_TEST(disk_full) {
  char st[256], parent[64];
  state_dir(st, sizeof st, parent, sizeof parent);
  /* QL_TEST_FSIZE=1 asks for the file-size limit even where mounting
   * works, to try that path. */
  int tmpfs = getenv("QL_TEST_FSIZE") == NULL &&
              mount("tmpfs", parent, "tmpfs", 0, "size=512k") == 0;
  struct rlimit old;
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*old_xfsz)(int) = SIG_DFL;
  if (!tmpfs) {
    struct rlimit lim = {512 * 1024, old.rlim_max};
    old_xfsz = signal(SIGXFSZ, SIG_IGN); /* inherited through exec */
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  printf("disk full: %s\n", tmpfs ? "a 512 KiB tmpfs (ENOSPC)"
                                   : "RLIMIT_FSIZE 512 KiB (EFBIG)");
  const char *args[] = {"--state-dir", st, "--log-level", "notice", NULL};
  td d;
  td_start(&d, args);
  if (!tmpfs) {
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_xfsz);
  }
  ql_client *a = td_connect_admin(&d), *u = td_connect(&d);
  td_layer small, big;
  td_layer_make(&small, 16, 64, 1, 1);
  td_layer_make(&big, 1024, 1024, 2, 0); /* 1 MiB of int8 */
  ck_assert_int_eq(load(a, "small", &small, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  int files = count_files(st, ".safetensors");
  ck_assert_int_eq(files, 1);
  for (int i = 0; i < 3; i++) {
    int rc = load(a, "big", &big, QL_FORMAT_Q8C, 0, 1, NULL);
    ck_assert_msg(rc == QL_EEXHAUSTED, "store on a full disk: %s (%s)",
                  ql_err_name(rc), ql_errmsg());
    ck_assert_msg(strstr(ql_errmsg(), parent) == NULL,
                  "the reply names the state directory: %s", ql_errmsg());
  }
  ql_weight_info wi;
  ck_assert_int_eq(ql_lookup(u, "big", &wi), QL_ENOTFOUND);
  ck_assert_int_eq(count_files(st, ".safetensors"), 1);
  ck_assert_int_eq(count_files(st, ".tmp-"), 0);
  /* Still serving: the stored weight, and a session load (memory only). */
  ck_assert(matches(u, "small", &small, QL_FORMAT_Q8C, 0, 3));
  ck_assert_int_eq(load(u, "big", &big, QL_FORMAT_Q8C, 0, 0, NULL), 0);
  ck_assert(matches(u, "big", &big, QL_FORMAT_Q8C, 0, 4));
  ql_close(u);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);
  td_start(&d, args);
  u = td_connect(&d);
  ck_assert(matches(u, "small", &small, QL_FORMAT_Q8C, 0, 5));
  ck_assert_int_eq(ql_lookup(u, "big", &wi), QL_ENOTFOUND);
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&small);
  td_layer_free(&big);
  if (tmpfs)
    ck_assert_int_eq(umount(parent), 0);
  rm_tree(parent);
}
END_TEST

/* ------------------------------------------------- runtime directory */

/*
 * Mounts a tmpfs of opts on dir, in a mount namespace of this test
 * process's own (the daemon, a child, is in it too), so that a failed
 * test leaves no mount behind. As root with mount rights (CI) in a mount
 * namespace only; elsewhere in a user namespace too (unprivileged user
 * namespaces; QL_TEST_USERNS=1 chooses this path even where the other
 * works, to try it). Returns how, or NULL when neither works.
 */
static const char *mount_tmpfs(const char *dir, const char *opts) {
  if (getenv("QL_TEST_USERNS") == NULL && unshare(CLONE_NEWNS) == 0 &&
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
      mount("tmpfs", dir, "tmpfs", 0, opts) == 0)
    return "a tmpfs";
  uid_t uid = getuid();
  gid_t gid = getgid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    fprintf(stderr, "unshare(CLONE_NEWUSER | CLONE_NEWNS): %s\n",
            strerror(errno));
    return NULL;
  }
  /* The same ids inside: the daemon checks it owns its directories. */
  char map[64];
  int ok = 1;
  const char *files[] = {"/proc/self/setgroups", "/proc/self/uid_map",
                         "/proc/self/gid_map"};
  for (int i = 0; i < 3 && ok; i++) {
    if (i == 0)
      snprintf(map, sizeof map, "deny");
    else
      snprintf(map, sizeof map, "%u %u 1", i == 1 ? (unsigned)uid : gid,
               i == 1 ? (unsigned)uid : gid);
    int fd = open(files[i], O_WRONLY | O_CLOEXEC);
    ok = fd >= 0 && write(fd, map, strlen(map)) == (ssize_t)strlen(map);
    if (fd >= 0)
      close(fd);
  }
  if (!ok || mount("tmpfs", dir, "tmpfs", 0, opts) != 0) {
    fprintf(stderr, "mount in a user namespace: %s\n", strerror(errno));
    return NULL;
  }
  return "a tmpfs in a user namespace";
}

/*
 * Fills dir's file system: new empty files until no inode is left, then
 * bytes into the first until no block is left. Returns the files made
 * (their names are fill-<i>, from *next on; *next is advanced).
 */
static int fill_fs(const char *dir, int *next) {
  char path[300];
  int made = 0;
  for (;; (*next)++) {
    snprintf(path, sizeof path, "%s/fill-%d", dir, *next);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      ck_assert_msg(errno == ENOSPC, "filling %s: %s", dir, strerror(errno));
      break;
    }
    close(fd);
    made++;
  }
  snprintf(path, sizeof path, "%s/fill-0", dir);
  int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  static const char block[4096];
  while (write(fd, block, sizeof block) == (ssize_t)sizeof block)
    ;
  ck_assert_int_eq(errno, ENOSPC);
  close(fd);
  return made;
}

/* The names in dir, sorted, one per line. */
static void listing(const char *dir, char *out, size_t len) {
  struct dirent **e = NULL;
  int n = scandir(dir, &e, NULL, alphasort);
  ck_assert_int_ge(n, 0);
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (e[i]->d_name[0] != '.' && used < len)
      used += (size_t)snprintf(out + used, len - used, "%s\n", e[i]->d_name);
    free(e[i]);
  }
  free(e);
  ck_assert_uint_lt(used, len);
}

/* 1 when every error line (<3>) of a daemon's log says the file system
 * is full and names the runtime directory, and there is at least one. */
static int errors_say_full(const char *log, const char *dir) {
  int n = 0;
  for (const char *l = log; *l != '\0';) {
    const char *end = strchr(l, '\n');
    size_t len = end ? (size_t)(end - l) : strlen(l);
    if (strncmp(l, "<3>", 3) == 0) {
      char line[1024];
      snprintf(line, sizeof line, "%.*s", (int)len, l);
      if (strstr(line, "No space left on device") == NULL ||
          strstr(line, dir) == NULL)
        return 0;
      n++;
    }
    l += len + (end != NULL);
  }
  return n > 0;
}

/*
 * The runtime directory (the socket directory) on a full file system: a
 * tmpfs of 64 KiB and 16 inodes, filled with files until no inode and no
 * byte is left. The daemon keeps there qlineard.sock, session.sock and
 * admin/admin.sock (sockets and a directory: inodes, no bytes); regions
 * are memfds and stored weights live in the state directory, elsewhere.
 * - A daemon serving when it fills up keeps serving: its sessions and new
 *   ones, requests inline and in regions, new regions, session and
 *   persistent loads; what it holds computes the same bytes after.
 * - A daemon started on it exits with status 1, every error it logs says
 *   "No space left on device" and names the path, and it leaves the
 *   directory as it found it: with 0, 1, 2, ... inodes freed, until it
 *   has the few it needs and starts.
 */
START_TEST(runtime_dir_full) {
  char parent[64], run[128], st[128];
  snprintf(parent, sizeof parent, "/tmp/ql-rundir-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(parent));
  snprintf(run, sizeof run, "%s/run", parent);
  snprintf(st, sizeof st, "%s/store", parent);
  ck_assert_int_eq(mkdir(run, 0700), 0);
  const char *how = mount_tmpfs(run, "size=64k,nr_inodes=16,mode=0700");
  ck_assert_msg(how != NULL, "cannot mount a tmpfs: not root, and no user "
                "namespace (see above); this test needs one of them");
  const char *args[] = {"--state-dir", st, NULL};
  td d;
  td_start_in(&d, run, args);
  ql_client *a = td_connect_admin(&d), *c = td_connect_messages(&d);
  td_layer kept, own, fresh;
  td_layer_make(&kept, 32, 128, 11, 1);
  td_layer_make(&own, 64, 256, 12, 0);
  td_layer_make(&fresh, 48, 256, 13, 1);
  ck_assert_int_eq(load(a, "rt/kept", &kept, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  ck_assert_int_eq(load(c, "rt/own", &own, QL_FORMAT_Q4G, 32, 0, NULL), 0);
  ql_region *r = NULL;
  ck_assert_int_eq(ql_region_create(c, 1 << 16, &r), 0);
  uint64_t seed = 21;
  td_randn(&seed, (float *)r->data, 4 * 256, 1.0f);
  ql_slice xs = {r, 0, 4 * 256 * 4}, ys = {r, 32768, 4 * 64 * 4};
  ck_assert_int_eq(ql_linear_region(c, "rt/own", QL_PATH_AUTO, QL_DTYPE_F32,
                                    4, 256, &xs, 64, &ys, NULL, NULL),
                   0);
  float before[4 * 64];
  memcpy(before, (char *)r->data + 32768, sizeof before);

  int next = 0, files = fill_fs(run, &next);
  printf("runtime dir full (%s): %d files\n", how, files);
  char probe[300];
  snprintf(probe, sizeof probe, "%s/probe", run);
  ck_assert_int_eq(mkdir(probe, 0700), -1);
  ck_assert_int_eq(errno, ENOSPC);

  /* The session that was there: inline, its region, its weights. */
  ck_assert(matches(c, "rt/own", &own, QL_FORMAT_Q4G, 32, 22));
  ck_assert(matches(c, "rt/kept", &kept, QL_FORMAT_Q8C, 0, 23));
  memset((char *)r->data + 32768, 0, sizeof before);
  ck_assert_int_eq(ql_linear_region(c, "rt/own", QL_PATH_AUTO, QL_DTYPE_F32,
                                    4, 256, &xs, 64, &ys, NULL, NULL),
                   0);
  ck_assert_mem_eq((char *)r->data + 32768, before, sizeof before);
  /* New sessions (session.sock and qlineard.sock), a new region, a
   * session load, and a persistent one (the state directory is
   * elsewhere). */
  ql_client *c2 = td_connect(&d), *a2 = td_connect_admin(&d);
  ql_region *r2 = NULL;
  ck_assert_int_eq(ql_region_create(c2, 1 << 20, &r2), 0);
  ck_assert_int_eq(load(c2, "rt/fresh", &fresh, QL_FORMAT_Q8C, 0, 0, NULL),
                   0);
  ck_assert(matches(c2, "rt/fresh", &fresh, QL_FORMAT_Q8C, 0, 24));
  memcpy(r2->data, r->data, 4 * 256 * 4);
  ql_slice xs2 = {r2, 0, 4 * 256 * 4}, ys2 = {r2, 1 << 19, 4 * 64 * 4};
  ck_assert_int_eq(ql_linear_region(c2, "rt/own", QL_PATH_AUTO,
                                    QL_DTYPE_F32, 4, 256, &xs2, 64, &ys2,
                                    NULL, NULL),
                   0);
  ck_assert_mem_eq((char *)r2->data + (1 << 19), before, sizeof before);
  ck_assert_int_eq(load(a2, "rt/kept2", &fresh, QL_FORMAT_Q4G, 64, 1, NULL),
                   0);
  ck_assert_int_eq(count_files(st, ".safetensors"), 2);
  ql_close(a2);
  ql_close(c2);
  /* c2's session ends: its region and its weight go (the harness's
   * session and c's remain; kept, kept2 and own). */
  ck_assert_int_eq(ql_region_destroy(c, r), 0);
  ck_assert(settle(c, 2, 3));
  ck_assert(matches(c, "rt/kept2", &fresh, QL_FORMAT_Q4G, 64, 25));
  ql_close(c);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);

  /* Starts on the full directory: refused cleanly, one more inode free
   * each time, until the daemon has what it needs. */
  files += fill_fs(run, &next);
  char want[4096], got[4096], log[8192];
  int freed = 0;
  for (;; freed++) {
    ck_assert_msg(freed <= 8, "the daemon does not start with 8 free "
                  "inodes");
    listing(run, want, sizeof want);
    int rc = td_start_or_exit(&d, run, args, log, sizeof log);
    if (rc == 0)
      break;
    ck_assert_msg(rc == 1, "start with %d inodes free: exit status %d",
                  freed, rc);
    ck_assert_msg(errors_say_full(log, run),
                  "start with %d inodes free: the log does not say the "
                  "file system is full:\n%s", freed, log);
    listing(run, got, sizeof got);
    ck_assert_msg(strcmp(want, got) == 0,
                  "start with %d inodes free left the directory changed:\n"
                  "%s\ninstead of\n%s", freed, got, want);
    /* frees an inode, not a byte: fill-0 holds them */
    char path[300];
    snprintf(path, sizeof path, "%s/fill-%d", run, --next);
    ck_assert_int_eq(unlink(path), 0);
  }
  printf("runtime dir full: %d refused starts, each exit status 1 and "
         "nothing left; started with %d inodes free\n", freed, freed);
  ck_assert_int_ge(freed, 1);
  /* What was stored is all there. */
  ql_client *u = td_connect(&d);
  ck_assert(matches(u, "rt/kept", &kept, QL_FORMAT_Q8C, 0, 26));
  ck_assert(matches(u, "rt/kept2", &fresh, QL_FORMAT_Q4G, 64, 27));
  ql_close(u);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&kept);
  td_layer_free(&own);
  td_layer_free(&fresh);
  ck_assert_int_eq(umount(run), 0);
  rm_tree(parent);
}
END_TEST

/* ---------------------------------------------------------- watchdog */

typedef struct slow_call {
  const td *d;
  int rc;
  int64_t done_ms;
} slow_call;

static void *slow_run(void *p) {
  slow_call *s = p;
  ql_client *c = td_connect(s->d);
  float x[64] = {0}, y[16];
  s->rc = ql_linear(c, "wd/w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1, 64, x,
                    16, y, NULL);
  s->done_ms = td_now_ms();
  ql_close(c);
  return NULL;
}

/*
 * A kernel that hangs (QL_TEST_KERNEL_DELAY_MS: 4 s) under systemd's
 * watchdog (NOTIFY_SOCKET and WATCHDOG_USEC of 400 ms, pinged every
 * 200 ms): WATCHDOG=1 stops while the worker makes no progress, other
 * requests are still answered (Stats), and the pings resume once the
 * kernel returns.
 */
/* A datagram socket at a fresh path standing in for systemd's
 * NOTIFY_SOCKET; its path in sock (108 bytes). */
static int notify_listen(char *sock, const char *tag) {
  snprintf(sock, 108, "/tmp/ql-notify-%s%d", tag, (int)getpid());
  unlink(sock);
  int nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(nfd, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
  ck_assert_int_eq(bind(nfd, (struct sockaddr *)&sa, sizeof sa), 0);
  return nfd;
}

/*
 * A start that loads stored weights asks systemd for more time as it goes
 * (EXTEND_TIMEOUT_USEC before READY=1): under the unit's TimeoutStartSec
 * a large store was killed while loading, and restarted to load it again.
 */
START_TEST(store_load_extends_start) {
  char dir[64], st[128], sock[108];
  snprintf(dir, sizeof dir, "/tmp/ql-extend-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(st, sizeof st, "%s/store", dir);
  const char *args[] = {"--state-dir", st, NULL};
  td d;
  td_start(&d, args);
  ql_client *a = td_connect_admin(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 7, 0);
  ck_assert_int_eq(load(a, "ext/w", &l, QL_FORMAT_Q8C, 0, 1, NULL), 0);
  ql_close(a);
  ck_assert_int_eq(td_stop(&d), 0);

  int nfd = notify_listen(sock, "x");
  setenv("NOTIFY_SOCKET", sock, 1);
  td_start(&d, args);
  unsetenv("NOTIFY_SOCKET");
  int extended = 0, ready = 0;
  char buf[512];
  for (int64_t t0 = td_now_ms(); !ready && td_now_ms() - t0 < 5000;) {
    struct pollfd p = {nfd, POLLIN, 0};
    if (poll(&p, 1, 100) != 1)
      continue;
    ssize_t n = recv(nfd, buf, sizeof buf - 1, 0);
    if (n <= 0)
      continue;
    if (memmem(buf, (size_t)n, "READY=1", 7) != NULL)
      ready = 1;
    else if (memmem(buf, (size_t)n, "EXTEND_TIMEOUT_USEC=", 20) != NULL)
      extended++;
  }
  ck_assert(ready);
  ck_assert_int_ge(extended, 1);
  ql_client *c = td_connect(&d);
  ck_assert(matches(c, "ext/w", &l, QL_FORMAT_Q8C, 0, 8));
  ql_close(c);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
  close(nfd);
  unlink(sock);
}
END_TEST

/* A socket or state directory that others may write is refused: they
 * could replace the sockets, or plant a weight that every client would be
 * served. */
START_TEST(dirs_writable_by_others_refused) {
  char base[64], run[128], st[128], log[4096];
  snprintf(base, sizeof base, "/tmp/ql-dirs-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(base));
  snprintf(run, sizeof run, "%s/run", base);
  snprintf(st, sizeof st, "%s/store", base);
  ck_assert_int_eq(mkdir(run, 0700), 0);
  ck_assert_int_eq(mkdir(st, 0700), 0);
  const char *args[] = {"--state-dir", st, NULL};
  td d;
  ck_assert_int_eq(chmod(st, 0770), 0);
  ck_assert_int_eq(td_start_or_exit(&d, run, args, log, sizeof log), 1);
  ck_assert_msg(strstr(log, st) != NULL && strstr(log, "writable") != NULL,
                "%s", log);
  ck_assert_int_eq(chmod(st, 0750), 0);
  ck_assert_int_eq(chmod(run, 0770), 0);
  ck_assert_int_eq(td_start_or_exit(&d, run, args, log, sizeof log), 1);
  ck_assert_msg(strstr(log, run) != NULL && strstr(log, "writable") != NULL,
                "%s", log);
  ck_assert_int_eq(chmod(run, 0750), 0);
  ck_assert_int_eq(td_start_or_exit(&d, run, args, log, sizeof log), 0);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The sockets are born 0660, the mode clients of the directory's group
 * need: one seen the moment it appears is already so (it was made so
 * after bind(), and a client connecting at once could find it 0755). */
START_TEST(sockets_born_with_their_mode) {
  char base[64], run[128], st[128], path[160];
  snprintf(base, sizeof base, "/tmp/ql-mode-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(base));
  snprintf(run, sizeof run, "%s/run", base);
  snprintf(st, sizeof st, "%s/store", base);
  snprintf(path, sizeof path, "%s/qlineard.sock", run);
  ck_assert_int_eq(mkdir(run, 0700), 0);
  const char *qld = getenv("QLINEARD");
  ck_assert_ptr_nonnull(qld);
  mode_t um = umask(022);
  for (int i = 0; i < 20; i++) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 2);
      execl(qld, qld, "--socket-dir", run, "--state-dir", st, (char *)NULL);
      _exit(127);
    }
    struct stat sb;
    int64_t t0 = td_now_ms();
    while (stat(path, &sb) != 0 && td_now_ms() - t0 < 10000)
      ;
    ck_assert_msg(td_now_ms() - t0 < 10000, "no socket");
    ck_assert_msg((sb.st_mode & 0777) == 0660, "start %d: %s born %04o", i,
                  path, (unsigned)(sb.st_mode & 0777));
    kill(pid, SIGTERM);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  }
  umask(um);
}
END_TEST

START_TEST(watchdog_hang) {
  char sock[108];
  int nfd = notify_listen(sock, "");
  setenv("NOTIFY_SOCKET", sock, 1);
  setenv("WATCHDOG_USEC", "400000", 1);
  setenv("QL_TEST_KERNEL_DELAY_MS", "4000", 1);
  td d;
  td_start(&d, NULL);
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  /* the default kernel_timeout_ms (10 s) against a 400 ms watchdog */
  char *log = td_read_log(&d);
  ck_assert_msg(strstr(log, "not below half the watchdog interval") != NULL,
                "%s", log);
  free(log);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 16, 64, 6, 0);
  ck_assert_int_eq(load(c, "wd/w", &l, QL_FORMAT_Q8C, 0, 0, NULL), 0);

  /* Pings arrive while idle. */
  int idle_pings = 0;
  char buf[256];
  for (int64_t t0 = td_now_ms(); td_now_ms() - t0 < 1000;) {
    struct pollfd p = {nfd, POLLIN, 0};
    if (poll(&p, 1, 100) == 1) {
      ssize_t n = recv(nfd, buf, sizeof buf - 1, 0);
      if (n > 0 && memmem(buf, (size_t)n, "WATCHDOG=1", 10) != NULL)
        idle_pings++;
    }
  }
  ck_assert_int_gt(idle_pings, 0);

  slow_call sc = {&d, 1, 0};
  pthread_t t;
  int64_t start = td_now_ms();
  ck_assert_int_eq(pthread_create(&t, NULL, slow_run, &sc), 0);
  /* From 1.5 s into the hang until it ends: no ping; the loop answers. */
  int hung_pings = 0, later_pings = 0, stats_ok = 0;
  while (td_now_ms() - start < 7000) {
    struct pollfd p = {nfd, POLLIN, 0};
    if (poll(&p, 1, 50) == 1) {
      ssize_t n = recv(nfd, buf, sizeof buf - 1, 0);
      int ping = n > 0 && memmem(buf, (size_t)n, "WATCHDOG=1", 10) != NULL;
      int64_t now = td_now_ms();
      if (ping && now - start > 1500 && (sc.done_ms == 0 ||
                                         now < sc.done_ms))
        hung_pings++;
      if (ping && sc.done_ms != 0 && now > sc.done_ms)
        later_pings++;
    }
    if (!stats_ok && td_now_ms() - start > 1000 && td_now_ms() - start < 3000) {
      ql_stats_info *s = stats(c);
      stats_ok = s->weights == 1;
      ql_stats_free(s);
    }
  }
  pthread_join(t, NULL);
  printf("watchdog: %d pings idle, %d during a 4 s hang, %d after it\n",
         idle_pings, hung_pings, later_pings);
  ck_assert_int_eq(sc.rc, 0);
  ck_assert_int_eq(hung_pings, 0);
  ck_assert_int_gt(later_pings, 0);
  ck_assert(stats_ok);
  ql_close(c);
  td_layer_free(&l);
  close(nfd);
  unlink(sock);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(int argc, char **argv) {
  if (argc >= 4 && strcmp(argv[1], "victim") == 0)
    return role_victim(argv[2], strtoull(argv[3], NULL, 10));
  if (argc >= 4 && strcmp(argv[1], "loader") == 0)
    return role_loader(argv[2], atoi(argv[3]));
  if (argc >= 4 && strcmp(argv[1], "intruder") == 0)
    return role_intruder(argv[2], strtoull(argv[3], NULL, 10));
  Suite *s = suite_create("faults");
  TCase *tc = tcase_create("faults");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, kill9_clients);
  tcase_add_test(tc, fork_after_connect);
  tcase_add_test(tc, kill9_daemon_during_loads);
  tcase_add_test(tc, disk_full);
  tcase_add_test(tc, runtime_dir_full);
  tcase_add_test(tc, watchdog_hang);
  tcase_add_test(tc, store_load_extends_start);
  tcase_add_test(tc, dirs_writable_by_others_refused);
  tcase_add_test(tc, sockets_born_with_their_mode);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
