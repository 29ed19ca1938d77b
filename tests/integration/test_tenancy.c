/*
 * test_tenancy.c - one user cannot make another's model compute with
 * other weights (docs/security.md, "Several users"): a real qlineard,
 * clients of this process and, when run as root, of a second uid
 * (TD_OTHER_UID, from td_spawn_self()), which plays the squatter.
 *
 * Names are bound to content in two ways, both tested here:
 * - a content-addressed name (ending in ".src-" and the hex of the load's
 *   source digest) takes only the content it names, whoever loads it;
 * - a plain name another user loaded is held only by digest (the
 *   canonical form's or the source's), or when the admin socket loaded it.
 *
 * The cases that need a second uid are a TCase of their own
 * ("second_uid"), skipped with a message where this does not run as root.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

#define N 48
#define K 128

/* ------------------------------------------------------------- helpers */

/* The descriptor every load of this file makes: layer l in q8c, f32. */
static void desc_of(ql_load_desc *d, const char *name, const td_layer *l) {
  memset(d, 0, sizeof *d);
  d->name = name;
  d->format = QL_FORMAT_Q8C;
  d->n = l->n;
  d->k = l->k;
  d->dtype = QL_DTYPE_F32;
  d->data = l->w;
  d->bias = l->b;
}

/* The quantizer version of the daemon c is connected to. */
static uint32_t qversion(ql_client *c) {
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  return h.quantizer_version;
}

/* The content-addressed name stem + ".src-" + hex(source digest of l). */
static void content_name(char *out, size_t len, const char *stem,
                         const td_layer *l, uint32_t qv) {
  ql_load_desc d;
  uint8_t dg[QL_DIGEST_BYTES];
  desc_of(&d, "x", l);
  ck_assert_int_eq(ql_source_digest_float(&d, qv, dg), 0);
  int at = snprintf(out, len, "%s.src-", stem);
  ck_assert(at > 0 && (size_t)at + 2 * QL_DIGEST_BYTES < len);
  for (int i = 0; i < QL_DIGEST_BYTES; i++)
    snprintf(out + at + 2 * i, 3, "%02x", dg[i]);
}

static int load(ql_client *c, const char *name, const td_layer *l,
                ql_weight_info *info) {
  ql_load_desc d;
  desc_of(&d, name, l);
  return ql_load_float(c, &d, info, NULL);
}

/* y = x W^T through the harness's raw session, m rows of seeded x. */
static void run(const td *d, const char *name, float *y) {
  enum { M = 3 };
  float x[M * K];
  uint64_t seed = 5;
  td_randn(&seed, x, M * K, 1.0f);
  char msg[256] = "";
  int rc = td_linear(d, name, NULL, QL_PATH_WEIGHT_ONLY, x, M, K, N, y, NULL,
                     msg, sizeof msg, 10000);
  ck_assert_msg(rc == 0, "linear on %s: %d %s", name, rc, msg);
}

/* --------------------------------------------------- the other process */

/* The shape of the uploads of the budget case: 1 MiB of floats. */
#define BIG_N 256
#define BIG_K 1024

/* The frame the buffered-bytes case leaves half sent: 15 MiB. */
#define HALF_FRAME ((size_t)15 << 20)

/* A raw connection to address (ipc://PATH) with the SP header and all but
 * the last byte of a HALF_FRAME frame sent; -1 when it failed (the daemon
 * may close it on the way). No check asserts: this runs outside the
 * suite. */
static int half_frame(const char *address) {
  static const uint8_t hello[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
  static uint8_t chunk[1 << 16];
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", address + 6);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    goto fail;
  /* The SP header, then an ipc frame: type 1 and a 64-bit length. */
  uint8_t hdr[8 + 1 + 8];
  memcpy(hdr, hello, 8);
  hdr[8] = 1;
  for (int i = 0; i < 8; i++)
    hdr[9 + i] = (uint8_t)((uint64_t)HALF_FRAME >> (56 - 8 * i));
  if (send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) != (ssize_t)sizeof hdr)
    goto fail;
  chunk[0] = 0x80; /* a request id's top bit, as REQ sends it */
  for (size_t left = HALF_FRAME - 1; left > 0;) {
    size_t n = left < sizeof chunk ? left : sizeof chunk;
    ssize_t w = send(fd, chunk, n, MSG_NOSIGNAL);
    if (w <= 0)
      goto fail;
    left -= (size_t)w;
    chunk[0] = 0;
  }
  return fd;
fail:
  if (fd >= 0)
    close(fd);
  return -1;
}

/* 1 while the daemon keeps fd open (after what it has read settled). */
static int still_open(int fd) {
  uint8_t b[64];
  usleep(200 * 1000);
  for (;;) {
    ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n > 0)
      continue; /* its SP header */
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

/* ql_progress_cb of a kept upload: arg is {in, out}. */
static void hold_upload(void *arg, uint64_t done, uint64_t total) {
  const int *fds = arg;
  char b;
  (void)total;
  if (done != 0)
    return;
  if (write(fds[1], "ok\n", 3) != 3)
    _exit(102);
  while (read(fds[0], &b, 1) > 0)
    ;
  _exit(0); /* the upload stays the daemon's until the connection closes */
}

/*
 * What the other user's process does (argv after --client IN OUT, its
 * pipe descriptors from and to this process): "load NAME SEED" loads layer SEED under NAME and keeps its session until stdin
 * closes; "hold NAME" holds NAME without a digest. Exits with the
 * negated status code (0 on success).
 */
static void other_client(int argc, char **argv) {
  if (argc < 7)
    _exit(100);
  int in = atoi(argv[2]), out = atoi(argv[3]);
  argv += 2; /* as before the descriptors: argv[2] is the address */
  argc -= 2;
  ql_client *c = NULL;
  if (ql_connect(argv[2], NULL, &c) != 0)
    _exit(101);
  int rc;
  if (strcmp(argv[3], "load") == 0 && argc == 6) {
    /* td_layer_make()'s layer, made without check's asserts (they cannot
     * report from outside the suite). */
    static float w[N * K], b[N];
    uint64_t seed = strtoull(argv[5], NULL, 10);
    td_randn(&seed, w, N * K, 0.05f);
    td_randn(&seed, b, N, 0.1f);
    td_layer l = {N, K, w, b};
    rc = load(c, argv[4], &l, NULL);
    if (rc == 0) {
      /* Keep holding it: the parent closes our stdin when done. */
      char b;
      if (write(out, "ok\n", 3) != 3)
        _exit(102);
      while (read(in, &b, 1) > 0)
        ;
    }
  } else if (strcmp(argv[3], "hold") == 0) {
    rc = ql_hold(c, argv[4], NULL, NULL);
  } else if (strcmp(argv[3], "upload") == 0 && argc == 6) {
    /* An upload of BIG_N x BIG_K floats begun and kept in progress: the
     * progress callback says "ok" once the daemon accepted it, then
     * blocks until the parent closes our stdin. */
    static float w[BIG_N * BIG_K];
    ql_load_desc ld;
    td_layer l = {BIG_N, BIG_K, w, NULL};
    desc_of(&ld, argv[4], &l);
    int fds[2] = {in, out};
    ld.progress = hold_upload;
    ld.progress_arg = fds;
    rc = ql_load_float(c, &ld, NULL, NULL);
  } else if (strcmp(argv[3], "halfsend") == 0 && argc == 6) {
    /* NCONN raw connections (argv[5]) to the request socket, each with
     * all but the last byte of a HALF_FRAME-byte frame sent; writes how
     * many the daemon kept open, then waits until stdin closes. */
    int n = atoi(argv[5]), fds[16], open_n = 0;
    if (n < 1 || n > 16)
      _exit(100);
    for (int i = 0; i < n; i++)
      fds[i] = half_frame(argv[2]);
    for (int i = 0; i < n; i++)
      open_n += fds[i] >= 0 && still_open(fds[i]);
    char line[16];
    int len = snprintf(line, sizeof line, "%d\n", open_n);
    if (write(out, line, (size_t)len) != len)
      _exit(102);
    char b;
    while (read(in, &b, 1) > 0)
      ;
    rc = 0;
  } else if (strcmp(argv[3], "flood") == 0 && argc == 6) {
    /* Linear requests on NAME one after another for SECONDS seconds. */
    float x[8 * K], y[8 * N];
    memset(x, 0, sizeof x);
    int64_t end = td_now_ms() + 1000 * atoi(argv[5]);
    rc = 0;
    if (write(out, "ok\n", 3) != 3)
      _exit(102);
    while (td_now_ms() < end) {
      int r = ql_linear(c, argv[4], QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, 8, K,
                        x, N, y, NULL);
      if (r != 0 && r != QL_EEXHAUSTED) {
        rc = r;
        break;
      }
    }
  } else {
    _exit(100);
  }
  ql_close(c);
  _exit(-rc);
}

/* A client process as the other user; *in is the pipe to it (its session
 * lasts until that closes), *out the pipe from it. */
static pid_t other_start(const td *d, const char *what, const char *name,
                         const char *seed, int *in, int *out) {
  int pi[2], po[2];
  char fds[2][16];
  /* Only the child's ends cross the exec. */
  ck_assert_int_eq(pipe2(pi, O_CLOEXEC), 0);
  ck_assert_int_eq(pipe2(po, O_CLOEXEC), 0);
  ck_assert_int_eq(fcntl(pi[0], F_SETFD, 0), 0);
  ck_assert_int_eq(fcntl(po[1], F_SETFD, 0), 0);
  snprintf(fds[0], sizeof fds[0], "%d", pi[0]);
  snprintf(fds[1], sizeof fds[1], "%d", po[1]);
  char *const argv[] = {"test_tenancy", "--client", fds[0], fds[1],
                        (char *)d->address, (char *)what, (char *)name,
                        (char *)seed, NULL};
  pid_t pid = td_spawn_self(argv, 1);
  close(pi[0]);
  close(po[1]);
  *in = pi[1];
  *out = po[0];
  return pid;
}

/* Waits for the other process; its exit code, i.e. the negated status. */
static int other_wait(pid_t pid, int in, int out) {
  int st;
  close(in);
  close(out);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert(WIFEXITED(st));
  return WEXITSTATUS(st);
}

/* Runs the other user's "what" to its end: the status code it got. */
static int other_run(const td *d, const char *what, const char *name,
                     const char *seed) {
  int in, out;
  pid_t pid = other_start(d, what, name, seed, &in, &out);
  return -other_wait(pid, in, out);
}

/* Starts the other user's "load" (or "upload") and waits until it is
 * resident (in progress), as it stays until other_wait(); 0, or the
 * load's status code. */
static int other_keep(const td *d, const char *what, const char *name,
                      const char *seed, pid_t *pid, int *in, int *out) {
  char buf[4] = "";
  *pid = other_start(d, what, name, seed, in, out);
  if (read(*out, buf, 3) == 3 && memcmp(buf, "ok\n", 3) == 0)
    return 0;
  return -other_wait(*pid, *in, *out);
}

/* ------------------------------------------------------------- one uid */

/* The digest a client computes is the daemon's, and a content-addressed
 * name takes its own content only: other bytes under it are refused
 * before anything is resident, and the right bytes load as usual. */
START_TEST(content_names_take_their_content) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  uint32_t qv = qversion(c);
  td_layer mine, other;
  td_layer_make(&mine, N, K, 1, 1);
  td_layer_make(&other, N, K, 2, 1);
  char name[256];
  content_name(name, sizeof name, "m/l0/q8c", &mine, qv);

  char msg[512];
  int rc = load(c, name, &other, NULL);
  snprintf(msg, sizeof msg, "%s", ql_errmsg());
  ck_assert_int_eq(rc, QL_ENAME);
  ck_assert_msg(strstr(msg, "source digest") != NULL, "message: %s", msg);
  ql_weight_info none;
  ck_assert_int_eq(ql_lookup(c, name, &none), QL_ENOTFOUND);
  /* Another quantizer version's name for the same content is another. */
  char old[256];
  content_name(old, sizeof old, "m/l0/q8c", &mine, qv + 1);
  ck_assert_int_eq(load(c, old, &mine, NULL), QL_ENAME);

  ql_weight_info info;
  ck_assert_int_eq(load(c, name, &mine, &info), 0);
  ck_assert_int_eq(info.has_source_digest, 1);
  ql_load_desc dd;
  uint8_t dg[QL_DIGEST_BYTES];
  desc_of(&dd, name, &mine);
  ck_assert_int_eq(ql_source_digest_float(&dd, qv, dg), 0);
  ck_assert_mem_eq(info.source_digest, dg, QL_DIGEST_BYTES);
  /* A plain-named load of the same content knows its source digest too,
   * and a hold names either digest. */
  ck_assert_int_eq(load(c, "plain/l0", &mine, &info), 0);
  ck_assert_mem_eq(info.source_digest, dg, QL_DIGEST_BYTES);
  ql_client *c2 = td_connect(&d);
  ck_assert_int_eq(ql_hold(c2, "plain/l0", dg, NULL), 0);
  ck_assert_int_eq(ql_hold(c2, "plain/l0", info.digest, NULL), 0);
  uint8_t wrong[QL_DIGEST_BYTES];
  memcpy(wrong, dg, sizeof wrong);
  wrong[0] ^= 1;
  ck_assert_int_eq(ql_hold(c2, "plain/l0", wrong, NULL), QL_EEXIST);
  /* The same uid holds what it loaded by name alone. */
  ck_assert_int_eq(ql_hold(c2, "plain/l0", NULL, NULL), 0);
  ck_assert_int_eq(ql_hold(c2, name, NULL, NULL), 0);
  float y1[3 * N], y2[3 * N];
  run(&d, name, y1);
  run(&d, "plain/l0", y2);
  ck_assert_mem_eq(y1, y2, sizeof y1);

  /* Packed loads have a source digest of their own. */
  int8_t qd[N * K];
  float scale[N];
  for (size_t i = 0; i < sizeof qd; i++)
    qd[i] = (int8_t)(i * 7 % 255 - 127);
  for (int i = 0; i < N; i++)
    scale[i] = 0.01f * (float)(i + 1);
  ql_packed_desc p;
  memset(&p, 0, sizeof p);
  p.format = QL_FORMAT_Q8C;
  p.n = N;
  p.k = K;
  p.qdata = (ql_packed_array){qd, QL_ADT_I8, 2, {N, K}};
  p.scale = (ql_packed_array){scale, QL_ADT_F32, 1, {N, 0}};
  ck_assert_int_eq(ql_source_digest_packed(&p, dg), 0);
  char pname[256];
  int at = snprintf(pname, sizeof pname, "packed/l0.src-");
  for (int i = 0; i < QL_DIGEST_BYTES; i++)
    snprintf(pname + at + 2 * i, 3, "%02x", dg[i]);
  p.name = pname;
  ck_assert_int_eq(ql_load_packed(c, &p, &info, NULL), 0);
  ck_assert_mem_eq(info.source_digest, dg, QL_DIGEST_BYTES);
  scale[3] *= 2.0f; /* other content under that name */
  ck_assert_int_eq(ql_load_packed(c2, &p, NULL, NULL), QL_ENAME);
  /* Uppercase hex is not the digest's spelling: a plain name. */
  for (char *h = pname + at; *h; h++)
    if (*h >= 'a' && *h <= 'f')
      *h = (char)(*h - 'a' + 'A');
  ck_assert_int_eq(ql_load_packed(c2, &p, NULL, NULL), 0);

  ql_close(c2);
  ql_close(c);
  td_layer_free(&mine);
  td_layer_free(&other);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A region of the harness's session made raw, without populating it (as a
 * hostile client would leave it): its id. */
static uint64_t raw_region(td *d, uint64_t size) {
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__CreateRegionRequest cr;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__create_region_request__init(&cr);
  cr.size = size;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
  req.create_region = &cr;
  int fd = -1;
  Qlinear__V1__SessionResponse *r = td_session_call(&d->sess, &req, &fd,
                                                    5000);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status ? r->status->code : 0, 0);
  uint64_t id = r->create_region->region_id;
  qlinear__v1__session_response__free_unpacked(r, NULL);
  ck_assert_int_ge(fd, 0);
  close(fd);
  return id;
}

/*
 * Memory the daemon would touch for a client: x and y_out in a region
 * whose pages its client never wrote are refused, not faulted into the
 * daemon's memory (which is what the daemon, not the client, would be
 * charged for): the daemon's resident set stays within a few MiB while
 * 64 MiB of x and 24 MiB of y are asked for, again and again.
 */
START_TEST(untouched_regions_refused) {
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 1, 1);
  ck_assert_int_eq(load(c, "w", &l, NULL), 0);
  const uint64_t m = 131072, xlen = m * K * 4, ylen = m * N * 4;
  uint64_t id = raw_region(&d, xlen + ylen);
  long before = td_daemon_rss_kib(&d);
  for (int i = 0; i < 4; i++) {
    Qlinear__V1__Request req;
    Qlinear__V1__LinearRequest lin;
    Qlinear__V1__Tensor x;
    Qlinear__V1__RegionSlice xs, ys;
    uint64_t shape[2] = {m, K};
    qlinear__v1__request__init(&req);
    qlinear__v1__linear_request__init(&lin);
    qlinear__v1__tensor__init(&x);
    qlinear__v1__region_slice__init(&xs);
    qlinear__v1__region_slice__init(&ys);
    req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
    req.request_id = 100 + (uint64_t)i;
    req.linear = &lin;
    lin.weight = "w";
    lin.x = &x;
    lin.path = QLINEAR__V1__PATH__PATH_WEIGHT_ONLY;
    x.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
    x.shape = shape;
    x.n_shape = 2;
    x.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    x.region = &xs;
    xs.region_id = id;
    xs.offset = 0;
    xs.length = xlen;
    ys.region_id = id;
    ys.offset = xlen;
    ys.length = ylen;
    lin.y_out = &ys;
    Qlinear__V1__Response *resp = td_call(&d, &req, 20000);
    ck_assert_ptr_nonnull(resp);
    ck_assert_int_eq(resp->status->code, QL_EINVAL);
    ck_assert_ptr_nonnull(strstr(resp->status->message, "never wrote"));
    qlinear__v1__response__free_unpacked(resp, NULL);
  }
  long after = td_daemon_rss_kib(&d);
  ck_assert_msg(after - before < 8 * 1024, "the daemon's RSS grew by %ld KiB",
                after - before);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * Crossover measurements one uid's loads start are bounded: ten weights of
 * new shapes, of which QL_TENANT_CALIB_BURST (8) are measured and the rest
 * keep the default crossover, and the log names the uid.
 */
START_TEST(calibrations_bounded) {
  td_fix_crossover = 0; /* measure (this test's process only) */
  td d;
  td_start(&d, NULL);
  ql_client *c = td_connect(&d);
  enum { W = 10, BURST = 8 };
  for (int i = 0; i < W; i++) {
    td_layer l;
    char name[32];
    td_layer_make(&l, 16 * (uint64_t)(i + 1), 64, 10 + (uint64_t)i, 0);
    snprintf(name, sizeof name, "shape%d", i);
    ck_assert_int_eq(load(c, name, &l, NULL), 0);
    td_layer_free(&l);
  }
  int measured = 0;
  for (int64_t end = td_now_ms() + 60000; td_now_ms() < end;) {
    measured = 0;
    for (int i = 0; i < W; i++) {
      char name[32];
      ql_weight_info wi;
      snprintf(name, sizeof name, "shape%d", i);
      ck_assert_int_eq(ql_lookup(c, name, &wi), 0);
      measured += wi.crossover_measured;
    }
    if (measured >= BURST)
      break;
    usleep(100 * 1000);
  }
  ck_assert_int_eq(measured, BURST);
  usleep(500 * 1000); /* nothing more comes */
  for (int i = BURST; i < W; i++) {
    char name[32];
    ql_weight_info wi;
    snprintf(name, sizeof name, "shape%d", i);
    ck_assert_int_eq(ql_lookup(c, name, &wi), 0);
    ck_assert_int_eq(wi.crossover_measured, 0);
  }
  char *log = td_read_log(&d);
  char want[96];
  snprintf(want, sizeof want, "uid %u reached its share of crossover "
           "measurements", (unsigned)geteuid());
  ck_assert_msg(strstr(log, want) != NULL, "the log names no uid");
  free(log);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* ---------------------------------------------------------- second uid */

/*
 * The squatter (another uid) goes first with other content under the
 * victim's names: under a content-addressed name it is refused, and the
 * victim's own load then succeeds with answers byte-exact to an
 * unattacked load; under a plain name it is resident, and the victim's
 * hold by name alone is refused (it could be anything), as is a hold by
 * the victim's own digest.
 */
START_TEST(squatting_refused) {
  td d;
  td_start(&d, NULL);
  /* The other user reaches the sockets through group 0. */
  ck_assert_int_eq(chmod(d.dir, 0750), 0);
  ql_client *c = td_connect(&d);
  uint32_t qv = qversion(c);
  td_layer mine;
  td_layer_make(&mine, N, K, 1, 1);
  char name[256];
  content_name(name, sizeof name, "victim/l0/q8c", &mine, qv);

  /* Seed 2 is other content than the victim's (seed 1). */
  ck_assert_int_eq(other_run(&d, "load", name, "2"), QL_ENAME);
  ql_weight_info none;
  ck_assert_int_eq(ql_lookup(c, name, &none), QL_ENOTFOUND);
  float want[3 * N], got[3 * N];
  ck_assert_int_eq(load(c, "ref", &mine, NULL), 0);
  run(&d, "ref", want);
  ck_assert_int_eq(ql_hold(c, name, NULL, NULL), QL_ENOTFOUND);
  ck_assert_int_eq(load(c, name, &mine, NULL), 0);
  run(&d, name, got);
  ck_assert_mem_eq(got, want, sizeof got);

  /* The squatter loading the victim's own content under the name is
   * sharing, not squatting: its hold by name is allowed too. */
  char shared[256];
  content_name(shared, sizeof shared, "victim/l1/q8c", &mine, qv);
  pid_t pid;
  int in, out;
  ck_assert_int_eq(other_keep(&d, "load", shared, "1", &pid, &in, &out), 0);
  ck_assert_int_eq(ql_hold(c, shared, NULL, NULL), 0);
  run(&d, shared, got);
  ck_assert_mem_eq(got, want, sizeof got);
  ck_assert_int_eq(other_wait(pid, in, out), 0);

  /* A plain name, squatted. */
  ck_assert_int_eq(other_keep(&d, "load", "victim/plain", "2", &pid, &in, &out),
                   0);
  int rc = ql_hold(c, "victim/plain", NULL, NULL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", ql_errmsg());
  ck_assert_int_eq(rc, QL_EPERM);
  ck_assert_msg(strstr(msg, "another user") != NULL, "message: %s", msg);
  ql_load_desc dd;
  uint8_t dg[QL_DIGEST_BYTES];
  desc_of(&dd, "victim/plain", &mine);
  ck_assert_int_eq(ql_source_digest_float(&dd, qv, dg), 0);
  ck_assert_int_eq(ql_hold(c, "victim/plain", dg, NULL), QL_EEXIST);
  /* The squatter holds what it loaded, from another of its sessions. */
  ck_assert_int_eq(other_run(&d, "hold", "victim/plain", NULL), 0);
  ck_assert_int_eq(other_wait(pid, in, out), 0);

  /* What the admin socket loaded is trusted by name. */
  ql_client *adm = td_connect_admin(&d);
  td_layer l3;
  td_layer_make(&l3, N, K, 3, 0);
  ck_assert_int_eq(load(adm, "model/admin", &l3, NULL), 0);
  ck_assert_int_eq(other_run(&d, "hold", "model/admin", NULL), 0);
  /* And the victim's plain-named weight is refused to the squatter. */
  ck_assert_int_eq(load(c, "victim/mine", &mine, NULL), 0);
  ck_assert_int_eq(other_run(&d, "hold", "victim/mine", NULL), QL_EPERM);
  td_layer_free(&l3);
  ql_close(adm);

  ql_close(c);
  td_layer_free(&mine);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * Uploads in progress: the other user begins 1 MiB uploads and keeps them
 * open (one byte never comes) until it is refused: it gets its share of
 * max_upload_bytes (8 MiB here, uid_share 50 %) and no more, and this
 * user's 1 MiB load then succeeds. Without a share the other user took
 * seven and this load was refused.
 */
START_TEST(upload_share) {
  static const char *const args[] = {"--max-upload-bytes", "8M", NULL};
  td d;
  td_start(&d, args);
  ck_assert_int_eq(chmod(d.dir, 0750), 0);
  enum { MAXP = 10 };
  pid_t pid[MAXP];
  int in[MAXP], out[MAXP], kept = 0, refused = 0;
  for (int i = 0; i < MAXP && refused == 0; i++) {
    char name[32];
    snprintf(name, sizeof name, "squat/up%d", i);
    int rc = other_keep(&d, "upload", name, "0", &pid[kept], &in[kept],
                             &out[kept]);
    if (rc == 0)
      kept++;
    else
      refused = rc;
  }
  ck_assert_int_eq(refused, QL_EEXHAUSTED);
  ck_assert_int_le(kept, 3); /* 4 x (1 MiB + a record) passes 4 MiB */
  ck_assert_int_ge(kept, 1);
  ql_client *c = td_connect(&d);
  static float w[BIG_N * BIG_K];
  for (size_t i = 0; i < BIG_N * BIG_K; i++)
    w[i] = (float)(i % 17) * 0.01f;
  td_layer l = {BIG_N, BIG_K, w, NULL};
  int rc = load(c, "victim/big", &l, NULL);
  ck_assert_msg(rc == 0, "the victim's load: %d %s", rc, ql_errmsg());
  char *log = td_read_log(&d);
  ck_assert_msg(strstr(log, "uid 65534 reached its share of uploads") != NULL,
                "the log does not name the uid: %s", log);
  free(log);
  /* Stats name the uid too: the admin sees every user, a session its own
   * uid only. */
  ql_client *adm = td_connect_admin(&d);
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(adm, &st), 0);
  const ql_user_stats *other = NULL;
  for (size_t i = 0; i < st->n_users; i++)
    if (st->users[i].uid == TD_OTHER_UID)
      other = &st->users[i];
  ck_assert_ptr_nonnull(other);
  ck_assert_uint_eq(other->uploads, (uint64_t)kept);
  ck_assert_uint_ge(other->upload_bytes, (uint64_t)kept * BIG_N * BIG_K * 4);
  ck_assert_uint_ge(other->refused, 1);
  ck_assert_uint_eq(other->sessions, (uint32_t)kept);
  ql_stats_free(st);
  ck_assert_int_eq(ql_stats(c, &st), 0);
  ck_assert_uint_eq(st->n_users, 1);
  ck_assert_uint_eq(st->users[0].uid, geteuid());
  ql_stats_free(st);
  ql_close(adm);
  for (int i = 0; i < kept; i++)
    ck_assert_int_eq(other_wait(pid[i], in[i], out[i]), 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * Queue slots: eight processes of the other user keep 8-row requests
 * coming on this user's weight, whose queue holds 8 (--max-queue 8) and
 * whose kernel takes 50 ms a launch: with uid_share 50 % the other user
 * never has more than 4 queued, so each of this user's requests is
 * admitted and answered, byte-exact.
 */
START_TEST(queue_share) {
  static const char *const args[] = {"--max-queue", "8", NULL};
  setenv("QL_TEST_KERNEL_DELAY_MS", "50", 1);
  td d;
  td_start(&d, args);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  ck_assert_int_eq(chmod(d.dir, 0750), 0);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 1, 1);
  char name[256];
  content_name(name, sizeof name, "victim/q/q8c", &l, qversion(c));
  ck_assert_int_eq(load(c, name, &l, NULL), 0);
  float want[3 * N], got[3 * N];
  run(&d, name, want);
  enum { P = 8 };
  pid_t pid[P];
  int in[P], out[P];
  for (int i = 0; i < P; i++) {
    char b[4] = "";
    pid[i] = other_start(&d, "flood", name, "4", &in[i], &out[i]);
    ck_assert_int_eq(read(out[i], b, 3), 3);
  }
  usleep(300 * 1000); /* the queue is full of theirs by now */
  int ok = 0, refused = 0;
  for (int i = 0; i < 10; i++) {
    enum { M = 3 };
    float x[M * K];
    uint64_t seed = 5;
    td_randn(&seed, x, M * K, 1.0f);
    char msg[256] = "";
    int rc = td_linear(&d, name, NULL, QL_PATH_WEIGHT_ONLY, x, M, K, N, got,
                       NULL, msg, sizeof msg, 10000);
    if (rc == 0 && memcmp(got, want, sizeof got) == 0)
      ok++;
    else if (rc == QL_EEXHAUSTED)
      refused++;
  }
  ck_assert_msg(ok == 10, "%d of 10 answered, %d refused", ok, refused);
  for (int i = 0; i < P; i++)
    ck_assert_int_eq(other_wait(pid[i], in[i], out[i]), 0);
  char *log = td_read_log(&d);
  ck_assert_msg(strstr(log, "uid 65534 reached its share of the request "
                            "queues") != NULL, "the log names no uid");
  free(log);
  td_layer_free(&l);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/*
 * Buffered bytes: the other user holds four 15 MiB frames half sent
 * (--max-buffered-bytes 64M): with uid_share 50 % the daemon keeps two of
 * its connections and closes the rest, and this user's 4 MiB upload chunk
 * then gets through. Without a share all four stayed, 60 MiB, and this
 * user's connection was dropped.
 */
START_TEST(buffered_share) {
  static const char *const args[] = {"--max-buffered-bytes", "64M",
                                     "--max-message-bytes", "16M", NULL};
  td d;
  td_start(&d, args);
  ck_assert_int_eq(chmod(d.dir, 0750), 0);
  int in, out;
  pid_t pid = other_start(&d, "halfsend", "-", "4", &in, &out);
  char line[16] = "";
  ck_assert_int_gt(read(out, line, sizeof line - 1), 0);
  int kept = atoi(line);
  ck_assert_msg(kept >= 1 && kept <= 2, "the other user kept %d of 4", kept);
  ql_client *c = td_connect(&d);
  /* [1024, 1024] floats: one 4 MiB chunk. */
  static float w[1024 * 1024];
  for (size_t i = 0; i < sizeof w / sizeof *w; i++)
    w[i] = (float)(i % 13) * 0.01f;
  td_layer l = {1024, 1024, w, NULL};
  int rc = load(c, "victim/chunky", &l, NULL);
  ck_assert_msg(rc == 0, "the victim's load: %d %s", rc, ql_errmsg());
  char *log = td_read_log(&d);
  ck_assert_msg(strstr(log, "uid 65534 reached its share of the buffered "
                            "bytes") != NULL, "the log names no uid");
  free(log);
  ck_assert_int_eq(other_wait(pid, in, out), 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(int argc, char **argv) {
  td_self_init(); /* the other user's process: from here on */
  if (argc > 1 && strcmp(argv[1], "--client") == 0)
    other_client(argc, argv);
  Suite *s = suite_create("tenancy");
  TCase *tc = tcase_create("one_uid");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, content_names_take_their_content);
  tcase_add_test(tc, untouched_regions_refused);
  tcase_add_test(tc, calibrations_bounded);
  suite_add_tcase(s, tc);
  if (geteuid() == 0) {
    TCase *uid = tcase_create("second_uid");
    tcase_set_timeout(uid, 120);
    tcase_add_test(uid, squatting_refused);
    tcase_add_test(uid, upload_share);
    tcase_add_test(uid, queue_share);
    tcase_add_test(uid, buffered_share);
    suite_add_tcase(s, uid);
  } else {
    printf("SKIP (part): not root: no second user to squat with; the "
           "second_uid cases did not run\n");
  }
  return td_run_suite(s);
}
