/*
 * harness.h - runs a real qlineard for integration tests: a private socket
 * directory, the daemon as a child process, and raw protocol calls that
 * bypass libqlinear so the daemon's own answers to bad input are tested.
 */
#ifndef QL_TEST_HARNESS_H
#define QL_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "qlinear.pb-c.h"

typedef struct td {
  pid_t pid;
  char dir[256];     /* private socket directory */
  char address[300]; /* ipc://<dir>/qlineard.sock */
  char log[300];     /* the daemon's stderr */
} td;

/* Starts $QLINEARD with the given extra arguments (NULL-terminated list,
 * may be NULL) and waits until it accepts connections. Aborts the test on
 * failure. */
void td_start(td *d, const char *const *args);

/* Sends SIGTERM and returns the daemon's exit status (-1 if it was killed
 * by a signal or did not stop within 20 s). Removes the directory. */
int td_stop(td *d);

/* Sends sig to the daemon. */
void td_kill(td *d, int sig);

/* Waits up to timeout_ms for the daemon to exit by itself; returns its exit
 * status, or -1 (killed by a signal, or still running: then killed). */
int td_wait(td *d, int timeout_ms);

/* 1 while the daemon process is running. */
int td_alive(td *d);

/*
 * One raw request/reply over a fresh REQ socket. Returns the unpacked
 * Response (free with qlinear__v1__response__free_unpacked(r, NULL)) or
 * NULL on timeout.
 */
Qlinear__V1__Response *td_call(const td *d, const Qlinear__V1__Request *req,
                               int timeout_ms);

/* Sends raw bytes as one message and waits for a reply; returns the reply
 * (as above) or NULL on timeout. */
Qlinear__V1__Response *td_call_bytes(const td *d, const void *buf, size_t len,
                                     int timeout_ms);

/* Fills out with n floats from N(0, sigma), drawn from the seedable stream
 * *state (tu_rng_gauss in testutil.h). */
void td_randn(uint64_t *state, float *out, size_t n, float sigma);

#endif
