/*
 * bench_daemon.c - `qlinear-bench daemon`: qlineard end to end (DESIGN §12;
 * the daemon benchmark of issues 4 and 6).
 *
 * It starts its own qlineard on a private socket directory, loads one
 * 4096x4096 q4g128 weight (random bf16 data, bf16 scales, quantized by the
 * daemon) and measures three cases:
 *   overhead    at M = 1, 128 and 512: the round trip of ql_linear (x and y
 *               inline) and of ql_linear_region (x and y in regions) minus
 *               the same kernel called in this process (ql_dispatch on the
 *               cpu backend, reading the CPU backend's repacked layout of
 *               the same quantized weight, on the path the daemon reported),
 *               against a bare nanomsg REQ/REP echo of the same message
 *               sizes, served by a thread of this process on another
 *               ipc:// address;
 *   throughput  rows/s of 1, 2, 4 and 8 client processes, each with its
 *               own ql_connect(), sending M = 1 requests back to back on
 *               the one weight for --seconds; the ratio to one client;
 *   decode_p99  one client process's M = 1 latency p99, alone and while
 *               another client process streams M = 512 prefill requests (x
 *               and y in regions, as a prefill client would send them) on
 *               the same weight; the ratio; and the prefill stream's rows/s
 *               alone and with the decode client, next to the in-process
 *               kernel's at M = 512.
 * The overhead case also gives the region round trip over (in-process
 * kernel + echo), the figure a lone prefill is judged by.
 * Every figure is a ratio of times measured in the same run, the median of
 * P >= 5 interleaved pairs with the min and max over them, because these
 * machines are shared and noisy: a pair times each of the things compared
 * once, in an order that rotates (and reverses) from pair to pair, and the
 * ratio is taken within the pair.
 *
 * The client processes are forked before this process touches nanomsg,
 * whose global state does not survive a fork; they wait for commands on a
 * socketpair. The daemon and the clients die with this process
 * (PR_SET_PDEATHSIG), and SIGINT/SIGTERM remove the socket directory.
 *
 * Output: a table for people, and one JSON object per case on a line that
 * starts with "{", as the kernel bench prints.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "bench.h"
#include "qlinear.pb-c.h"
#include "qlinear/qlinear.h"

/* The weight: the shape and format the issues name (--shape, --format). */
static int W_N = 4096, W_K = 4096;
static ql_format W_FMT = QL_FORMAT_Q4G;
#define W_GROUP 128
#define W_NAME "bench/weight"
#define PREFILL_M 512
#define MAX_CLIENTS 8
#define MAX_PAIRS 64
/* Clients start together at a moment this far ahead of the command, so
 * that all of them have received it. */
#define START_MARGIN_S 0.05
/* A call that takes longer than this means the daemon is stuck (or gone:
 * a REQ socket waits for a restarted peer until then). */
#define CALL_TIMEOUT_MS 30000

static const uint64_t ovh_ms[] = {1, 128, PREFILL_M};
#define N_OVH (int)(sizeof ovh_ms / sizeof ovh_ms[0])
static const int tput_clients[] = {1, 2, 4, MAX_CLIENTS};
#define N_TPUT (int)(sizeof tput_clients / sizeof tput_clients[0])

/* ------------------------------------------------------------ options */

typedef struct dopts {
  double seconds; /* one throughput or latency sample */
  int pairs;
  int threads;
  const char *daemon;
  const char *device; /* --device: where the weight goes; NULL: default */
  int json_only;
} dopts;

/* Whether the in-process kernel (the CPU's) is timed: the weight is on
 * the CPU. */
static int in_process(const dopts *o) {
  return o->device == NULL || strcmp(o->device, "cpu") == 0;
}

static const char *fmt_name(void) {
  return W_FMT == QL_FORMAT_Q8C ? "q8c" : "q4g";
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: qlinear-bench daemon [options]\n"
          "Starts its own qlineard, loads a 4096x4096 q4g128 weight and "
          "measures per-call\noverhead (M = 1, 128, 512; inline and region "
          "tensors) against a bare nanomsg\necho, rows/s of 1, 2, 4, 8 client "
          "processes, and a decode client's p99 alone\nand under an M = 512 "
          "prefill stream.\n"
          "  --seconds S   length of one throughput or latency sample "
          "(default 1);\n"
          "                per-call samples last S/4\n"
          "  --pairs P     interleaved pairs per figure (>= 5, default 7)\n"
          "  --daemon PATH qlineard to start (default: $QLINEARD, else "
          "./qlineard)\n"
          "  --threads T   CPU threads of the daemon and of the in-process "
          "kernel\n"
          "                (QL_CPU_THREADS; default 2)\n"
          "  --shape NxK   the weight's shape (default 4096x4096)\n"
          "  --format F    q4g (group 128, default) or q8c\n"
          "  --device D    load the weight on device D only (e.g. cuda:0); "
          "on a\n"
          "                device other than cpu the in-process kernel is "
          "not timed:\n"
          "                'kernel' is then the daemon's mean job time\n"
          "  --quick       5 pairs of 0.05 s samples: a smoke test, not a "
          "measurement\n"
          "  --json        JSON lines only\n");
}

static int parse_opts(int argc, char **argv, dopts *o) {
  const char *env = getenv("QLINEARD");
  memset(o, 0, sizeof *o);
  o->seconds = 1.0;
  o->pairs = 7;
  o->threads = 2;
  o->daemon = env != NULL && *env != '\0' ? env : "./qlineard";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end;
    if (strcmp(a, "--quick") == 0) {
      o->seconds = 0.05;
      o->pairs = 5;
      continue;
    }
    if (strcmp(a, "--json") == 0) {
      o->json_only = 1;
      continue;
    }
    if (v == NULL)
      return -1;
    i++;
    if (strcmp(a, "--seconds") == 0) {
      o->seconds = strtod(v, &end);
      if (*end != '\0' || !(o->seconds >= 0.001 && o->seconds <= 3600))
        return -1;
    } else if (strcmp(a, "--pairs") == 0) {
      o->pairs = (int)strtol(v, &end, 10);
      if (*end != '\0' || o->pairs < 5 || o->pairs > MAX_PAIRS)
        return -1;
    } else if (strcmp(a, "--threads") == 0) {
      o->threads = (int)strtol(v, &end, 10);
      if (*end != '\0' || o->threads < 1 || o->threads > 256)
        return -1;
    } else if (strcmp(a, "--daemon") == 0) {
      o->daemon = v;
    } else if (strcmp(a, "--shape") == 0) {
      long n = strtol(v, &end, 10), k;
      if (*end != 'x' || n < 16 || n > 65536)
        return -1;
      k = strtol(end + 1, &end, 10);
      if (*end != '\0' || k < W_GROUP || k > 65536 || k % W_GROUP != 0)
        return -1;
      W_N = (int)n;
      W_K = (int)k;
    } else if (strcmp(a, "--format") == 0) {
      if (strcmp(v, "q4g") == 0)
        W_FMT = QL_FORMAT_Q4G;
      else if (strcmp(v, "q8c") == 0)
        W_FMT = QL_FORMAT_Q8C;
      else
        return -1;
    } else if (strcmp(a, "--device") == 0) {
      o->device = v;
    } else {
      return -1;
    }
  }
  return 0;
}

/* ------------------------------------------------- what the run owns */

/* Everything cleanup must undo, also from a signal handler: plain values
 * and paths prepared in advance. */
static struct run {
  pid_t parent;
  pid_t daemon; /* 0: not running */
  pid_t workers[MAX_CLIENTS];
  int wfd[MAX_CLIENTS]; /* this side of each worker's socketpair */
  int nworkers;
  int dir_made;
  int done; /* cleanup ran */
  char dir[96];
  char address[128]; /* ipc://<dir>/qlineard.sock */
  char echo_address[128];
  char sock[112], session[112], echo_sock[112], log[112];
} R;

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* Waits up to timeout_s for pid to exit; kills it after that. Returns its
 * exit status, or -1 when it was killed or died by a signal. */
static int reap(pid_t pid, double timeout_s) {
  int st;
  for (double t = 0; t < timeout_s; t += 0.01) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid)
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (r < 0)
      return -1;
    sleep_s(0.01);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

/* The last lines of the daemon's log, when something went wrong. */
static void show_log(void) {
  char buf[4096];
  FILE *f = fopen(R.log, "r");
  long size;
  size_t n;
  if (f == NULL)
    return;
  fseek(f, 0, SEEK_END);
  size = ftell(f);
  fseek(f, size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0,
        SEEK_SET);
  n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  fprintf(stderr, "qlinear-bench: the end of qlineard's log:\n%s\n", buf);
}

/* The admin socket's directory the daemon made inside the socket
 * directory. Async-signal-safe (snprintf aside, which only formats). */
static void remove_admin(void) {
  char p[sizeof R.dir + 32];
  snprintf(p, sizeof p, "%s/admin/admin.sock", R.dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/admin", R.dir);
  rmdir(p);
}

static void remove_dir(void) {
  remove_admin();
  unlink(R.sock);
  unlink(R.session);
  unlink(R.echo_sock);
  unlink(R.log);
  if (R.dir_made && rmdir(R.dir) != 0 && errno != ENOENT)
    fprintf(stderr, "qlinear-bench: cannot remove %s: %s\n", R.dir,
            strerror(errno));
  R.dir_made = 0;
}

/*
 * Stops the clients (end of file on their socket makes them close their
 * sessions and exit), then the daemon (SIGTERM, as a service manager
 * would), and removes the socket directory. Safe to call twice, and from
 * exit() in the middle of a run (atexit). Returns -1 if the daemon did not
 * stop cleanly.
 */
static int run_cleanup(int failed) {
  int rv = 0;
  if (R.done || getpid() != R.parent)
    return 0;
  R.done = 1;
  for (int i = 0; i < R.nworkers; i++)
    close(R.wfd[i]);
  for (int i = 0; i < R.nworkers; i++)
    if (reap(R.workers[i], 10) != 0)
      failed = 1;
  R.nworkers = 0;
  if (R.daemon > 0) {
    kill(R.daemon, SIGTERM);
    if (reap(R.daemon, 30) != 0) {
      fprintf(stderr, "qlinear-bench: qlineard did not stop cleanly\n");
      rv = -1;
      failed = 1;
    }
    R.daemon = 0;
  }
  if (failed)
    show_log();
  remove_dir();
  return rv;
}

/* exit() from a helper (xalloc, lin_run) still stops the daemon. */
static void cleanup_atexit(void) { run_cleanup(1); }

/* SIGINT, SIGTERM: only async-signal-safe calls. */
static void on_signal(int sig) {
  int st;
  if (getpid() != R.parent)
    _exit(128 + sig);
  for (int i = 0; i < R.nworkers; i++)
    kill(R.workers[i], SIGKILL);
  if (R.daemon > 0) {
    kill(R.daemon, SIGKILL);
    waitpid(R.daemon, &st, 0);
  }
  unlink(R.sock);
  unlink(R.session);
  unlink(R.echo_sock);
  unlink(R.log);
  remove_admin();
  rmdir(R.dir);
  _exit(128 + sig);
}

/* ------------------------------------------------------------ daemon */

/* The daemon is ready once a socket accepts a connection. */
static int accepts(const char *path, int type) {
  struct sockaddr_un sa;
  int fd, ok;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path)
    return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if ((fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0)) < 0)
    return 0;
  ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

/* Starts o->daemon on R.dir with QL_CPU_THREADS = o->threads, its output
 * in R.log, and waits until both sockets accept. */
static int daemon_start(const dopts *o) {
  char threads[16];
  const char *argv[] = {o->daemon,     "--socket-dir", R.dir, "--log-level",
                        "warning",     NULL};
  pid_t pid;
  int st;

  if (access(o->daemon, X_OK) != 0) {
    fprintf(stderr,
            "qlinear-bench: cannot run %s: %s (--daemon PATH, or run from the "
            "top of the build tree)\n",
            o->daemon, strerror(errno));
    return -1;
  }
  snprintf(threads, sizeof threads, "%d", o->threads);
  fflush(NULL);
  if ((pid = fork()) < 0) {
    perror("qlinear-bench: fork");
    return -1;
  }
  if (pid == 0) {
    int fd;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != R.parent)
      _exit(127);
    fd = open(R.log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    setenv("QL_CPU_THREADS", threads, 1);
    execv(o->daemon, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", o->daemon, strerror(errno));
    _exit(127);
  }
  R.daemon = pid;
  for (int i = 0; i < 1500; i++) {
    if (accepts(R.sock, SOCK_STREAM) && accepts(R.session, SOCK_SEQPACKET))
      return 0;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      R.daemon = 0;
      fprintf(stderr, "qlinear-bench: qlineard exited at start\n");
      return -1;
    }
    sleep_s(0.02);
  }
  fprintf(stderr, "qlinear-bench: qlineard did not start listening\n");
  return -1;
}

/* ------------------------------------------------- client processes */

enum { W_PREP = 1, W_DECODE, W_PREFILL };

/* A command to a client process. W_PREP connects (once) and makes one
 * warm-up call of m rows; W_DECODE (M = 1, inline) and W_PREFILL (M =
 * PREFILL_M, regions) call back to back from t0 until t1. */
typedef struct wcmd {
  int op;
  uint64_t m;
  double t0, t1; /* now_s() clock */
} wcmd;

/* Its answer. calls and rows count calls completed by t1; the latency
 * percentiles cover every call started before t1. */
typedef struct wres {
  int rc;
  uint64_t calls, rows;
  double p50, p99, pmax; /* seconds */
  char msg[200];
} wres;

typedef struct wstate {
  ql_client *c;
  float *x, *y;       /* M = 1, inline */
  ql_region *rx, *ry; /* M = PREFILL_M */
  double *lat;
  size_t nlat, cap;
} wstate;

static void fill_x(float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)gauss();
}

static int w_call(wstate *w, uint64_t m) {
  if (m == PREFILL_M) {
    ql_slice xs = {w->rx, 0, w->rx->size}, ys = {w->ry, 0, w->ry->size};
    return ql_linear_region(w->c, W_NAME, QL_PATH_AUTO, QL_DTYPE_F32, m, W_K,
                            &xs, W_N, &ys, NULL, NULL);
  }
  return ql_linear(w->c, W_NAME, QL_PATH_AUTO, QL_DTYPE_F32, 1, W_K, w->x, W_N,
                   w->y, NULL);
}

static int w_prep(wstate *w, uint64_t m, wres *r) {
  ql_connect_opts co = {.timeout_ms = CALL_TIMEOUT_MS,
                       .client_name = "qlinear-bench"};
  int rc;
  if (w->c == NULL && (rc = ql_connect(R.address, &co, &w->c)) != 0) {
    snprintf(r->msg, sizeof r->msg, "connect: %s", ql_errmsg());
    return rc;
  }
  if (m == PREFILL_M && w->rx == NULL) {
    if ((rc = ql_region_create(w->c, PREFILL_M * W_K * sizeof(float),
                               &w->rx)) != 0 ||
        (rc = ql_region_create(w->c, PREFILL_M * W_N * sizeof(float),
                               &w->ry)) != 0) {
      snprintf(r->msg, sizeof r->msg, "region: %s", ql_errmsg());
      return rc;
    }
    fill_x(w->rx->data, PREFILL_M * W_K);
  } else if (m == 1 && w->x == NULL) {
    w->x = xalloc(W_K * sizeof(float));
    w->y = xalloc(W_N * sizeof(float));
    fill_x(w->x, W_K);
  }
  if ((rc = w_call(w, m)) != 0)
    snprintf(r->msg, sizeof r->msg, "warm-up: %s", ql_errmsg());
  return rc;
}

static double pct(const double *sorted, size_t n, double q) {
  size_t i = (size_t)ceil(q * (double)n);
  return n == 0 ? 0 : sorted[i > 0 ? i - 1 : 0];
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int w_run(wstate *w, const wcmd *c, wres *r) {
  struct timespec ts;
  int rc = 0;
  ts.tv_sec = (time_t)c->t0;
  ts.tv_nsec = (long)((c->t0 - floor(c->t0)) * 1e9);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
  w->nlat = 0;
  for (;;) {
    double t0 = now_s(), t1;
    if (t0 >= c->t1)
      break;
    if ((rc = w_call(w, c->m)) != 0) {
      snprintf(r->msg, sizeof r->msg, "linear: %s", ql_errmsg());
      break;
    }
    t1 = now_s();
    if (w->nlat == w->cap) {
      size_t cap = w->cap ? 2 * w->cap : 4096;
      double *p = realloc(w->lat, cap * sizeof *p);
      if (p == NULL) {
        snprintf(r->msg, sizeof r->msg, "out of memory");
        rc = QL_ENOMEM;
        break;
      }
      w->lat = p;
      w->cap = cap;
    }
    w->lat[w->nlat++] = t1 - t0;
    if (t1 <= c->t1) {
      r->calls++;
      r->rows += c->m;
    }
  }
  qsort(w->lat, w->nlat, sizeof *w->lat, cmp_double);
  r->p50 = pct(w->lat, w->nlat, 0.50);
  r->p99 = pct(w->lat, w->nlat, 0.99);
  r->pmax = pct(w->lat, w->nlat, 1.0);
  return rc;
}

/* A client process: commands until end of file, then it closes its
 * session and exits. It never returns. */
static void worker_main(int fd) {
  wstate w;
  wcmd c;
  memset(&w, 0, sizeof w);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  while (recv(fd, &c, sizeof c, 0) == (ssize_t)sizeof c) {
    wres r;
    memset(&r, 0, sizeof r);
    r.rc = c.op == W_PREP ? w_prep(&w, c.m, &r) : w_run(&w, &c, &r);
    if (send(fd, &r, sizeof r, MSG_NOSIGNAL) != (ssize_t)sizeof r)
      break;
  }
  ql_close(w.c); /* destroys the regions too */
  free(w.x);
  free(w.y);
  free(w.lat);
  _exit(0);
}

static int workers_fork(int n) {
  for (int i = 0; i < n; i++) {
    int sv[2];
    pid_t pid;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      perror("qlinear-bench: socketpair");
      return -1;
    }
    fflush(NULL);
    if ((pid = fork()) < 0) {
      perror("qlinear-bench: fork");
      close(sv[0]);
      close(sv[1]);
      return -1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != R.parent)
        _exit(1);
      /* Only its own socket: another client's must see end of file when
       * this process's parent closes it. */
      for (int j = 0; j < R.nworkers; j++)
        close(R.wfd[j]);
      close(sv[0]);
      worker_main(sv[1]);
    }
    close(sv[1]);
    R.workers[R.nworkers] = pid;
    R.wfd[R.nworkers++] = sv[0];
  }
  return 0;
}

/* Sends cmd[i] to clients 0..n-1 (cmd[i].op 0: client i sits this one
 * out) and collects their answers in res[i]. */
static int workers_run(int n, const wcmd *cmd, wres *res) {
  int rv = 0;
  for (int i = 0; i < n; i++) {
    memset(&res[i], 0, sizeof res[i]);
    if (cmd[i].op != 0 &&
        send(R.wfd[i], &cmd[i], sizeof cmd[i], MSG_NOSIGNAL) !=
            (ssize_t)sizeof cmd[i]) {
      fprintf(stderr, "qlinear-bench: client %d is gone\n", i);
      return -1;
    }
  }
  for (int i = 0; i < n; i++) {
    struct pollfd p = {R.wfd[i], POLLIN, 0};
    if (cmd[i].op == 0)
      continue;
    double left = cmd[i].t1 - now_s();
    int ms = (int)((left > 0 ? left : 0) * 1e3) + CALL_TIMEOUT_MS + 10000;
    if (poll(&p, 1, ms) != 1 ||
        recv(R.wfd[i], &res[i], sizeof res[i], 0) != (ssize_t)sizeof res[i]) {
      fprintf(stderr, "qlinear-bench: client %d did not answer\n", i);
      return -1;
    }
    if (res[i].rc != 0) {
      fprintf(stderr, "qlinear-bench: client %d: %s: %s\n", i,
              ql_strerror(res[i].rc), res[i].msg);
      rv = -1;
    }
  }
  return rv;
}

/* ------------------------------------------------------------- echo */

/* The baseline of a round trip: a REP thread that answers each request
 * with a message of the size its first 8 bytes ask for. Each side copies
 * its payload into the message it sends, as any sender of the data must;
 * neither reads what it receives. */
typedef struct echo_srv {
  int sock;
  pthread_t th;
  int running;
  const uint8_t *payload; /* at least the largest message */
} echo_srv;

#define ECHO_QUIT UINT64_MAX

static void *echo_main(void *arg) {
  echo_srv *e = arg;
  for (;;) {
    void *in = NULL, *out;
    uint64_t want = 0;
    int n = nn_recv(e->sock, &in, NN_MSG, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      break;
    }
    if (n >= 8)
      memcpy(&want, in, 8);
    nn_freemsg(in);
    size_t len = want == ECHO_QUIT || want < 8 ? 8 : (size_t)want;
    if ((out = nn_allocmsg(len, 0)) == NULL)
      break;
    memcpy(out, e->payload, len);
    if (nn_send(e->sock, &out, NN_MSG, 0) < 0) {
      nn_freemsg(out);
      break;
    }
    if (want == ECHO_QUIT)
      break;
  }
  return NULL;
}

typedef struct echo_ctx {
  int sock; /* REQ */
  size_t req_bytes, resp_bytes;
  const uint8_t *payload;
  int rc; /* the first failure's nn_errno() */
} echo_ctx;

static int echo_call(echo_ctx *c, uint64_t want, size_t len) {
  void *out = nn_allocmsg(len, 0), *in = NULL;
  if (out == NULL)
    return -1;
  memcpy(out, c->payload, len);
  memcpy(out, &want, 8);
  if (nn_send(c->sock, &out, NN_MSG, 0) < 0) {
    nn_freemsg(out);
    return -1;
  }
  if (nn_recv(c->sock, &in, NN_MSG, 0) < 0)
    return -1;
  nn_freemsg(in);
  return 0;
}

static void echo_run(void *ctx, long i) {
  echo_ctx *c = ctx;
  (void)i;
  if (c->rc == 0 && echo_call(c, c->resp_bytes, c->req_bytes) != 0)
    c->rc = nn_errno() != 0 ? nn_errno() : EIO;
}

static int set_opt(int s, int level, int opt, int v) {
  return nn_setsockopt(s, level, opt, &v, sizeof v);
}

/* Starts the REP thread on R.echo_address and connects a REQ socket to it
 * (*req). No receive limit: the messages are as large as M = 512's. */
static int echo_start(echo_srv *e, const uint8_t *payload, int *req) {
  int r = -1;
  memset(e, 0, sizeof e[0]);
  e->payload = payload;
  *req = -1;
  if ((e->sock = nn_socket(AF_SP, NN_REP)) < 0 ||
      set_opt(e->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, -1) < 0 ||
      nn_bind(e->sock, R.echo_address) < 0)
    goto fail;
  if (pthread_create(&e->th, NULL, echo_main, e) != 0)
    goto fail;
  e->running = 1;
  if ((r = nn_socket(AF_SP, NN_REQ)) < 0 ||
      set_opt(r, NN_SOL_SOCKET, NN_RCVMAXSIZE, -1) < 0 ||
      set_opt(r, NN_SOL_SOCKET, NN_RCVTIMEO, CALL_TIMEOUT_MS) < 0 ||
      set_opt(r, NN_SOL_SOCKET, NN_SNDTIMEO, CALL_TIMEOUT_MS) < 0 ||
      /* as libqlinear: never resend a slow request */
      set_opt(r, NN_REQ, NN_REQ_RESEND_IVL, 3600000) < 0 ||
      nn_connect(r, R.echo_address) < 0)
    goto fail;
  *req = r;
  return 0;

fail:
  fprintf(stderr, "qlinear-bench: echo: %s\n", nn_strerror(nn_errno()));
  if (r >= 0)
    nn_close(r);
  return -1;
}

/* Tells the thread to stop, joins it, closes both sockets. Safe on a
 * half-started echo (sock -1 or 0 from memset: checked by running). */
static void echo_stop(echo_srv *e, int req) {
  if (e->running && req >= 0) {
    echo_ctx q = {req, 0, 0, e->payload, 0};
    if (echo_call(&q, ECHO_QUIT, 8) == 0) {
      pthread_join(e->th, NULL);
      e->running = 0;
    }
  }
  if (req >= 0)
    nn_close(req);
  if (!e->running && e->sock >= 0) {
    nn_close(e->sock);
    e->sock = -1;
  }
  /* A thread that did not answer keeps its socket: the process ends soon. */
}

/* ------------------------------------------------ per-call overhead */

/* One round trip through libqlinear: inline (ql_linear) or region
 * (ql_linear_region). The first error stops the calls; it is checked
 * after each sample. */
typedef struct rt_ctx {
  ql_client *c;
  uint64_t m;
  int region;
  const float *x;
  float *y;
  ql_slice xs, ys;
  ql_linear_result res;
  int rc;
  char msg[200];
} rt_ctx;

static int rt_call(rt_ctx *r, ql_linear_result *res) {
  int rc = r->region
               ? ql_linear_region(r->c, W_NAME, QL_PATH_AUTO, QL_DTYPE_F32,
                                  r->m, W_K, &r->xs, W_N, &r->ys, NULL, res)
               : ql_linear(r->c, W_NAME, QL_PATH_AUTO, QL_DTYPE_F32, r->m, W_K,
                           r->x, W_N, r->y, res);
  if (rc != 0 && r->rc == 0) {
    r->rc = rc;
    snprintf(r->msg, sizeof r->msg, "%s: %s: %s",
             r->region ? "ql_linear_region" : "ql_linear", ql_strerror(rc),
             ql_errmsg());
  }
  return rc;
}

static void rt_run(void *ctx, long i) {
  rt_ctx *r = ctx;
  (void)i;
  if (r->rc == 0)
    rt_call(r, NULL);
}

/*
 * The sizes of the Request and Response that libqlinear and the daemon
 * exchange for this call, from the same protobuf definitions: the echo
 * baseline sends exactly as many bytes each way. The request id is as
 * long as the library's (random 64-bit) ones.
 */
static void msg_sizes(const rt_ctx *r, const ql_region *rx,
                      const ql_region *ry, size_t *req_b, size_t *resp_b) {
  Qlinear__V1__Request req = QLINEAR__V1__REQUEST__INIT;
  Qlinear__V1__LinearRequest lr = QLINEAR__V1__LINEAR_REQUEST__INIT;
  Qlinear__V1__Tensor xt, yt; /* its INIT trips -Wmissing-braces */
  Qlinear__V1__RegionSlice xs = QLINEAR__V1__REGION_SLICE__INIT,
                           ys = QLINEAR__V1__REGION_SLICE__INIT;
  Qlinear__V1__Response resp = QLINEAR__V1__RESPONSE__INIT;
  Qlinear__V1__Status st = QLINEAR__V1__STATUS__INIT;
  Qlinear__V1__LinearResponse lp = QLINEAR__V1__LINEAR_RESPONSE__INIT;
  uint8_t token[16] = {0};
  uint64_t xshape[2] = {r->m, W_K}, yshape[2] = {r->m, W_N};

  qlinear__v1__tensor__init(&xt);
  qlinear__v1__tensor__init(&yt);
  req.request_id = 0x9E3779B97F4A7C15u;
  req.session_token.data = token;
  req.session_token.len = sizeof token;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR;
  req.linear = &lr;
  lr.weight = W_NAME;
  lr.x = &xt;
  lr.path = QLINEAR__V1__PATH__PATH_AUTO;
  xt.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  xt.n_shape = 2;
  xt.shape = xshape;
  yt.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  yt.n_shape = 2;
  yt.shape = yshape;
  if (r->region) {
    xs.region_id = rx->id;
    xs.length = r->m * W_K * sizeof(float);
    ys.region_id = ry->id;
    ys.length = r->m * W_N * sizeof(float);
    xt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    xt.region = &xs;
    yt.data_case = QLINEAR__V1__TENSOR__DATA_REGION;
    yt.region = &ys;
    lr.y_out = &ys;
  } else {
    /* get_packed_size() reads only the length */
    xt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
    xt.inline_data.data = (uint8_t *)r->x;
    xt.inline_data.len = r->m * W_K * sizeof(float);
    yt.data_case = QLINEAR__V1__TENSOR__DATA_INLINE_DATA;
    yt.inline_data.data = (uint8_t *)r->y;
    yt.inline_data.len = r->m * W_N * sizeof(float);
  }
  resp.request_id = req.request_id;
  resp.status = &st;
  st.message = "";
  resp.body_case = QLINEAR__V1__RESPONSE__BODY_LINEAR;
  resp.linear = &lp;
  lp.y = &yt;
  lp.path = (Qlinear__V1__Path)r->res.path;
  lp.impl = (char *)r->res.impl;
  *req_b = qlinear__v1__request__get_packed_size(&req);
  *resp_b = qlinear__v1__response__get_packed_size(&resp);
}

/* The daemon's own counters of the weight: requests, and the time they
 * spent running (kernel) and queued. 0 on success. */
typedef struct wcount {
  uint64_t requests, kernel_ns, queue_ns;
} wcount;

static int weight_counters(ql_client *c, wcount *out) {
  ql_stats_info *st = NULL;
  int rc = ql_stats(c, &st);
  memset(out, 0, sizeof *out);
  if (rc != 0)
    return rc;
  for (size_t i = 0; i < st->n_per_weight; i++)
    if (strcmp(st->per_weight[i].weight, W_NAME) == 0) {
      out->requests += st->per_weight[i].requests;
      out->kernel_ns += st->per_weight[i].kernel_ns;
      out->queue_ns += st->per_weight[i].queue_ns;
    }
  ql_stats_free(st);
  return 0;
}

/* The five things a pair of the overhead case times. */
enum { T_INLINE, T_REGION, T_KERNEL, T_ECHO_INLINE, T_ECHO_REGION, T_COUNT };

/* Index j of pair p's order: rotated by p, reversed on odd pairs, so that
 * no one of them always runs first or right after another. */
static int order(int p, int j, int n) {
  return p % 2 == 0 ? (p + j) % n : (p + n - 1 - j) % n;
}

static void print_ns(FILE *f, const char *name, stat3 s) {
  fprintf(f, ",\"%s\":{\"median\":%.0f,\"min\":%.0f,\"max\":%.0f}", name,
          s.med * 1e9, s.min * 1e9, s.max * 1e9);
}

static stat3 stats_copy(const double *v, int n) {
  double tmp[MAX_PAIRS];
  memcpy(tmp, v, (size_t)n * sizeof *v);
  return stats(tmp, n);
}

static const char *path_name(ql_path p) {
  return p == QL_PATH_ACT_QUANT ? "aq" : p == QL_PATH_WEIGHT_ONLY ? "wo" : "?";
}

typedef struct ovh_env {
  const dopts *o;
  ql_client *c;
  const wset *ws;
  ql_region *rx, *ry;
  const float *x; /* PREFILL_M rows; a case uses the first m */
  float *y, *yk;
  int echo_req;
  const uint8_t *payload;
  struct ovh_out *out;
} ovh_env;

/* What the later cases take from the overhead cases. */
typedef struct ovh_out {
  double prefill_kernel_s; /* in-process kernel at M = PREFILL_M */
} ovh_out;

static void noop_run(void *ctx, long i) {
  (void)ctx;
  (void)i;
}

static int overhead_case(const ovh_env *e, uint64_t m, int header) {
  const dopts *o = e->o;
  rt_ctx ri, rr;
  echo_ctx ei, er;
  lin_ctx kc;
  timed T[T_COUNT];
  double t[T_COUNT][MAX_PAIRS], oi[MAX_PAIRS], orr[MAX_PAIRS];
  double ri_e[MAX_PAIRS], rr_e[MAX_PAIRS], i_r[MAX_PAIRS], r_ke[MAX_PAIRS];
  stat3 s[T_COUNT], s_oi, s_or, s_rie, s_rre, s_ir, s_rke;
  size_t ybytes = m * W_N * sizeof(float);
  const ql_kernel_impl *im;
  wcount w0, w1;
  double jobs;
  int same, rc, P = o->pairs;

  memset(&ri, 0, sizeof ri);
  ri.c = e->c;
  ri.m = m;
  ri.x = e->x;
  ri.y = e->y;
  rr = ri;
  rr.region = 1;
  rr.xs = (ql_slice){e->rx, 0, m * W_K * sizeof(float)};
  rr.ys = (ql_slice){e->ry, 0, ybytes};
  memcpy(e->rx->data, e->x, m * W_K * sizeof(float));

  /* One call of each: the path the daemon chose decides the in-process
   * kernel, and all three results must be the same bytes (the kernels are
   * batch-invariant and the weight is the same quantized weight). */
  if (rt_call(&ri, &ri.res) != 0 || rt_call(&rr, &rr.res) != 0) {
    fprintf(stderr, "qlinear-bench: %s\n", ri.rc ? ri.msg : rr.msg);
    return -1;
  }
  im = NULL;
  same = 1;
  if (in_process(o)) {
    im = ql_dispatch(ql_backend_find("cpu"),
                     ri.res.path == QL_PATH_ACT_QUANT ? QL_OP_LINEAR_AQ
                                                      : QL_OP_LINEAR_WO,
                     W_FMT, QL_DTYPE_F32, (int64_t)m, W_N, W_K);
    if (im == NULL) {
      fprintf(stderr, "qlinear-bench: no cpu kernel for M = %llu\n",
              (unsigned long long)m);
      return -1;
    }
    kc = (lin_ctx){im, e->ws, e->x, (int64_t)m, e->yk, 0};
    lin_run(&kc, 0);
    same = memcmp(e->y, e->yk, ybytes) == 0 &&
           memcmp(e->ry->data, e->yk, ybytes) == 0;
    if (!same)
      fprintf(stderr,
              "qlinear-bench: warning: M = %llu: the daemon's y differs from "
              "the in-process kernel's\n",
              (unsigned long long)m);
  } else {
    /* On another device only the daemon times the kernel: the inline and
     * region results must agree with each other. */
    same = memcmp(e->y, e->ry->data, ybytes) == 0;
  }

  ei = (echo_ctx){e->echo_req, 0, 0, e->payload, 0};
  er = ei;
  msg_sizes(&ri, e->rx, e->ry, &ei.req_bytes, &ei.resp_bytes);
  msg_sizes(&rr, e->rx, e->ry, &er.req_bytes, &er.resp_bytes);

  T[T_INLINE] = (timed){"inline", rt_run, &ri, 0, 0};
  T[T_REGION] = (timed){"region", rt_run, &rr, 0, 0};
  T[T_KERNEL] = in_process(o) ? (timed){"kernel", lin_run, &kc, 0, 0}
                               : (timed){"kernel", noop_run, NULL, 0, 0};
  T[T_ECHO_INLINE] = (timed){"echo_inline", echo_run, &ei, 0, 0};
  T[T_ECHO_REGION] = (timed){"echo_region", echo_run, &er, 0, 0};
  /* The daemon's view of the same calls, as a cross-check of the
   * in-process kernel time: its mean time per job, over the whole case. */
  if ((rc = weight_counters(e->c, &w0)) != 0) {
    fprintf(stderr, "qlinear-bench: stats: %s\n", ql_strerror(rc));
    return -1;
  }
  for (int j = 0; j < T_COUNT; j++)
    calibrate(&T[j], o->seconds / 4);
  for (int p = 0; p < P && ri.rc == 0 && rr.rc == 0 && ei.rc == 0 &&
                  er.rc == 0;
       p++)
    for (int j = 0; j < T_COUNT; j++) {
      int k = order(p, j, T_COUNT);
      t[k][p] = sample(&T[k]);
    }
  if (ri.rc != 0 || rr.rc != 0) {
    fprintf(stderr, "qlinear-bench: %s\n", ri.rc ? ri.msg : rr.msg);
    return -1;
  }
  if (ei.rc != 0 || er.rc != 0) {
    fprintf(stderr, "qlinear-bench: echo: %s\n",
            nn_strerror(ei.rc ? ei.rc : er.rc));
    return -1;
  }
  if ((rc = weight_counters(e->c, &w1)) != 0) {
    fprintf(stderr, "qlinear-bench: stats: %s\n", ql_strerror(rc));
    return -1;
  }
  jobs = w1.requests > w0.requests ? (double)(w1.requests - w0.requests) : 1;
  if (!in_process(o))
    for (int p = 0; p < P; p++)
      t[T_KERNEL][p] = (double)(w1.kernel_ns - w0.kernel_ns) / jobs * 1e-9;
  for (int p = 0; p < P; p++) {
    oi[p] = t[T_INLINE][p] - t[T_KERNEL][p];
    orr[p] = t[T_REGION][p] - t[T_KERNEL][p];
    ri_e[p] = oi[p] / t[T_ECHO_INLINE][p];
    rr_e[p] = orr[p] / t[T_ECHO_REGION][p];
    i_r[p] = t[T_INLINE][p] / t[T_REGION][p];
    r_ke[p] = t[T_REGION][p] / (t[T_KERNEL][p] + t[T_ECHO_REGION][p]);
  }
  for (int j = 0; j < T_COUNT; j++)
    s[j] = stats_copy(t[j], P);
  s_oi = stats_copy(oi, P);
  s_or = stats_copy(orr, P);
  s_rie = stats_copy(ri_e, P);
  s_rre = stats_copy(rr_e, P);
  s_ir = stats_copy(i_r, P);
  s_rke = stats_copy(r_ke, P);
  if (m == PREFILL_M)
    e->out->prefill_kernel_s = s[T_KERNEL].med;

  if (!o->json_only) {
    if (header)
      printf("\nper-call overhead = round trip - in-process kernel; echo = "
             "bare nanomsg REQ/REP\nof the same message sizes; (daemon) = its "
             "mean job time; times in us (medians),\nratios median "
             "[min-max]\n"
             "%-26s | %-47s | %-47s |\n"
             "%4s %-3s %8s %8s | %8s %8s %8s %-20s | %8s %8s %8s %-20s | "
             "%s\n",
             "", "inline tensors (ql_linear)",
             "region tensors (ql_linear_region)", "M", "pth", "kernel",
             "(daemon)", "rt",
             "overhead", "echo", "overhead/echo", "rt", "overhead", "echo",
             "overhead/echo", "rt inline/region");
    printf("%4llu %-3s %8.1f %8.1f | %8.1f %8.1f %8.1f %5.2f [%5.2f-%5.2f]  | "
           "%8.1f %8.1f %8.1f %5.2f [%5.2f-%5.2f]  | %.2f [%.2f-%.2f]%s\n",
           (unsigned long long)m, path_name(ri.res.path), s[T_KERNEL].med * 1e6,
           (double)(w1.kernel_ns - w0.kernel_ns) / jobs * 1e-3,
           s[T_INLINE].med * 1e6, s_oi.med * 1e6, s[T_ECHO_INLINE].med * 1e6,
           s_rie.med, s_rie.min, s_rie.max, s[T_REGION].med * 1e6,
           s_or.med * 1e6, s[T_ECHO_REGION].med * 1e6, s_rre.med, s_rre.min,
           s_rre.max, s_ir.med, s_ir.min, s_ir.max,
           same ? "" : "  (y differs!)");
    printf("%4s     region rt / (kernel + echo): %.2f [%.2f-%.2f]\n", "",
           s_rke.med, s_rke.min, s_rke.max);
  }
  printf("{\"bench\":\"daemon\",\"case\":\"overhead\",\"n\":%d,\"k\":%d,"
         "\"format\":\"%s\",\"group_size\":%d,\"scale_dtype\":\"bf16\","
         "\"m\":%llu,\"path\":\"%s\",\"impl\":\"%s\",\"daemon_impl\":\"%s\","
         "\"threads\":%d,\"pairs\":%d,\"sample_s\":%.4f,\"same_bytes\":%s,"
         "\"req_bytes\":%zu,\"resp_bytes\":%zu,\"region_req_bytes\":%zu,"
         "\"region_resp_bytes\":%zu",
         W_N, W_K, fmt_name(), W_GROUP, (unsigned long long)m,
         path_name(ri.res.path),
         im ? im->name : "daemon", ri.res.impl, o->threads, P, o->seconds / 4,
         same ? "true" : "false", ei.req_bytes, ei.resp_bytes, er.req_bytes,
         er.resp_bytes);
  print_ns(stdout, "kernel_ns", s[T_KERNEL]);
  printf(",\"daemon_kernel_ns_mean\":%.0f,\"daemon_queue_ns_mean\":%.0f",
         (double)(w1.kernel_ns - w0.kernel_ns) / jobs,
         (double)(w1.queue_ns - w0.queue_ns) / jobs);
  print_ns(stdout, "inline_rt_ns", s[T_INLINE]);
  print_ns(stdout, "overhead_ns", s_oi);
  print_ns(stdout, "echo_ns", s[T_ECHO_INLINE]);
  print_stat(stdout, "overhead_vs_echo", s_rie);
  print_ns(stdout, "region_rt_ns", s[T_REGION]);
  print_ns(stdout, "region_overhead_ns", s_or);
  print_ns(stdout, "region_echo_ns", s[T_ECHO_REGION]);
  print_stat(stdout, "region_overhead_vs_echo", s_rre);
  print_stat(stdout, "inline_vs_region", s_ir);
  print_stat(stdout, "region_vs_kernel_echo", s_rke);
  printf("}\n");
  fflush(stdout);
  return 0;
}

/* ------------------------------------------------------- throughput */

static int throughput(const dopts *o) {
  double rate[N_TPUT][MAX_PAIRS], ratio[N_TPUT][MAX_PAIRS];
  int P = o->pairs;

  for (int p = 0; p < P; p++)
    for (int j = 0; j < N_TPUT; j++) {
      int ci = order(p, j, N_TPUT), nc = tput_clients[ci];
      wcmd cmd[MAX_CLIENTS];
      wres res[MAX_CLIENTS];
      uint64_t rows = 0;
      double t0 = now_s() + START_MARGIN_S;
      for (int i = 0; i < nc; i++)
        cmd[i] = (wcmd){W_DECODE, 1, t0, t0 + o->seconds};
      if (workers_run(nc, cmd, res) != 0)
        return -1;
      for (int i = 0; i < nc; i++)
        rows += res[i].rows;
      rate[ci][p] = (double)rows / o->seconds;
    }
  for (int ci = 0; ci < N_TPUT; ci++) {
    stat3 sr, sx;
    for (int p = 0; p < P; p++)
      ratio[ci][p] = rate[ci][p] / rate[0][p];
    sr = stats_copy(rate[ci], P);
    sx = stats_copy(ratio[ci], P);
    if (!o->json_only) {
      if (ci == 0)
        printf("\nthroughput: client processes sending M = 1 requests back "
               "to back, %.2f s samples\n%7s %-28s %s\n",
               o->seconds, "clients", "rows/s median [min-max]",
               "x 1 client [min-max]");
      printf("%7d %8.0f [%7.0f-%7.0f]   %5.2f [%.2f-%.2f]\n", tput_clients[ci],
             sr.med, sr.min, sr.max, sx.med, sx.min, sx.max);
    }
    printf("{\"bench\":\"daemon\",\"case\":\"throughput\",\"n\":%d,\"k\":%d,"
           "\"format\":\"%s\",\"group_size\":%d,\"m\":1,\"clients\":%d,"
           "\"threads\":%d,\"pairs\":%d,\"seconds\":%.4f",
           W_N, W_K, fmt_name(), W_GROUP, tput_clients[ci], o->threads, P,
           o->seconds);
    fprintf(stdout, ",\"rows_per_s\":{\"median\":%.1f,\"min\":%.1f,"
                    "\"max\":%.1f}",
            sr.med, sr.min, sr.max);
    print_stat(stdout, "vs_1_client", sx);
    printf("}\n");
  }
  fflush(stdout);
  return 0;
}

/* ---------------------------------------------------- decode latency */

static int decode_latency(const dopts *o, const ovh_out *oo) {
  double p50[2][MAX_PAIRS], p99[2][MAX_PAIRS], calls[2][MAX_PAIRS];
  double pf_rate[2][MAX_PAIRS], ratio[MAX_PAIRS], pf_ratio[MAX_PAIRS];
  stat3 s50[2], s99[2], sc[2], sr, spf[2], spr;
  int P = o->pairs;

  /* Triple p: the decode client alone (k = 0), with the prefill stream
   * (k = 1), and the prefill stream alone (k = 2), in an order that
   * rotates. */
  for (int p = 0; p < P; p++)
    for (int j = 0; j < 3; j++) {
      int k = order(p, j, 3);
      wcmd cmd[2];
      wres res[2];
      double t0 = now_s() + START_MARGIN_S;
      cmd[0] = (wcmd){k < 2 ? W_DECODE : 0, 1, t0, t0 + o->seconds};
      cmd[1] = (wcmd){k ? W_PREFILL : 0, PREFILL_M, t0, t0 + o->seconds};
      if (workers_run(2, cmd, res) != 0)
        return -1;
      if (k < 2) {
        p50[k][p] = res[0].p50;
        p99[k][p] = res[0].p99;
        calls[k][p] = (double)res[0].calls;
      }
      if (k)
        pf_rate[k - 1][p] = (double)res[1].rows / o->seconds;
    }
  for (int p = 0; p < P; p++) {
    ratio[p] = p99[1][p] / p99[0][p];
    pf_ratio[p] = pf_rate[0][p] / pf_rate[1][p];
  }
  for (int k = 0; k < 2; k++) {
    s50[k] = stats_copy(p50[k], P);
    s99[k] = stats_copy(p99[k], P);
    sc[k] = stats_copy(calls[k], P);
    spf[k] = stats_copy(pf_rate[k], P);
  }
  sr = stats_copy(ratio, P);
  spr = stats_copy(pf_ratio, P);
  /* The in-process kernel's rows/s at the same M, for comparison. */
  double kernel_rate =
      oo->prefill_kernel_s > 0 ? PREFILL_M / oo->prefill_kernel_s : 0;
  if (!o->json_only) {
    printf("\ndecode latency: one client process's M = 1 requests, alone and "
           "while another\nstreams M = %d prefill requests (regions) on the "
           "same weight; %.2f s samples, us\n%-14s %8s %-26s %s\n",
           PREFILL_M, o->seconds, "", "p50", "p99 median [min-max]",
           "calls/sample");
    for (int k = 0; k < 2; k++)
      printf("%-14s %8.1f %8.1f [%7.1f-%7.1f]   %.0f\n",
             k ? "with prefill" : "alone", s50[k].med * 1e6, s99[k].med * 1e6,
             s99[k].min * 1e6, s99[k].max * 1e6, sc[k].med);
    printf("p99 with prefill / alone: %.2f [%.2f-%.2f]\n", sr.med, sr.min,
           sr.max);
    printf("prefill rows/s: alone %.0f [%.0f-%.0f], with decode %.0f "
           "[%.0f-%.0f] (with/alone %.2f [%.2f-%.2f]); in-process kernel at "
           "M = %d: %.0f\n",
           spf[1].med, spf[1].min, spf[1].max, spf[0].med, spf[0].min,
           spf[0].max, spr.med, spr.min, spr.max, PREFILL_M, kernel_rate);
  }
  printf("{\"bench\":\"daemon\",\"case\":\"decode_p99\",\"n\":%d,\"k\":%d,"
         "\"format\":\"%s\",\"group_size\":%d,\"m\":1,\"prefill_m\":%d,"
         "\"threads\":%d,\"pairs\":%d,\"seconds\":%.4f",
         W_N, W_K, fmt_name(), W_GROUP, PREFILL_M, o->threads, P,
         o->seconds);
  print_ns(stdout, "alone_p50_ns", s50[0]);
  print_ns(stdout, "alone_p99_ns", s99[0]);
  print_ns(stdout, "prefill_p50_ns", s50[1]);
  print_ns(stdout, "prefill_p99_ns", s99[1]);
  print_stat(stdout, "p99_vs_alone", sr);
  printf(",\"alone_calls\":%.0f,\"prefill_calls\":%.0f,"
         "\"prefill_rows_per_s\":%.1f,\"prefill_alone_rows_per_s\":%.1f,"
         "\"kernel_rows_per_s\":%.1f",
         sc[0].med, sc[1].med, spf[0].med, spf[1].med, kernel_rate);
  print_stat(stdout, "prefill_with_vs_alone", spr);
  printf("}\n");
  fflush(stdout);
  return 0;
}

/* ------------------------------------------------------------- main */

/* The in-process weight: the daemon's quantization of the same bf16 data
 * (same format, group and scale dtype), repacked once by the CPU backend.
 * One copy, not the kernel bench's rotation: the daemon holds one copy
 * too, and at 8.5 MiB it may stay in the last-level cache for both. */
static int wset_from_bf16(const uint16_t *wb, wset *ws) {
  ql_quant_params qp = {W_FMT, W_FMT == QL_FORMAT_Q4G ? W_GROUP : 0, 0,
                        QL_DTYPE_BF16};
  ql_repack_args ra = {NULL, NULL, 0};
  int rc;

  memset(ws, 0, sizeof *ws);
  ws->f = W_FMT;
  if ((rc = ql_qweight_quantize(&qp, W_N, W_K, QL_DTYPE_BF16, wb, NULL,
                                &ws->q)) != 0)
    return rc;
  ws->wbytes = ws->q->qdata_bytes + ws->q->scale_bytes * (ws->q->zero ? 2 : 1);
  ws->rp = ql_dispatch(ql_backend_find("cpu"), QL_OP_REPACK, W_FMT,
                       QL_DTYPE_F32, 0, W_N, W_K);
  if (ws->rp == NULL)
    return QL_ENOTSUP;
  if ((ws->pk = calloc(1, sizeof *ws->pk)) == NULL)
    return QL_ENOMEM;
  ra.w = ws->q;
  if ((rc = ws->rp->fn.repack(&ra)) != 0)
    return rc;
  ws->pk[0] = ra.packed;
  ws->ncopies = 1;
  return 0;
}

int bench_daemon(int argc, char **argv) {
  dopts o;
  ql_client *c = NULL;
  ql_connect_opts co = {.timeout_ms = CALL_TIMEOUT_MS,
                       .client_name = "qlinear-bench"};
  ql_hello_info hi;
  ql_load_desc ld;
  ql_region *rx = NULL, *ry = NULL;
  wset ws;
  ovh_out oo = {0};
  echo_srv es;
  int echo_req = -1, have_ws = 0, rc, rv = 1;
  uint16_t *wb = NULL;
  float *tmp = NULL, *x = NULL, *y = NULL, *yk = NULL;
  uint8_t *payload = NULL;
  char tbuf[16];
  const char *tmpdir;
  struct sigaction sa;

  memset(&es, 0, sizeof es);
  es.sock = -1;
  if (argc > 1 &&
      (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    usage(stdout);
    return 0;
  }
  if (parse_opts(argc, argv, &o) != 0) {
    usage(stderr);
    return 2;
  }
  /* The in-process kernel runs on as many threads as the daemon's. */
  snprintf(tbuf, sizeof tbuf, "%d", o.threads);
  setenv("QL_CPU_THREADS", tbuf, 1);

  memset(&R, 0, sizeof R);
  R.parent = getpid();
  /* TMPDIR if it is absolute and short enough for the socket paths
   * inside (sockaddr_un holds 108 bytes). */
  tmpdir = getenv("TMPDIR");
  if (tmpdir == NULL || tmpdir[0] != '/' || strlen(tmpdir) > 64)
    tmpdir = "/tmp";
  snprintf(R.dir, sizeof R.dir, "%s/qlinear-bench-XXXXXX", tmpdir);
  if (mkdtemp(R.dir) == NULL) {
    perror("qlinear-bench: mkdtemp");
    return 1;
  }
  R.dir_made = 1;
  snprintf(R.sock, sizeof R.sock, "%s/qlineard.sock", R.dir);
  snprintf(R.session, sizeof R.session, "%s/session.sock", R.dir);
  snprintf(R.echo_sock, sizeof R.echo_sock, "%s/echo.sock", R.dir);
  snprintf(R.log, sizeof R.log, "%s/qlineard.log", R.dir);
  snprintf(R.address, sizeof R.address, "ipc://%s", R.sock);
  snprintf(R.echo_address, sizeof R.echo_address, "ipc://%s", R.echo_sock);
  atexit(cleanup_atexit);
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  if (daemon_start(&o) != 0)
    goto fail;
  /* Before anything here touches nanomsg (see the top of the file). */
  if (workers_fork(MAX_CLIENTS) != 0)
    goto fail;

  if ((rc = ql_connect(R.address, &co, &c)) != 0 ||
      (rc = ql_hello(c, &hi)) != 0) {
    fprintf(stderr, "qlinear-bench: connect: %s: %s\n", ql_strerror(rc),
            ql_errmsg());
    goto fail;
  }
  /* A bf16 weight, as models ship them: N(0, 0.02). The daemon quantizes
   * it; this process quantizes the same data for the in-process kernel. */
  wb = xalloc((size_t)W_N * W_K * sizeof *wb);
  tmp = xalloc((size_t)W_N * W_K * sizeof *tmp);
  for (size_t i = 0; i < (size_t)W_N * W_K; i++)
    tmp[i] = (float)(0.02 * gauss());
  ql_from_f32(QL_DTYPE_BF16, tmp, wb, (size_t)W_N * W_K);
  free(tmp);
  tmp = NULL;
  memset(&ld, 0, sizeof ld);
  ld.name = W_NAME;
  ld.format = W_FMT;
  ld.group_size = W_FMT == QL_FORMAT_Q4G ? W_GROUP : 0;
  ld.devices = o.device;
  ld.n = W_N;
  ld.k = W_K;
  ld.dtype = QL_DTYPE_BF16;
  ld.data = wb;
  ld.policy = QL_PATH_AUTO;
  ld.scale_dtype = QL_DTYPE_BF16;
  if ((rc = ql_load_float(c, &ld, NULL, NULL)) != 0) {
    fprintf(stderr, "qlinear-bench: load: %s: %s\n", ql_strerror(rc),
            ql_errmsg());
    goto fail;
  }
  have_ws = in_process(&o); /* wset_free() takes a half-built one too */
  if (have_ws && (rc = wset_from_bf16(wb, &ws)) != 0) {
    fprintf(stderr, "qlinear-bench: in-process weight: %s\n",
            ql_strerror(rc));
    goto fail;
  }
  free(wb);
  wb = NULL;
  /* The daemon measures the crossover of a new shape after it is loaded:
   * wait for it, so that every case runs on the paths it will keep. */
  ql_weight_info wi;
  memset(&wi, 0, sizeof wi);
  for (int i = 0; i < 600 && ql_lookup(c, W_NAME, &wi) == 0 &&
                  !wi.crossover_measured;
       i++)
    usleep(100 * 1000);

  if (!o.json_only) {
    printf("qlinear-bench daemon: qlineard %s (%s), %dx%d %s (g%d for q4g), "
           "bf16 scales, f32 activations, on %s;\nthreads %d (daemon and "
           "in-process), level %s, %d pairs, samples %.3f s (per call %.3f "
           "s)\n",
           hi.daemon_version, o.daemon, W_N, W_K, fmt_name(), W_GROUP,
           o.device ? o.device : "the default devices", o.threads,
           ql__cpu_level_name(ql__cpu_level_get()), o.pairs, o.seconds,
           o.seconds / 4);
    if (wi.crossover_rows == UINT32_MAX)
      printf("crossover: AUTO never runs activation-quantized (%s)\n",
             wi.crossover_measured ? "measured" : "not measured");
    else
      printf("crossover: AUTO runs activation-quantized from %u rows (%s)\n",
             wi.crossover_rows,
             wi.crossover_measured ? "measured" : "not measured yet");
  }

  /* 1. Per-call overhead. */
  x = xalloc((size_t)PREFILL_M * W_K * sizeof *x);
  y = xalloc((size_t)PREFILL_M * W_N * sizeof *y);
  yk = xalloc((size_t)PREFILL_M * W_N * sizeof *yk);
  fill_x(x, (size_t)PREFILL_M * W_K);
  /* The echo's messages: the largest is M = 512's inline x or y plus its
   * envelope. */
  payload = xalloc((size_t)PREFILL_M * (W_K > W_N ? W_K : W_N) *
                       sizeof(float) + 4096);
  memset(payload, 0x5a, (size_t)PREFILL_M * (W_K > W_N ? W_K : W_N) *
                            sizeof(float) + 4096);
  if ((rc = ql_region_create(c, (size_t)PREFILL_M * W_K * sizeof(float),
                             &rx)) != 0 ||
      (rc = ql_region_create(c, (size_t)PREFILL_M * W_N * sizeof(float),
                             &ry)) != 0) {
    fprintf(stderr, "qlinear-bench: region: %s: %s\n", ql_strerror(rc),
            ql_errmsg());
    goto fail;
  }
  if (echo_start(&es, payload, &echo_req) != 0)
    goto fail;
  {
    ovh_env env = {&o, c, &ws, rx, ry, x, y, yk, echo_req, payload, &oo};
    for (int i = 0; i < N_OVH; i++)
      if (overhead_case(&env, ovh_ms[i], i == 0) != 0)
        goto fail;
  }
  /* Idle from here on, but not part of what the clients measure. */
  echo_stop(&es, echo_req);
  echo_req = -1;
  ql_region_destroy(c, rx);
  ql_region_destroy(c, ry);
  rx = ry = NULL;

  /* 2 and 3. The clients: connected, warmed up, then timed. This
   * process's session keeps holding the weight. */
  {
    wcmd cmd[MAX_CLIENTS];
    wres res[MAX_CLIENTS];
    for (int i = 0; i < MAX_CLIENTS; i++)
      cmd[i] = (wcmd){W_PREP, 1, 0, 0};
    if (workers_run(MAX_CLIENTS, cmd, res) != 0)
      goto fail;
    cmd[0].op = 0;
    cmd[1].m = PREFILL_M;
    if (workers_run(2, cmd, res) != 0)
      goto fail;
  }
  if (throughput(&o) != 0 || decode_latency(&o, &oo) != 0)
    goto fail;
  rv = 0;

fail:
  echo_stop(&es, echo_req);
  if (c != NULL) {
    ql_region_destroy(c, rx);
    ql_region_destroy(c, ry);
    ql_close(c);
  }
  if (have_ws)
    wset_free(&ws);
  free(wb);
  free(tmp);
  free(x);
  free(y);
  free(yk);
  free(payload);
  if (run_cleanup(rv != 0) != 0)
    rv = 1;
  return rv;
}
