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

#include "devices.h"
#include "listen.h"
#include "metrics.h"
#include "registry.h"
#include "transport.h"
#include "upload.h"
#include "weights.h"
#include "worker.h"

/* cpu_level values; names in conf.c. */
enum {
  QL_CPU_LEVEL_OPT_AUTO,
  QL_CPU_LEVEL_OPT_C,
  QL_CPU_LEVEL_OPT_AVX2,
  QL_CPU_LEVEL_OPT_AVX2VNNI,
  QL_CPU_LEVEL_OPT_AVX512
};

/* mapped_mode values; names in conf.c. A mapping can be made writable by
 * its importer whatever the daemon asks (the exported descriptor carries
 * no access right), so the choice is whose sessions may map. */
enum {
  QL_MAPPED_OFF,   /* MapWeight refused */
  QL_MAPPED_OWNER, /* sessions of the daemon's own user, or of root */
  QL_MAPPED_ANY    /* every session (a host whose clients trust each
                      other) */
};

/* A list option's value, e.g. required_devices = cpu,cuda:0: up to
 * QL_CONFIG_LIST_MAX distinct items, each a NUL-terminated name. */
#define QL_CONFIG_LIST_MAX 16
#define QL_CONFIG_ITEM_MAX 64
typedef struct ql__config_list {
  unsigned n;
  char item[QL_CONFIG_LIST_MAX][QL_CONFIG_ITEM_MAX];
} ql__config_list;

/* Options. Each field is described once in the table of conf.c (type,
 * default, bounds, whether SIGHUP changes it); main.c fills them from the
 * config file and the command line through that table. */
typedef struct ql__config {
  char socket_dir[PATH_MAX]; /* directory of qlineard.sock; created 0700 */
  size_t max_message_bytes;  /* larger messages are refused (NN_RCVMAXSIZE) */
  uint32_t max_connections; /* per request socket, open at once */
  uint32_t max_connections_per_uid; /* of one peer uid */
  uint32_t max_sessions_per_uid; /* sessions of one peer uid */
  uint64_t frame_timeout_ms; /* a half-sent message or unread reply */
  size_t max_buffered_bytes; /* half-received messages and unread replies
                                of one socket's connections */
  size_t max_chunk_bytes;    /* largest LoadChunk payload */
  size_t max_upload_bytes;   /* all uploads in progress together */
  uint64_t upload_idle_ms;   /* an idle upload is dropped after this */
  uint64_t session_lease_ms; /* a session idle this long ends; 0: never */
  uint32_t ring_spin_us;     /* a quiet ring is polled this long before
                                the loop sleeps on its doorbell */
  size_t max_queue;          /* waiting requests per (weight, device,
                                path) queue */
  uint32_t max_batch_rows;   /* rows of one launch */
  uint32_t decode_max_rows;  /* requests up to this are decode work */
  uint32_t prefill_chunk_rows; /* most rows of a prefill launch; 0: none */
  uint32_t prefill_chunk_us; /* a prefill launch's time budget while
                                decode work is about; 0: none */
  uint64_t max_queue_delay_us; /* a small batch may wait this long */
  uint64_t decode_hold_us; /* the most a decode launch waits for the rows
                              of the one before to come back */
  size_t session_max_requests; /* requests of one session in the queues */
  size_t max_queued_bytes;   /* tensor bytes held by waiting jobs */
  size_t max_pinned_bytes;   /* region bytes page-locked for devices' DMA,
                                over every session; 0: none */
  uint64_t drain_ms;         /* shutdown: queued work not started by then
                                is answered QL_ESHUTDOWN */
  uint32_t crossover_rows;   /* AUTO: rows below this run weight-only;
                                0: measured per shape (calibrate.h) */
  uint32_t crossover_default_rows; /* until a shape's is measured */
  int log_level;             /* QL_LOG_* */
  int mapped_mode;           /* QL_MAPPED_*: whether sessions may map
                                weight layouts into their own process */
  char state_dir[PATH_MAX];  /* persistent weight store; "" = none */
  char admin_dir[PATH_MAX];  /* directory of admin.sock; "" =
                                <socket_dir>/admin */
  uint32_t cpu_threads;      /* CPU worker threads; 0 = online CPUs */
  int cpu_level;             /* QL_CPU_LEVEL_OPT_*: the highest kernel
                                level to use; 0 = the best detected */
  size_t cpu_budget_bytes;   /* weight bytes resident on the CPU; 0 = no
                                limit */
  uint64_t kernel_timeout_ms; /* an accelerator launch not done by then
                                 takes its device out of service */
  uint32_t batches_in_flight; /* worker threads (lanes) of an accelerator,
                                 1 .. QL__WORKER_MAX_THREADS; at start */
  ql__config_list required_devices; /* must be present before READY=1 */
  uint32_t accel_budget_percent; /* an accelerator's weight budget, in
                                    hundredths of a percent of its memory
                                    (8750: 87.5 %) */
  ql__config_list device_budget_bytes; /* "DEVICE=SIZE" items: a device's
                                          budget, instead of the percent */
  char metrics_listen[QL_LISTEN_ADDR_MAX + 1]; /* HOST:PORT of /metrics,
                                                  loopback; "" = none */
  uint32_t metrics_weights; /* weights named in /metrics; 0 = none */
} ql__config;


typedef struct ql__counters {
  uint64_t requests; /* requests received (decodable or not); those a
                        ring answered itself are the ring's (fastpath.h) */
  uint64_t errors;   /* replies with a non-zero status */
  uint64_t bytes_in;
  uint64_t bytes_out;
  uint64_t errors_by_code[QL__ERR_SLOTS + 1]; /* of them, by code
                                                 (ql__err_slot) */
} ql__counters;

/*
 * What the metrics count besides the per-weight counters (ql__weight_stats,
 * which go with their weight): totals per device, per format and per path
 * that only ever grow, as Prometheus counters must. Loop thread, but for
 * the atomic ones, which a device worker adds to for the replies it sends
 * itself (route.h, early).
 */
typedef struct ql__metrics_counts {
  struct ql__metrics_dev {
    _Atomic uint64_t requests; /* Linear requests and LinearMulti parts
                                  answered with success */
    _Atomic uint64_t rows;     /* their rows */
    uint64_t batches[2];       /* launches, by path (ql__path_slot) */
    uint64_t kernel_ns;        /* time in launches */
    uint64_t queue_ns;         /* time requests waited for their first */
  } dev[QL__MAX_DEVICES];
  struct ql__metrics_fmt {
    _Atomic uint64_t requests, rows; /* as above, by format */
  } fmt[QL__FMT_SLOTS];
  /* By path: a successful request from its admission to its answer
   * (latency), every request to its first launch (queue), and each
   * successful launch. */
  ql__hist latency[2], queue[2], launch[2];
} ql__metrics_counts;

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
  int stopping;           /* SIGINT/SIGTERM seen: new requests refused */
  atomic_int cancel;      /* drain deadline passed: jobs not yet run are
                             answered QL_ESHUTDOWN (read by workers) */
  uint64_t stop_ns;       /* when stopping began */
  int quiet_ticks;        /* drain ticks with nothing in flight */
  uint64_t test_delay_ms; /* QL_TEST_KERNEL_DELAY_MS: tests only, every
                             linear job sleeps this long first */
  uint64_t test_early_delay_ms; /* QL_TEST_EARLY_DELAY_MS: tests only, a
                                   job that replied early sleeps this long
                                   before the loop hears of it */
  uint64_t test_piece_delay_us; /* QL_TEST_PIECE_DELAY_US: tests only, a
                                   launch in parts sleeps this long each
                                   time it asks whether to stop, so that
                                   it lasts long enough to be stopped */
  ql__counters counters;
  ql__metrics_counts mcounts; /* metrics.h */
  ql__metrics *metrics;       /* the /metrics listener, or NULL: none */
} ql__server;

/* Runs the daemon until SIGINT/SIGTERM; returns the process exit status.
 * argv (kept, not copied) is parsed again on SIGHUP. */
int ql__server_run(const ql__config *cfg, int argc, char **argv);


#endif /* QLINEARD_H */
