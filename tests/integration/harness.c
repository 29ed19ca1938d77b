/* harness.c - see harness.h. */
#include <errno.h>
#include <fcntl.h>
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

#include <check.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "harness.h"
#include "testutil.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The daemon is ready once its socket accepts a connection. */
static int socket_accepts(const char *path) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path)
    return 0;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0)
    return 0;
  int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
  close(fd);
  return ok;
}

void td_start(td *d, const char *const *args) {
  const char *bin = getenv("QLINEARD");
  ck_assert_msg(bin != NULL, "QLINEARD is not set (run through make check)");
  memset(d, 0, sizeof *d);
  snprintf(d->dir, sizeof d->dir, "/tmp/ql-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(d->dir));
  chmod(d->dir, 0700);
  snprintf(d->address, sizeof d->address, "ipc://%s/qlineard.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s.log", d->dir);
  const char *argv[32];
  int n = 0;
  argv[n++] = bin;
  argv[n++] = "--socket-dir";
  argv[n++] = d->dir;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  for (int i = 0; args && args[i] && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  d->pid = fork();
  ck_assert_int_ge(d->pid, 0);
  if (d->pid == 0) {
    /* A failed test ends its process early: take the daemon with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  char path[300];
  snprintf(path, sizeof path, "%s/qlineard.sock", d->dir);
  for (int i = 0; i < 1000; i++) {
    if (socket_accepts(path))
      return;
    ck_assert_msg(td_alive(d), "qlineard exited at start (see %s)", d->log);
    sleep_ms(20);
  }
  ck_abort_msg("qlineard did not start listening");
}

int td_alive(td *d) {
  if (d->pid <= 0)
    return 0;
  int st;
  return waitpid(d->pid, &st, WNOHANG) == 0;
}

void td_kill(td *d, int sig) {
  if (d->pid > 0)
    kill(d->pid, sig);
}

int td_wait(td *d, int timeout_ms) {
  int status = -1, st;
  if (d->pid > 0) {
    for (int i = 0; i < timeout_ms / 10 + 1; i++) {
      pid_t r = waitpid(d->pid, &st, WNOHANG);
      if (r == d->pid) {
        status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        break;
      }
      sleep_ms(10);
    }
    if (status == -1 && kill(d->pid, SIGKILL) == 0)
      waitpid(d->pid, &st, 0);
    d->pid = 0;
  }
  char path[300];
  snprintf(path, sizeof path, "%s/qlineard.sock", d->dir);
  unlink(path);
  rmdir(d->dir);
  if (status != 0) {
    /* Show the daemon's log when it did not stop cleanly. */
    FILE *f = fopen(d->log, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
      fputs(line, stderr);
    if (f)
      fclose(f);
  }
  unlink(d->log);
  return status;
}

int td_stop(td *d) {
  td_kill(d, SIGTERM);
  return td_wait(d, 20000);
}

Qlinear__V1__Response *td_call_bytes(const td *d, const void *buf, size_t len,
                                     int timeout_ms) {
  int s = nn_socket(AF_SP, NN_REQ);
  ck_assert_int_ge(s, 0);
  int resend = 3600 * 1000;
  nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
  nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
  nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend);
  ck_assert_int_ge(nn_connect(s, d->address), 0);
  Qlinear__V1__Response *resp = NULL;
  if (nn_send(s, buf, len, 0) == (int)len) {
    void *msg = NULL;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    if (n >= 0) {
      resp = qlinear__v1__response__unpack(NULL, (size_t)n, msg);
      ck_assert_msg(resp != NULL, "daemon sent an undecodable reply");
      nn_freemsg(msg);
    }
  }
  nn_close(s);
  return resp;
}

Qlinear__V1__Response *td_call(const td *d, const Qlinear__V1__Request *req,
                               int timeout_ms) {
  size_t len = qlinear__v1__request__get_packed_size(req);
  uint8_t *buf = tu_xmalloc(len ? len : 1);
  qlinear__v1__request__pack(req, buf);
  Qlinear__V1__Response *r = td_call_bytes(d, buf, len, timeout_ms);
  free(buf);
  return r;
}

void td_randn(uint64_t *state, float *out, size_t n, float sigma) {
  for (size_t i = 0; i < n; i++)
    out[i] = (float)(sigma * tu_rng_gauss(state));
}
