/*
 * server.c - the daemon's life: set up the loop, the socket directory, the
 * request socket, the device worker and the signal handlers; run; and on
 * SIGINT/SIGTERM stop reading requests, let in-flight work finish and be
 * answered, then tear everything down in reverse order.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "conf.h"
#include "serve/handlers.h"
#include "dispatch/calibrate.h"
#include "dispatch/linear.h"
#include "faults.h"
#include "log.h"
#include "notify.h"
#include "qlineard.h"
#include "heap.h"
#include "serve/metrics.h"
#include "serve/reload.h"
#include "serve/serve.h"
#include "state/devices.h"
#include "state/store.h"

/*
 * mkdir(dir, 0700), remembering in made (PATH_MAX bytes) a directory it
 * made, which a failed start removes again; 0 if it exists already.
 */
static int make_dir(const char *dir, char *made) {
  if (mkdir(dir, 0700) == 0) {
    snprintf(made, PATH_MAX, "%s", dir);
    return 0;
  }
  if (errno == EEXIST)
    return 0;
  ql__err("cannot create %s: %s", dir, strerror(errno));
  return QL_EIO;
}

/*
 * Makes dir (0700) if it is missing and checks that an existing one is a
 * directory of the daemon's effective user (the owner of what it creates
 * there) that grants none of the mode bits forbidden; want says, in the
 * log, what it must be instead. The directory is the access boundary of
 * the sockets in it.
 */
static int prepare_private_dir(const char *dir, char *made, mode_t forbidden,
                               const char *want) {
  struct stat st;
  if (make_dir(dir, made) != 0)
    return QL_EIO;
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    ql__err("%s is not a directory", dir);
    return QL_EIO;
  }
  if (st.st_uid != geteuid() || (st.st_mode & forbidden)) {
    ql__err("%s must belong to this user and %s", dir, want);
    return QL_EPERM;
  }
  return 0;
}

/* The socket directory: its group may connect, nobody else may replace
 * the sockets. */
static int prepare_socket_dir(const char *dir, char *made) {
  return prepare_private_dir(dir, made, 0022,
                             "be writable by no one else (mode 0750 or "
                             "0700)");
}

/*
 * The admin directory is the admin socket's only access check: it must be
 * ours and closed to others (group access is the point: the admin group).
 * A missing one is made 0700, for the daemon's own user only.
 */
static int prepare_admin_dir(const char *dir, char *made) {
  return prepare_private_dir(dir, made, 0007,
                             "give others no access (mode 0750 or 2750, "
                             "group: the admin group)");
}

/*
 * A socket cannot be bound over an existing socket file. A file left by a
 * daemon that died is removed; one that still accepts connections belongs
 * to a running daemon, which is an error.
 */
static int clear_stale_socket(const char *path) {
  struct sockaddr_un sa;
  if (strlen(path) >= sizeof sa.sun_path) {
    ql__err("socket path too long: %s", path);
    return QL_EINVAL;
  }
  if (access(path, F_OK) != 0)
    return 0;
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0)
    return QL_EIO;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  strcpy(sa.sun_path, path);
  int alive = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  if (alive) {
    ql__err("another qlineard is listening at %s", path);
    return QL_EEXIST;
  }
  unlink(path);
  return 0;
}

static void on_sweep(uv_timer_t *t) {
  ql__server *s = t->data;
  ql__serve_expire_uploads(s);
  ql__sessions_expire(s, s->cfg.session_lease_ms * 1000000u);
}

static void close_all(ql__server *s);

/* READY=1 only with every required device present and in service: a
 * missing GPU is an error, never a silent fall-back to the CPU (DESIGN
 * §10). A device is named by its name or its alias. */
static int check_required_devices(ql__server *s) {
  for (unsigned i = 0; i < s->cfg.required_devices.n; i++) {
    const char *want = s->cfg.required_devices.item[i];
    if (ql__device_find(s, want) == NULL) {
      char present[512];
      ql__devices_list(s, ~(uint64_t)0, present, sizeof present);
      ql__err("required device %s is not present (present: %s)", want,
              present);
      return QL_ENOTFOUND;
    }
  }
  return 0;
}

/*
 * The placement a stored weight's load named (its file's "devices", names
 * joined by ','): their mask, or 0 for the default placement, which also
 * stands in, with a warning, when one of them is missing or out of
 * service at this start: a stored weight is served somewhere rather than
 * not at all.
 */
static int stored_placement(ql__server *s, const char *name,
                            const char *devices, uint64_t *mask) {
  char list[QL_STORE_DEVICES_MAX], *names[QL__MAX_DEVICES], *save = NULL;
  char why[300];
  size_t n = 0;
  *mask = 0;
  if (devices == NULL || devices[0] == '\0')
    return 0;
  snprintf(list, sizeof list, "%s", devices);
  for (char *t = strtok_r(list, ",", &save); t != NULL;
       t = strtok_r(NULL, ",", &save)) {
    if (n == QL__MAX_DEVICES) {
      ql__warn("stored weight %s: more than %d devices; the default "
               "placement applies", name, QL__MAX_DEVICES);
      return 0;
    }
    names[n++] = t;
  }
  if (ql__devices_resolve(s, names, n, mask, why, sizeof why) != 0) {
    ql__warn("stored weight %s was placed on %s, but %s: the default "
             "placement applies", name, devices, why);
    *mask = 0;
  }
  return 0;
}

/*
 * ql__store_load_all()'s callback: a stored weight becomes resident, kept
 * by the admin socket. When this returns non-zero the store frees q and
 * keeps the file (a weight over the budget today may fit after a change of
 * configuration: it is never deleted for that).
 */
/* Each stored weight loaded extends systemd's start timeout by this much
 * (TimeoutStartSec bounds a start that stops making progress, not a large
 * store: killed while loading, the daemon would be restarted to load it
 * again, for good). */
#define STORE_STEP_USEC (60u * 1000000u)

static int load_stored(void *arg, const char *name, ql_qweight *q,
                       ql_path policy, const uint8_t digest[QL_DIGEST_BYTES],
                       const char *devices) {
  ql__server *s = arg;
  ql__notify_extend_timeout(STORE_STEP_USEC); /* for the next file */
  ql__weight *w, *existing = NULL;
  ql__placement pl;
  uint64_t mask = 0;
  int rc = stored_placement(s, name, devices, &mask);
  if (rc == 0)
    rc = mask != 0 ? ql__devices_placement_mask(s, mask, &pl, NULL, 0)
                   : ql__devices_placement(s, &pl);
  if (rc == 0)
    rc = ql__weight_create_known(name, q, policy, &pl, digest, s->store, &w);
  if (rc != 0) {
    ql__err("stored weight %s: %s; its file is kept", name, ql_strerror(rc));
    return rc;
  }
  rc = ql__weight_store_insert(s->weights, w, &existing);
  if (rc != 0 || existing != NULL) {
    if (rc == QL_ENOMEM)
      ql__err("stored weight %s (%zu bytes) exceeds a device's budget; "
              "its file is kept", name, w->bytes);
    else
      ql__err("stored weight %s: %s; its file is kept", name,
              ql_strerror(rc ? rc : QL_EEXIST));
    w->q = NULL; /* q is the store's again: it frees it */
    ql__weight_unref(w);
    return rc ? rc : QL_EEXIST;
  }
  w->pinned = w->persistent = 1;
  w->placed = mask != 0;
  s->persistent_count++;
  ql__calibrate_weight(s, w);
  ql__weight_unref(w); /* the resident store keeps its reference */
  return 0;
}

/* Opens the state directory and makes every stored weight resident, before
 * any socket is open: clients never see a half-loaded daemon. */
static int open_store(ql__server *s) {
  char err[512];
  uint64_t t0 = ql__now_ns();
  int rc = ql__store_open(s->cfg.state_dir, &s->store, err, sizeof err);
  if (rc != 0) {
    ql__err("state directory %s: %s", s->cfg.state_dir, err);
    return rc;
  }
  ql__notify_status("loading stored weights from %s", s->cfg.state_dir);
  ql__notify_extend_timeout(STORE_STEP_USEC); /* for the first file */
  rc = ql__store_load_all(s->store, load_stored, s);
  if (rc < 0) {
    ql__err("cannot read the state directory %s: %s", s->cfg.state_dir,
            ql_strerror(rc));
    return rc;
  }
  ql__notice("loaded %d stored weight%s (%zu bytes) from %s in %.0f ms", rc,
             rc == 1 ? "" : "s", ql__weight_store_bytes(s->weights),
             s->cfg.state_dir, (double)(ql__now_ns() - t0) / 1e6);
  return 0;
}

static void transport_limits(const ql__config *cfg, ql__transport_limits *l) {
  l->max_msg = cfg->max_message_bytes;
  l->max_conns = cfg->max_connections;
  l->max_conns_per_uid = cfg->max_connections_per_uid;
  l->frame_timeout_ms = cfg->frame_timeout_ms;
  l->max_buffered = cfg->max_buffered_bytes;
  l->uid_share = cfg->uid_share;
}

/* Binds admin.sock in admin_dir, group- but not world-accessible. */
static int open_admin(ql__server *s) {
  char dir[PATH_MAX], path[PATH_MAX];
  int rc;
  /* By default a directory of the daemon's own user, inside the socket
   * directory: the service configures one for the admin group. */
  if ((s->cfg.admin_dir[0] != '\0'
           ? snprintf(dir, sizeof dir, "%s", s->cfg.admin_dir)
           : snprintf(dir, sizeof dir, "%s/admin", s->cfg.socket_dir)) >=
          (int)sizeof dir ||
      snprintf(path, sizeof path, "%s/admin.sock", dir) >= (int)sizeof path) {
    ql__err("admin directory path too long");
    return QL_EINVAL;
  }
  snprintf(s->admin_address, sizeof s->admin_address, "ipc://%s", path);
  if ((rc = prepare_admin_dir(dir, s->made_admin_dir)) != 0 ||
      (rc = clear_stale_socket(path)) != 0)
    return rc;
  /* (ql__transport_open() logs why it failed) */
  ql__transport_limits lim;
  transport_limits(&s->cfg, &lim);
  mode_t um = umask(0117); /* born 0660: see ql__server_run */
  rc = ql__transport_open(s->loop, s->admin_address, &lim,
                          ql__handle_admin_message, s, &s->admin);
  umask(um);
  if (rc != 0)
    return rc;
  if (chmod(path, 0660) != 0)
    ql__warn("chmod %s: %s", path, strerror(errno));
  ql__notice("admin socket at %s", s->admin_address);
  return 0;
}

/*
 * The bounded drain: while work is in flight, wait; past the deadline,
 * jobs not yet started are answered QL_ESHUTDOWN instead of run (a kernel
 * already running, or a commit, still completes). Once nothing is in
 * flight, give the peers a moment to read the last replies (closing does
 * not linger) and stop.
 */
static void on_drain(uv_timer_t *t) {
  ql__server *s = t->data;
  if (ql__handlers_in_flight(s) > 0) {
    s->quiet_ticks = 0;
    if (!atomic_load(&s->cancel) &&
        ql__now_ns() - s->stop_ns > s->cfg.drain_ms * 1000000u) {
      ql__warn("drain deadline passed: refusing %zu queued request%s",
               ql__handlers_in_flight(s),
               ql__handlers_in_flight(s) == 1 ? "" : "s");
      atomic_store(&s->cancel, 1);
      ql__linear_cancel_waiting(s);
    }
    return;
  }
  if (++s->quiet_ticks < 10) /* 10 ticks of 20 ms */
    return;
  close_all(s);
}

/*
 * WATCHDOG=1 only while the workers make progress: a tick where a worker
 * has jobs pending and completed none since the previous tick is a miss;
 * two misses in a row (a kernel stuck for a whole watchdog period) stop
 * the pings and systemd restarts the daemon. Completions arrive through
 * the loop, so a stuck loop stops the pings too.
 */
static void on_watchdog(uv_timer_t *t) {
  ql__server *s = t->data;
  int stuck = 0;
  for (unsigned i = 0; i < s->n_dev; i++) {
    ql__device *d = &s->dev[i];
    uint64_t done = ql__worker_completed(d->worker);
    if (ql__worker_pending(d->worker) > 0 && done == d->wd_completed)
      d->wd_misses++;
    else
      d->wd_misses = 0;
    d->wd_completed = done;
    stuck |= d->wd_misses >= 2;
  }
  if (!stuck)
    ql__notify_watchdog();
}

static void on_signal(uv_signal_t *sig, int signum) {
  ql__server *s = sig->data;
  if (s->stopping) {
    ql__notice("second signal: exiting now");
    exit(1);
  }
  s->stopping = 1;
  s->stop_ns = ql__now_ns();
  ql__notify_stopping();
  ql__notify_status("stopping: draining %zu requests",
                    ql__handlers_in_flight(s));
  ql__notice("%s: stopping; %zu request%s in flight", strsignal(signum),
             ql__handlers_in_flight(s),
             ql__handlers_in_flight(s) == 1 ? "" : "s");
  /* The socket stays open while draining: new requests are answered
   * QL_ESHUTDOWN at once rather than left to time out. */
  uv_timer_start(&s->drain, on_drain, 20, 20);
}

/* A session ended (session.h's end hook): its requests still waiting in
 * the dispatcher go. */
static void linear_session_ended(void *arg, uint64_t session_id) {
  ql__linear_session_ended(arg, session_id);
}

static void on_hup(uv_signal_t *sig, int signum) {
  char rep[1024];
  (void)signum;
  (void)ql__server_reload(sig->data, rep, sizeof rep);
}

/* ------------------------------------------------------------ modules */

/*
 * The daemon's parts, in two tables opened in order and closed in
 * reverse from the last one opened: the state (what requests work on),
 * opened before any socket so that clients never see a half-loaded
 * daemon, and the listeners, which are libuv handles closed through the
 * loop (close_all). An open returns 0 or a QL_E* code having logged why;
 * a close is safe on what a failed open left. The device workers are
 * joined before anything closes (ql__devices_close): completing a job
 * replies through the transport and touches the dispatcher's state.
 */
typedef struct module {
  const char *name;
  int (*open)(ql__server *s);
  void (*close)(ql__server *s);
} module;

/* The CPU backend's settings from the config (its threads, SIMD level,
 * kernel timeout), for its configure and for ql__devices_open. */
static ql_backend_config backend_config(const ql__config *cfg) {
  static const char *const levels[] = {"auto", "c", "avx2", "avx2vnni",
                                       "avx512"};
  ql_backend_config bc = {cfg->cpu_threads, levels[cfg->cpu_level],
                          (unsigned)cfg->kernel_timeout_ms};
  return bc;
}

static void tenants_close(ql__server *s) { ql__tenants_clear(&s->tenants); }

static int weights_open(ql__server *s) {
  int rc = ql__weight_store_create(s->cfg.cpu_budget_bytes, &s->weights);
  if (rc != 0)
    ql__err("cannot start: %s", ql_strerror(rc));
  return rc;
}

static void weights_close(ql__server *s) {
  ql__weight_store_free(s->weights);
  s->weights = NULL;
}

static int uploads_open(ql__server *s) {
  int rc = ql__uploads_create(s->cfg.max_upload_bytes, &s->uploads);
  if (rc != 0) {
    ql__err("cannot start: %s", ql_strerror(rc));
    return rc;
  }
  ql__uploads_set_share(s->uploads, s->cfg.uid_share);
  return 0;
}

static void uploads_close(ql__server *s) {
  ql__uploads_free(s->uploads);
  s->uploads = NULL;
}

static int devices_open(ql__server *s) {
  ql_backend_config bc = backend_config(&s->cfg);
  int rc = ql__devices_open(s, &bc);
  return rc != 0 ? rc : check_required_devices(s);
}

/* (Its workers were joined before any module closed.) */
static void devices_close(ql__server *s) { ql__devices_free(s); }

/* Before the store loads: weights tell the scheduler when they go. */
static int dispatch_open(ql__server *s) {
  int rc = ql__linear_open(s);
  if (rc != 0)
    ql__err("cannot start the scheduler: %s", ql_strerror(rc));
  return rc;
}

static int calibrate_open(ql__server *s) {
  int rc = ql__calibrate_open(s);
  if (rc != 0)
    ql__err("cannot start the scheduler: %s", ql_strerror(rc));
  return rc;
}

static int store_open(ql__server *s) {
  return s->cfg.state_dir[0] != '\0' ? open_store(s) : 0;
}

static void store_close(ql__server *s) {
  ql__store_close(s->store);
  s->store = NULL;
}

static const module state_modules[] = {
    {"tenants", NULL, tenants_close},
    {"weights", weights_open, weights_close},
    {"uploads", uploads_open, uploads_close},
    {"devices", devices_open, devices_close},
    {"dispatch", dispatch_open, ql__linear_close},
    {"calibration", calibrate_open, ql__calibrate_close},
    {"store", store_open, store_close},
};

/* The loop's signal and timer handles; these cannot fail on a valid loop
 * (libuv only checks arguments). SIGHUP, blocked until now, goes to the
 * loop from here on. */
static int signals_open(ql__server *s) {
  uv_signal_init(s->loop, &s->sig_int);
  uv_signal_init(s->loop, &s->sig_term);
  uv_signal_init(s->loop, &s->sig_hup);
  uv_timer_init(s->loop, &s->sweep);
  uv_timer_init(s->loop, &s->drain);
  uv_timer_init(s->loop, &s->watchdog);
  s->sig_int.data = s->sig_term.data = s->sig_hup.data = s;
  s->sweep.data = s->drain.data = s->watchdog.data = s;
  if (uv_signal_start(&s->sig_int, on_signal, SIGINT) != 0 ||
      uv_signal_start(&s->sig_term, on_signal, SIGTERM) != 0 ||
      uv_signal_start(&s->sig_hup, on_hup, SIGHUP) != 0 ||
      uv_timer_start(&s->sweep, on_sweep, 250, 250) != 0) {
    ql__err("cannot install signal handlers");
    return QL_EINTERNAL;
  }
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_UNBLOCK, &hup, NULL);
  /* The sweep timer must not keep the loop alive on its own. */
  uv_unref((uv_handle_t *)&s->sweep);
  return 0;
}

static void signals_close(ql__server *s) {
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  uv_close((uv_handle_t *)&s->sweep, NULL);
  uv_close((uv_handle_t *)&s->drain, NULL);
  uv_close((uv_handle_t *)&s->watchdog, NULL);
}

/*
 * The request socket. It is created 0660 (the directory's group is the
 * access boundary), not made so after: a client that connects as soon as
 * one appears must not find it closed to its group. (chmod after, too, in
 * case the transport creates it otherwise.)
 */
static int transport_open(ql__server *s) {
  ql__transport_limits lim;
  transport_limits(&s->cfg, &lim);
  mode_t um = umask(0117);
  int rc = ql__transport_open(s->loop, s->address, &lim, ql__handle_message,
                              s, &s->transport);
  umask(um);
  if (rc != 0)
    return rc; /* (ql__transport_open() logs why) */
  if (chmod(s->address + 6, 0660) != 0) /* after "ipc://" */
    ql__warn("chmod %s: %s", s->address + 6, strerror(errno));
  return 0;
}

static void transport_close(ql__server *s) {
  ql__transport_close(s->transport);
  s->transport = NULL;
}

static int sessions_open(ql__server *s) {
  int rc = ql__serve_sessions_open(s, &ql__handlers_ring_ops, s);
  return rc != 0 ? rc : ql__sessions_add_end_hook(s, linear_session_ended, s);
}

/* Ends every session, and what it held. */
static void sessions_close(ql__server *s) { ql__serve_sessions_close(s); }

static int metrics_open(ql__server *s) {
  return ql__metrics_open(s, &s->metrics);
}

static void metrics_close(ql__server *s) {
  ql__metrics_close(s->metrics);
  s->metrics = NULL;
}

static void admin_close(ql__server *s) {
  ql__transport_close(s->admin);
  s->admin = NULL;
}

/* The metrics listener (opt-in) before the admin socket, which comes
 * last: whoever waits for admin.sock to appear finds it listening. */
static const module listeners[] = {
    {"signals", signals_open, signals_close},
    {"transport", transport_open, transport_close},
    {"sessions", sessions_open, sessions_close},
    {"metrics", metrics_open, metrics_close},
    {"admin", open_admin, admin_close},
};

#define N_MODULES(t) (sizeof(t) / sizeof(t)[0])

/* Opens t[*opened..n) in order, counting each one opened in *opened;
 * stops at the first that fails and returns its code. */
static int modules_open(ql__server *s, const module *t, size_t n,
                        size_t *opened) {
  for (; *opened < n; (*opened)++) {
    int rc = t[*opened].open != NULL ? t[*opened].open(s) : 0;
    if (rc != 0) {
      ql__debug("start: %s failed: %s", t[*opened].name, ql_strerror(rc));
      return rc;
    }
  }
  return 0;
}

/* Closes the *opened first modules of t, in reverse, and sets it to 0. */
static void modules_close(ql__server *s, const module *t, size_t *opened) {
  while (*opened > 0) {
    const module *m = &t[--*opened];
    if (m->close != NULL)
      m->close(s);
  }
}

/* The stop: workers first (completing a job replies through the
 * transport), then the listeners in reverse, then the dispatcher's own
 * loop handles. Their close callbacks run on the loop's next turn. */
static void close_all(ql__server *s) {
  ql__devices_close(s);
  modules_close(s, listeners, &s->listeners_open);
  ql__linear_close_timers(s);
}

int ql__server_run(const ql__config *cfg, int argc, char **argv) {
  int rc, status = 1;
  size_t state_open = 0; /* state_modules opened */
  ql__server *s = calloc(1, sizeof *s);
  uv_loop_t loop;
  if (s == NULL || uv_loop_init(&loop) != 0) {
    free(s);
    return 1;
  }
  s->cfg = *cfg;
  s->replies.cap = &s->cfg.max_message_bytes;
  s->replies.counters = &s->counters;
  s->argc = argc;
  s->argv = argv;
  s->loop = &loop;
  s->start_ns = ql__now_ns();
  ql__faults_init(); /* test hooks: before anything they delay */
  ql__log_set_level(cfg->log_level);
  ql__heap_setup();
  signal(SIGPIPE, SIG_IGN);
  /* SIGHUP's default action ends the process: until its handler is in
   * place (after the store has loaded), a reload sent during the start
   * (systemd's ExecReload) waits, blocked, and runs once the loop is up.
   * The threads started meanwhile keep it blocked: it goes to this one. */
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &hup, NULL);
  /* libcrypto's one-time set-up (it reads its config file) here, in this
   * thread, rather than in the first worker that hashes a weight: that
   * thread would keep the set-up's per-thread error state, which
   * LeakSanitizer reports at exit when the thread outlives libcrypto's
   * exit handler (as it does once a Level Zero driver is loaded). */
  if (OPENSSL_init_crypto(OPENSSL_INIT_LOAD_CONFIG, NULL) != 1) {
    ql__err("libcrypto did not initialise");
    goto fail;
  }
  if (getrandom(s->instance_id, sizeof s->instance_id, 0) !=
      (ssize_t)sizeof s->instance_id) {
    ql__err("getrandom failed: %s", strerror(errno));
    goto fail;
  }
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/qlineard.sock", cfg->socket_dir) >=
      (int)sizeof path) {
    ql__err("socket directory path too long");
    goto fail;
  }
  snprintf(s->address, sizeof s->address, "ipc://%s", path);
  if (prepare_socket_dir(cfg->socket_dir, s->made_socket_dir) != 0 ||
      clear_stale_socket(path) != 0)
    goto fail;

  /* The CPU backend is always built: it is the default device. */
  s->cpu_backend = ql_backend_find("cpu");
  if (s->cpu_backend == NULL || ql_backend_check(s->cpu_backend) != 0) {
    ql__err("the cpu backend is missing or malformed");
    goto fail;
  }
  /* Before any kernel runs (the store's repacks are the first). */
  ql_backend_config bc = backend_config(cfg);
  if (s->cpu_backend->configure != NULL &&
      (rc = s->cpu_backend->configure(&bc)) != 0) {
    ql__err("cpu_threads = %u, cpu_level = %s: %s", cfg->cpu_threads,
            bc.level, ql_strerror(rc));
    goto fail;
  }
  if (modules_open(s, state_modules, N_MODULES(state_modules),
                   &state_open) != 0)
    goto fail;
  ql__fault_sleep(QL_FAULT_START);
  if (modules_open(s, listeners, N_MODULES(listeners),
                   &s->listeners_open) != 0) {
    close_all(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto fail;
  }
  char devs[512];
  ql__devices_list(s, ~(uint64_t)0, devs, sizeof devs);
  ql__notice("listening at %s (devices: %s; message cap %zu bytes)",
             s->address, devs, cfg->max_message_bytes);
  char ready[PATH_MAX + 64];
  snprintf(ready, sizeof ready, "serving %s; %zu weights (%zu stored)",
           s->address, ql__weight_store_count(s->weights),
           s->persistent_count);
  ql__notify_ready(ready);
  ql__calibrate_start(s);
  /* systemd arms its watchdog at READY; ping at half its period. */
  uint64_t wd = ql__notify_watchdog_usec();
  if (wd > 0) {
    /* Two ticks without a completion stop the pings: a hang must end in
     * its device's timeout (QL_EDEVICE, the others serving on) first. */
    if (cfg->kernel_timeout_ms * 1000u >= wd / 2)
      ql__warn("kernel_timeout_ms (%llu ms) is not below half the watchdog "
               "interval (%llu ms): a kernel hung that long gets the whole "
               "daemon restarted by the watchdog, rather than its device "
               "taken out of service",
               (unsigned long long)cfg->kernel_timeout_ms,
               (unsigned long long)(wd / 1000));
    uv_timer_start(&s->watchdog, on_watchdog, wd / 2000, wd / 2000);
    uv_unref((uv_handle_t *)&s->watchdog);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  unlink(path);
  if (s->admin_address[0] != '\0')
    unlink(s->admin_address + 6); /* after "ipc://" */
  ql__notice("stopped");
  status = 0;
fail:
  /* A failed start leaves the runtime directory as it found it: the
   * sockets are gone with their transports (each removes the socket it
   * bound), and the directories it made, empty, go too. */
  if (status != 0) {
    if (s->made_admin_dir[0] != '\0' && rmdir(s->made_admin_dir) != 0)
      ql__warn("cannot remove %s: %s", s->made_admin_dir, strerror(errno));
    if (s->made_socket_dir[0] != '\0' && rmdir(s->made_socket_dir) != 0)
      ql__warn("cannot remove %s: %s", s->made_socket_dir, strerror(errno));
  }
  ql__devices_close(s); /* no-op for workers already closed */
  modules_close(s, state_modules, &state_open);
  uv_run(&loop, UV_RUN_NOWAIT); /* runs close callbacks still pending */
  if (uv_loop_close(&loop) != 0)
    ql__warn("loop closed with handles still open");
  free(s);
  return status;
}
