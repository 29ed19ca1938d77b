/*
 * bench_daemon.c - `qlinear-bench daemon`: qlineard end to end (DESIGN §12;
 * the daemon benchmark of issues 4 and 6).
 *
 * It starts its own qlineard on a private socket directory, loads one
 * 4096x4096 q4g128 weight (random bf16 data, bf16 scales, quantized by the
 * daemon) and measures each case on both of libqlinear's transports: the
 * message path (nanomsg REQ/REP, a client connected with
 * ql_connect_opts.no_ring) and the session's shared-memory ring (the
 * default):
 *   overhead    at M = 1, 128 and 512: the round trip of ql_linear (x and y
 *               inline on the message path; staged through the library's
 *               own regions on the ring) and of ql_linear_region (x and y
 *               in regions), each on both transports, minus the same
 *               kernel called in this process (ql_dispatch on the cpu
 *               backend, reading the CPU backend's repacked layout of the
 *               same quantized weight, on the path the daemon reported),
 *               against a bare nanomsg REQ/REP echo of the message path's
 *               sizes, served by a thread of this process on another
 *               ipc:// address; and the message path's round trip over
 *               the ring's;
 *   throughput  rows/s of 1, 2, 4 and 8 client processes, each with its
 *               own sessions, sending M = 1 requests back to back on the
 *               one weight for --seconds, on each transport; the ratio to
 *               one client, and ring over message path;
 *   decode_p99  one client process's M = 1 latency p99, alone and while
 *               another client process streams M = 512 prefill requests (x
 *               and y in regions, as a prefill client would send them) on
 *               the same weight; the ratio; and the prefill stream's rows/s
 *               alone and with the decode client, next to the in-process
 *               kernel's at M = 512; on each transport (both clients use
 *               the same one);
 *   idle        the daemon's CPU time (utime + stime of /proc/PID/stat)
 *               over about a second with nothing to do, first with no
 *               ring, then with 16 more sessions each holding a ring that
 *               served one request: what quiet rings cost the daemon.
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
#include <dirent.h>
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
/* The q4g group: 128, or (--shape with a K that 128 does not divide) the
 * largest of 64 and 32 that divides K, or --group. */
static int W_GROUP = 128;
#define W_NAME "bench/weight"
#define PREFILL_M 512
#define MAX_CLIENTS 8
#define MAX_PAIRS 64
#define MAX_DAEMON_ARGS 32
/* The idle case: rings opened, and the length of each CPU-time window. */
#define IDLE_RINGS 16
#define IDLE_WINDOW_S 1.0
/* Longer than the daemon's longest ring_spin_us (100 ms), so that every
 * ring has gone to sleep before the window starts. */
#define IDLE_SETTLE_S 0.25
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

/* libqlinear's two transports: a client connected with no_ring, and one
 * with the session's ring. */
enum { TR_MSG, TR_RING, N_TR };
static const char *const tr_name[N_TR] = {"message", "ring"};

/* ------------------------------------------------------------ options */

typedef struct dopts {
  double seconds; /* one throughput or latency sample */
  int pairs;
  int threads;
  const char *daemon;
  const char *device; /* --device: where the weight goes; NULL: default */
  int json_only;
  const char *daemon_args[MAX_DAEMON_ARGS]; /* --daemon-arg, in order */
  int n_daemon_args;
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
          "measures, on the\nmessage path (nanomsg REQ/REP) and on the "
          "session's shared-memory ring:\nper-call overhead (M = 1, 128, 512; "
          "inline and region tensors) against the\nin-process kernel and a "
          "bare nanomsg echo, rows/s of 1, 2, 4, 8 client\nprocesses (with "
          "what the in-process kernel's 8-row time allows them), a\n"
          "decode client's p50/p99 alone and under an M = 512 prefill\n"
          "stream, and the daemon's CPU use with 16 idle rings.\n"
          "  --seconds S   length of one throughput or latency sample "
          "(default 1);\n"
          "                per-call samples last S/4\n"
          "  --pairs P     interleaved pairs per figure (>= 5, default 7)\n"
          "  --daemon PATH qlineard to start (default: $QLINEARD, else "
          "./qlineard)\n"
          "  --daemon-arg ARG\n"
          "                one more argument for qlineard, after the "
          "bench's own\n"
          "                (repeat it: --daemon-arg --ring-spin-us "
          "--daemon-arg 0)\n"
          "  --threads T   CPU threads of the daemon and of the in-process "
          "kernel\n"
          "                (QL_CPU_THREADS; default 2)\n"
          "  --shape NxK   the weight's shape (default 4096x4096): N >= 16, "
          "K a\n"
          "                multiple of 32 (of the group for q4g), both up "
          "to 65536\n"
          "  --format F    q4g (default) or q8c\n"
          "  --group G     q4g group: 32, 64, 128 or 256 dividing K "
          "(default 128, or\n"
          "                the largest of 64 and 32 that divides K)\n"
          "  --device D    load the weight on device D only (e.g. cuda:0); "
          "on a\n"
          "                device other than cpu the in-process kernel is "
          "not timed:\n"
          "                'kernel' is then the daemon's mean job time\n"
          "  --quick       5 pairs of 0.05 s samples: a smoke test, not a "
          "measurement\n"
          "  --json        JSON lines only\n"
          "The ring side waits as libqlinear does (QLINEAR_RING_SPIN_US "
          "applies);\nQLINEAR_RING in the environment is ignored: each "
          "client picks its transport.\n");
}

static int parse_opts(int argc, char **argv, dopts *o) {
  const char *env = getenv("QLINEARD");
  long group = 0;
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
    } else if (strcmp(a, "--daemon-arg") == 0) {
      if (o->n_daemon_args == MAX_DAEMON_ARGS) {
        fprintf(stderr, "qlinear-bench: at most %d --daemon-arg\n",
                MAX_DAEMON_ARGS);
        return -1;
      }
      o->daemon_args[o->n_daemon_args++] = v;
    } else if (strcmp(a, "--shape") == 0) {
      long n = strtol(v, &end, 10), k;
      if (*end != 'x' || n < 16 || n > 65536) {
        fprintf(stderr,
                "qlinear-bench: --shape %s: want NxK, N from 16 to "
                "65536\n",
                v);
        return -1;
      }
      k = strtol(end + 1, &end, 10);
      if (*end != '\0' || k < 32 || k > 65536 || k % 32 != 0) {
        fprintf(stderr,
                "qlinear-bench: --shape %s: K must be a multiple of "
                "32 from 32 to 65536\n",
                v);
        return -1;
      }
      W_N = (int)n;
      W_K = (int)k;
    } else if (strcmp(a, "--format") == 0) {
      if (strcmp(v, "q4g") == 0)
        W_FMT = QL_FORMAT_Q4G;
      else if (strcmp(v, "q8c") == 0)
        W_FMT = QL_FORMAT_Q8C;
      else
        return -1;
    } else if (strcmp(a, "--group") == 0) {
      group = strtol(v, &end, 10);
      if (*end != '\0' ||
          (group != 32 && group != 64 && group != 128 && group != 256)) {
        fprintf(stderr, "qlinear-bench: --group %s: 32, 64, 128 or 256\n", v);
        return -1;
      }
    } else if (strcmp(a, "--device") == 0) {
      o->device = v;
    } else {
      return -1;
    }
  }
  /* The q4g group divides K: asked for, or the largest that does. */
  if (group != 0) {
    if (W_K % group != 0) {
      fprintf(stderr, "qlinear-bench: --group %ld does not divide K = %d\n",
              group, W_K);
      return -1;
    }
    W_GROUP = (int)group;
  } else {
    W_GROUP = W_K % 128 == 0 ? 128 : W_K % 64 == 0 ? 64 : 32;
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
  const char *argv[6 + MAX_DAEMON_ARGS] = {o->daemon, "--socket-dir", R.dir,
                                           "--log-level", "warning"};
  pid_t pid;
  int st;

  /* --daemon-arg after the bench's own, so that they may override them. */
  for (int i = 0; i < o->n_daemon_args; i++)
    argv[5 + i] = o->daemon_args[i];
  argv[5 + o->n_daemon_args] = NULL;

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

/* A command to a client process. W_PREP connects (once: a session on each
 * transport) and makes one warm-up call of m rows on each; W_DECODE (M =
 * 1, ql_linear) and W_PREFILL (M = PREFILL_M, regions) call back to back
 * on transport tr from t0 until t1. */
typedef struct wcmd {
  int op;
  int tr; /* TR_MSG or TR_RING */
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
  ql_client *c[N_TR];
  float *x, *y;                   /* M = 1: inline (staged on the ring) */
  ql_region *rx[N_TR], *ry[N_TR]; /* M = PREFILL_M, each session's own */
  double *lat;
  size_t nlat, cap;
} wstate;

static void fill_x(float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)gauss();
}

/* Connects a client on transport tr: no_ring for the message path. */
static int connect_tr(int tr, ql_client **c) {
  ql_connect_opts co = {.timeout_ms = CALL_TIMEOUT_MS,
                        .client_name = "qlinear-bench",
                        .no_ring = tr == TR_MSG};
  return ql_connect(R.address, &co, c);
}

static int w_call(wstate *w, int tr, uint64_t m) {
  if (m == PREFILL_M) {
    ql_slice xs = {w->rx[tr], 0, w->rx[tr]->size},
             ys = {w->ry[tr], 0, w->ry[tr]->size};
    return ql_linear_region(w->c[tr], W_NAME, QL_PATH_AUTO, QL_DTYPE_F32, m,
                            W_K, &xs, W_N, &ys, NULL, NULL);
  }
  return ql_linear(w->c[tr], W_NAME, QL_PATH_AUTO, QL_DTYPE_F32, 1, W_K, w->x,
                   W_N, w->y, NULL);
}

static int w_prep(wstate *w, uint64_t m, wres *r) {
  int rc;
  if (m == 1 && w->x == NULL) {
    w->x = xalloc(W_K * sizeof(float));
    w->y = xalloc(W_N * sizeof(float));
    fill_x(w->x, W_K);
  }
  for (int tr = 0; tr < N_TR; tr++) {
    if (w->c[tr] == NULL && (rc = connect_tr(tr, &w->c[tr])) != 0) {
      snprintf(r->msg, sizeof r->msg, "connect (%s): %s", tr_name[tr],
               ql_errmsg());
      return rc;
    }
    if (m == PREFILL_M && w->rx[tr] == NULL) {
      if ((rc = ql_region_create(w->c[tr], PREFILL_M * W_K * sizeof(float),
                                 &w->rx[tr])) != 0 ||
          (rc = ql_region_create(w->c[tr], PREFILL_M * W_N * sizeof(float),
                                 &w->ry[tr])) != 0) {
        snprintf(r->msg, sizeof r->msg, "region: %s", ql_errmsg());
        return rc;
      }
      fill_x(w->rx[tr]->data, PREFILL_M * W_K);
    }
    if ((rc = w_call(w, tr, m)) != 0) {
      snprintf(r->msg, sizeof r->msg, "warm-up (%s): %s", tr_name[tr],
               ql_errmsg());
      return rc;
    }
  }
  return 0;
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
    if ((rc = w_call(w, c->tr, c->m)) != 0) {
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
  for (int tr = 0; tr < N_TR; tr++)
    ql_close(w.c[tr]); /* destroys the regions too */
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
  uint64_t requests, kernel_ns, queue_ns, rows, batches;
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
      out->rows += st->per_weight[i].rows;
      out->batches += st->per_weight[i].batches;
    }
  ql_stats_free(st);
  return 0;
}

/* The things a pair of the overhead case times: ql_linear and
 * ql_linear_region on each transport, the in-process kernel, and the echo
 * of the message path's sizes. */
enum {
  T_INLINE,      /* message path, x and y inline */
  T_REGION,      /* message path, x and y in regions */
  T_RING_REGION, /* ring, x and y in regions */
  T_RING_INLINE, /* ring, ql_linear: staged through the library's regions */
  T_KERNEL,
  T_ECHO_INLINE,
  T_ECHO_REGION,
  T_COUNT
};

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
  ql_client *c;  /* message path (no_ring) */
  ql_client *cr; /* the ring */
  const wset *ws;
  ql_region *rx, *ry;   /* c's */
  ql_region *rrx, *rry; /* cr's */
  const float *x; /* PREFILL_M rows; a case uses the first m */
  float *y, *yr, *yk; /* message inline, ring inline, in-process */
  int echo_req;
  const uint8_t *payload;
  struct ovh_out *out;
} ovh_env;

/* What the later cases take from the overhead cases. */
typedef struct ovh_out {
  double prefill_kernel_s; /* in-process kernel at M = PREFILL_M */
  /* In-process, the faster path at 8 rows: its time, and over the faster
   * at 1 row, per pair (valid 0: not timed, the weight is on another
   * device). */
  stat3 k8, k8_over_k1;
} ovh_out;

static void noop_run(void *ctx, long i) {
  (void)ctx;
  (void)i;
}

/* One line of the overhead table: a round trip, its overhead with spread,
 * and (message path) its echo and overhead/echo. */
static void print_rt_row(const char *name, stat3 rt, stat3 ovh,
                         const stat3 *echo, const stat3 *ovh_echo) {
  printf("  %-15s %9.1f %9.1f [%8.1f-%8.1f]", name, rt.med * 1e6, ovh.med * 1e6,
         ovh.min * 1e6, ovh.max * 1e6);
  if (echo != NULL)
    printf(" %9.1f  %5.2f [%5.2f-%5.2f]", echo->med * 1e6, ovh_echo->med,
           ovh_echo->min, ovh_echo->max);
  printf("\n");
}

static int overhead_case(const ovh_env *e, uint64_t m, int header) {
  const dopts *o = e->o;
  rt_ctx rt[4]; /* T_INLINE .. T_RING_INLINE */
  echo_ctx ei, er;
  lin_ctx kc;
  timed T[T_COUNT];
  double t[T_COUNT][MAX_PAIRS], oi[MAX_PAIRS], orr[MAX_PAIRS];
  double ogr[MAX_PAIRS], ogi[MAX_PAIRS], r_gr[MAX_PAIRS], i_gi[MAX_PAIRS];
  double gi_gr[MAX_PAIRS];
  double ri_e[MAX_PAIRS], rr_e[MAX_PAIRS], i_r[MAX_PAIRS], r_ke[MAX_PAIRS];
  stat3 s[T_COUNT], s_oi, s_or, s_rie, s_rre, s_ir, s_rke;
  stat3 s_ogr, s_ogi, s_rgr, s_igi, s_gigr;
  size_t ybytes = m * W_N * sizeof(float);
  const ql_kernel_impl *im;
  wcount w0, w1;
  double jobs;
  int same, rc, P = o->pairs, failed = 0;
  /* The y each round trip writes. */
  const void *yout[4] = {e->y, e->ry->data, e->rry->data, e->yr};

  memset(rt, 0, sizeof rt);
  for (int j = T_INLINE; j <= T_RING_INLINE; j++) {
    rt_ctx *r = &rt[j];
    int ring = j == T_RING_REGION || j == T_RING_INLINE;
    r->c = ring ? e->cr : e->c;
    r->m = m;
    r->region = j == T_REGION || j == T_RING_REGION;
    r->x = e->x;
    r->y = j == T_RING_INLINE ? e->yr : e->y;
    r->xs = (ql_slice){ring ? e->rrx : e->rx, 0, m * W_K * sizeof(float)};
    r->ys = (ql_slice){ring ? e->rry : e->ry, 0, ybytes};
  }
  memcpy(e->rx->data, e->x, m * W_K * sizeof(float));
  memcpy(e->rrx->data, e->x, m * W_K * sizeof(float));

  /* One call of each: the path the daemon chose decides the in-process
   * kernel, and all the results must be the same bytes (the kernels are
   * batch-invariant and the weight is the same quantized weight, whichever
   * way the request travelled). */
  for (int j = T_INLINE; j <= T_RING_INLINE; j++)
    if (rt_call(&rt[j], &rt[j].res) != 0) {
      fprintf(stderr, "qlinear-bench: %s: %s\n",
              j < T_RING_REGION ? "message path" : "ring", rt[j].msg);
      return -1;
    }
  im = NULL;
  same = 1;
  if (in_process(o)) {
    im = ql_dispatch(ql_backend_find("cpu"),
                     rt[T_INLINE].res.path == QL_PATH_ACT_QUANT
                         ? QL_OP_LINEAR_AQ
                         : QL_OP_LINEAR_WO,
                     W_FMT, QL_DTYPE_F32, (int64_t)m, W_N, W_K);
    if (im == NULL) {
      fprintf(stderr, "qlinear-bench: no cpu kernel for M = %llu\n",
              (unsigned long long)m);
      return -1;
    }
    kc = (lin_ctx){im, e->ws, e->x, (int64_t)m, e->yk, 0};
    lin_run(&kc, 0);
    for (int j = T_INLINE; j <= T_RING_INLINE; j++)
      same &= memcmp(yout[j], e->yk, ybytes) == 0;
    if (!same)
      fprintf(stderr,
              "qlinear-bench: warning: M = %llu: the daemon's y differs from "
              "the in-process kernel's\n",
              (unsigned long long)m);
  } else {
    /* On another device only the daemon times the kernel: the four results
     * must agree with each other. */
    for (int j = T_REGION; j <= T_RING_INLINE; j++)
      same &= memcmp(yout[T_INLINE], yout[j], ybytes) == 0;
  }

  ei = (echo_ctx){e->echo_req, 0, 0, e->payload, 0};
  er = ei;
  msg_sizes(&rt[T_INLINE], e->rx, e->ry, &ei.req_bytes, &ei.resp_bytes);
  msg_sizes(&rt[T_REGION], e->rx, e->ry, &er.req_bytes, &er.resp_bytes);

  T[T_INLINE] = (timed){"inline", rt_run, &rt[T_INLINE], 0, 0};
  T[T_REGION] = (timed){"region", rt_run, &rt[T_REGION], 0, 0};
  T[T_RING_REGION] = (timed){"ring_region", rt_run, &rt[T_RING_REGION], 0, 0};
  T[T_RING_INLINE] = (timed){"ring_inline", rt_run, &rt[T_RING_INLINE], 0, 0};
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
  for (int p = 0; p < P && !failed; p++)
    for (int j = 0; j < T_COUNT; j++) {
      int k = order(p, j, T_COUNT);
      t[k][p] = sample(&T[k]);
      for (int i = T_INLINE; i <= T_RING_INLINE; i++)
        failed |= rt[i].rc != 0;
      failed |= ei.rc != 0 || er.rc != 0;
    }
  for (int j = T_INLINE; j <= T_RING_INLINE; j++)
    if (rt[j].rc != 0) {
      fprintf(stderr, "qlinear-bench: %s: %s\n",
              j < T_RING_REGION ? "message path" : "ring", rt[j].msg);
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
    ogr[p] = t[T_RING_REGION][p] - t[T_KERNEL][p];
    ogi[p] = t[T_RING_INLINE][p] - t[T_KERNEL][p];
    ri_e[p] = oi[p] / t[T_ECHO_INLINE][p];
    rr_e[p] = orr[p] / t[T_ECHO_REGION][p];
    i_r[p] = t[T_INLINE][p] / t[T_REGION][p];
    r_ke[p] = t[T_REGION][p] / (t[T_KERNEL][p] + t[T_ECHO_REGION][p]);
    r_gr[p] = t[T_REGION][p] / t[T_RING_REGION][p];
    i_gi[p] = t[T_INLINE][p] / t[T_RING_INLINE][p];
    gi_gr[p] = t[T_RING_INLINE][p] / t[T_RING_REGION][p];
  }
  for (int j = 0; j < T_COUNT; j++)
    s[j] = stats_copy(t[j], P);
  s_oi = stats_copy(oi, P);
  s_or = stats_copy(orr, P);
  s_ogr = stats_copy(ogr, P);
  s_ogi = stats_copy(ogi, P);
  s_rie = stats_copy(ri_e, P);
  s_rre = stats_copy(rr_e, P);
  s_ir = stats_copy(i_r, P);
  s_rke = stats_copy(r_ke, P);
  s_rgr = stats_copy(r_gr, P);
  s_igi = stats_copy(i_gi, P);
  s_gigr = stats_copy(gi_gr, P);
  if (m == PREFILL_M)
    e->out->prefill_kernel_s = s[T_KERNEL].med;

  if (!o->json_only) {
    if (header)
      printf("\nper-call round trip (rt) and overhead = rt - in-process "
             "kernel, us (medians,\noverhead with its [min-max]); echo = "
             "bare nanomsg REQ/REP of the message\npath's sizes; ring inline "
             "= ql_linear staged through the library's regions;\nratios "
             "median [min-max] over the pairs\n");
    printf("\nM = %llu, path %s: in-process kernel %.1f us, the daemon's mean "
           "job %.1f us%s\n"
           "  %-15s %9s %9s %-19s %9s  %s\n",
           (unsigned long long)m, path_name(rt[T_INLINE].res.path),
           s[T_KERNEL].med * 1e6,
           (double)(w1.kernel_ns - w0.kernel_ns) / jobs * 1e-3,
           same ? "" : "  (y differs!)", "", "rt", "overhead", "", "echo",
           "overhead/echo");
    print_rt_row("message inline", s[T_INLINE], s_oi, &s[T_ECHO_INLINE],
                 &s_rie);
    print_rt_row("message region", s[T_REGION], s_or, &s[T_ECHO_REGION],
                 &s_rre);
    print_rt_row("ring region", s[T_RING_REGION], s_ogr, NULL, NULL);
    print_rt_row("ring inline", s[T_RING_INLINE], s_ogi, NULL, NULL);
    printf("  rt message / ring: region %.2f [%.2f-%.2f], inline %.2f "
           "[%.2f-%.2f]\n",
           s_rgr.med, s_rgr.min, s_rgr.max, s_igi.med, s_igi.min, s_igi.max);
    printf("  rt inline / region: message %.2f [%.2f-%.2f], ring %.2f "
           "[%.2f-%.2f]; message region rt / (kernel + echo): %.2f "
           "[%.2f-%.2f]\n",
           s_ir.med, s_ir.min, s_ir.max, s_gigr.med, s_gigr.min, s_gigr.max,
           s_rke.med, s_rke.min, s_rke.max);
  }
  printf("{\"bench\":\"daemon\",\"case\":\"overhead\",\"n\":%d,\"k\":%d,"
         "\"format\":\"%s\",\"group_size\":%d,\"scale_dtype\":\"bf16\","
         "\"m\":%llu,\"path\":\"%s\",\"impl\":\"%s\",\"daemon_impl\":\"%s\","
         "\"ring_impl\":\"%s\",\"threads\":%d,\"pairs\":%d,\"sample_s\":%.4f,"
         "\"same_bytes\":%s,\"req_bytes\":%zu,\"resp_bytes\":%zu,"
         "\"region_req_bytes\":%zu,\"region_resp_bytes\":%zu",
         W_N, W_K, fmt_name(), W_GROUP, (unsigned long long)m,
         path_name(rt[T_INLINE].res.path), im ? im->name : "daemon",
         rt[T_INLINE].res.impl, rt[T_RING_REGION].res.impl, o->threads, P,
         o->seconds / 4, same ? "true" : "false", ei.req_bytes, ei.resp_bytes,
         er.req_bytes, er.resp_bytes);
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
  print_ns(stdout, "ring_region_rt_ns", s[T_RING_REGION]);
  print_ns(stdout, "ring_region_overhead_ns", s_ogr);
  print_ns(stdout, "ring_inline_rt_ns", s[T_RING_INLINE]);
  print_ns(stdout, "ring_inline_overhead_ns", s_ogi);
  print_stat(stdout, "region_vs_ring_region", s_rgr);
  print_stat(stdout, "inline_vs_ring_inline", s_igi);
  print_stat(stdout, "ring_inline_vs_ring_region", s_gigr);
  printf("}\n");
  fflush(stdout);
  return 0;
}

/* ------------------------------------------------------- throughput */

static void print_rate(FILE *f, const char *name, stat3 s) {
  fprintf(f, ",\"%s\":{\"median\":%.1f,\"min\":%.1f,\"max\":%.1f}", name, s.med,
          s.min, s.max);
}

/*
 * Rows/s of 1, 2, 4 and 8 clients on each transport. The daemon's counters,
 * read through c around each sample, give the rows of a launch and the
 * share of the sample its kernels ran: what a batch gained, and whether
 * the kernel or the round trips around it held the rate.
 */
/*
 * What batching can give 8 clients at M = 1: the in-process kernel's time
 * for 8 rows, and over its time for 1, the faster of the two paths at
 * each (the crossover's choice), on the same warm layout the daemon
 * reads. Launches of 8 rows back to back give 8 rows per 8-row kernel;
 * against one client's round trip that is the most 8 clients can gain
 * while the transport's work hides behind the kernels. Where the kernel
 * takes every CPU it cannot hide, and if the transport cost nothing the
 * gain would be 8 / (8-row time / 1-row time): where a batch costs
 * several single rows (a weight held in the caches, whose 8 rows are
 * bound by the SIMD units), no scheduling gets past that.
 */
static void batch_bound(const dopts *o, const wset *ws, const float *x,
                        float *yk, ovh_out *oo) {
  enum { NB = 4 }; /* M = 1 AQ, M = 1 WO, M = 8 AQ, M = 8 WO */
  timed t[NB];
  lin_ctx lc[NB];
  double v[NB][MAX_PAIRS], r[MAX_PAIRS], k8s[MAX_PAIRS];
  int P = o->pairs;
  for (int i = 0; i < NB; i++) {
    int64_t m = i < 2 ? 1 : 8;
    ql_op op = i % 2 == 0 ? QL_OP_LINEAR_AQ : QL_OP_LINEAR_WO;
    const ql_kernel_impl *im =
        ql_dispatch(ql_backend_find("cpu"), op, W_FMT, QL_DTYPE_F32, m, W_N,
                    W_K);
    if (im == NULL)
      return;
    lc[i] = (lin_ctx){im, ws, x, m, yk, 0};
    t[i] = (timed){"batch_bound", lin_run, &lc[i], 0, 0};
    calibrate(&t[i], o->seconds / 4);
  }
  for (int p = 0; p < P; p++) {
    for (int j = 0; j < NB; j++) {
      int i = order(p, j, NB);
      v[i][p] = sample(&t[i]);
    }
    double k1 = v[0][p] < v[1][p] ? v[0][p] : v[1][p];
    double k8 = v[2][p] < v[3][p] ? v[2][p] : v[3][p];
    r[p] = k8 / k1;
    k8s[p] = k8;
  }
  oo->k8_over_k1 = stats(r, P);
  oo->k8 = stats(k8s, P);
}

static int throughput(const dopts *o, ql_client *c, const ovh_out *oo) {
  double rate[N_TR][N_TPUT][MAX_PAIRS], ratio[N_TR][N_TPUT][MAX_PAIRS];
  double vs_msg[N_TPUT][MAX_PAIRS];
  double per_launch[N_TR][N_TPUT][MAX_PAIRS], busy[N_TR][N_TPUT][MAX_PAIRS];
  stat3 launch_s[N_TPUT][N_TR], busy_s[N_TPUT][N_TR]; /* their medians */
  int P = o->pairs;

  /* A pair: every client count on each transport, 2 x N_TPUT samples. */
  for (int p = 0; p < P; p++)
    for (int j = 0; j < N_TR * N_TPUT; j++) {
      int k = order(p, j, N_TR * N_TPUT), tr = k / N_TPUT, ci = k % N_TPUT;
      int nc = tput_clients[ci];
      wcmd cmd[MAX_CLIENTS];
      wres res[MAX_CLIENTS];
      uint64_t rows = 0;
      double t0 = now_s() + START_MARGIN_S;
      for (int i = 0; i < nc; i++)
        cmd[i] = (wcmd){
            .op = W_DECODE, .tr = tr, .m = 1, .t0 = t0, .t1 = t0 + o->seconds};
      wcount w0, w1;
      int rc;
      if ((rc = weight_counters(c, &w0)) != 0) {
        fprintf(stderr, "qlinear-bench: stats: %s\n", ql_strerror(rc));
        return -1;
      }
      if (workers_run(nc, cmd, res) != 0)
        return -1;
      if ((rc = weight_counters(c, &w1)) != 0) {
        fprintf(stderr, "qlinear-bench: stats: %s\n", ql_strerror(rc));
        return -1;
      }
      for (int i = 0; i < nc; i++)
        rows += res[i].rows;
      rate[tr][ci][p] = (double)rows / o->seconds;
      /* The counters also hold the warm-up calls around the timed span:
       * the launch size is theirs too, the busy share is over the span. */
      uint64_t nb = w1.batches - w0.batches;
      per_launch[tr][ci][p] =
          nb != 0 ? (double)(w1.rows - w0.rows) / (double)nb : 0;
      busy[tr][ci][p] = (double)(w1.kernel_ns - w0.kernel_ns) * 1e-9 /
                        o->seconds;
    }
  for (int ci = 0; ci < N_TPUT; ci++) {
    stat3 sr[N_TR], sx[N_TR], sv, *sl = launch_s[ci], *sb = busy_s[ci];
    for (int tr = 0; tr < N_TR; tr++) {
      for (int p = 0; p < P; p++)
        ratio[tr][ci][p] = rate[tr][ci][p] / rate[tr][0][p];
      sr[tr] = stats_copy(rate[tr][ci], P);
      sx[tr] = stats_copy(ratio[tr][ci], P);
      sl[tr] = stats_copy(per_launch[tr][ci], P);
      sb[tr] = stats_copy(busy[tr][ci], P);
    }
    for (int p = 0; p < P; p++)
      vs_msg[ci][p] = rate[TR_RING][ci][p] / rate[TR_MSG][ci][p];
    sv = stats_copy(vs_msg[ci], P);
    if (!o->json_only) {
      if (ci == 0)
        printf("\nthroughput: client processes sending M = 1 requests "
               "(ql_linear) back to back,\n%.2f s samples; rows/s median "
               "[min-max], x 1 client median [min-max]\n"
               "%7s | %-26s %-17s | %-26s %-17s | %s\n",
               o->seconds, "clients", "message path rows/s", "x 1 client",
               "ring rows/s", "x 1 client", "ring / message");
      printf("%7d | %8.0f [%7.0f-%7.0f] %5.2f [%4.2f-%4.2f] | "
             "%8.0f [%7.0f-%7.0f] %5.2f [%4.2f-%4.2f] | %.2f [%.2f-%.2f]\n",
             tput_clients[ci], sr[TR_MSG].med, sr[TR_MSG].min, sr[TR_MSG].max,
             sx[TR_MSG].med, sx[TR_MSG].min, sx[TR_MSG].max, sr[TR_RING].med,
             sr[TR_RING].min, sr[TR_RING].max, sx[TR_RING].med, sx[TR_RING].min,
             sx[TR_RING].max, sv.med, sv.min, sv.max);
    }
    /* rows_per_s and vs_1_client: the message path, as before the ring. */
    printf("{\"bench\":\"daemon\",\"case\":\"throughput\",\"n\":%d,\"k\":%d,"
           "\"format\":\"%s\",\"group_size\":%d,\"m\":1,\"clients\":%d,"
           "\"threads\":%d,\"pairs\":%d,\"seconds\":%.4f",
           W_N, W_K, fmt_name(), W_GROUP, tput_clients[ci], o->threads, P,
           o->seconds);
    print_rate(stdout, "rows_per_s", sr[TR_MSG]);
    print_stat(stdout, "vs_1_client", sx[TR_MSG]);
    print_rate(stdout, "ring_rows_per_s", sr[TR_RING]);
    print_stat(stdout, "ring_vs_1_client", sx[TR_RING]);
    print_stat(stdout, "ring_vs_message", sv);
    print_stat(stdout, "rows_per_launch", sl[TR_MSG]);
    print_stat(stdout, "kernel_busy", sb[TR_MSG]);
    print_stat(stdout, "ring_rows_per_launch", sl[TR_RING]);
    print_stat(stdout, "ring_kernel_busy", sb[TR_RING]);
    printf("}\n");
  }
  /* 8 rows per 8-row kernel over one client's rows/s */
  double bound[N_TR] = {0};
  for (int tr = 0; oo->k8_over_k1.valid && tr < N_TR; tr++) {
    stat3 r1 = stats_copy(rate[tr][0], P);
    bound[tr] = r1.med > 0 ? 8 / oo->k8.med / r1.med : 0;
  }
  if (!o->json_only) {
    printf("rows a launch (message, ring), share of the time in kernels "
           "(message, ring), medians:\n");
    for (int ci = 0; ci < N_TPUT; ci++)
      printf("%7d | %5.2f %5.2f | %4.2f %4.2f\n", tput_clients[ci],
             launch_s[ci][TR_MSG].med, launch_s[ci][TR_RING].med,
             busy_s[ci][TR_MSG].med, busy_s[ci][TR_RING].med);
    if (oo->k8_over_k1.valid)
      printf("in process, the kernel at 8 rows: %.1f us, %.2f [%.2f-%.2f] "
             "times its time at 1 row;\nlaunches of 8 rows back to back: "
             "%.2fx one client on the message path, %.2fx on the\nring; "
             "were the transport free: 8 / %.2f = %.2fx\n",
             oo->k8.med * 1e6, oo->k8_over_k1.med, oo->k8_over_k1.min,
             oo->k8_over_k1.max, bound[TR_MSG], bound[TR_RING],
             oo->k8_over_k1.med, 8 / oo->k8_over_k1.med);
  }
  if (oo->k8_over_k1.valid) {
    printf("{\"bench\":\"daemon\",\"case\":\"batch_bound\",\"n\":%d,"
           "\"k\":%d,\"format\":\"%s\",\"group_size\":%d,\"threads\":%d,"
           "\"pairs\":%d",
           W_N, W_K, fmt_name(), W_GROUP, o->threads, o->pairs);
    print_ns(stdout, "kernel_m8_ns", oo->k8);
    print_stat(stdout, "kernel_m8_over_m1", oo->k8_over_k1);
    printf(",\"back_to_back_vs_1_client\":%.4f,\"ring_back_to_back_vs_1_"
           "client\":%.4f,\"free_transport_vs_1_client\":%.4f}\n",
           bound[TR_MSG], bound[TR_RING], 8 / oo->k8_over_k1.med);
  }
  fflush(stdout);
  return 0;
}

/* ---------------------------------------------------- decode latency */

static int decode_latency(const dopts *o, const ovh_out *oo) {
  /* [transport][0: alone, 1: with the prefill stream] */
  double p50[N_TR][2][MAX_PAIRS], p99[N_TR][2][MAX_PAIRS];
  double calls[N_TR][2][MAX_PAIRS];
  /* [transport][0: with decode, 1: alone] */
  double pf_rate[N_TR][2][MAX_PAIRS];
  double ratio[N_TR][MAX_PAIRS], pf_ratio[N_TR][MAX_PAIRS];
  double p50_vs[2][MAX_PAIRS], p99_vs[2][MAX_PAIRS];
  stat3 s50[N_TR][2], s99[N_TR][2], sc[N_TR][2], sr[N_TR], spf[N_TR][2];
  stat3 spr[N_TR], s50v[2], s99v[2];
  int P = o->pairs;

  /* Pair p: on each transport, the decode client alone (k = 0), with the
   * prefill stream (k = 1), and the prefill stream alone (k = 2), six
   * samples in an order that rotates. */
  for (int p = 0; p < P; p++)
    for (int j = 0; j < 3 * N_TR; j++) {
      int q = order(p, j, 3 * N_TR), tr = q / 3, k = q % 3;
      wcmd cmd[2];
      wres res[2];
      double t0 = now_s() + START_MARGIN_S;
      cmd[0] = (wcmd){.op = k < 2 ? W_DECODE : 0,
                      .tr = tr,
                      .m = 1,
                      .t0 = t0,
                      .t1 = t0 + o->seconds};
      cmd[1] = (wcmd){.op = k ? W_PREFILL : 0,
                      .tr = tr,
                      .m = PREFILL_M,
                      .t0 = t0,
                      .t1 = t0 + o->seconds};
      if (workers_run(2, cmd, res) != 0)
        return -1;
      if (k < 2) {
        p50[tr][k][p] = res[0].p50;
        p99[tr][k][p] = res[0].p99;
        calls[tr][k][p] = (double)res[0].calls;
      }
      if (k)
        pf_rate[tr][k - 1][p] = (double)res[1].rows / o->seconds;
    }
  for (int tr = 0; tr < N_TR; tr++) {
    for (int p = 0; p < P; p++) {
      ratio[tr][p] = p99[tr][1][p] / p99[tr][0][p];
      pf_ratio[tr][p] = pf_rate[tr][0][p] / pf_rate[tr][1][p];
    }
    for (int k = 0; k < 2; k++) {
      s50[tr][k] = stats_copy(p50[tr][k], P);
      s99[tr][k] = stats_copy(p99[tr][k], P);
      sc[tr][k] = stats_copy(calls[tr][k], P);
      spf[tr][k] = stats_copy(pf_rate[tr][k], P);
    }
    sr[tr] = stats_copy(ratio[tr], P);
    spr[tr] = stats_copy(pf_ratio[tr], P);
  }
  /* The message path's latency over the ring's, within each pair. */
  for (int k = 0; k < 2; k++) {
    for (int p = 0; p < P; p++) {
      p50_vs[k][p] = p50[TR_MSG][k][p] / p50[TR_RING][k][p];
      p99_vs[k][p] = p99[TR_MSG][k][p] / p99[TR_RING][k][p];
    }
    s50v[k] = stats_copy(p50_vs[k], P);
    s99v[k] = stats_copy(p99_vs[k], P);
  }
  /* The in-process kernel's rows/s at the same M, for comparison. */
  double kernel_rate =
      oo->prefill_kernel_s > 0 ? PREFILL_M / oo->prefill_kernel_s : 0;
  if (!o->json_only) {
    printf("\ndecode latency: one client process's M = 1 requests, alone and "
           "while another\nstreams M = %d prefill requests (regions) on the "
           "same weight, both on the\nsame transport; %.2f s samples, us\n"
           "%-22s %8s %-26s %s\n",
           PREFILL_M, o->seconds, "", "p50", "p99 median [min-max]",
           "calls/sample");
    for (int tr = 0; tr < N_TR; tr++)
      for (int k = 0; k < 2; k++)
        printf("%-7s %-14s %8.1f %8.1f [%7.1f-%7.1f]   %.0f\n", tr_name[tr],
               k ? "with prefill" : "alone", s50[tr][k].med * 1e6,
               s99[tr][k].med * 1e6, s99[tr][k].min * 1e6, s99[tr][k].max * 1e6,
               sc[tr][k].med);
    for (int tr = 0; tr < N_TR; tr++)
      printf("%-7s p99 with prefill / alone: %.2f [%.2f-%.2f]\n", tr_name[tr],
             sr[tr].med, sr[tr].min, sr[tr].max);
    printf("message / ring: p50 alone %.2f [%.2f-%.2f], with prefill %.2f "
           "[%.2f-%.2f];\n                p99 alone %.2f [%.2f-%.2f], with "
           "prefill %.2f [%.2f-%.2f]\n",
           s50v[0].med, s50v[0].min, s50v[0].max, s50v[1].med, s50v[1].min,
           s50v[1].max, s99v[0].med, s99v[0].min, s99v[0].max, s99v[1].med,
           s99v[1].min, s99v[1].max);
    for (int tr = 0; tr < N_TR; tr++)
      printf("%-7s prefill rows/s: alone %.0f [%.0f-%.0f], with decode %.0f "
             "[%.0f-%.0f] (with/alone %.2f [%.2f-%.2f])\n",
             tr_name[tr], spf[tr][1].med, spf[tr][1].min, spf[tr][1].max,
             spf[tr][0].med, spf[tr][0].min, spf[tr][0].max, spr[tr].med,
             spr[tr].min, spr[tr].max);
    printf("in-process kernel at M = %d: %.0f rows/s\n", PREFILL_M,
           kernel_rate);
  }
  /* The fields without a prefix: the message path, as before the ring. */
  printf("{\"bench\":\"daemon\",\"case\":\"decode_p99\",\"n\":%d,\"k\":%d,"
         "\"format\":\"%s\",\"group_size\":%d,\"m\":1,\"prefill_m\":%d,"
         "\"threads\":%d,\"pairs\":%d,\"seconds\":%.4f",
         W_N, W_K, fmt_name(), W_GROUP, PREFILL_M, o->threads, P,
         o->seconds);
  for (int tr = 0; tr < N_TR; tr++) {
    const char *pre = tr == TR_RING ? "ring_" : "";
    char key[64];
#define KEY(name) (snprintf(key, sizeof key, "%s%s", pre, name), key)
    print_ns(stdout, KEY("alone_p50_ns"), s50[tr][0]);
    print_ns(stdout, KEY("alone_p99_ns"), s99[tr][0]);
    print_ns(stdout, KEY("prefill_p50_ns"), s50[tr][1]);
    print_ns(stdout, KEY("prefill_p99_ns"), s99[tr][1]);
    print_stat(stdout, KEY("p99_vs_alone"), sr[tr]);
    printf(",\"%s\":%.0f", KEY("alone_calls"), sc[tr][0].med);
    printf(",\"%s\":%.0f", KEY("prefill_calls"), sc[tr][1].med);
    printf(",\"%s\":%.1f", KEY("prefill_rows_per_s"), spf[tr][0].med);
    printf(",\"%s\":%.1f", KEY("prefill_alone_rows_per_s"), spf[tr][1].med);
    if (tr == TR_MSG)
      printf(",\"kernel_rows_per_s\":%.1f", kernel_rate);
    print_stat(stdout, KEY("prefill_with_vs_alone"), spr[tr]);
#undef KEY
  }
  print_stat(stdout, "alone_p50_message_vs_ring", s50v[0]);
  print_stat(stdout, "alone_p99_message_vs_ring", s99v[0]);
  print_stat(stdout, "prefill_p50_message_vs_ring", s50v[1]);
  print_stat(stdout, "prefill_p99_message_vs_ring", s99v[1]);
  printf("}\n");
  fflush(stdout);
  return 0;
}

/* --------------------------------------------------------------- idle */

/* The daemon's CPU time so far: utime + stime of /proc/PID/stat (every
 * thread, in clock ticks) as seconds, and (*ns, -1 where it cannot be
 * read) the sum of its threads' schedstat run times, finer grained.
 * -1 if the stat file cannot be read. */
static double daemon_cpu_s(double *ns) {
  char path[64], buf[1024];
  FILE *f;
  size_t n;
  unsigned long long ut = 0, st = 0;
  const char *p;
  DIR *d;
  struct dirent *de;

  *ns = -1;
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)R.daemon);
  if ((f = fopen(path, "r")) == NULL)
    return -1;
  n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Fields 14 and 15; the command name (field 2) may hold spaces, so
   * count from its closing parenthesis: field 3 comes next. */
  if ((p = strrchr(buf, ')')) == NULL ||
      sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
             &ut, &st) != 2)
    return -1;
  snprintf(path, sizeof path, "/proc/%ld/task", (long)R.daemon);
  if ((d = opendir(path)) != NULL) {
    double sum = 0;
    int ok = 1;
    while ((de = readdir(d)) != NULL) {
      char tpath[128];
      unsigned long long run;
      if (de->d_name[0] == '.' || strlen(de->d_name) > 20)
        continue;
      if (snprintf(tpath, sizeof tpath, "/proc/%ld/task/%.20s/schedstat",
                   (long)R.daemon, de->d_name) >= (int)sizeof tpath)
        continue;
      if ((f = fopen(tpath, "r")) == NULL) {
        ok = 0;
        continue;
      }
      if (fscanf(f, "%llu", &run) == 1)
        sum += (double)run;
      else
        ok = 0;
      fclose(f);
    }
    closedir(d);
    if (ok)
      *ns = sum;
  }
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* What the idle case found: the daemon's CPU use in percent of one core
 * over each window (-1: not measured), from /proc/PID/stat and from the
 * threads' schedstat. */
typedef struct idle_out {
  int done;
  int rings;          /* sessions with a ring opened for the window */
  double window_s[2]; /* 0: no ring, 1: IDLE_RINGS rings */
  double pct[2], pct_sched[2];
  uint64_t ring_bytes; /* the daemon's region bytes the rings added */
} idle_out;

/* One window: sleeps IDLE_WINDOW_S and measures the daemon meanwhile. */
static void idle_window(idle_out *io, int w) {
  double ns0, ns1, c0, c1, t0, t1;
  c0 = daemon_cpu_s(&ns0);
  t0 = now_s();
  sleep_s(IDLE_WINDOW_S);
  c1 = daemon_cpu_s(&ns1);
  t1 = now_s();
  io->window_s[w] = t1 - t0;
  io->pct[w] = c0 >= 0 && c1 >= 0 ? 100 * (c1 - c0) / (t1 - t0) : -1;
  io->pct_sched[w] =
      ns0 >= 0 && ns1 >= 0 ? 100 * (ns1 - ns0) * 1e-9 / (t1 - t0) : -1;
}

/*
 * With no ring in the daemon (c is a message-path client), a window; then
 * IDLE_RINGS more sessions, each with its ring (made at ql_connect: the
 * daemon's region bytes grow by the rings alone) and one ql_linear sent
 * through it, and another window once every ring had time to go to sleep.
 */
static int idle_cost(ql_client *c, idle_out *io) {
  ql_client *cl[IDLE_RINGS] = {0};
  ql_stats_info *st = NULL;
  uint64_t bytes0 = 0, regions0 = 0;
  float *x = xalloc(W_K * sizeof *x), *y = xalloc(W_N * sizeof *y);
  int rc, rv = -1;

  memset(io, 0, sizeof *io);
  fill_x(x, W_K);
  sleep_s(IDLE_SETTLE_S);
  idle_window(io, 0);
  if ((rc = ql_stats(c, &st)) != 0)
    goto fail;
  bytes0 = st->region_bytes;
  regions0 = st->regions;
  ql_stats_free(st);
  st = NULL;
  for (int i = 0; i < IDLE_RINGS; i++)
    if ((rc = connect_tr(TR_RING, &cl[i])) != 0)
      goto fail;
  if ((rc = ql_stats(c, &st)) != 0)
    goto fail;
  if (st->regions == regions0 && st->region_bytes > bytes0)
    io->ring_bytes = st->region_bytes - bytes0;
  ql_stats_free(st);
  st = NULL;
  if (io->ring_bytes == 0) {
    fprintf(stderr, "qlinear-bench: the daemon made no ring for the idle "
                    "case's sessions\n");
    goto out;
  }
  for (int i = 0; i < IDLE_RINGS; i++)
    if ((rc = ql_linear(cl[i], W_NAME, QL_PATH_AUTO, QL_DTYPE_F32, 1, W_K, x,
                        W_N, y, NULL)) != 0)
      goto fail;
  io->rings = IDLE_RINGS;
  sleep_s(IDLE_SETTLE_S);
  idle_window(io, 1);
  io->done = 1;
  rv = 0;
  goto out;
fail:
  fprintf(stderr, "qlinear-bench: idle: %s: %s\n", ql_strerror(rc),
          ql_errmsg());
out:
  for (int i = 0; i < IDLE_RINGS; i++)
    ql_close(cl[i]);
  free(x);
  free(y);
  return rv;
}

static void idle_report(const dopts *o, const idle_out *io) {
  if (!o->json_only) {
    printf("\nidle: the daemon's CPU use, %% of one core, over %.2f s "
           "windows (/proc/PID/stat\nutime + stime; threads' schedstat in "
           "parentheses)\n"
           "  no ring                            %6.2f (%6.3f)\n"
           "  %2d sessions with an idle ring       %6.2f (%6.3f)   "
           "(ring memory %.1f KiB each)\n",
           IDLE_WINDOW_S, io->pct[0], io->pct_sched[0], io->rings, io->pct[1],
           io->pct_sched[1],
           io->rings ? (double)io->ring_bytes / io->rings / 1024 : 0);
  }
  printf("{\"bench\":\"daemon\",\"case\":\"idle\",\"n\":%d,\"k\":%d,"
         "\"format\":\"%s\",\"group_size\":%d,\"threads\":%d,"
         "\"ring_sessions\":%d,\"ring_bytes\":%llu,\"clk_tck\":%ld,"
         "\"window_s\":%.3f,\"no_ring_window_s\":%.3f,"
         "\"cpu_pct\":%.3f,\"cpu_pct_schedstat\":%.4f,"
         "\"no_ring_cpu_pct\":%.3f,\"no_ring_cpu_pct_schedstat\":%.4f}\n",
         W_N, W_K, fmt_name(), W_GROUP, o->threads, io->rings,
         (unsigned long long)io->ring_bytes, sysconf(_SC_CLK_TCK),
         io->window_s[1], io->window_s[0], io->pct[1], io->pct_sched[1],
         io->pct[0], io->pct_sched[0]);
  fflush(stdout);
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
  ql_client *c = NULL, *cr = NULL; /* message path, ring */
  ql_hello_info hi;
  ql_load_desc ld;
  ql_region *rx = NULL, *ry = NULL, *rrx = NULL, *rry = NULL;
  ql_stats_info *st = NULL;
  uint64_t bytes0;
  wset ws;
  ovh_out oo = {0};
  idle_out io = {0};
  echo_srv es;
  int echo_req = -1, have_ws = 0, rc, rv = 1;
  uint16_t *wb = NULL;
  float *tmp = NULL, *x = NULL, *y = NULL, *yr = NULL, *yk = NULL;
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
  /* Each client says which transport it uses (no_ring). */
  unsetenv("QLINEAR_RING");
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

  if ((rc = connect_tr(TR_MSG, &c)) != 0 || (rc = ql_hello(c, &hi)) != 0) {
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
    if (o.n_daemon_args > 0) {
      printf("qlineard arguments added:");
      for (int i = 0; i < o.n_daemon_args; i++)
        printf(" %s", o.daemon_args[i]);
      printf("\n");
    }
    if (wi.crossover_rows == UINT32_MAX)
      printf("crossover: AUTO never runs activation-quantized (%s)\n",
             wi.crossover_measured ? "measured" : "not measured");
    else
      printf("crossover: AUTO runs activation-quantized from %u rows (%s)\n",
             wi.crossover_rows,
             wi.crossover_measured ? "measured" : "not measured yet");
  }

  /* 0. Idle rings, while nothing else runs in the daemon; reported
   * last. */
  if (idle_cost(c, &io) != 0)
    goto fail;

  /* 1. Per-call overhead: c on the message path, cr on its ring (which
   * ql_connect made: the daemon's region bytes grow with no region). */
  if ((rc = ql_stats(c, &st)) != 0) {
    fprintf(stderr, "qlinear-bench: stats: %s\n", ql_strerror(rc));
    goto fail;
  }
  bytes0 = st->region_bytes;
  ql_stats_free(st);
  if ((rc = connect_tr(TR_RING, &cr)) != 0 || (rc = ql_stats(c, &st)) != 0) {
    fprintf(stderr, "qlinear-bench: connect (ring): %s: %s\n", ql_strerror(rc),
            ql_errmsg());
    goto fail;
  }
  rc = st->region_bytes > bytes0;
  ql_stats_free(st);
  if (!rc) {
    fprintf(stderr, "qlinear-bench: the daemon made no ring for the ring "
                    "client's session\n");
    goto fail;
  }
  x = xalloc((size_t)PREFILL_M * W_K * sizeof *x);
  y = xalloc((size_t)PREFILL_M * W_N * sizeof *y);
  yr = xalloc((size_t)PREFILL_M * W_N * sizeof *yr);
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
                             &ry)) != 0 ||
      (rc = ql_region_create(cr, (size_t)PREFILL_M * W_K * sizeof(float),
                             &rrx)) != 0 ||
      (rc = ql_region_create(cr, (size_t)PREFILL_M * W_N * sizeof(float),
                             &rry)) != 0) {
    fprintf(stderr, "qlinear-bench: region: %s: %s\n", ql_strerror(rc),
            ql_errmsg());
    goto fail;
  }
  if (echo_start(&es, payload, &echo_req) != 0)
    goto fail;
  {
    ovh_env env = {&o, c, cr, &ws, rx,       ry,      rrx, rry,
                   x,  y, yr, yk,  echo_req, payload, &oo};
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
  ql_close(cr); /* its regions too */
  cr = NULL;
  rrx = rry = NULL;

  /* 2 and 3. The clients: connected, warmed up, then timed. This
   * process's session keeps holding the weight. */
  {
    wcmd cmd[MAX_CLIENTS];
    wres res[MAX_CLIENTS];
    for (int i = 0; i < MAX_CLIENTS; i++)
      cmd[i] = (wcmd){.op = W_PREP, .m = 1};
    if (workers_run(MAX_CLIENTS, cmd, res) != 0)
      goto fail;
    cmd[0].op = 0;
    cmd[1].m = PREFILL_M;
    if (workers_run(2, cmd, res) != 0)
      goto fail;
  }
  if (in_process(&o))
    batch_bound(&o, &ws, x, yk, &oo);
  if (throughput(&o, c, &oo) != 0 || decode_latency(&o, &oo) != 0)
    goto fail;
  idle_report(&o, &io);
  rv = 0;

fail:
  echo_stop(&es, echo_req);
  if (c != NULL) {
    ql_region_destroy(c, rx);
    ql_region_destroy(c, ry);
    ql_close(c);
  }
  ql_close(cr);
  if (have_ws)
    wset_free(&ws);
  free(wb);
  free(tmp);
  free(x);
  free(y);
  free(yr);
  free(yk);
  free(payload);
  if (run_cleanup(rv != 0) != 0)
    rv = 1;
  return rv;
}
