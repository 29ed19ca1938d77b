/*
 * ctl_hold.c - a helper of test_ctl.sh: loads a q4g weight from .npy files
 * (f32, as qlinearctl load does) and holds it in its session until its
 * standard input closes.
 *
 * A weight lives while a session holds it (DESIGN §8), and each qlinearctl
 * command is a session of its own: without a holder, the weight of
 * "qlinearctl load" is gone when the command exits. (Persistent loads,
 * through the admin socket, keep one with no session.)
 *
 *   ctl_hold NAME W.npy B.npy GROUP_SIZE   (address: $QLINEAR_ADDRESS)
 *
 * Prints "held NAME" once the weight is resident; exit status 0 after a
 * clean release, 1 on any failure (with a message).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"
#include "qlinear/qlinear.h"

int main(int argc, char **argv) {
  ql__npy w = {0}, b = {0};
  ql_client *c = NULL;
  char err[256];
  int rv;

  if (argc != 5) {
    fprintf(stderr, "usage: ctl_hold NAME W.npy B.npy GROUP_SIZE\n");
    return 2;
  }
  if ((rv = ql__npy_load(argv[2], &w, err, sizeof err)) != 0 ||
      (rv = ql__npy_load(argv[3], &b, err, sizeof err)) != 0) {
    fprintf(stderr, "ctl_hold: %s\n", err);
    return 1;
  }
  if (w.type != QL__NPY_F32 || b.type != QL__NPY_F32 || w.ndim != 2) {
    fprintf(stderr, "ctl_hold: want f32 [N,K] and [N]\n");
    return 1;
  }
  ql_load_desc d;
  memset(&d, 0, sizeof d);
  d.name = argv[1];
  d.format = QL_FORMAT_Q4G;
  d.group_size = (uint32_t)atoi(argv[4]);
  d.n = w.shape[0];
  d.k = w.shape[1];
  d.dtype = QL_DTYPE_F32;
  d.data = w.data;
  d.bias = b.data;
  if ((rv = ql_connect(NULL, NULL, &c)) != 0 ||
      (rv = ql_load_float(c, &d, NULL, NULL)) != 0) {
    fprintf(stderr, "ctl_hold: %s: %s\n", ql_strerror(rv), ql_errmsg());
    ql_close(c);
    return 1;
  }
  printf("held %s\n", d.name);
  fflush(stdout);
  char buf[64];
  while (read(STDIN_FILENO, buf, sizeof buf) > 0)
    ;
  ql_close(c);
  ql__npy_free(&w);
  ql__npy_free(&b);
  return 0;
}
