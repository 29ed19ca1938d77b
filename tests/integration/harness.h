/*
 * harness.h - runs a real qlineard for integration tests: a private socket
 * directory, the daemon as a child process, and raw protocol calls that
 * bypass libqlinear so the daemon's own answers to bad input are tested:
 * requests on the nanomsg socket and packets on the session socket.
 */
#ifndef QL_TEST_HARNESS_H
#define QL_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>

#include "qlinear.pb-c.h"
#include "qlinear/qlinear.h"

/* A raw session (session.sock), without libqlinear. */
typedef struct td_session {
  int fd;            /* -1: none */
  uint8_t token[16]; /* Request.session_token */
  uint64_t next_id;  /* SessionRequest.request_id */
  uint32_t max_regions;      /* the limits SessionOpen announced */
  uint64_t max_region_bytes;
} td_session;

typedef struct td {
  pid_t pid;
  char dir[256];     /* socket directory (private unless the test gave it) */
  int own_dir;       /* dir was made by the harness: removed at the end */
  char address[300]; /* ipc://<dir>/qlineard.sock */
  char session[300]; /* <dir>/session.sock */
  char admin[320];   /* ipc://<dir>/admin/admin.sock (the default) */
  char log[300];     /* the daemon's stderr */
  td_session sess;   /* the harness's own session: td_call() uses it */
} td;

/* 1 (the default): td_start() passes --crossover-rows 16 before the
 * test's own arguments; 0: it does not (each test runs in a process of its
 * own, so setting it stays local). */
extern int td_fix_crossover;

/* Starts $QLINEARD with the given extra arguments (NULL-terminated list,
 * may be NULL; they come after the harness's own: --crossover-rows 16,
 * which a test may override), waits until it accepts connections and opens
 * the harness's session (d->sess). Aborts the test on failure. */
void td_start(td *d, const char *const *args);

/* The same in the socket directory dir, which the test made (it is not
 * removed at the end; the daemon's sockets in it are). */
void td_start_in(td *d, const char *dir, const char *const *args);

/*
 * Starts the daemon as td_start_in() does, for a start that may fail:
 * returns 0 once it serves, or its exit status if it exits first (-1: by a
 * signal, or it neither served nor exited within 20 s) with what it wrote
 * to stderr in log (len bytes, NUL-terminated); d->pid is 0 then.
 */
int td_start_or_exit(td *d, const char *dir, const char *const *args,
                     char *log, size_t len);

/* The next daemon td_start*() starts is handed fd (which the test keeps
 * open) as systemd hands over a socket unit's socket: as descriptor 3,
 * with LISTEN_PID its own pid, LISTEN_FDS=1 and LISTEN_FDNAMES=names
 * (NULL: unset). */
void td_hand_over(int fd, const char *names);

/* Sends SIGTERM and returns the daemon's exit status (-1 if it was killed
 * by a signal or did not stop within 20 s). Closes d->sess and removes the
 * directory. */
int td_stop(td *d);

/* Sends sig to the daemon. */
void td_kill(td *d, int sig);

/* Waits up to timeout_ms for the daemon to exit by itself; returns its exit
 * status, or -1 (killed by a signal, or still running: then killed). */
int td_wait(td *d, int timeout_ms);

/* 1 while the daemon process is running. */
int td_alive(td *d);

/*
 * One raw request/reply over a fresh REQ socket, carrying the token of the
 * harness's session unless req has a token of its own. Returns the
 * unpacked Response (free with qlinear__v1__response__free_unpacked(r,
 * NULL)) or NULL on timeout.
 */
Qlinear__V1__Response *td_call(const td *d, const Qlinear__V1__Request *req,
                               int timeout_ms);

/* One raw request on the admin socket (no token). As td_call(). */
Qlinear__V1__Response *td_call_admin(const td *d,
                                     const Qlinear__V1__Request *req,
                                     int timeout_ms);

/* The same with the token of session s (NULL: with no token at all, unless
 * req has one). */
Qlinear__V1__Response *td_call_as(const td *d, const td_session *s,
                                  const Qlinear__V1__Request *req,
                                  int timeout_ms);

/*
 * Opens a raw session: connects <dir>/session.sock and sends SessionOpen.
 * Returns 0 with s->token set, or the daemon's error code (QL_EEXHAUSTED
 * when too many sessions are open), or QL_ECONNECT / QL_ETIMEDOUT; s->fd is
 * -1 then.
 */
int td_session_open(const td *d, td_session *s);

/* A connection to <dir>/session.sock with nothing sent yet, or -1. */
int td_session_connect(const td *d);

/* Closes the session's socket (which ends it in the daemon). Safe twice. */
void td_session_close(td_session *s);

/*
 * One raw exchange on a session: req gets the next request id. Returns the
 * reply (free with qlinear__v1__session_response__free_unpacked(r, NULL))
 * or NULL on timeout or end of file; a descriptor that came with it is
 * stored in *fd_out if fd_out is not NULL, else closed (-1: none).
 */
Qlinear__V1__SessionResponse *td_session_call(
    td_session *s, Qlinear__V1__SessionRequest *req, int *fd_out,
    int timeout_ms);

/* The same, sending send_fd (when >= 0) with the packet as SCM_RIGHTS;
 * the caller keeps its descriptor. */
Qlinear__V1__SessionResponse *td_session_call_fd(
    td_session *s, Qlinear__V1__SessionRequest *req, int send_fd,
    int *fd_out, int timeout_ms);

/* The same, keeping the first two descriptors of the reply in fds[] (-1
 * where none came): CreateRing's ring and doorbell. */
Qlinear__V1__SessionResponse *td_session_call_fds(
    td_session *s, Qlinear__V1__SessionRequest *req, int fds[2],
    int timeout_ms);

/* CreateRegion on a raw session: returns the status code; on success *id
 * is the region's id and *fd its descriptor (the caller closes it). */
int td_region_create(td_session *s, uint64_t size, uint64_t *id, int *fd);

/* DestroyRegion on a raw session: returns the status code. */
int td_region_destroy(td_session *s, uint64_t id);

/* Sends raw bytes as one message and waits for a reply; returns the reply
 * (as above) or NULL on timeout. */
Qlinear__V1__Response *td_call_bytes(const td *d, const void *buf, size_t len,
                                     int timeout_ms);

/* Fills out with n floats from N(0, sigma), drawn from the seedable stream
 * *state (tu_rng_gauss in testutil.h). */
void td_randn(uint64_t *state, float *out, size_t n, float sigma);

/* A float layer [n, k] with N(0, 0.05) weights and, with_bias, an N(0, 0.1)
 * bias, from seed. td_layer_free() frees its arrays. */
typedef struct td_layer {
  uint64_t n, k;
  float *w, *b; /* b NULL without a bias */
} td_layer;
void td_layer_make(td_layer *l, uint64_t n, uint64_t k, uint64_t seed,
                   int with_bias);
void td_layer_free(td_layer *l);

/* Loads layer l (f32) as weight name in format f (gs: q4g group size or
 * q8b block, else 0) through ql_load_float(); info and shared may be NULL.
 * The library's status. */
int td_load(ql_client *c, const char *name, const td_layer *l, ql_format f,
            uint32_t gs, int persistent, ql_weight_info *info, int *shared);

/* The same placed on devices (a ql_load_desc.devices list; NULL: where the
 * daemon places it by default). */
int td_load_on(ql_client *c, const char *name, const td_layer *l,
               ql_format f, uint32_t gs, int persistent, const char *devices,
               ql_weight_info *info, int *shared);

/* A libqlinear client of the daemon's request socket (with a session), or
 * of its admin socket; aborts the test when it cannot connect. */
ql_client *td_connect(const td *d);
/* A client without the ring: every request travels as a message. */
ql_client *td_connect_messages(const td *d);
ql_client *td_connect_admin(const td *d);

/* Monotonic milliseconds. */
int64_t td_now_ms(void);

/* The daemon's resident set (VmRSS, KiB) and its open descriptors, from
 * /proc; abort the test when they cannot be read. */
long td_daemon_rss_kib(const td *d);
int td_daemon_fds(const td *d);
/* The RLIMIT_NOFILE that leaves the daemon exactly spare free descriptor
 * numbers: the kernel hands out the lowest free number and fails with
 * EMFILE at the limit, so a count of open descriptors is not enough once
 * closed connections left holes below the highest one. */
int td_daemon_fd_limit(const td *d, int spare);

/* 1 in a --enable-sanitizers build (make check exports its flags): RSS
 * says little there, ASan keeps freed memory in quarantine. */
int td_sanitized(void);

/* ---- Helpers the accelerator tests (cuda, ze) share. ---- */

/* The daemon's log (its stderr so far) as a new NUL-terminated string, up
 * to 1 MiB; the caller frees it. Read it before td_stop(), which removes
 * the file. Aborts the test when the file cannot be opened. */
char *td_read_log(const td *d);

/* How many times needle occurs in hay (overlapping occurrences count). */
int td_count(const char *hay, const char *needle);

/* The environment of a daemon on the emulated CUDA runtime: QLINEARD
 * becomes $QLINEARD_CUDAEMU (the test fails when it is not set), with
 * devices GPUs (QL_EMU_CUDA_DEVICES) and the injected faults fault
 * (QL_EMU_CUDA_FAULT; NULL: none). */
void td_cuda_env(const char *devices, const char *fault);

/* Mappings in process pid of memfds that process owner made on the
 * emulated runtime, named "<kind>:<owner>:..." (kind "ql-emu-cuda" for
 * cudaMalloc, "ql-emu-cuda-vmm" for cuMemCreate). */
int td_emu_mappings(pid_t pid, const char *kind, pid_t owner);

/* The environment of a daemon (and of this process's children) on the
 * Level Zero test driver at driver (libze_qltest.so) with the loader's
 * validation layer: devices devices of mem bytes each (QL_ZE_TEST_MEM;
 * NULL: the driver's default), faults fault (QL_ZE_TEST_FAULT; NULL:
 * none), and the driver's IPC support as it is by default
 * (QL_ZE_TEST_IPC unset). */
void td_ze_env(const char *driver, const char *devices, const char *mem,
               const char *fault);

/* Fills a Linear request on weight (device NULL: the scheduler's choice)
 * with path path and an f32 x of shape[0] x shape[1]; the x tensor's data
 * is left for the caller to set (inline or a device slice). req, lin, xt
 * and shape are the caller's; req points into lin, lin into xt, xt into
 * shape, and weight and device are borrowed, not copied. */
void td_linear_request(Qlinear__V1__Request *req,
                       Qlinear__V1__LinearRequest *lin,
                       Qlinear__V1__Tensor *xt, uint64_t shape[2],
                       const char *weight, const char *device, ql_path path);

/* One raw Linear request with x [m, k] inline on the harness's session,
 * so that it can name a device and a path. Returns the reply (never NULL:
 * a timeout fails the test); the caller frees it with
 * qlinear__v1__response__free_unpacked(r, NULL). */
Qlinear__V1__Response *td_linear_inline(const td *d, const char *weight,
                                        const char *device, ql_path path,
                                        const float *x, uint64_t m,
                                        uint64_t k, int timeout_ms);

/* td_linear_inline() with the reply read: returns the status code; on
 * success y gets the m x n result (the reply's length is checked) and impl
 * (may be NULL; 64 bytes) the name of the implementation that ran. msg
 * (may be NULL) gets the status message, msglen bytes. */
int td_linear(const td *d, const char *weight, const char *device,
              ql_path path, const float *x, uint64_t m, uint64_t k,
              uint64_t n, float *y, char *impl, char *msg, size_t msglen,
              int timeout_ms);

/* td_linear() that also checks, on success, that backend's own kernel ran
 * ("<backend>.linear_aq" on QL_PATH_ACT_QUANT, else
 * "<backend>.linear_wo"). */
int td_linear_backend(const td *d, const char *backend, const char *weight,
                      const char *device, ql_path path, const float *x,
                      uint64_t m, uint64_t k, uint64_t n, float *y, char *msg,
                      size_t msglen, int timeout_ms);

/*
 * Runs fn(arg, out) in a child made by fork(), with out a buffer of n
 * floats shared with this process, and copies out to y (n floats) once the
 * child has exited. fn returns 1 for success; the child leaves with
 * _exit() (0 on success, 1 else), so that nothing of this process (check's
 * state, atexit handlers, a sanitizer's leak check) runs in it. Returns the
 * child's wait status (the caller asserts on it).
 */
int td_child_floats(int (*fn)(void *arg, float *out), void *arg, float *y,
                    size_t n);

/* The user the second-user cases run as: nobody's uid, not the daemon's. */
#define TD_OTHER_UID 65534

/*
 * Runs this program again (/proc/self/exe with argv, argv[0] first and
 * NULL-terminated) in a child and returns its pid. With as_other, the
 * child becomes TD_OTHER_UID (group 0 kept: the daemon's sockets are
 * 0660) only after exec, in td_self_init(), so that the program and its
 * libraries are loaded while it is still root: a build under a directory
 * the other user cannot enter (a clone in a 0700 home) runs it all the
 * same. The peer credentials are taken at connect, so the child must not
 * connect before td_self_init(). as_other needs root (the caller checks
 * geteuid()). A child that cannot become the other user exits 3; one
 * whose exec fails, 127.
 */
pid_t td_spawn_self(char *const argv[], int as_other);

/*
 * Called first in main() of a program whose children td_spawn_self()
 * starts: in such a child started as_other, drops every group but 0 and
 * becomes TD_OTHER_UID for good (the saved uid too: it cannot become root
 * again), then moves to "/" (the build directory may be closed to it);
 * _exit(3) when any of that fails. Does nothing in any other process.
 */
void td_self_init(void);

/* Runs the suite (check's CK_NORMAL output) and returns the exit status
 * for main(): 0 when no test failed, else 1. Frees the suite. */
int td_run_suite(Suite *s);

/* An accelerator backend as the checks below drive it (a test file's
 * own request and in-process functions, which know its N, K and timeout). */
typedef struct td_accel {
  const char *dev0, *dev1; /* the aliases of its first two devices */
  uint64_t n, k;           /* the shape of the layers it loads */
  /* One raw Linear of x [m, k] on weight on device (NULL: the scheduler's
   * choice) with path: the status code; on success y gets the m x n
   * result, and the implementation that ran was checked to be the
   * backend's own. msg (may be NULL) gets the status message. */
  int (*linear)(const td *d, const char *weight, const char *device,
                ql_path path, const float *x, uint64_t m, float *y,
                char *msg, size_t msglen);
  /* What this process's own backend gives for layer l in format f (gs as
   * for td_load) on x [m, k] with the op that path runs (weight-only or
   * activation-quantized): m x n floats into y. */
  void (*expected)(const td_layer *l, ql_format f, uint32_t gs, ql_path path,
                   const float *x, uint64_t m, float *y);
  /* Further checks on each weight, before the CPU is asked for it; x is
   * the weight's m x k input. NULL: none. */
  void (*each)(const td *d, const char *weight, const float *x, uint64_t m);
} td_accel;

/*
 * A daemon on two devices of backend a and the CPU, whose Hello c gave as
 * h (devices 0 and 1 the accelerator's): loads one layer in each format
 * (q4g/64, q8c, q8b/32, f8r) as w0..w3 through c, each placed on both
 * devices; weight-only replies on each device by alias, on device 1 by
 * name and on the scheduler's choice are the bytes of a->expected, and so
 * are activation-quantized ones on device 1 where the format has them
 * (q4g, q8c); the CPU does not hold the weights (NOT_FOUND naming dev0).
 * Then the daemon's stats: three devices, the same non-zero bytes
 * resident on both accelerators, a budget on device 0, and two per-weight
 * entries per weight, none on the CPU. Returns the requests those entries
 * count, for the caller to check (what a->each sent may count too).
 */
uint64_t td_serve_formats(const td *d, ql_client *c, const ql_hello_info *h,
                          const td_accel *a);

/*
 * Sends weight-only requests of x [m, a->k] on weight to device (NULL: the
 * scheduler's choice) until one fails or 100 have succeeded; each success
 * must give the bytes of want (m x a->n). Returns how many succeeded; *rc
 * gets the last status, msg (msglen bytes) its message, and t_fail (may be
 * NULL) how long the failing request took, in milliseconds (0: none
 * failed).
 */
int td_serve_until_error(const td *d, const td_accel *a, const char *weight,
                         const char *device, const float *x, uint64_t m,
                         const float *want, int *rc, char *msg, size_t msglen,
                         int64_t *t_fail);

/* A device that is to fail: requests to device by name succeed (as
 * td_serve_until_error()) until one fails with QL_EDEVICE, whose message
 * speaks of the device; after that the device is out of service and
 * refuses the next request at once, saying so by name. */
void td_device_fails(const td *d, const td_accel *a, const char *weight,
                     const char *device, const float *x, uint64_t m,
                     const float *want);

#endif
