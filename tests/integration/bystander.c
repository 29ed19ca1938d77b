/* bystander.c - see bystander.h. */
#include "bystander.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "ql_kernels.h"
#include "qlinear/qlinear.h"

/* The child: Linear on "by/w" until stop is readable, then "served bad
 * errors" on out. */
static void bystander_main(const td *d, int stop, int out) {
  td_layer l;
  ql_qweight *q = NULL;
  ql_client *c = NULL;
  unsigned long served = 0, bad = 0, errors = 0;
  td_layer_make(&l, 24, 96, 501, 1);
  ql_quant_params p = {QL_FORMAT_Q4G, 32, 0, (ql_dtype)0};
  /* The message path, so that it holds no region: tests count them. */
  ql_connect_opts o = {0};
  o.no_ring = 1;
  if (ql_qweight_quantize(&p, 24, 96, QL_DTYPE_F32, l.w, l.b, &q) != 0 ||
      ql_connect(d->address, &o, &c) != 0 ||
      td_load(c, "by/w", &l, QL_FORMAT_Q4G, 32, 0, NULL, NULL) != 0)
    _exit(3);
  float x[3 * 96], y[3 * 24], ref[3 * 24];
  uint64_t seed = 9;
  struct pollfd pf = {stop, POLLIN, 0};
  while (poll(&pf, 1, 0) == 0) {
    td_randn(&seed, x, 3 * 96, 1.0f);
    for (int path = QL_PATH_WEIGHT_ONLY; path <= QL_PATH_ACT_QUANT; path++) {
      if (ql_linear(c, "by/w", (ql_path)path, QL_DTYPE_F32, 3, 96, x, 24, y,
                    NULL) != 0) {
        errors++;
        continue;
      }
      /* The first answer tells the parent the bystander is serving, so
       * that the test's attack starts only then (td_bystander_start). */
      if (served++ == 0 && write(out, "R", 1) != 1)
        _exit(4);
      if ((path == QL_PATH_WEIGHT_ONLY
               ? ql_linear_wo_ref(q, QL_DTYPE_F32, x, 3, ref)
               : ql_linear_aq_ref(q, QL_DTYPE_F32, x, 3, ref)) != 0 ||
          memcmp(y, ref, sizeof y) != 0)
        bad++;
    }
  }
  char msg[96];
  int len = snprintf(msg, sizeof msg, "%lu %lu %lu", served, bad, errors);
  _exit(write(out, msg, (size_t)len) == len ? 0 : 4);
}

void td_bystander_start(const td *d, td_bystander *b) {
  int st[2], out[2];
  ck_assert_int_eq(pipe(st), 0);
  ck_assert_int_eq(pipe(out), 0);
  b->pid = fork();
  ck_assert_int_ge(b->pid, 0);
  if (b->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Not the harness's session: that one is the parent's. */
    close(d->sess.fd);
    close(st[1]);
    close(out[0]);
    bystander_main(d, st[0], out[1]);
  }
  close(st[0]);
  close(out[1]);
  b->stop = st[1];
  b->out = out[0];
  /* Serving before the test goes on (a loaded machine, a sanitizer build
   * can make its start slower than a short test). */
  struct pollfd pf = {out[0], POLLIN, 0};
  char r = 0;
  ck_assert_msg(poll(&pf, 1, 60000) == 1 && read(out[0], &r, 1) == 1 &&
                    r == 'R',
                "the bystander did not start serving within 60 s");
}

void td_bystander_end(td_bystander *b) {
  char msg[96] = "";
  unsigned long served = 0, bad = 0, errors = 0;
  close(b->stop);
  ssize_t n = read(b->out, msg, sizeof msg - 1);
  close(b->out);
  int wst;
  ck_assert_int_eq(waitpid(b->pid, &wst, 0), b->pid);
  ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
                "the bystander failed (status %d)", wst);
  ck_assert_int_gt(n, 0);
  msg[n] = '\0';
  ck_assert_int_eq(sscanf(msg, "%lu %lu %lu", &served, &bad, &errors), 3);
  printf("bystander: %lu requests served, %lu wrong, %lu errors\n", served,
         bad, errors);
  ck_assert_uint_gt(served, 0);
  ck_assert_uint_eq(bad, 0);
  ck_assert_uint_eq(errors, 0);
}
