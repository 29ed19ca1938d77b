/*
 * qlineard.h - the daemon's configuration and its top-level state.
 *
 * One libuv loop thread owns everything here; device workers touch only
 * the jobs handed to them (worker.h).
 */
#ifndef QLINEARD_H
#define QLINEARD_H

#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "conf.h"
#include "state/device.h"
#include "net/listen.h"
#include "dispatch/counts.h"
#include "registry.h"
#include "net/transport.h"
#include "state/tenants.h"
#include "state/upload.h"
#include "state/weights.h"
#include "state/worker.h"
#include "wire/reply.h"




typedef struct ql__server {
  ql__config cfg;
  uv_loop_t *loop;
  char address[PATH_MAX + 8]; /* "ipc://<socket_dir>/qlineard.sock" */
  ql__transport *transport;
  ql__transport *admin; /* admin.sock */
  char admin_address[PATH_MAX + 8];
  /* The socket and admin directories if this start made them, else "":
   * a failed start removes them. */
  char made_socket_dir[PATH_MAX], made_admin_dir[PATH_MAX];
  struct ql__store *store; /* the state directory, or NULL: none */
  size_t persistent_count; /* weights with a file in the store */
  struct ql__sessions *sessions; /* the session registry (session.h) */
  /* session.sock, its packets and the sessions' rings (session_ops.c) */
  struct ql__session_plane *session_plane;
  ql__weight_store *weights;
  ql__uploads *uploads;
  struct ql__linear_state *lin; /* the scheduler and its timers (batch.c) */
  struct ql__calib *calib;      /* crossovers (calibrate.c) */
  ql__device dev[QL__MAX_DEVICES]; /* devices.h */
  unsigned n_dev;
  ql__device *cpu;               /* the CPU, one of dev[] */
  const ql_backend *cpu_backend; /* its kernels (registry) */
  uv_signal_t sig_int, sig_term, sig_hup;
  int argc;    /* the command line, read again on SIGHUP */
  char **argv;
  uv_timer_t sweep; /* expires idle uploads */
  uv_timer_t drain; /* polls for the end of in-flight work at shutdown */
  uv_timer_t watchdog; /* pings systemd while workers make progress */
  uint8_t instance_id[16];
  uint64_t start_ns;
  size_t commits_running; /* LoadCommit quantizations in the thread pool */
  size_t queued_bytes;    /* x and y bytes of accepted linear jobs */
  ql__tenants tenants;    /* what each uid holds of the shared budgets */
  size_t listeners_open;  /* server.c's listeners opened (close_all closes
                             them in reverse) */
  int stopping;           /* SIGINT/SIGTERM seen: new requests refused */
  atomic_int cancel;      /* drain deadline passed: jobs not yet run are
                             answered QL_ESHUTDOWN (read by workers) */
  uint64_t stop_ns;       /* when stopping began */
  int quiet_ticks;        /* drain ticks with nothing in flight */
  ql__counters counters;
  ql__reply_sink replies; /* cap and counters for wire/reply.c */
  ql__metrics_counts mcounts; /* metrics.h */
  struct ql__metrics *metrics; /* the /metrics listener (serve/metrics.h),
                                  or NULL: none */
} ql__server;

/* Runs the daemon until SIGINT/SIGTERM; returns the process exit status.
 * argv (kept, not copied) is parsed again on SIGHUP. */
int ql__server_run(const ql__config *cfg, int argc, char **argv);


#endif /* QLINEARD_H */
