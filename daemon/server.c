/*
 * server.c - the daemon's life: set up the loop, the socket directory, the
 * request socket, the device worker and the signal handlers; run; and on
 * SIGINT/SIGTERM stop reading requests, let in-flight work finish and be
 * answered, then tear everything down in reverse order.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "conf.h"
#include "handlers.h"
#include "log.h"
#include "notify.h"
#include "qlineard.h"

/*
 * Makes the socket directory (0700) if it is missing and checks that an
 * existing one is ours and not writable by others: the directory is the
 * access boundary of the socket.
 */
static int prepare_socket_dir(const char *dir) {
  struct stat st;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    ql__err("cannot create %s: %s", dir, strerror(errno));
    return QL_EIO;
  }
  if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    ql__err("%s is not a directory", dir);
    return QL_EIO;
  }
  if (st.st_uid != getuid() || (st.st_mode & 0002)) {
    ql__err("%s must belong to this user and not be world-writable", dir);
    return QL_EPERM;
  }
  return 0;
}

/*
 * nanomsg fails to bind over an existing socket file. A file left by a
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
  ql__handlers_expire_uploads(t->data);
}

static void close_all(ql__server *s);

/*
 * The bounded drain: while work is in flight, wait; past the deadline,
 * jobs not yet started are answered QL_ESHUTDOWN instead of run (a kernel
 * already running, or a commit, still completes). Once nothing is in
 * flight, give nanomsg a moment to write the last replies (nn_close does
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
  uint64_t done = ql__worker_completed(s->cpu);
  if (ql__worker_pending(s->cpu) > 0 && done == s->wd_last_completed)
    s->wd_misses++;
  else
    s->wd_misses = 0;
  s->wd_last_completed = done;
  if (s->wd_misses < 2)
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

/*
 * SIGHUP: read the configuration again from the same sources (the file
 * and the command line, which still override it), apply the options that
 * may change live, and say what needs a restart. A bad file changes
 * nothing.
 */
static void on_hup(uv_signal_t *sig, int signum) {
  ql__server *s = sig->data;
  (void)signum;
  ql__config *parsed = malloc(sizeof *parsed);
  char err[1024], rep[1024];
  ql__cmdline cl;
  if (parsed == NULL)
    return;
  if (ql__config_from_args(s->argc, s->argv, parsed, &cl, err, sizeof err) !=
      0) {
    ql__err("SIGHUP: %s; keeping the running configuration", err);
    free(parsed);
    return;
  }
  ql__config_reload(&s->cfg, parsed, &s->cfg, rep, sizeof rep);
  free(parsed);
  ql__log_set_level(s->cfg.log_level);
  ql__worker_set_max_queue(s->cpu, s->cfg.max_queue);
  ql__uploads_set_max(s->uploads, s->cfg.max_upload_bytes);
  ql__notice("SIGHUP: %s", rep);
  ql__notify_status("reloaded: %s", rep);
}

static void close_all(ql__server *s) {
  /* Workers first: completing a job replies through the transport. */
  if (s->cpu)
    ql__worker_close(s->cpu);
  ql__transport_close(s->transport);
  s->transport = NULL;
  ql__sessions_close(s); /* ends every session: releases what they hold */
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  uv_close((uv_handle_t *)&s->sweep, NULL);
  uv_close((uv_handle_t *)&s->drain, NULL);
  uv_close((uv_handle_t *)&s->watchdog, NULL);
}

int ql__server_run(const ql__config *cfg, int argc, char **argv) {
  int rc, status = 1;
  ql__server *s = calloc(1, sizeof *s);
  uv_loop_t loop;
  if (s == NULL || uv_loop_init(&loop) != 0) {
    free(s);
    return 1;
  }
  s->cfg = *cfg;
  s->argc = argc;
  s->argv = argv;
  s->loop = &loop;
  s->start_ns = ql__now_ns();
  /* A test hook, from the environment so no configuration can set it. */
  const char *delay = getenv("QL_TEST_KERNEL_DELAY_MS");
  if (delay != NULL) {
    s->test_delay_ms = strtoull(delay, NULL, 10);
    if (s->test_delay_ms > 60000)
      s->test_delay_ms = 60000;
    ql__warn("QL_TEST_KERNEL_DELAY_MS: every linear job sleeps %llu ms",
             (unsigned long long)s->test_delay_ms);
  }
  ql__log_set_level(cfg->log_level);
  signal(SIGPIPE, SIG_IGN);
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
  if (prepare_socket_dir(cfg->socket_dir) != 0 ||
      clear_stale_socket(path) != 0)
    goto fail;

  /* The CPU backend is always built: it is the default device. */
  s->cpu_backend = ql_backend_find("cpu");
  if (s->cpu_backend == NULL || ql_backend_check(s->cpu_backend) != 0) {
    ql__err("the cpu backend is missing or malformed");
    goto fail;
  }
  if ((rc = ql__weight_store_create(&s->weights)) != 0 ||
      (rc = ql__uploads_create(cfg->max_upload_bytes, &s->uploads)) != 0 ||
      (rc = ql__worker_create(&loop, "cpu", cfg->max_queue, &s->cpu)) != 0) {
    ql__err("cannot start: %s", ql_strerror(rc));
    goto fail;
  }
  /* These cannot fail on a valid loop (libuv only checks arguments). */
  uv_signal_init(&loop, &s->sig_int);
  uv_signal_init(&loop, &s->sig_term);
  uv_signal_init(&loop, &s->sig_hup);
  uv_timer_init(&loop, &s->sweep);
  uv_timer_init(&loop, &s->drain);
  uv_timer_init(&loop, &s->watchdog);
  s->sig_int.data = s->sig_term.data = s->sig_hup.data = s;
  s->sweep.data = s->drain.data = s->watchdog.data = s;
  if (uv_signal_start(&s->sig_int, on_signal, SIGINT) != 0 ||
      uv_signal_start(&s->sig_term, on_signal, SIGTERM) != 0 ||
      uv_signal_start(&s->sig_hup, on_hup, SIGHUP) != 0 ||
      uv_timer_start(&s->sweep, on_sweep, 1000, 1000) != 0) {
    ql__err("cannot install signal handlers");
    close_all(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto fail;
  }
  /* The sweep timer must not keep the loop alive on its own. */
  uv_unref((uv_handle_t *)&s->sweep);

  if ((rc = ql__transport_open(&loop, s->address, cfg->max_message_bytes,
                               ql__handle_message, s, &s->transport)) != 0) {
    ql__err("cannot listen at %s: %s", s->address, ql_strerror(rc));
    close_all(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto fail;
  }
  if (ql__sessions_open(s) != 0) {
    close_all(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    goto fail;
  }
  /* The socket directory's group is the access boundary: the sockets
   * themselves are group-writable whatever the umask. */
  if (chmod(path, 0660) != 0)
    ql__warn("chmod %s: %s", path, strerror(errno));
  ql__notice("listening at %s (cpu device, message cap %zu bytes)",
             s->address, cfg->max_message_bytes);
  char ready[PATH_MAX + 64];
  snprintf(ready, sizeof ready, "serving %s; %zu weights", s->address,
           ql__weight_store_count(s->weights));
  ql__notify_ready(ready);
  /* systemd arms its watchdog at READY; ping at half its period. */
  uint64_t wd = ql__notify_watchdog_usec();
  if (wd > 0) {
    uv_timer_start(&s->watchdog, on_watchdog, wd / 2000, wd / 2000);
    uv_unref((uv_handle_t *)&s->watchdog);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  unlink(path);
  ql__notice("stopped");
  status = 0;
fail:
  ql__worker_free(s->cpu);
  ql__uploads_free(s->uploads);
  ql__weight_store_free(s->weights);
  uv_run(&loop, UV_RUN_NOWAIT); /* runs close callbacks still pending */
  if (uv_loop_close(&loop) != 0)
    ql__warn("loop closed with handles still open");
  free(s);
  return status;
}
