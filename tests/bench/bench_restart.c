/*
 * bench_restart.c - `qlinear-bench restart`: how long a daemon with GiBs of
 * persistent weights takes to be ready again after a restart (DESIGN §8,
 * issue 4), against reading the same store files in this process (the
 * floor: the bytes have to be looked at once to check their digests).
 *
 * It starts its own qlineard on a temporary socket and state directory,
 * uploads random packed q8c weights through the admin socket as persistent
 * loads until --gib GiB are stored, stops it, then times P restarts: from
 * fork/exec to the moment a client's ListWeights shows every weight (the
 * daemon opens its sockets only after the store is resident, so that is
 * when it is ready), interleaved with P reads of every store file. With
 * --cache warm (the default) the files are in the page cache, as after a
 * daemon restart on a running host; with --cache cold every file of the
 * state directory is dropped from the page cache before each restart and
 * each read (written back, then POSIX_FADV_DONTNEED), as after a reboot;
 * --cache both interleaves the two. What stayed resident is measured
 * (mincore) and printed: a file system that keeps its files in memory
 * (tmpfs) cannot be cold. Output: a table and one JSON line per cache
 * state, starting with "{".
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_restart.h"
#include "qlinear/qlinear.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct rig {
  const char *daemon;
  char dir[64];      /* temporary: sock/, state/, daemon.log */
  char address[128]; /* ipc://<dir>/sock/qlineard.sock */
  char admin[128];
  char state[96];
  pid_t pid;
} rig;

static int start(rig *r) {
  char sock[96], log[96];
  snprintf(sock, sizeof sock, "%s/sock", r->dir);
  snprintf(log, sizeof log, "%s/daemon.log", r->dir);
  r->pid = fork();
  if (r->pid < 0)
    return -1;
  if (r->pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0)
      dup2(fd, 2);
    execl(r->daemon, r->daemon, "--socket-dir", sock, "--state-dir", r->state,
          "--log-level", "notice", (char *)NULL);
    _exit(127);
  }
  return 0;
}

/* Connects as soon as the daemon accepts; -1 if it died or took 10 min. */
static int wait_ready(rig *r, size_t want, ql_client **out) {
  ql_connect_opts o = {0};
  o.client_name = "qlinear-bench";
  for (long i = 0; i < 600000; i++) {
    ql_client *c = NULL;
    if (ql_connect(r->address, &o, &c) == 0) {
      ql_weight_info *w = NULL;
      size_t n = 0;
      int rc = ql_list(c, &w, &n);
      ql_free(w);
      if (rc == 0 && n >= want) {
        *out = c;
        return 0;
      }
      ql_close(c);
    }
    int st;
    if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
      r->pid = 0;
      return -1;
    }
    usleep(1000);
  }
  return -1;
}

static void stop(rig *r) {
  int st;
  if (r->pid <= 0)
    return;
  kill(r->pid, SIGTERM);
  waitpid(r->pid, &st, 0);
  r->pid = 0;
}

/* Reads every store file once; returns the bytes read. */
static size_t read_store(const char *dir, void *buf, size_t buflen) {
  DIR *d = opendir(dir);
  struct dirent *e;
  size_t total = 0;
  char path[512];
  while (d != NULL && (e = readdir(d)) != NULL) {
    if (strstr(e->d_name, ".safetensors") == NULL)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
      continue;
    ssize_t n;
    while ((n = read(fd, buf, buflen)) > 0)
      total += (size_t)n;
    close(fd);
  }
  if (d)
    closedir(d);
  return total;
}

/*
 * The fraction of the pages of dir's regular files in the page cache,
 * after making them cold (evict: dropped from it, written back first since
 * only clean pages can be dropped) or warm (else: read once, as the last
 * daemon left them, the cached layouts included).
 */
static double cache_state(const char *dir, int evict) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[512];
  size_t page = (size_t)sysconf(_SC_PAGESIZE), total = 0, resident = 0;
  unsigned char *vec = NULL;
  size_t veclen = 0;
  while (d != NULL && (e = readdir(d)) != NULL) {
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
      close(fd);
      continue;
    }
    if (evict) {
      (void)fsync(fd);
      (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    size_t len = (size_t)st.st_size, pages = (len + page - 1) / page;
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (!evict && m != MAP_FAILED) {
      volatile const unsigned char *b = m;
      for (size_t i = 0; i < len; i += page)
        (void)b[i];
    }
    if (pages > veclen) {
      unsigned char *v = realloc(vec, pages);
      if (v != NULL) {
        vec = v;
        veclen = pages;
      }
    }
    if (m != MAP_FAILED && pages <= veclen && mincore(m, len, vec) == 0) {
      total += pages;
      for (size_t i = 0; i < pages; i++)
        resident += vec[i] & 1;
    }
    if (m != MAP_FAILED)
      munmap(m, len);
    close(fd);
  }
  if (d)
    closedir(d);
  free(vec);
  return total ? (double)resident / (double)total : 0.0;
}

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[512];
  while (d != NULL && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
      rm_tree(path);
    else
      unlink(path);
  }
  if (d)
    closedir(d);
  rmdir(dir);
}

int ql_bench_restart(int argc, char **argv) {
  double gib = 1.0;
  int pairs = 5, rv = 1, keep = 0;
  int modes[2] = {0, -1}; /* the cache states timed: 0 warm, 1 cold */
  static const char *const mode_name[2] = {"warm", "cold"};
  uint64_t n = 8192, k = 8192;
  rig r;
  memset(&r, 0, sizeof r);
  r.daemon = "./qlineard";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--gib") == 0 && i + 1 < argc)
      gib = atof(argv[++i]);
    else if (strcmp(argv[i], "--pairs") == 0 && i + 1 < argc)
      pairs = atoi(argv[++i]);
    else if (strcmp(argv[i], "--daemon") == 0 && i + 1 < argc)
      r.daemon = argv[++i];
    else if (strcmp(argv[i], "--cache") == 0 && i + 1 < argc) {
      i++;
      int both = strcmp(argv[i], "both") == 0;
      if (both || strcmp(argv[i], "warm") == 0 ||
          strcmp(argv[i], "cold") == 0) {
        modes[0] = strcmp(argv[i], "cold") == 0;
        modes[1] = both ? 1 : -1;
      } else {
        fprintf(stderr, "qlinear-bench restart: --cache warm, cold or "
                        "both\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--keep") == 0)
      keep = 1; /* leaves the state directory for a look at it */
    else if (strcmp(argv[i], "--quick") == 0) {
      gib = 0.03;
      n = k = 1024;
      pairs = 1;
    } else {
      fprintf(stderr, "usage: qlinear-bench restart [--gib G] [--pairs P] "
                      "[--cache warm|cold|both] [--daemon PATH] [--quick] "
                      "[--keep]\n");
      return 2;
    }
  }
  if (gib <= 0 || pairs < 1 || pairs > 100) {
    fprintf(stderr, "qlinear-bench restart: bad --gib or --pairs\n");
    return 2;
  }
  snprintf(r.dir, sizeof r.dir, "/tmp/ql-restart-XXXXXX");
  if (mkdtemp(r.dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(r.address, sizeof r.address, "ipc://%s/sock/qlineard.sock", r.dir);
  snprintf(r.admin, sizeof r.admin, "ipc://%s/sock/admin/admin.sock", r.dir);
  snprintf(r.state, sizeof r.state, "%s/state", r.dir);

  size_t per = (size_t)(n * k + n * sizeof(float));
  size_t count = (size_t)(gib * (double)(1u << 30) / (double)per + 0.999);
  int8_t *qd = malloc(n * k);
  float *sc = malloc(n * sizeof(float));
  size_t buflen = 1u << 20;
  void *buf = malloc(buflen);
  /* per cache state: [0, pairs) warm, [pairs, 2 pairs) cold */
  double *t_restart = calloc(2 * (size_t)pairs, sizeof(double));
  double *t_read = calloc(2 * (size_t)pairs, sizeof(double));
  double *resident = calloc(2 * (size_t)pairs, sizeof(double));
  ql_client *c = NULL;
  if (qd == NULL || sc == NULL || buf == NULL || t_restart == NULL ||
      t_read == NULL || resident == NULL)
    goto done;

  if (start(&r) != 0 || wait_ready(&r, 0, &c) != 0) {
    fprintf(stderr, "qlinear-bench restart: the daemon did not start (see "
                    "%s/daemon.log)\n", r.dir);
    goto done;
  }
  ql_close(c);
  c = NULL;
  ql_connect_opts ao = {0};
  ao.admin = 1;
  if (ql_connect(r.admin, &ao, &c) != 0) {
    fprintf(stderr, "qlinear-bench restart: admin connect: %s\n",
            ql_errmsg());
    goto done;
  }
  uint64_t seed = 0x9e3779b97f4a7c15u;
  double t0 = now_s();
  for (size_t w = 0; w < count; w++) {
    for (size_t i = 0; i < n * k; i++) {
      seed = seed * 6364136223846793005u + 1442695040888963407u;
      qd[i] = (int8_t)(seed >> 56);
    }
    for (size_t i = 0; i < n; i++)
      sc[i] = 1e-3f * (float)(1 + (i + w) % 97);
    ql_packed_desc d;
    memset(&d, 0, sizeof d);
    char name[64];
    snprintf(name, sizeof name, "bench/layer%zu", w);
    d.name = name;
    d.format = QL_FORMAT_Q8C;
    d.n = n;
    d.k = k;
    d.qdata = (ql_packed_array){qd, QL_ADT_I8, 2, {n, k}};
    d.scale = (ql_packed_array){sc, QL_ADT_F32, 1, {n, 0}};
    d.persistent = 1;
    int rc = ql_load_packed(c, &d, NULL, NULL);
    if (rc != 0) {
      fprintf(stderr, "qlinear-bench restart: load %s: %s: %s\n", name,
              ql_strerror(rc), ql_errmsg());
      goto done;
    }
  }
  double t_load = now_s() - t0;
  ql_close(c);
  c = NULL;
  stop(&r);

  size_t bytes = 0, stored = 0;
  for (int p = 0; p < pairs; p++) {
    for (int m = 0; m < 2 && modes[m] >= 0; m++) {
      /* Interleaved: the daemon's restart, then the read floor, each from
       * the same cache state. */
      int cold = modes[m], at = cold * pairs + p;
      resident[at] = cache_state(r.state, cold);
      double a = now_s();
      if (start(&r) != 0 || wait_ready(&r, count, &c) != 0) {
        fprintf(stderr, "qlinear-bench restart: restart %d failed (see "
                        "%s/daemon.log)\n", p, r.dir);
        goto done;
      }
      t_restart[at] = now_s() - a;
      ql_close(c);
      c = NULL;
      stop(&r);
      (void)cache_state(r.state, cold);
      a = now_s();
      bytes = read_store(r.state, buf, buflen);
      t_read[at] = now_s() - a;
    }
  }
  stored = count * per;
  double gb = (double)bytes / (double)(1u << 30);
  printf("restart: %zu persistent q8c weights %llux%llu, %.2f GiB stored "
         "(%zu bytes of tensors, %zu of files; uploaded in %.1f s)\n",
         count, (unsigned long long)n, (unsigned long long)k, gb, stored,
         bytes, t_load);
  printf("  %-34s %9s %9s %9s\n", "", "median", "min", "max");
  double med_r[2], med_f[2], med_res[2];
  for (int m = 0; m < 2 && modes[m] >= 0; m++) {
    int cold = modes[m];
    double *tr = t_restart + cold * pairs, *tf = t_read + cold * pairs;
    double *res = resident + cold * pairs;
    qsort(tr, (size_t)pairs, sizeof(double), cmp_double);
    qsort(tf, (size_t)pairs, sizeof(double), cmp_double);
    qsort(res, (size_t)pairs, sizeof(double), cmp_double);
    med_r[cold] = tr[pairs / 2];
    med_f[cold] = tf[pairs / 2];
    med_res[cold] = res[pairs / 2];
    char label[64];
    snprintf(label, sizeof label, "restart until ready, %s", mode_name[cold]);
    printf("  %-34s %8.3fs %8.3fs %8.3fs\n", label, med_r[cold], tr[0],
           tr[pairs - 1]);
    snprintf(label, sizeof label, "read the store files once, %s",
             mode_name[cold]);
    printf("  %-34s %8.3fs %8.3fs %8.3fs\n", label, med_f[cold], tf[0],
           tf[pairs - 1]);
  }
  for (int m = 0; m < 2 && modes[m] >= 0; m++) {
    int cold = modes[m];
    printf("  %s: restart / read = %.2f; %.2f GiB/s; %.1f%% of the state "
           "directory in the page cache at the start\n",
           mode_name[cold], med_r[cold] / med_f[cold], gb / med_r[cold],
           100 * med_res[cold]);
    if (cold && resident[2 * pairs - 1] > 0.05)
      printf("  cold: the files stayed in the page cache (a tmpfs?): these "
             "are not cold figures\n");
  }
  for (int m = 0; m < 2 && modes[m] >= 0; m++) {
    int cold = modes[m];
    double *tr = t_restart + cold * pairs;
    printf("{\"bench\":\"restart\",\"cache\":\"%s\",\"weights\":%zu,"
           "\"gib\":%.3f,\"restart_s\":%.4f,\"restart_min_s\":%.4f,"
           "\"restart_max_s\":%.4f,\"read_s\":%.4f,\"ratio\":%.3f,"
           "\"resident\":%.4f,\"pairs\":%d}\n",
           mode_name[cold], count, gb, med_r[cold], tr[0], tr[pairs - 1],
           med_f[cold], med_r[cold] / med_f[cold], med_res[cold], pairs);
  }
  rv = 0;
done:
  ql_close(c);
  stop(&r);
  if (keep)
    printf("kept %s\n", r.dir);
  else
    rm_tree(r.dir);
  free(qd);
  free(sc);
  free(buf);
  free(t_restart);
  free(t_read);
  free(resident);
  return rv;
}
