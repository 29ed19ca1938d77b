/*
 * test_sessions.c - integration tests of sessions and shared-memory regions
 * (DESIGN §7, §8): a real qlineard on a temporary socket, driven through
 * libqlinear by this process, its threads and forked client processes, and
 * through raw requests and raw session packets (harness.h) for what the
 * library would refuse to send.
 *
 * The daemon runs under the sanitizers in the sanitizer build, and every
 * test ends by stopping it with SIGTERM and requiring exit status 0, which
 * includes LeakSanitizer's verdict on everything a session left behind.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

static int load_opts(ql_client *c, const char *name, const td_layer *l,
                     ql_format f, uint32_t gs, ql_progress_cb progress,
                     void *arg, int *shared) {
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
  d.policy = QL_PATH_AUTO;
  d.progress = progress;
  d.progress_arg = arg;
  return ql_load_float(c, &d, NULL, shared);
}

static int load(ql_client *c, const char *name, const td_layer *l, int *shared) {
  return load_opts(c, name, l, QL_FORMAT_Q8C, 0, NULL, NULL, shared);
}

static ql_stats_info *stats(ql_client *c) {
  ql_stats_info *st = NULL;
  int rc = ql_stats(c, &st);
  ck_assert_msg(rc == 0, "stats: %s: %s", ql_strerror(rc), ql_errmsg());
  return st;
}

/* The status code of a raw request sent with session s's token (NULL: no
 * token); an error must come with a message. */
static int raw_code_as(const td *d, const td_session *s,
                       const Qlinear__V1__Request *req) {
  Qlinear__V1__Response *resp = td_call_as(d, s, req, 10000);
  ck_assert_msg(resp != NULL, "no reply from the daemon");
  ck_assert_uint_eq(resp->request_id, req->request_id);
  ck_assert_ptr_nonnull(resp->status);
  int code = resp->status->code;
  if (code != 0)
    ck_assert_msg(resp->status->message && resp->status->message[0],
                  "error reply without a message");
  qlinear__v1__response__free_unpacked(resp, NULL);
  return code;
}

static int raw_code(const td *d, const Qlinear__V1__Request *req) {
  return raw_code_as(d, &d->sess, req);
}

/* A raw Linear request whose x is a region slice (and y_out one when
 * set_y is called). */
typedef struct raw_linear {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor x;
  Qlinear__V1__RegionSlice xs, ys;
  uint64_t shape[2];
} raw_linear;

static Qlinear__V1__Request *mk_linear(raw_linear *r, const char *weight,
                                       ql_dtype dt, uint64_t m, uint64_t k,
                                       uint64_t xid, uint64_t xoff,
                                       uint64_t xlen) {
  static uint64_t id = 5000;
  memset(r, 0, sizeof *r);
  qlinear__v1__request__init(&r->req);
  qlinear__v1__linear_request__init(&r->lin);
  qlinear__v1__tensor__init(&r->x);
  qlinear__v1__region_slice__init(&r->xs);
  qlinear__v1__region_slice__init(&r->ys);
  r->req.request_id = ++id;
  r->req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  r->req.linear = &r->lin;
  r->lin.weight = (char *)weight;
  r->lin.x = &r->x;
  r->lin.path = QLINEAR__V1__PATH__PATH_WEIGHT_ONLY;
  r->shape[0] = m;
  r->shape[1] = k;
  r->x.dtype = (Qlinear__V1__DType)dt;
  r->x.shape = r->shape;
  r->x.n_shape = 2;
  r->x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
  r->x.region = &r->xs;
  r->xs.region_id = xid;
  r->xs.offset = xoff;
  r->xs.length = xlen;
  return &r->req;
}

static void set_y(raw_linear *r, uint64_t yid, uint64_t yoff, uint64_t ylen) {
  r->lin.y_out = &r->ys;
  r->ys.region_id = yid;
  r->ys.offset = yoff;
  r->ys.length = ylen;
}

/* Maps a region descriptor received on a raw session. */
static void *map_fd(int fd, size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ck_assert_msg(p != MAP_FAILED, "mmap: %s", strerror(errno));
  return p;
}

/* How many of the daemon's descriptors lead to target (a readlink() of
 * /proc/PID/fd/N: a path, or "socket:[INODE]"). */
static int daemon_fds_to(const td *d, const char *target) {
  char path[64], link[512];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)d->pid);
  DIR *dir = opendir(path);
  ck_assert_ptr_nonnull(dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    char fdpath[384];
    if (e->d_name[0] == '.')
      continue;
    snprintf(fdpath, sizeof fdpath, "%s/%s", path, e->d_name);
    ssize_t len = readlink(fdpath, link, sizeof link - 1);
    if (len < 0)
      continue;
    link[len] = '\0';
    n += strcmp(link, target) == 0;
  }
  closedir(dir);
  return n;
}

/* --------------------------------------------------------------- tests */

/* Hello needs no session (discovery); every other body does. A token that
 * is missing, of the wrong size, made up, or of a session that ended is
 * refused with QL_ESESSION. */
START_TEST(test_token_required) {
  td d;
  td_start(&d, NULL);
  Qlinear__V1__Request req;
  Qlinear__V1__HelloRequest hello;
  qlinear__v1__request__init(&req);
  qlinear__v1__hello_request__init(&hello);
  req.request_id = 1;
  req.body_case = QLINEAR__V1__REQUEST__BODY_HELLO;
  req.hello = &hello;
  hello.protocol_version = QL_PROTOCOL_VERSION;
  ck_assert_int_eq(raw_code_as(&d, NULL, &req), 0);
  /* A stale token does not spoil discovery either. */
  uint8_t junk[16];
  memset(junk, 0xa5, sizeof junk);
  req.session_token.data = junk;
  req.session_token.len = sizeof junk;
  ck_assert_int_eq(raw_code_as(&d, NULL, &req), 0);

  /* Every other body, without a token. */
  Qlinear__V1__ListWeightsRequest list;
  Qlinear__V1__StatsRequest st;
  Qlinear__V1__UnloadWeightRequest un;
  Qlinear__V1__LoadBeginRequest lb;
  Qlinear__V1__WeightSpec sp;
  qlinear__v1__list_weights_request__init(&list);
  qlinear__v1__stats_request__init(&st);
  qlinear__v1__unload_weight_request__init(&un);
  qlinear__v1__load_begin_request__init(&lb);
  qlinear__v1__weight_spec__init(&sp);
  un.name = "w";
  lb.spec = &sp;
  sp.name = "w";
  sp.format = QLINEAR__V1__FORMAT__FORMAT_Q8C;
  sp.n = 4;
  sp.k = 32;
  sp.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  raw_linear rl;
  Qlinear__V1__Request *lin = mk_linear(&rl, "w", QL_DTYPE_F32, 1, 1, 1, 0, 4);
  struct {
    Qlinear__V1__Request__BodyCase bc;
    void *body;
  } bodies[] = {
      {QLINEAR__V1__REQUEST__BODY_LIST, &list},
      {QLINEAR__V1__REQUEST__BODY_STATS, &st},
      {QLINEAR__V1__REQUEST__BODY_UNLOAD, &un},
      {QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN, &lb},
  };
  uint8_t shorty[15];
  memset(shorty, 1, sizeof shorty);
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    qlinear__v1__request__init(&req);
    req.request_id = 10 + i;
    req.body_case = bodies[i].bc;
    req.list = bodies[i].body; /* every body member is a message pointer */
    ck_assert_int_eq(raw_code_as(&d, NULL, &req), QL_ESESSION);
    req.session_token.data = junk; /* made up */
    req.session_token.len = sizeof junk;
    ck_assert_int_eq(raw_code_as(&d, NULL, &req), QL_ESESSION);
    req.session_token.data = shorty; /* wrong size */
    req.session_token.len = sizeof shorty;
    ck_assert_int_eq(raw_code_as(&d, NULL, &req), QL_ESESSION);
    /* The harness's own session: accepted. */
    req.session_token.len = 0;
    ck_assert_int_ne(raw_code(&d, &req), QL_ESESSION);
  }
  ck_assert_int_eq(raw_code_as(&d, NULL, lin), QL_ESESSION);
  /* Even a request with no body is refused for its token first. */
  qlinear__v1__request__init(&req);
  req.request_id = 99;
  ck_assert_int_eq(raw_code_as(&d, NULL, &req), QL_ESESSION);
  ck_assert_int_eq(raw_code(&d, &req), QL_EPROTO);

  /* The token of a session that ended stops working at once. */
  td_session s2;
  ck_assert_int_eq(td_session_open(&d, &s2), 0);
  qlinear__v1__request__init(&req);
  req.request_id = 100;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LIST;
  req.list = &list;
  ck_assert_int_eq(raw_code_as(&d, &s2, &req), 0);
  uint8_t saved[16];
  memcpy(saved, s2.token, sizeof saved);
  td_session_close(&s2);
  req.session_token.data = saved;
  req.session_token.len = sizeof saved;
  int rc = 0;
  for (int i = 0; i < 200 && (rc = raw_code_as(&d, NULL, &req)) == 0; i++)
    usleep(5000);
  ck_assert_int_eq(rc, QL_ESESSION);
  ck_assert_str_eq(ql_err_name(QL_ESESSION), "QL_ESESSION");
  ck_assert_str_eq(ql_strerror(QL_ESESSION), "no such session");
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* What one session makes is not another's: a region, an upload, a hold on
 * a weight. Another session's region or upload is simply not found. */
START_TEST(test_other_sessions) {
  td d;
  td_start(&d, NULL);
  ql_client *c1 = td_connect(&d), *c2 = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 8, 32, 3, 1);
  int shared = -1;
  ck_assert_int_eq(load(c1, "o/w", &l, &shared), 0);
  ck_assert_int_eq(shared, 0);

  /* A region of session B used with A's token. */
  td_session b;
  ck_assert_int_eq(td_session_open(&d, &b), 0);
  uint64_t rid;
  int fd;
  ck_assert_int_eq(td_region_create(&b, 4096, &rid, &fd), 0);
  raw_linear rl;
  Qlinear__V1__Request *lin =
      mk_linear(&rl, "o/w", QL_DTYPE_F32, 1, 32, rid, 0, 32 * 4);
  ck_assert_int_eq(raw_code_as(&d, &b, lin), 0);
  ck_assert_int_eq(raw_code(&d, lin), QL_ENOTFOUND);
  set_y(&rl, rid, 1024, 8 * 4);
  ck_assert_int_eq(raw_code_as(&d, &b, lin), 0);
  rl.xs.region_id = 0; /* never an id */
  ck_assert_int_eq(raw_code_as(&d, &b, lin), QL_ENOTFOUND);
  ck_assert_int_eq(td_region_destroy(&d.sess, rid), QL_ENOTFOUND);
  ck_assert_int_eq(td_region_destroy(&b, rid), 0);
  ck_assert_int_eq(td_region_destroy(&b, rid), QL_ENOTFOUND);
  close(fd);

  /* An upload begun by the harness's session, continued by B. */
  Qlinear__V1__Request req;
  Qlinear__V1__LoadBeginRequest lb;
  Qlinear__V1__WeightSpec sp;
  qlinear__v1__request__init(&req);
  qlinear__v1__load_begin_request__init(&lb);
  qlinear__v1__weight_spec__init(&sp);
  req.request_id = 7;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_BEGIN;
  req.load_begin = &lb;
  lb.spec = &sp;
  sp.name = "o/up";
  sp.format = QLINEAR__V1__FORMAT__FORMAT_Q8C;
  sp.n = 2;
  sp.k = 16;
  sp.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  Qlinear__V1__Response *resp = td_call(&d, &req, 5000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, 0);
  uint64_t up = resp->load_begin->upload_id;
  qlinear__v1__response__free_unpacked(resp, NULL);
  uint8_t bytes[2 * 16 * 4];
  memset(bytes, 0, sizeof bytes);
  Qlinear__V1__LoadChunkRequest ch;
  qlinear__v1__load_chunk_request__init(&ch);
  ch.upload_id = up;
  ch.data.data = bytes;
  ch.data.len = sizeof bytes;
  qlinear__v1__request__init(&req);
  req.request_id = 8;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_CHUNK;
  req.load_chunk = &ch;
  ck_assert_int_eq(raw_code_as(&d, &b, &req), QL_ENOTFOUND);
  Qlinear__V1__LoadCommitRequest cm;
  qlinear__v1__load_commit_request__init(&cm);
  cm.upload_id = up;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_COMMIT;
  req.load_commit = &cm;
  ck_assert_int_eq(raw_code_as(&d, &b, &req), QL_ENOTFOUND);
  Qlinear__V1__LoadAbortRequest ab;
  qlinear__v1__load_abort_request__init(&ab);
  ab.upload_id = up;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LOAD_ABORT;
  req.load_abort = &ab;
  ck_assert_int_eq(raw_code_as(&d, &b, &req), QL_ENOTFOUND);
  ck_assert_int_eq(raw_code(&d, &req), 0);
  td_session_close(&b);

  /* Holds: c2 shares o/w, then lets go; c1 still holds it. */
  ck_assert_int_eq(load(c2, "o/w", &l, &shared), 0);
  ck_assert_int_eq(shared, 1);
  ck_assert_int_eq(ql_unload(c2, "o/w"), 0);
  ql_weight_info info;
  ck_assert_int_eq(ql_lookup(c2, "o/w", &info), 0);
  /* Its hold is gone: unloading again is not its to do. */
  ck_assert_int_eq(ql_unload(c2, "o/w"), QL_EPERM);
  ck_assert_int_eq(ql_unload(c2, "o/none"), QL_ENOTFOUND);
  /* Any session may compute with a resident weight. */
  float x[32] = {0}, y[8];
  ck_assert_int_eq(ql_linear(c2, "o/w", QL_PATH_AUTO, QL_DTYPE_F32, 1, 32, x,
                             8, y, NULL),
                   0);
  /* The last holder lets go: the weight is unloaded. */
  ck_assert_int_eq(ql_unload(c1, "o/w"), 0);
  ck_assert_int_eq(ql_lookup(c2, "o/w", &info), QL_ENOTFOUND);
  /* A session that loads twice holds once. */
  ck_assert_int_eq(load(c1, "o/w", &l, NULL), 0);
  ck_assert_int_eq(load(c1, "o/w", &l, &shared), 0);
  ck_assert_int_eq(shared, 1);
  ck_assert_int_eq(ql_unload(c1, "o/w"), 0);
  ck_assert_int_eq(ql_lookup(c2, "o/w", &info), QL_ENOTFOUND);
  td_layer_free(&l);
  ql_close(c1);
  ql_close(c2);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The client process of test_kill9: two weights, two regions and an
 * upload stopped halfway (its progress callback never returns). */
static void stuck(void *arg, uint64_t done, uint64_t total) {
  (void)done;
  (void)total;
  int fd = *(int *)arg;
  if (write(fd, "y", 1) != 1)
    _exit(3);
  for (;;)
    pause();
}

static void kill9_child(const td *d, int ready) {
  ql_client *c = NULL;
  td_layer own, common, big;
  td_layer_make(&own, 16, 64, 1, 1);
  td_layer_make(&common, 16, 64, 2, 1);
  td_layer_make(&big, 64, 1024, 3, 0);
  ql_region *r1 = NULL, *r2 = NULL;
  /* Messages only: the regions counted below are exactly these two (a
   * ring and staging regions would count too). */
  ql_connect_opts o = {0};
  o.no_ring = 1;
  if (ql_connect(d->address, &o, &c) != 0 ||
      load(c, "kill/own", &own, NULL) != 0 ||
      load(c, "kill/shared", &common, NULL) != 0 ||
      ql_region_create(c, 1 << 20, &r1) != 0 ||
      ql_region_create(c, 1 << 20, &r2) != 0) {
    if (write(ready, "n", 1) != 1)
      _exit(2);
    _exit(1);
  }
  memset(r1->data, 0x3c, r1->size);
  load_opts(c, "kill/partial", &big, QL_FORMAT_Q8C, 0, stuck, &ready, NULL);
  _exit(4); /* not reached */
}

/* A client killed with -9 frees its regions, its uploads and the weights
 * only it held at once; a weight another session also holds stays. */
START_TEST(test_kill9) {
  td d;
  td_start(&d, NULL);
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  /* Forked before this process touches nanomsg. */
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(p[0]);
    kill9_child(&d, p[1]);
  }
  close(p[1]);
  char ok = 0;
  ck_assert_int_eq(read(p[0], &ok, 1), 1);
  ck_assert_msg(ok == 'y', "the client process failed to set up");
  close(p[0]);

  ql_client *c = td_connect_messages(&d);
  td_layer common;
  td_layer_make(&common, 16, 64, 2, 1);
  int shared = -1;
  ck_assert_int_eq(load(c, "kill/shared", &common, &shared), 0);
  ck_assert_int_eq(shared, 1);
  td_layer_free(&common);
  ql_stats_info *st = stats(c);
  ck_assert_uint_eq(st->sessions, 3); /* harness, child, this one */
  ck_assert_uint_eq(st->regions, 2);
  ck_assert_uint_eq(st->region_bytes, 2u << 20);
  ck_assert_uint_eq(st->uploads_in_progress, 1);
  ck_assert_uint_eq(st->weights, 2);
  ql_stats_free(st);

  ck_assert_int_eq(kill(pid, SIGKILL), 0);
  int wst;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  int64_t t0 = td_now_ms(), waited = -1;
  while (td_now_ms() - t0 < 5000) {
    st = stats(c);
    int done = st->sessions == 2 && st->regions == 0 &&
               st->region_bytes == 0 && st->uploads_in_progress == 0 &&
               st->weights == 1;
    ql_stats_free(st);
    if (done) {
      waited = td_now_ms() - t0;
      break;
    }
    usleep(2000);
  }
  ck_assert_msg(waited >= 0, "the dead client's session was not cleaned up");
  /* "At once": the socket's end, not a lease timeout (seconds). */
  ck_assert_msg(waited < 1000, "cleanup took %lld ms", (long long)waited);
  ql_weight_info *list = NULL;
  size_t n = 0;
  ck_assert_int_eq(ql_list(c, &list, &n), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_str_eq(list[0].name, "kill/shared");
  ql_free(list);
  /* The name of the partial upload is free: nothing of it remained. */
  td_layer big;
  td_layer_make(&big, 8, 32, 9, 0);
  ck_assert_int_eq(load(c, "kill/partial", &big, &shared), 0);
  ck_assert_int_eq(shared, 0);
  td_layer_free(&big);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A child made by fork() gets a copy of every descriptor, the session
 * socket too; the library closes the child's copy, so the parent's session
 * still ends when the parent lets go, however long the child lives. */
START_TEST(test_fork_child_keeps_nothing) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 4, 32, 1, 0);
  ck_assert_int_eq(load(c, "f/w", &l, NULL), 0);
  td_layer_free(&l);
  ql_region *r = NULL;
  ck_assert_int_eq(ql_region_create(c, 4096, &r), 0);
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* Lives on, touching nothing of the parent's, until told to go. */
    char b;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(p[1]);
    _exit(read(p[0], &b, 1) < 0 ? 1 : 0);
  }
  close(p[0]);
  ql_close(c);
  ql_client *obs = td_connect(&d);
  uint64_t weights = 1, regions = 1;
  for (int64_t t0 = td_now_ms(); td_now_ms() - t0 < 5000; usleep(2000)) {
    ql_stats_info *st = stats(obs);
    weights = st->weights;
    regions = st->regions;
    ql_stats_free(st);
    if (weights == 0 && regions == 0)
      break;
  }
  ck_assert_uint_eq(weights, 0);
  ck_assert_uint_eq(regions, 0);
  close(p[1]);
  int wst;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
  ql_close(obs);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Slices are checked against their region as off <= size && len <=
 * size - off, never off + len: offsets near 2^64 cannot wrap into range.
 * Dtype, shape and length must agree; x and y must not overlap. */
START_TEST(test_region_validation) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 4, 1, 5, 1); /* K = 1: an f16 row of x is 2 bytes */
  ck_assert_int_eq(load(c, "v/w", &l, NULL), 0);
  const uint64_t size = 4096;
  uint64_t rid, yid;
  int fd, yfd;
  ck_assert_int_eq(td_region_create(&d.sess, size, &rid, &fd), 0);
  ck_assert_int_eq(td_region_create(&d.sess, size, &yid, &yfd), 0);
  uint16_t *x = map_fd(fd, size);
  for (size_t i = 0; i < size / 2; i++)
    x[i] = 0x3c00; /* f16 1.0 */

  raw_linear rl;
  const ql_dtype h = QL_DTYPE_F16;
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", h, 1, 1, rid, 0, 2)),
                   0);
  /* The last element, exactly. */
  ck_assert_int_eq(
      raw_code(&d, mk_linear(&rl, "v/w", h, 1, 1, rid, size - 2, 2)), 0);
  ck_assert_int_eq(
      raw_code(&d, mk_linear(&rl, "v/w", h, 2, 1, rid, size - 4, 4)), 0);
  /* Offsets near 2^64: off + len wraps to a small number. */
  static const uint64_t far[] = {UINT64_MAX, UINT64_MAX - 1, UINT64_MAX - 3,
                                 (uint64_t)1 << 63, size, size + 2};
  for (size_t i = 0; i < sizeof far / sizeof far[0]; i++)
    ck_assert_int_eq(
        raw_code(&d, mk_linear(&rl, "v/w", h, 1, 1, rid, far[i], 2)),
        QL_EINVAL);
  /* len > size - off, by one element. */
  ck_assert_int_eq(
      raw_code(&d, mk_linear(&rl, "v/w", h, 2, 1, rid, size - 2, 4)),
      QL_EINVAL);
  /* An offset that is not a multiple of the element size. */
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", h, 1, 1, rid, 1, 2)),
                   QL_EINVAL);
  ck_assert_int_eq(
      raw_code(&d, mk_linear(&rl, "v/w", QL_DTYPE_F32, 1, 1, rid, 2, 4)),
      QL_EINVAL);
  /* Length against dtype and shape. */
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", h, 1, 1, rid, 0, 4)),
                   QL_ESHAPE);
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", h, 2, 1, rid, 0, 2)),
                   QL_ESHAPE);
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", h, 1, 1, rid, 0, 0)),
                   QL_ESHAPE);
  ck_assert_int_eq(
      raw_code(&d, mk_linear(&rl, "v/w", QL_DTYPE_F32, 1, 1, rid, 0, 2)),
      QL_ESHAPE);
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", (ql_dtype)9, 1, 1, rid,
                                          0, 2)),
                   QL_EDTYPE);
  /* K of the weight. */
  ck_assert_int_eq(raw_code(&d, mk_linear(&rl, "v/w", h, 1, 2, rid, 0, 4)),
                   QL_ESHAPE);
  /* y_out: [1,4] f16 is 8 bytes. */
  mk_linear(&rl, "v/w", h, 1, 1, rid, 0, 2);
  set_y(&rl, yid, size - 8, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), 0);
  set_y(&rl, yid, UINT64_MAX - 7, 8); /* wraps to 0 */
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_EINVAL);
  set_y(&rl, yid, size - 6, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_EINVAL);
  set_y(&rl, yid, 1, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_EINVAL);
  set_y(&rl, yid, 0, 6);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_ESHAPE);
  set_y(&rl, yid, 0, 10);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_ESHAPE);
  set_y(&rl, yid + 1000, 0, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_ENOTFOUND);
  /* x and y in one region: apart is fine, overlapping is not. */
  set_y(&rl, rid, 8, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), 0);
  set_y(&rl, rid, 2, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), 0);
  set_y(&rl, rid, 0, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_EINVAL);
  mk_linear(&rl, "v/w", h, 1, 1, rid, 6, 2);
  set_y(&rl, rid, 0, 8);
  ck_assert_int_eq(raw_code(&d, &rl.req), QL_EINVAL);
  /* A reply names the slice, never inline bytes, never an address. */
  mk_linear(&rl, "v/w", h, 1, 1, rid, 0, 2);
  set_y(&rl, yid, 16, 8);
  Qlinear__V1__Response *resp = td_call(&d, &rl.req, 5000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, 0);
  const Qlinear__V1__Tensor *yt = resp->linear->y;
  ck_assert_int_eq(yt->data_case, QLINEAR__V1__TENSOR__DATA_REGION);
  ck_assert_uint_eq(yt->region->region_id, yid);
  ck_assert_uint_eq(yt->region->offset, 16);
  ck_assert_uint_eq(yt->region->length, 8);
  qlinear__v1__response__free_unpacked(resp, NULL);

  /* The library checks the same before sending. */
  ql_region *r = NULL, *r2 = NULL;
  ck_assert_int_eq(ql_region_create(c, size, &r), 0);
  ck_assert_int_eq(ql_region_create(c, size, &r2), 0);
  uint16_t yb[4];
  ql_slice xs = {r, UINT64_MAX - 1, 2}, ys = {r2, 0, 8};
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, NULL, NULL),
                   QL_EINVAL);
  xs.offset = size; /* an empty slice there would fit; 2 bytes do not */
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, NULL, NULL),
                   QL_EINVAL);
  xs.offset = 0;
  xs.length = 4;
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, NULL, NULL),
                   QL_ESHAPE);
  xs.length = 2;
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, yb, NULL),
                   QL_EINVAL); /* both y and y_inline */
  ys.region = r; /* overlapping x */
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, NULL, NULL),
                   QL_EINVAL);
  ql_region fake = *r; /* not one of this client's */
  xs.region = &fake;
  ys.region = r2;
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, NULL, NULL),
                   QL_EINVAL);
  ck_assert_int_eq(ql_region_destroy(c, &fake), QL_EINVAL);
  xs.region = r;
  ck_assert_int_eq(ql_linear_region(c, "v/w", QL_PATH_AUTO, h, 1, 1, &xs, 4,
                                    &ys, NULL, NULL),
                   0);
  ck_assert_int_eq(ql_region_destroy(c, r), 0);
  ck_assert_int_eq(ql_region_destroy(c, r2), 0);
  ck_assert_int_eq(ql_region_destroy(c, NULL), 0);

  munmap(x, size);
  close(fd);
  close(yfd);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The descriptor a client receives is sealed: it cannot shrink or grow
 * the memory under the daemon's mapping, nor change the seals. What it can
 * do (punch a hole: the pages read as zero) cannot make the daemon take
 * SIGBUS. */
START_TEST(test_seals) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, 8, 256, 6, 1);
  ck_assert_int_eq(load(c, "s/w", &l, NULL), 0);
  const size_t size = 1 << 20;
  uint64_t rid;
  int fd;
  ck_assert_int_eq(td_region_create(&d.sess, size, &rid, &fd), 0);
  int seals = fcntl(fd, F_GET_SEALS);
  ck_assert_int_eq(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                   F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  errno = 0;
  ck_assert_int_eq(ftruncate(fd, 0), -1);
  ck_assert_int_eq(errno, EPERM);
  errno = 0;
  ck_assert_int_eq(ftruncate(fd, size / 2), -1);
  ck_assert_int_eq(errno, EPERM);
  errno = 0;
  ck_assert_int_eq(ftruncate(fd, size * 2), -1);
  ck_assert_int_eq(errno, EPERM);
  errno = 0;
  ck_assert_int_eq(fallocate(fd, 0, 0, (off_t)size * 2), -1);
  ck_assert_int_eq(errno, EPERM);
  errno = 0;
  ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  ck_assert_int_eq(errno, EPERM);
  struct stat sb;
  ck_assert_int_eq(fstat(fd, &sb), 0);
  ck_assert_int_eq(sb.st_size, (off_t)size);

  /* The last row of x at the very end of the region. */
  float *map = map_fd(fd, size);
  uint64_t seed = 4;
  const uint64_t off = size - 256 * 4;
  td_randn(&seed, map + off / 4, 256, 1.0f);
  float want[8], y[8];
  ck_assert_int_eq(ql_linear(c, "s/w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             256, map + off / 4, 8, want, NULL),
                   0);
  raw_linear rl;
  Qlinear__V1__Request *lin =
      mk_linear(&rl, "s/w", QL_DTYPE_F32, 1, 256, rid, off, 256 * 4);
  ck_assert_int_eq(raw_code(&d, lin), 0);
  /* Punched out, the pages are nobody's: the daemon does not fault them
   * into its own memory, and says so. */
  ck_assert_int_eq(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                             (off_t)size),
                   0);
  Qlinear__V1__Response *resp = td_call(&d, lin, 5000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, QL_EINVAL);
  ck_assert_ptr_nonnull(strstr(resp->status->message, "never wrote"));
  qlinear__v1__response__free_unpacked(resp, NULL);
  /* Written again (as zeros), they read as zero: y is the bias. */
  memset(map + off / 4, 0, 256 * 4);
  resp = td_call(&d, lin, 5000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_int_eq(resp->status->code, 0);
  ck_assert_uint_eq(resp->linear->y->inline_data.len, sizeof y);
  memcpy(y, resp->linear->y->inline_data.data, sizeof y);
  qlinear__v1__response__free_unpacked(resp, NULL);
  float zeros[256] = {0};
  ck_assert_int_eq(ql_linear(c, "s/w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 1,
                             256, zeros, 8, want, NULL),
                   0);
  ck_assert_mem_eq(y, want, sizeof y);
  ck_assert(td_alive(&d));
  munmap(map, size);
  close(fd);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Packets on the session socket that are not what they should be: each is
 * answered, nothing a client sends is installed in the daemon. */
START_TEST(test_session_packets) {
  td d;
  td_start(&d, NULL);
  td_session s;
  ck_assert_int_eq(td_session_open(&d, &s), 0);

  /* Garbage, and a packet over 4096 bytes: error replies under id 0. */
  static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0x0f, 0x12, 0x99};
  uint8_t buf[8192];
  ck_assert_int_eq(send(s.fd, garbage, sizeof garbage, 0), sizeof garbage);
  ssize_t n = recv(s.fd, buf, sizeof buf, 0);
  ck_assert_int_gt(n, 0);
  Qlinear__V1__SessionResponse *r =
      qlinear__v1__session_response__unpack(NULL, (size_t)n, buf);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->request_id, 0);
  ck_assert_int_eq(r->status->code, QL_EPROTO);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  memset(buf, 0, sizeof buf);
  ck_assert_int_eq(send(s.fd, buf, 5000, 0), 5000);
  n = recv(s.fd, buf, sizeof buf, 0);
  ck_assert_int_gt(n, 0);
  r = qlinear__v1__session_response__unpack(NULL, (size_t)n, buf);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_ETOOBIG);
  qlinear__v1__session_response__free_unpacked(r, NULL);

  /* Open twice; no body; size 0; id 0. */
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__SessionOpenRequest op;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__session_open_request__init(&op);
  op.protocol_version = QL_PROTOCOL_VERSION;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  req.open = &op;
  r = td_session_call(&s, &req, NULL, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->request_id, req.request_id);
  ck_assert_int_eq(r->status->code, QL_EPROTO);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  qlinear__v1__session_request__init(&req);
  r = td_session_call(&s, &req, NULL, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_EPROTO);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  uint64_t id;
  int fd;
  ck_assert_int_eq(td_region_create(&s, 0, &id, &fd), QL_EINVAL);
  ck_assert_int_eq(td_region_destroy(&s, 0), QL_EINVAL);

  /* Descriptors sent to the daemon are dropped by the kernel, unread. */
  Qlinear__V1__CreateRegionRequest cr;
  qlinear__v1__create_region_request__init(&cr);
  cr.size = 4096;
  qlinear__v1__session_request__init(&req);
  req.request_id = 77;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
  req.create_region = &cr;
  size_t len = qlinear__v1__session_request__pack(&req, buf);
  char marker[300], sock[64];
  snprintf(marker, sizeof marker, "%s.marker", d.dir);
  int mfd = open(marker, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ck_assert_int_ge(mfd, 0);
  struct stat sst;
  ck_assert_int_eq(fstat(s.fd, &sst), 0);
  snprintf(sock, sizeof sock, "socket:[%lu]", (unsigned long)sst.st_ino);
  int mine[3] = {mfd, dup(s.fd), dup(mfd)};
  union {
    struct cmsghdr align;
    char b[CMSG_SPACE(sizeof mine)];
  } ctl;
  struct iovec iov = {buf, len};
  struct msghdr mh;
  memset(&mh, 0, sizeof mh);
  memset(&ctl, 0, sizeof ctl);
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl.b;
  mh.msg_controllen = sizeof ctl.b;
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof mine);
  memcpy(CMSG_DATA(cm), mine, sizeof mine);
  ck_assert_int_eq(sendmsg(s.fd, &mh, 0), (ssize_t)len);
  for (int i = 0; i < 3; i++)
    close(mine[i]);
  n = recv(s.fd, buf, sizeof buf, 0);
  ck_assert_int_gt(n, 0);
  r = qlinear__v1__session_response__unpack(NULL, (size_t)n, buf);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, 0); /* the request itself was fine */
  qlinear__v1__session_response__free_unpacked(r, NULL);
  ck_assert_int_ge(daemon_fds_to(&d, d.log), 1); /* the check sees fds */
  ck_assert_int_eq(daemon_fds_to(&d, marker), 0);
  ck_assert_int_eq(daemon_fds_to(&d, sock), 0);
  unlink(marker);

  /* A connection that never opened its session can do nothing. */
  td_session raw;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, d.session, strlen(d.session) + 1);
  memset(&raw, 0, sizeof raw);
  raw.fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  ck_assert_int_eq(connect(raw.fd, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(td_region_create(&raw, 4096, &id, &fd), QL_ESESSION);
  /* ... and one of another protocol version is refused. */
  op.protocol_version = QL_PROTOCOL_VERSION + 1;
  qlinear__v1__session_request__init(&req);
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_OPEN;
  req.open = &op;
  r = td_session_call(&raw, &req, NULL, 5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_EVERSION);
  ck_assert_int_eq(r->body_case, QLINEAR__V1__SESSION_RESPONSE__BODY__NOT_SET);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  td_session_close(&raw);

  /* Too many sessions: the one over the limit is told so; closing one
   * makes room. Every session here is this process's uid, so the limit
   * met is max_sessions_per_uid (64 by default), not the daemon's 256. */
  ql_client *c = td_connect(&d);
  ql_stats_info *st = stats(c);
  uint64_t open0 = st->sessions;
  ql_stats_free(st);
  enum { MANY = 1000 };
  td_session *many = tu_xmalloc(MANY * sizeof *many);
  int rc = 0, opened = 0;
  while (opened < MANY && (rc = td_session_open(&d, &many[opened])) == 0)
    opened++;
  ck_assert_int_eq(rc, QL_EEXHAUSTED);
  ck_assert_int_ge(opened, 1);
  ck_assert_uint_eq(open0 + (uint64_t)opened, 64);
  st = stats(c);
  ck_assert_uint_eq(st->sessions, open0 + (uint64_t)opened);
  ql_stats_free(st);
  ql_client *c2 = NULL;
  ck_assert_int_eq(ql_connect(d.address, NULL, &c2), QL_EEXHAUSTED);
  td_session_close(&many[0]);
  int64_t t0 = td_now_ms();
  while ((rc = td_session_open(&d, &many[0])) != 0 && td_now_ms() - t0 < 5000)
    usleep(2000);
  ck_assert_int_eq(rc, 0);
  for (int i = 0; i < opened; i++)
    td_session_close(&many[i]);
  free(many);
  ql_close(c);
  td_session_close(&s);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A session may hold so many regions of so many bytes. */
START_TEST(test_region_limits) {
  td d;
  td_start(&d, NULL);
  td_session *s = &d.sess;
  ck_assert_uint_ge(s->max_regions, 1);
  ck_assert_uint_ge(s->max_region_bytes, 1u << 20);
  uint64_t *ids = tu_xmalloc(s->max_regions * sizeof *ids);
  int fd;
  ck_assert_int_eq(td_region_create(s, s->max_region_bytes + 1, &ids[0], &fd),
                   QL_EEXHAUSTED);
  ck_assert_int_eq(td_region_create(s, UINT64_MAX, &ids[0], &fd),
                   QL_EEXHAUSTED);
  for (uint32_t i = 0; i < s->max_regions; i++) {
    ck_assert_int_eq(td_region_create(s, 4096, &ids[i], &fd), 0);
    close(fd);
  }
  uint64_t extra;
  ck_assert_int_eq(td_region_create(s, 4096, &extra, &fd), QL_EEXHAUSTED);
  ck_assert_int_eq(td_region_destroy(s, ids[0]), 0);
  ck_assert_int_eq(td_region_create(s, 4096, &ids[0], &fd), 0);
  close(fd);
  /* Ids are never reused. */
  for (uint32_t i = 1; i < s->max_regions; i++)
    ck_assert_uint_ne(ids[0], ids[i]);
  for (uint32_t i = 0; i < s->max_regions; i++)
    ck_assert_int_eq(td_region_destroy(s, ids[i]), 0);
  /* The byte budget: one region of all of it would be fine, but not one
   * byte more next to a small one. */
  ck_assert_int_eq(td_region_create(s, 4096, &ids[0], &fd), 0);
  close(fd);
  ck_assert_int_eq(
      td_region_create(s, s->max_region_bytes - 4095, &extra, &fd),
      QL_EEXHAUSTED);
  free(ids);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Results written into a region are the bytes the inline path returns,
 * for every dtype and both paths; a region result may exceed the message
 * cap. */
START_TEST(test_zero_copy_equals_inline) {
  td d;
  static const char *const args[] = {"--max-message-bytes", "65536", NULL};
  td_start(&d, args);
  ql_client *c = td_connect_messages(&d);
  td_layer l;
  td_layer_make(&l, 96, 320, 8, 1);
  ck_assert_int_eq(load_opts(c, "z/w", &l, QL_FORMAT_Q4G, 64, NULL, NULL,
                             NULL),
                   0);
  ql_region *rx = NULL, *ry = NULL;
  ck_assert_int_eq(ql_region_create(c, 1 << 20, &rx), 0);
  ck_assert_int_eq(ql_region_create(c, 1 << 20, &ry), 0);
  ck_assert_ptr_nonnull(rx->data);
  ck_assert_uint_eq(rx->size, 1 << 20);
  ck_assert_uint_ne(rx->id, ry->id);
  uint64_t seed = 12;
  for (int dt = QL_DTYPE_F32; dt <= QL_DTYPE_BF16; dt++) {
    for (int p = QL_PATH_WEIGHT_ONLY; p <= QL_PATH_ACT_QUANT; p++) {
      const uint64_t m = 5, k = l.k, n = l.n;
      size_t es = ql_dtype_size(dt);
      float xf[5 * 320];
      td_randn(&seed, xf, m * k, 1.0f);
      /* x somewhere inside, y at another offset of another region. */
      uint64_t xoff = 4096 + 64 * (uint64_t)dt, yoff = 8 * es * (uint64_t)p;
      uint8_t *x = (uint8_t *)rx->data + xoff;
      ql_from_f32((ql_dtype)dt, xf, x, m * k);
      uint8_t *want = tu_xmalloc(m * n * es), *got = tu_xmalloc(m * n * es);
      ql_linear_result r1, r2;
      ck_assert_int_eq(ql_linear(c, "z/w", (ql_path)p, (ql_dtype)dt, m, k, x,
                                 n, want, &r1),
                       0);
      ql_slice xs = {rx, xoff, m * k * es}, ys = {ry, yoff, m * n * es};
      memset((uint8_t *)ry->data + yoff, 0xee, m * n * es);
      int rc = ql_linear_region(c, "z/w", (ql_path)p, (ql_dtype)dt, m, k, &xs,
                                n, &ys, NULL, &r2);
      ck_assert_msg(rc == 0, "%s: %s", ql_strerror(rc), ql_errmsg());
      ck_assert_int_eq(r2.path, r1.path);
      ck_assert_str_eq(r2.impl, r1.impl);
      ck_assert_mem_eq((uint8_t *)ry->data + yoff, want, m * n * es);
      /* x from the region, y inline. */
      ck_assert_int_eq(ql_linear_region(c, "z/w", (ql_path)p, (ql_dtype)dt, m,
                                        k, &xs, n, NULL, got, NULL),
                       0);
      ck_assert_mem_eq(got, want, m * n * es);
      /* x and y in one region, apart. */
      ql_slice ys2 = {rx, 0, m * n * es};
      ck_assert_int_eq(ql_linear_region(c, "z/w", (ql_path)p, (ql_dtype)dt, m,
                                        k, &xs, n, &ys2, NULL, NULL),
                       0);
      ck_assert_mem_eq(rx->data, want, m * n * es);
      free(want);
      free(got);
    }
  }
  /* 64 rows of y: 24 KiB; 256 rows: 96 KiB, more than the 64 KiB cap. */
  const uint64_t m = 256;
  float *xf = tu_xmalloc(m * l.k * 4), *want = tu_xmalloc(m * l.n * 4);
  td_randn(&seed, xf, m * l.k, 1.0f);
  memcpy(rx->data, xf, m * l.k * 4);
  ck_assert_int_eq(ql_linear(c, "z/w", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, m,
                             l.k, xf, l.n, want, NULL),
                   QL_ETOOBIG);
  ql_slice xs = {rx, 0, m * l.k * 4}, ys = {ry, 0, m * l.n * 4};
  ck_assert_int_eq(ql_linear_region(c, "z/w", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, m, l.k, &xs, l.n, NULL, want,
                                    NULL),
                   QL_ETOOBIG);
  ck_assert_int_eq(ql_linear_region(c, "z/w", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, m, l.k, &xs, l.n, &ys, NULL,
                                    NULL),
                   0);
  /* The same bytes as the in-process reference (as in test_daemon.c). */
  ql_qweight *q = NULL;
  ql_quant_params qp = {QL_FORMAT_Q4G, 64, 0, (ql_dtype)0};
  ck_assert_int_eq(ql_qweight_quantize(&qp, (int64_t)l.n, (int64_t)l.k,
                                       QL_DTYPE_F32, l.w, l.b, &q),
                   0);
  ck_assert_int_eq(ql_linear_wo_ref(q, QL_DTYPE_F32, xf, (int64_t)m, want), 0);
  ql_qweight_free(q);
  ck_assert_mem_eq(ry->data, want, m * l.n * 4);
  ql_stats_info *st = stats(c);
  ck_assert_uint_eq(st->regions, 2);
  ck_assert_uint_eq(st->region_bytes, 2u << 20);
  ql_stats_free(st);
  free(xf);
  free(want);
  td_layer_free(&l);
  ql_close(c); /* frees the regions it still has */
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A region destroyed, or a session ended, while a request on it waits in
 * the queue (behind a long one): the requests are still answered, the
 * daemon keeps the memory until they finish, then frees it. */
typedef struct bg_linear {
  ql_client *c;
  ql_slice x, y;
  uint64_t m;
  int rc;
} bg_linear;

static void *bg_run(void *p) {
  bg_linear *a = p;
  a->rc = ql_linear_region(a->c, "long", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                           a->m, 4096, &a->x, 1024, &a->y, NULL, NULL);
  return NULL;
}

typedef struct bg_raw {
  const td *d;
  const td_session *s;
  const Qlinear__V1__Request *req;
  int rc;
} bg_raw;

static void *bg_raw_run(void *p) {
  bg_raw *a = p;
  Qlinear__V1__Response *resp = td_call_as(a->d, a->s, a->req, 120000);
  a->rc = resp == NULL ? -1000 : resp->status->code;
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return NULL;
}

START_TEST(test_destroy_in_flight) {
  td d;
  /* The blocker must run as one launch, not in chunks, and not stop for
   * the decode requests queued behind it. */
  static const char *const args[] = {"--prefill-chunk-rows", "1048576",
                                     "--max-batch-rows", "1048576",
                                     "--prefill-chunk-us", "0", NULL};
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  const uint64_t k = 4096, n = 1024;
  td_layer l;
  td_layer_make(&l, n, k, 5, 0);
  ck_assert_int_eq(load(c, "long", &l, NULL), 0);
  td_layer_free(&l);

  /* How long does a row take here? Size the blocker to about two seconds,
   * so that it is still running when the others are queued behind it. */
  ql_region *cal = NULL;
  ck_assert_int_eq(ql_region_create(c, 64 * (k + n) * 4, &cal), 0);
  ql_slice cx = {cal, 0, 64 * k * 4}, cy = {cal, 64 * k * 4, 64 * n * 4};
  int64_t t0 = td_now_ms();
  ck_assert_int_eq(ql_linear_region(c, "long", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, 64, k, &cx, n, &cy, NULL,
                                    NULL),
                   0);
  int64_t t64 = td_now_ms() - t0 + 1;
  uint64_t mb = 64 * (uint64_t)(2000 / t64 + 1);
  if (mb > 32768)
    mb = 32768;
  ck_assert_int_eq(ql_region_destroy(c, cal), 0);

  ql_region *big = NULL, *rx = NULL, *ry = NULL;
  ck_assert_int_eq(ql_region_create(c, mb * (k + n) * 4, &big), 0);
  ck_assert_int_eq(ql_region_create(c, 8 * k * 4, &rx), 0);
  ck_assert_int_eq(ql_region_create(c, 8 * n * 4, &ry), 0);
  bg_linear blocker = {c, {big, 0, mb * k * 4}, {big, mb * k * 4, mb * n * 4},
                       mb, -1};
  bg_linear queued = {c, {rx, 0, 8 * k * 4}, {ry, 0, 8 * n * 4}, 8, -1};
  pthread_t t1, t2, t3;
  ck_assert_int_eq(pthread_create(&t1, NULL, bg_run, &blocker), 0);
  usleep(100 * 1000);
  ck_assert_int_eq(pthread_create(&t2, NULL, bg_run, &queued), 0);

  /* A raw session with a request queued too, then its socket closes. */
  td_session s;
  ck_assert_int_eq(td_session_open(&d, &s), 0);
  uint64_t sid;
  int sfd;
  ck_assert_int_eq(td_region_create(&s, 8 * k * 4, &sid, &sfd), 0);
  raw_linear rl;
  bg_raw raw = {&d, NULL,
                mk_linear(&rl, "long", QL_DTYPE_F32, 8, k, sid, 0, 8 * k * 4),
                -1};
  rl.req.session_token.data = s.token;
  rl.req.session_token.len = sizeof s.token;
  ck_assert_int_eq(pthread_create(&t3, NULL, bg_raw_run, &raw), 0);
  usleep(100 * 1000);

  /* All three are in flight: nothing on "long" has completed since the
   * calibration. */
  ql_stats_info *st = stats(c);
  ck_assert_uint_eq(st->n_per_weight, 1);
  ck_assert_msg(st->per_weight[0].requests == 1,
                "the blocker finished too soon (%llu requests done)",
                (unsigned long long)st->per_weight[0].requests);
  ql_stats_free(st);
  ck_assert_int_eq(ql_region_destroy(c, rx), 0);
  ck_assert_int_eq(ql_region_destroy(c, ry), 0);
  td_session_close(&s);
  close(sfd);
  uint64_t regions = 0;
  for (t0 = td_now_ms(); td_now_ms() - t0 < 5000; usleep(2000)) {
    st = stats(c);
    regions = st->regions;
    ql_stats_free(st);
    if (regions == 1) /* only the blocker's */
      break;
  }
  ck_assert_uint_eq(regions, 1);

  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  pthread_join(t3, NULL);
  ck_assert_int_eq(blocker.rc, 0);
  ck_assert_int_eq(queued.rc, 0);
  /* The ended session's waiting request is not run: it is answered (its
   * process would be gone) and frees its region at once. */
  ck_assert_int_eq(raw.rc, QL_ESESSION);
  st = stats(c);
  ck_assert_uint_eq(st->per_weight[0].requests, 3);
  ql_stats_free(st);
  ck_assert(td_alive(&d));
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Hold: a second session keeps a weight another loaded without sending
 * it; the weight outlives its loader while held, and the hold is dropped
 * like a load's. */
START_TEST(test_hold) {
  td d;
  td_start(&d, NULL);
  ql_client *a = td_connect(&d), *b = td_connect(&d);
  ql_client *adm = td_connect_admin(&d);
  td_layer l;
  td_layer_make(&l, 8, 32, 4, 1);
  ck_assert_int_eq(load(a, "hold/w", &l, NULL), 0);
  ql_weight_info wi, hi;
  ck_assert_int_eq(ql_lookup(a, "hold/w", &wi), 0);

  ck_assert_int_eq(ql_hold(b, "hold/none", NULL, NULL), QL_ENOTFOUND);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "hold/none"));
  uint8_t other[QL_DIGEST_BYTES];
  memcpy(other, wi.digest, sizeof other);
  other[7] ^= 1;
  ck_assert_int_eq(ql_hold(b, "hold/w", other, NULL), QL_EEXIST);
  ck_assert_int_eq(ql_hold(b, "../x", NULL, NULL), QL_ENAME);
  ck_assert_int_eq(ql_hold(adm, "hold/w", NULL, NULL), QL_EPERM);
  ck_assert_int_eq(ql_hold(b, "hold/w", wi.digest, &hi), 0);
  ck_assert_str_eq(hi.name, "hold/w");
  ck_assert_mem_eq(hi.digest, wi.digest, QL_DIGEST_BYTES);
  ck_assert_int_eq(ql_hold(b, "hold/w", NULL, NULL), 0); /* twice is once */

  /* the loader goes: b's hold keeps the weight, and b computes with it */
  ql_close(a);
  float x[32], y[8];
  for (int i = 0; i < 32; i++)
    x[i] = (float)(i % 5) - 2.0f;
  ck_assert_int_eq(ql_linear(b, "hold/w", QL_PATH_AUTO, QL_DTYPE_F32, 1, 32,
                             x, 8, y, NULL),
                   0);
  ql_stats_info *st = stats(b);
  ck_assert_uint_eq(st->weights, 1);
  ql_stats_free(st);
  /* dropping the last hold unloads it */
  ck_assert_int_eq(ql_unload(b, "hold/w"), 0);
  ck_assert_int_eq(ql_lookup(b, "hold/w", &hi), QL_ENOTFOUND);
  ql_close(b);
  ql_close(adm);
  td_layer_free(&l);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* An ExportWeight request sent with session s's token: the reply, which
 * the caller frees. */
static Qlinear__V1__Response *raw_export(const td *d, const td_session *s,
                                         const char *name, uint64_t offset,
                                         uint64_t max_bytes) {
  Qlinear__V1__Request req = QLINEAR__V1__REQUEST__INIT;
  Qlinear__V1__ExportWeightRequest er =
      QLINEAR__V1__EXPORT_WEIGHT_REQUEST__INIT;
  er.name = (char *)name;
  er.offset = offset;
  er.max_bytes = max_bytes;
  req.request_id = 77;
  req.body_case = QLINEAR__V1__REQUEST__BODY_EXPORT_WEIGHT;
  req.export_weight = &er;
  Qlinear__V1__Response *resp = td_call_as(d, s, &req, 10000);
  ck_assert_ptr_nonnull(resp);
  ck_assert_ptr_nonnull(resp->status);
  return resp;
}

/* Export: every format read back in several chunks is the weight's
 * canonical form (loaded again, it has the same digest, and computes the
 * same bytes); a session reads only what it holds, the admin anything. */
START_TEST(test_export) {
  td d;
  const char *args[] = {"--max-chunk-bytes", "16384", NULL};
  td_start(&d, args);
  ql_client *a = td_connect(&d), *b = td_connect(&d);
  ql_client *adm = td_connect_admin(&d);
  td_layer l;
  /* K odd: q4g's last byte of a row has a padding nibble */
  td_layer_make(&l, 256, 131, 9, 1);
  static const struct {
    const char *name;
    ql_format f;
    uint32_t gs;
    int asym;
  } fm[] = {{"ex/q4g", QL_FORMAT_Q4G, 32, 0},
            {"ex/q8c", QL_FORMAT_Q8C, 0, 0},
            {"ex/q8b", QL_FORMAT_Q8B, 64, 1},
            {"ex/f8r", QL_FORMAT_F8R, 0, 0}};
  float x[2 * 131], y0[2 * 256], y1[2 * 256];
  for (int i = 0; i < 2 * 131; i++)
    x[i] = (float)(i % 7) - 3.0f;
  for (size_t i = 0; i < sizeof fm / sizeof fm[0]; i++) {
    ql_load_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.name = fm[i].name;
    ld.format = fm[i].f;
    ld.group_size = fm[i].gs;
    ld.asymmetric = fm[i].asym;
    ld.n = l.n;
    ld.k = l.k;
    ld.dtype = QL_DTYPE_F32;
    ld.data = l.w;
    ld.bias = l.b;
    ql_weight_info wi;
    int rc = ql_load_float(a, &ld, &wi, NULL);
    ck_assert_msg(rc == 0, "%s: %s", fm[i].name, ql_errmsg());
    ql_exported_weight *e = NULL;
    rc = ql_export_weight(a, fm[i].name, &e);
    ck_assert_msg(rc == 0, "%s: %s: %s", fm[i].name, ql_strerror(rc),
                  ql_errmsg());
    ck_assert_str_eq(e->info.name, fm[i].name);
    ck_assert_mem_eq(e->info.digest, wi.digest, QL_DIGEST_BYTES);
    ck_assert_int_eq(e->packed.format, fm[i].f);
    ck_assert_uint_eq(e->packed.n, 256);
    ck_assert_uint_eq(e->packed.k, 131);
    ck_assert_ptr_nonnull(e->packed.bias.data);
    ck_assert_int_eq(e->packed.zero.data != NULL,
                     fm[i].f == QL_FORMAT_Q4G || fm[i].asym);
    /* more than one chunk was read */
    ck_assert_uint_gt(e->bytes, 16384);
    ck_assert_uint_eq((uintptr_t)e->packed.scale.data % 64, 0);
    /* loaded again under another name: the same canonical content */
    char again[64];
    snprintf(again, sizeof again, "%s.again", fm[i].name);
    ql_packed_desc pd = e->packed;
    pd.name = again;
    ql_weight_info wi2;
    rc = ql_load_packed(a, &pd, &wi2, NULL);
    ck_assert_msg(rc == 0, "%s: reload: %s", fm[i].name, ql_errmsg());
    ck_assert_mem_eq(wi2.digest, wi.digest, QL_DIGEST_BYTES);
    ck_assert_int_eq(ql_linear(a, fm[i].name, QL_PATH_WEIGHT_ONLY,
                               QL_DTYPE_F32, 2, 131, x, 256, y0, NULL), 0);
    ck_assert_int_eq(ql_linear(a, again, QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 2,
                               131, x, 256, y1, NULL), 0);
    ck_assert_mem_eq(y0, y1, sizeof y0);
    /* the admin reads any weight, to the same bytes */
    ql_exported_weight *ea = NULL;
    ck_assert_int_eq(ql_export_weight(adm, fm[i].name, &ea), 0);
    ck_assert_uint_eq(ea->bytes, e->bytes);
    ck_assert_mem_eq(ea->packed.qdata.data, e->packed.qdata.data,
                     e->packed.qdata.shape[0] * e->packed.qdata.shape[1]);
    ql_free(ea);
    ql_free(e);
  }

  /* b holds nothing: the weight exists, but is not its to read */
  ql_exported_weight *e = (void *)1;
  ck_assert_int_eq(ql_export_weight(b, "ex/q8c", &e), QL_EPERM);
  ck_assert_ptr_null(e);
  ck_assert_ptr_nonnull(strstr(ql_errmsg(), "ex/q8c"));
  ck_assert_int_eq(ql_export_weight(b, "ex/none", &e), QL_ENOTFOUND);
  ck_assert_int_eq(ql_export_weight(b, "../x", &e), QL_ENAME);
  ck_assert_int_eq(ql_export_weight(NULL, "ex/q8c", &e), QL_EINVAL);
  /* after a hold it is */
  ql_weight_info wi;
  ck_assert_int_eq(ql_lookup(a, "ex/q8c", &wi), 0);
  ck_assert_int_eq(ql_hold(b, "ex/q8c", wi.digest, NULL), 0);
  ck_assert_int_eq(ql_export_weight(b, "ex/q8c", &e), 0);
  ck_assert_mem_eq(e->info.digest, wi.digest, QL_DIGEST_BYTES);
  uint64_t total = e->bytes;
  ql_free(e);

  /* The raw request: max_bytes bounds a chunk, the chunk size bounds
   * max_bytes, the end of the stream is an empty chunk, past it an error;
   * a session holding nothing is refused, no session at all too. */
  Qlinear__V1__Response *r = raw_export(&d, &d.sess, "ex/q8c", 0, 100);
  ck_assert_int_eq(r->status->code, QL_EPERM);
  qlinear__v1__response__free_unpacked(r, NULL);
  r = raw_export(&d, NULL, "ex/q8c", 0, 100);
  ck_assert_int_eq(r->status->code, QL_ESESSION);
  qlinear__v1__response__free_unpacked(r, NULL);
  Qlinear__V1__Request hreq = QLINEAR__V1__REQUEST__INIT;
  Qlinear__V1__HoldWeightRequest hr = QLINEAR__V1__HOLD_WEIGHT_REQUEST__INIT;
  hr.name = "ex/q8c";
  hr.digest.data = wi.digest;
  hr.digest.len = QL_DIGEST_BYTES;
  hreq.request_id = 78;
  hreq.body_case = QLINEAR__V1__REQUEST__BODY_HOLD;
  hreq.hold = &hr;
  ck_assert_int_eq(raw_code(&d, &hreq), 0);
  static const struct {
    uint64_t offset, max_bytes, want;
  } cut[] = {{0, 100, 100}, {0, 0, 16384}, {0, 1u << 30, 16384},
             {5, 7, 7}, {0, 0, 0} /* total - 10: set below */};
  for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++) {
    uint64_t off = i == 4 ? total - 10 : cut[i].offset;
    uint64_t want = i == 4 ? 10 : cut[i].want;
    r = raw_export(&d, &d.sess, "ex/q8c", off, cut[i].max_bytes);
    ck_assert_int_eq(r->status->code, 0);
    ck_assert_int_eq(r->body_case, QLINEAR__V1__RESPONSE__BODY_EXPORT_WEIGHT);
    ck_assert_uint_eq(r->export_weight->total_bytes, total);
    ck_assert_uint_eq(r->export_weight->offset, off);
    ck_assert_uint_eq(r->export_weight->data.len, want);
    ck_assert_ptr_nonnull(r->export_weight->packed);
    ck_assert_ptr_nonnull(r->export_weight->packed->qdata);
    ck_assert_ptr_null(r->export_weight->packed->zero);
    ck_assert_mem_eq(r->export_weight->weight->digest.data, wi.digest,
                     QL_DIGEST_BYTES);
    qlinear__v1__response__free_unpacked(r, NULL);
  }
  r = raw_export(&d, &d.sess, "ex/q8c", total, 0);
  ck_assert_int_eq(r->status->code, 0);
  ck_assert_uint_eq(r->export_weight->data.len, 0);
  qlinear__v1__response__free_unpacked(r, NULL);
  r = raw_export(&d, &d.sess, "ex/q8c", total + 1, 0);
  ck_assert_int_eq(r->status->code, QL_EINVAL);
  ck_assert_ptr_nonnull(strstr(r->status->message, "past the end"));
  qlinear__v1__response__free_unpacked(r, NULL);
  r = raw_export(&d, &d.sess, "ex/../x", 0, 0);
  ck_assert_int_lt(r->status->code, 0);
  qlinear__v1__response__free_unpacked(r, NULL);
  ql_close(b);
  ck_assert_int_eq(ql_export_weight(adm, "ex/q8c", &e), 0);
  ql_free(e);
  ql_close(adm);
  ql_close(a);
  td_layer_free(&l);
  ck_assert(td_alive(&d));
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sessions");
  TCase *tc = tcase_create("sessions");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_token_required);
  tcase_add_test(tc, test_other_sessions);
  tcase_add_test(tc, test_kill9);
  tcase_add_test(tc, test_fork_child_keeps_nothing);
  tcase_add_test(tc, test_region_validation);
  tcase_add_test(tc, test_seals);
  tcase_add_test(tc, test_session_packets);
  tcase_add_test(tc, test_region_limits);
  tcase_add_test(tc, test_zero_copy_equals_inline);
  tcase_add_test(tc, test_destroy_in_flight);
  tcase_add_test(tc, test_hold);
  tcase_add_test(tc, test_export);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
