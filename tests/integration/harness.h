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

/* A libqlinear client of the daemon's request socket (with a session), or
 * of its admin socket; aborts the test when it cannot connect. */
ql_client *td_connect(const td *d);
ql_client *td_connect_admin(const td *d);

/* Monotonic milliseconds. */
int64_t td_now_ms(void);

/* The daemon's resident set (VmRSS, KiB) and its open descriptors, from
 * /proc; abort the test when they cannot be read. */
long td_daemon_rss_kib(const td *d);
int td_daemon_fds(const td *d);

/* 1 in a --enable-sanitizers build (make check exports its flags): RSS
 * says little there, ASan keeps freed memory in quarantine. */
int td_sanitized(void);

#endif
