/*
 * soak.c - a bounded soak of one daemon (issue 8): SOAK_CLIENTS client
 * processes (16) for SOAK_SECONDS (20 in 'make check'; 'make soak' runs
 * it longer) mixing decode (1-4 rows) and prefill (32-128 rows) requests,
 * inline and region tensors, dtypes, LinearMulti, loads and unloads of
 * weights of their own, and deaths: a client sometimes kills itself with
 * SIGKILL, and this program kills a random client now and then; a new one
 * takes each dead one's place.
 *
 * Every successful reply is compared byte for byte with the reference
 * computed in the client's own process (the same quantization and the
 * generic op of the path that ran). The only error allowed is
 * QL_EEXHAUSTED (backpressure). At the end: requests and errors by code,
 * the daemon's RSS while loaded near the start and near the end (bounded
 * growth), its descriptors before and after (equal), and every session,
 * region and upload of the clients freed.
 *
 * Clients run this program again with the role "client" (nanomsg does not
 * survive fork()) and count into a shared memory file, so that what a
 * killed client did is still counted. No ck_* call happens in a client.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "ql_kernels.h"
#include "qlinear/qlinear.h"
#include "testutil.h"

#define MAX_SLOTS 4096
#define N_CODES 32
/* RSS may grow this much between the loaded start and the loaded end. */
#define RSS_BOUND_KIB (32 * 1024)

/* What one client process did; updated atomically by that client. */
typedef struct slot {
  uint64_t decode, prefill, region, multi; /* replies checked equal */
  uint64_t loads, unloads;
  uint64_t mismatches;
  uint64_t errors[N_CODES]; /* by -code */
  uint64_t unexpected;      /* errors other than QL_EEXHAUSTED */
  int last_unexpected;
} slot;

/* The shared weights: the parent loads and holds them. */
typedef struct sw {
  const char *name;
  ql_format f;
  uint32_t gs;
  uint64_t n, k;
  uint64_t seed;
} sw;

static const sw SW[] = {
    {"soak/q4g", QL_FORMAT_Q4G, 32, 64, 256, 11},
    {"soak/q8c", QL_FORMAT_Q8C, 0, 96, 320, 12},
    {"soak/f8r", QL_FORMAT_F8R, 0, 48, 128, 13},
    {"soak/q8b", QL_FORMAT_Q8B, 64, 32, 192, 14},
    {"soak/q4g.b", QL_FORMAT_Q4G, 64, 40, 256, 15}, /* K of soak/q4g */
};
#define NSW (sizeof SW / sizeof SW[0])

/* A layer without check (clients): as td_layer_make(). */
static int make_layer(td_layer *l, uint64_t n, uint64_t k, uint64_t seed,
                      int bias) {
  l->n = n;
  l->k = k;
  l->w = malloc(n * k * sizeof(float));
  l->b = bias ? malloc(n * sizeof(float)) : NULL;
  if (l->w == NULL || (bias && l->b == NULL))
    return -1;
  td_randn(&seed, l->w, n * k, 0.05f);
  if (l->b)
    td_randn(&seed, l->b, n, 0.1f);
  return 0;
}

static int load(ql_client *c, const char *name, const td_layer *l,
                ql_format f, uint32_t gs) {
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
  return ql_load_float(c, &d, NULL, NULL);
}

static ql_qweight *quantize(const td_layer *l, ql_format f, uint32_t gs) {
  ql_qweight *q = NULL;
  ql_quant_params p = {f, gs, 0, (ql_dtype)0};
  if (ql_qweight_quantize(&p, (int64_t)l->n, (int64_t)l->k, QL_DTYPE_F32,
                          l->w, l->b, &q) != 0)
    return NULL;
  return q;
}

/* ------------------------------------------------------------- client */

static slot *S;

static void count_err(slot *s, int rc) {
  int i = -rc;
  __atomic_fetch_add(&s->errors[i >= 0 && i < N_CODES ? i : 0], 1,
                     __ATOMIC_RELAXED);
  if (rc != QL_EEXHAUSTED) {
    __atomic_fetch_add(&s->unexpected, 1, __ATOMIC_RELAXED);
    s->last_unexpected = rc;
    fprintf(stderr, "soak client %d: %s: %s\n", (int)getpid(),
            ql_err_name(rc), ql_errmsg());
  }
}

/* Compares y (m rows of weight q in dt, path that ran) with the
 * reference; counts a mismatch. Returns 1 when equal. */
static int check(slot *s, const ql_qweight *q, ql_path path, ql_dtype dt,
                 const void *x, uint64_t m, const void *y) {
  size_t bytes = m * (size_t)q->n * ql_dtype_size(dt);
  void *ref = malloc(bytes);
  int same = ref != NULL &&
             (path == QL_PATH_WEIGHT_ONLY
                  ? ql_linear_wo_ref(q, dt, x, (int64_t)m, ref)
                  : ql_linear_aq_ref(q, dt, x, (int64_t)m, ref)) == 0 &&
             memcmp(ref, y, bytes) == 0;
  free(ref);
  if (!same) {
    __atomic_fetch_add(&s->mismatches, 1, __ATOMIC_RELAXED);
    fprintf(stderr, "soak client %d: a reply differs from the reference\n",
            (int)getpid());
  }
  return same;
}

static int role_client(const char *address, int index, int64_t end_ms,
                       uint64_t seed) {
  slot *s = &S[index];
  ql_client *c = NULL;
  ql_region *r = NULL;
  td_layer L[NSW];
  ql_qweight *Q[NSW];
  for (size_t i = 0; i < NSW; i++)
    if (make_layer(&L[i], SW[i].n, SW[i].k, SW[i].seed, i % 2 == 0) != 0 ||
        (Q[i] = quantize(&L[i], SW[i].f, SW[i].gs)) == NULL)
      return 2;
  int rc = ql_connect(address, NULL, &c);
  if (rc != 0 || (rc = ql_region_create(c, 2 << 20, &r)) != 0) {
    count_err(s, rc);
    return 3;
  }
  const size_t cap = 128 * 320;
  float *xf = malloc(cap * sizeof(float));
  uint8_t *x = malloc(cap * 4), *y = malloc(128 * 96 * 4),
          *y2 = malloc(128 * 96 * 4);
  if (!xf || !x || !y || !y2)
    return 4;
  char own[64];
  snprintf(own, sizeof own, "soak/c%d", index);
  int own_loaded = 0;
  td_layer ol;
  ql_qweight *oq = NULL;
  if (make_layer(&ol, 24, 128, seed, 1) != 0 ||
      (oq = quantize(&ol, QL_FORMAT_Q8C, 0)) == NULL)
    return 5;

  while (td_now_ms() < end_ms) {
    uint64_t u = tu_rng_next(&seed);
    /* Now and then the client dies, wherever it is. */
    if (u % 1000 < 1)
      kill(getpid(), SIGKILL);
    size_t wi = (u >> 8) % NSW;
    const sw *w = &SW[wi];
    ql_dtype dt = (ql_dtype)(QL_DTYPE_F32 + (u >> 16) % 3);
    size_t es = ql_dtype_size(dt);
    int prefill = (u >> 20) % 4 == 0;
    uint64_t m = prefill ? 32 + (u >> 24) % 97 : 1 + (u >> 24) % 4;
    int kind = (int)((u >> 32) % 10);
    td_randn(&seed, xf, m * w->k, 1.0f);
    ql_from_f32(dt, xf, x, m * w->k);
    ql_linear_result res;
    if (kind < 5) { /* inline */
      rc = ql_linear(c, w->name, QL_PATH_AUTO, dt, m, w->k, x, w->n, y, &res);
      if (rc != 0)
        count_err(s, rc);
      else if (check(s, Q[wi], res.path, dt, x, m, y))
        __atomic_fetch_add(prefill ? &s->prefill : &s->decode, 1,
                           __ATOMIC_RELAXED);
    } else if (kind < 8) { /* region: x there, y there or inline */
      size_t xb = m * w->k * es, yb = m * w->n * es;
      memcpy(r->data, x, xb);
      size_t yoff = (xb + 4095) & ~(size_t)4095;
      ql_slice xs = {r, 0, xb}, ys = {r, yoff, yb};
      int inl = kind == 7;
      rc = ql_linear_region(c, w->name, QL_PATH_AUTO, dt, m, w->k, &xs, w->n,
                            inl ? NULL : &ys, inl ? y : NULL, &res);
      if (rc != 0)
        count_err(s, rc);
      else if (check(s, Q[wi], res.path, dt, x, m,
                     inl ? y : (uint8_t *)r->data + yoff))
        __atomic_fetch_add(&s->region, 1, __ATOMIC_RELAXED);
    } else if (kind == 8) { /* LinearMulti on the two K=256 weights */
      const char *names[2] = {SW[0].name, SW[4].name};
      uint64_t ns[2] = {SW[0].n, SW[4].n};
      void *ys[2] = {y, y2};
      ql_linear_result rs[2];
      td_randn(&seed, xf, m * 256, 1.0f);
      ql_from_f32(dt, xf, x, m * 256);
      rc = ql_linear_multi(c, 2, names, QL_PATH_AUTO, dt, m, 256, x, ns, ys,
                           rs);
      if (rc != 0)
        count_err(s, rc);
      else if (check(s, Q[0], rs[0].path, dt, x, m, y) &&
               check(s, Q[4], rs[1].path, dt, x, m, y2))
        __atomic_fetch_add(&s->multi, 1, __ATOMIC_RELAXED);
    } else { /* a weight of its own: load, use, unload */
      if (!own_loaded) {
        rc = load(c, own, &ol, QL_FORMAT_Q8C, 0);
        if (rc != 0) {
          count_err(s, rc);
          continue;
        }
        own_loaded = 1;
        __atomic_fetch_add(&s->loads, 1, __ATOMIC_RELAXED);
      }
      td_randn(&seed, xf, 2 * 128, 1.0f);
      rc = ql_linear(c, own, QL_PATH_AUTO, QL_DTYPE_F32, 2, 128, xf, 24, y,
                     &res);
      if (rc != 0)
        count_err(s, rc);
      else if (check(s, oq, res.path, QL_DTYPE_F32, xf, 2, y))
        __atomic_fetch_add(&s->decode, 1, __ATOMIC_RELAXED);
      if ((u >> 40) % 2 == 0) {
        if ((rc = ql_unload(c, own)) != 0)
          count_err(s, rc);
        else
          __atomic_fetch_add(&s->unloads, 1, __ATOMIC_RELAXED);
        own_loaded = 0;
      }
    }
  }
  ql_close(c);
  /* A clean exit frees everything (LeakSanitizer checks it). */
  for (size_t i = 0; i < NSW; i++) {
    td_layer_free(&L[i]);
    ql_qweight_free(Q[i]);
  }
  td_layer_free(&ol);
  ql_qweight_free(oq);
  free(xf);
  free(x);
  free(y);
  free(y2);
  return 0;
}

/* ------------------------------------------------------------- parent */

static int env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : def;
}

static int shm_fd = -1;

static pid_t spawn(const td *d, int index, int64_t end_ms, uint64_t seed) {
  char a_index[16], a_end[32], a_seed[32], a_fd[16];
  snprintf(a_index, sizeof a_index, "%d", index);
  snprintf(a_end, sizeof a_end, "%lld", (long long)end_ms);
  snprintf(a_seed, sizeof a_seed, "%llu", (unsigned long long)seed);
  snprintf(a_fd, sizeof a_fd, "%d", shm_fd);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(d->sess.fd);
    const char *argv[] = {"/proc/self/exe", "client", d->address, a_index,
                          a_end, a_seed, a_fd, NULL};
    execv("/proc/self/exe", (char *const *)argv);
    _exit(127);
  }
  return pid;
}

START_TEST(soak) {
  const int seconds = env_int("SOAK_SECONDS", 20);
  const int clients = env_int("SOAK_CLIENTS", 16);
  ck_assert_int_gt(seconds, 0);
  ck_assert(clients > 0 && clients <= 256);
  shm_fd = memfd_create("soak", 0); /* inherited by the clients */
  ck_assert_int_ge(shm_fd, 0);
  ck_assert_int_eq(ftruncate(shm_fd, MAX_SLOTS * sizeof(slot)), 0);
  S = mmap(NULL, MAX_SLOTS * sizeof(slot), PROT_READ | PROT_WRITE,
           MAP_SHARED, shm_fd, 0);
  ck_assert(S != MAP_FAILED);

  td d;
  /* Small queues, so that backpressure happens. */
  const char *args[] = {"--max-queue", "8", "--log-level", "notice", NULL};
  td_start(&d, args);
  ql_client *c = td_connect(&d);
  td_layer L[NSW];
  for (size_t i = 0; i < NSW; i++) {
    ck_assert_int_eq(make_layer(&L[i], SW[i].n, SW[i].k, SW[i].seed,
                                i % 2 == 0),
                     0);
    ck_assert_int_eq(load(c, SW[i].name, &L[i], SW[i].f, SW[i].gs), 0);
  }
  ql_stats_info *st = NULL;
  ck_assert_int_eq(ql_stats(c, &st), 0);
  uint64_t base_sessions = st->sessions, base_weights = st->weights;
  ql_stats_free(st);
  int fd0 = td_daemon_fds(&d);

  int64_t t0 = td_now_ms(), end = t0 + seconds * 1000LL;
  uint64_t rng = 0xc0ffee;
  pid_t pids[256];
  int slots = 0, deaths = 0, kills = 0;
  for (int i = 0; i < clients; i++)
    pids[i] = spawn(&d, slots++, end, tu_rng_next(&rng));
  long rss_start = -1, rss_end = -1;
  while (td_now_ms() < end) {
    usleep(100 * 1000);
    int64_t now = td_now_ms();
    if (rss_start < 0 && now - t0 >= (end - t0) / 5)
      rss_start = td_daemon_rss_kib(&d);
    if (now >= end - 1000 && rss_end < 0)
      rss_end = td_daemon_rss_kib(&d);
    /* Kill a random client now and then (about twice a second). */
    if (tu_rng_next(&rng) % 5 == 0) {
      pid_t victim = pids[tu_rng_next(&rng) % (uint64_t)clients];
      if (victim > 0) { /* never kill(-1) */
        kill(victim, SIGKILL);
        kills++;
      }
    }
    /* Replace the dead. */
    for (int i = 0; i < clients; i++) {
      int wst;
      /* A slot with no client is skipped: waitpid(-1) would reap another
       * slot's client. */
      if (pids[i] <= 0 || waitpid(pids[i], &wst, WNOHANG) != pids[i])
        continue;
      ck_assert_msg(WIFSIGNALED(wst) || WEXITSTATUS(wst) == 0,
                    "a client failed with status %d", WEXITSTATUS(wst));
      if (WIFSIGNALED(wst))
        deaths++;
      if (td_now_ms() < end - 500 && slots < MAX_SLOTS)
        pids[i] = spawn(&d, slots++, end, tu_rng_next(&rng));
      else
        pids[i] = -1;
    }
  }
  if (rss_end < 0)
    rss_end = td_daemon_rss_kib(&d);
  for (int i = 0; i < clients; i++) {
    int wst;
    if (pids[i] <= 0)
      continue;
    pid_t got = waitpid(pids[i], &wst, 0);
    ck_assert_msg(got == pids[i], "waitpid %d: %s", (int)pids[i],
                  strerror(errno));
    ck_assert_msg(WIFSIGNALED(wst) || WEXITSTATUS(wst) == 0,
                  "a client failed with status %d", WEXITSTATUS(wst));
    if (WIFSIGNALED(wst))
      deaths++;
  }
  /* Every client's session, region and upload is gone. */
  int settled = 0;
  for (int64_t w0 = td_now_ms(); td_now_ms() - w0 < 10000; usleep(10000)) {
    ck_assert_int_eq(ql_stats(c, &st), 0);
    settled = st->sessions == base_sessions && st->regions == 0 &&
              st->uploads_in_progress == 0 && st->weights == base_weights;
    ql_stats_free(st);
    if (settled)
      break;
  }
  int fd1 = td_daemon_fds(&d);
  for (int64_t w0 = td_now_ms(); fd1 != fd0 && td_now_ms() - w0 < 5000;
       usleep(10000))
    fd1 = td_daemon_fds(&d);

  slot t;
  memset(&t, 0, sizeof t);
  for (int i = 0; i < slots; i++) {
    t.decode += S[i].decode;
    t.prefill += S[i].prefill;
    t.region += S[i].region;
    t.multi += S[i].multi;
    t.loads += S[i].loads;
    t.unloads += S[i].unloads;
    t.mismatches += S[i].mismatches;
    t.unexpected += S[i].unexpected;
    for (int e = 0; e < N_CODES; e++)
      t.errors[e] += S[i].errors[e];
  }
  uint64_t ok = t.decode + t.prefill + t.region + t.multi, errs = 0;
  for (int e = 0; e < N_CODES; e++)
    errs += t.errors[e];
  printf("soak: %d s, %d clients at a time, %d in all, %d died (%d kills "
         "sent)\n", seconds, clients, slots, deaths, kills);
  printf("soak: %llu replies checked equal (decode %llu, prefill %llu, "
         "region %llu, multi %llu), %llu loads, %llu unloads\n",
         (unsigned long long)ok, (unsigned long long)t.decode,
         (unsigned long long)t.prefill, (unsigned long long)t.region,
         (unsigned long long)t.multi, (unsigned long long)t.loads,
         (unsigned long long)t.unloads);
  printf("soak: %llu errors:", (unsigned long long)errs);
  for (int e = 0; e < N_CODES; e++)
    if (t.errors[e])
      printf(" %s %llu", ql_err_name(-e), (unsigned long long)t.errors[e]);
  printf("; %llu wrong replies\n", (unsigned long long)t.mismatches);
  printf("soak: daemon RSS %ld KiB loaded at the start, %ld KiB at the end; "
         "fds %d before, %d after\n", rss_start, rss_end, fd0, fd1);
  fflush(stdout);

  ck_assert_uint_gt(ok, 0);
  ck_assert_uint_eq(t.mismatches, 0);
  ck_assert_msg(t.unexpected == 0, "%llu unexpected errors",
                (unsigned long long)t.unexpected);
  ck_assert_msg(settled, "the clients' sessions were not all freed");
  ck_assert_int_eq(fd1, fd0);
  /* Under ASan freed memory waits in a quarantine of up to 256 MiB, so RSS
   * says nothing about leaks there: LeakSanitizer checks them when the
   * daemon exits (td_stop() must return 0). */
  if (!td_sanitized())
    ck_assert_msg(rss_end - rss_start < RSS_BOUND_KIB,
                  "RSS grew by %ld KiB", rss_end - rss_start);
  for (size_t i = 0; i < NSW; i++)
    td_layer_free(&L[i]);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  munmap(S, MAX_SLOTS * sizeof(slot));
  close(shm_fd);
}
END_TEST

int main(int argc, char **argv) {
  if (argc >= 7 && strcmp(argv[1], "client") == 0) {
    int fd = atoi(argv[6]);
    S = mmap(NULL, MAX_SLOTS * sizeof(slot), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
    if (S == MAP_FAILED)
      return 6;
    return role_client(argv[2], atoi(argv[3]), atoll(argv[4]),
                       strtoull(argv[5], NULL, 10));
  }
  Suite *s = suite_create("soak");
  TCase *tc = tcase_create("soak");
  tcase_set_timeout(tc, env_int("SOAK_SECONDS", 20) + 180);
  tcase_add_test(tc, soak);
  suite_add_tcase(s, tc);
  return tu_run_suite(s, CK_NORMAL);
}
