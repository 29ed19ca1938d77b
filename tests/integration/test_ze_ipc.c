/*
 * test_ze_ipc.c - Level Zero tensors (DESIGN §7): a client's device memory
 * imported into its session over session.sock (the dma-buf descriptor as
 * SCM_RIGHTS with the ze IPC handle) and read and written in place by the
 * real daemon ($QLINEARD) on the test driver (tests/ze_driver, PoCL) with
 * the loader's validation layer on.
 *
 * The client side runs in a child process: the driver must be initialised
 * after fork (check forks every test), and the child is what gets killed.
 * It allocates device memory, writes x with the driver's copy, exports it
 * with <qlinear/qlinear_ze.h> and sends Linear with x and y as Level Zero
 * slices; y must equal the inline reply byte for byte. Hostile imports and
 * slices get their codes while the daemon keeps serving; an import goes
 * away when it is released, when its session closes and when its client
 * is killed with SIGKILL: the daemon then holds neither a descriptor of
 * the client's memfd nor a mapping of it (/proc/<pid>/fd and maps).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>
#include <level_zero/ze_api.h>

#include "harness.h"
#include "qlinear/qlinear.h"
#include "qlinear/qlinear_ze.h"
#include "testutil.h"

#ifndef QL_ZE_TEST_DRIVER
#error "QL_ZE_TEST_DRIVER: the path of libze_qltest.so (Makefile.am)"
#endif

#define N 48
#define K 200
#define M 5
#define TMO 60000

/* td_ze_env() on the test driver, without faults. */
static void ze_env(const char *devices) {
  td_ze_env(QL_ZE_TEST_DRIVER, devices, NULL, NULL);
}

/* In the child: a failed check ends it with its line as the exit code
 * (the parent asserts 0), after saying why on stderr. */
#define CHK(c)                                                                \
  do {                                                                        \
    if (!(c)) {                                                               \
      fprintf(stderr, "test_ze_ipc child: line %d: %s (%s)\n", __LINE__, #c,  \
              ql_errmsg());                                               \
      _exit(__LINE__ & 0xff ? __LINE__ & 0xff : 1);                           \
    }                                                                         \
  } while (0)

/* The child's Level Zero objects: devices 0 and 1 of the test driver, one
 * context, a synchronous immediate command list per device for copies. */
typedef struct zc {
  ze_driver_handle_t drv;
  ze_device_handle_t dev[2];
  ze_context_handle_t ctx;
  ze_command_list_handle_t list[2];
} zc;

static void zc_init(zc *z, uint32_t ndev) {
  uint32_t n = 1;
  ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
  ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
  CHK(zeInit(0) == ZE_RESULT_SUCCESS);
  CHK(zeDriverGet(&n, &z->drv) == ZE_RESULT_SUCCESS && n == 1);
  n = ndev;
  CHK(zeDeviceGet(z->drv, &n, z->dev) == ZE_RESULT_SUCCESS && n == ndev);
  CHK(zeContextCreate(z->drv, &cd, &z->ctx) == ZE_RESULT_SUCCESS);
  for (uint32_t i = 0; i < ndev; i++)
    CHK(zeCommandListCreateImmediate(z->ctx, z->dev[i], &qd, &z->list[i]) ==
        ZE_RESULT_SUCCESS);
}

static void *zc_alloc(zc *z, int dev, size_t bytes) {
  ze_device_mem_alloc_desc_t dd = {
      .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
  void *p = NULL;
  CHK(zeMemAllocDevice(z->ctx, &dd, bytes, 64, z->dev[dev], &p) ==
      ZE_RESULT_SUCCESS);
  return p;
}

static void zc_copy(zc *z, int dev, void *dst, const void *src, size_t n) {
  /* synchronous mode: done when the append returns */
  CHK(zeCommandListAppendMemoryCopy(z->list[dev], dst, src, n, NULL, 0,
                                    NULL) == ZE_RESULT_SUCCESS);
}

/* 1 when process pid holds a descriptor or a mapping of the file (dev,
 * ino). */
static int holds_file(pid_t pid, dev_t dev, ino_t ino) {
  char path[96], line[1024];
  int found = 0;
  for (int fd = 0; fd < 4096 && !found; fd++) {
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
    if (stat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino)
      found = 1;
  }
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return found;
  while (!found && fgets(line, sizeof line, f) != NULL) {
    unsigned long long in = 0;
    /* address perms offset dev inode path */
    if (sscanf(line, "%*s %*s %*s %*s %llu", &in) == 1 && in == ino &&
        strstr(line, "memfd:") != NULL)
      found = 1;
  }
  fclose(f);
  return found;
}

/* Waits (up to 30 s: a bound for a stuck daemon, not a timing check) for
 * pid to let go of the file. Returns 1 when it has. */
static int lets_go(pid_t pid, dev_t dev, ino_t ino) {
  for (int i = 0; i < 3000; i++) {
    if (!holds_file(pid, dev, ino))
      return 1;
    usleep(10000);
  }
  return 0;
}

/* Loads the test's weights for c's session (they stay while it is open). */
static void load_weights(ql_client *c, td_layer *l) {
  td_layer_make(l, N, K, 7, 1);
  CHK(td_load(c, "wq4", l, QL_FORMAT_Q4G, 64, 0, NULL, NULL) == 0);
  CHK(td_load(c, "wq8", l, QL_FORMAT_Q8B, 32, 0, NULL, NULL) == 0);
}

static int run_child(void (*fn)(const td *), const td *d) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    fn(d);
    _exit(0);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return status;
}

/* ImportZeIpc on a raw session with fd attached: the status code, and
 * the id on success. */
static int raw_import(td_session *s, int fd, const unsigned char *handle,
                      size_t len, const char *device, uint64_t *id) {
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__ImportZeIpcRequest ir;
  qlinear__v1__session_request__init(&req);
  qlinear__v1__import_ze_ipc_request__init(&ir);
  ir.ipc_handle.data = (uint8_t *)handle;
  ir.ipc_handle.len = len;
  ir.device = (char *)device;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC;
  req.import_ze_ipc = &ir;
  Qlinear__V1__SessionResponse *r = td_session_call_fd(s, &req, fd, NULL,
                                                       TMO);
  if (r == NULL)
    return QL_ETIMEDOUT;
  int rc = r->status ? r->status->code : 0;
  if (rc == 0 && id != NULL)
    *id = r->import_ze_ipc->import_id;
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return rc;
}

/* A raw LinearMulti of wq4 and wq8 on x in import id with one y slice per
 * weight in the same allocation at y_off[i]: 0 and the replies naming the
 * slices, or the status code. */
static int raw_multi(const td *d, const td_session *s, uint64_t id,
                     uint64_t xb, uint64_t yb, const uint64_t y_off[2]) {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearMultiRequest lm;
  Qlinear__V1__Tensor xt;
  Qlinear__V1__ZeIpcSlice xs, ys[2], *yp[2] = {&ys[0], &ys[1]};
  char *weights[2] = {"wq4", "wq8"};
  uint64_t shape[2] = {M, K};
  qlinear__v1__request__init(&req);
  qlinear__v1__linear_multi_request__init(&lm);
  qlinear__v1__tensor__init(&xt);
  qlinear__v1__ze_ipc_slice__init(&xs);
  xs.import_id = id;
  xs.length = xb;
  for (int i = 0; i < 2; i++) {
    qlinear__v1__ze_ipc_slice__init(&ys[i]);
    ys[i].import_id = id;
    ys[i].offset = y_off[i];
    ys[i].length = yb;
  }
  xt.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  xt.shape = shape;
  xt.n_shape = 2;
  xt.data_case = QLINEAR__V1__TENSOR__DATA_ZE_IPC;
  xt.ze_ipc = &xs;
  lm.n_weights = 2;
  lm.weights = weights;
  lm.x = &xt;
  lm.path = QLINEAR__V1__PATH__PATH_WEIGHT_ONLY;
  lm.n_y_out_ze = 2;
  lm.y_out_ze = yp;
  req.request_id = 91;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI;
  req.linear_multi = &lm;
  Qlinear__V1__Response *r = td_call_as(d, s, &req, TMO);
  if (r == NULL)
    return QL_ETIMEDOUT;
  int rc = r->status ? r->status->code : 0;
  if (rc == 0) {
    CHK(r->linear_multi->n_results == 2);
    for (int i = 0; i < 2; i++) {
      const Qlinear__V1__Tensor *y = r->linear_multi->results[i]->y;
      CHK(y->data_case == QLINEAR__V1__TENSOR__DATA_ZE_IPC);
      CHK(y->ze_ipc->import_id == id && y->ze_ipc->offset == y_off[i] &&
          y->ze_ipc->length == yb);
    }
  }
  qlinear__v1__response__free_unpacked(r, NULL);
  return rc;
}

/* The child of imports_and_linear. */
static void child_linear(const td *d) {
  zc z;
  ql_ze_export ex, ex1;
  uint64_t id = 0, id1 = 0, size = 0, other = 0;
  const size_t xb = M * K * sizeof(float), yb = M * N * sizeof(float);
  float x[M * K], y_inline[M * N], y_dev[M * N];
  uint64_t seed = 5;
  ql_linear_result res;

  zc_init(&z, 2);
  td_randn(&seed, x, M * K, 1.0f);
  /* One allocation holds x at offset 0 and y after it; a second, on the
   * other device, holds another y. */
  const size_t alloc = 64 * 1024;
  unsigned char *buf = zc_alloc(&z, 0, alloc), *buf1 = zc_alloc(&z, 1, 4096);
  zc_copy(&z, 0, buf, x, xb);
  CHK(ql_ze_export_ptr(z.ctx, buf + 4096, xb, &ex) == 0);
  CHK(ex.offset == 4096 && ex.alloc_size >= alloc);
  CHK(ql_ze_export_ptr(z.ctx, buf1, 16, &ex1) == 0);
  /* Not device memory / out of its allocation: refused by the helper. */
  ql_ze_export no;
  CHK(ql_ze_export_ptr(z.ctx, x, xb, &no) == QL_EINVAL);
  CHK(ql_ze_export_ptr(z.ctx, buf, ex.alloc_size + 1, &no) == QL_EINVAL);
  CHK(ql_ze_export_ptr(z.ctx, buf, xb, &ex) == 0 && ex.offset == 0);

  /* nanomsg does not survive fork(): this process connects on its own. */
  ql_client *c = td_connect(d);
  td_layer l;
  load_weights(c, &l);
  ql_hello_info h;
  CHK(ql_hello(c, &h) == 0 && strcmp(h.devices[0].alias, "ze:0") == 0);
  CHK(strcmp(ex.device, h.devices[0].name) == 0);
  CHK(strcmp(ex1.device, h.devices[1].name) == 0);
  CHK(ql_ze_import(c, ex.fd, ex.handle, ex.device, &id, &size) == 0);
  CHK(id != 0 && size == ex.alloc_size);
  CHK(ql_ze_import(c, ex1.fd, ex1.handle, "ze:1", &id1, NULL) == 0);
  CHK(id1 != id);

  const char *weights[] = {"wq4", "wq8"};
  for (int w = 0; w < 2; w++) {
    for (int p = 0; p < 2; p++) {
      ql_path path = p ? QL_PATH_ACT_QUANT : QL_PATH_WEIGHT_ONLY;
      if (w == 1 && p == 1)
        continue; /* q8b is weight-only */
      ql_ze_slice xs = {id, 0, xb}, ys = {id, 8192, yb};
      float ref[M * N];
      CHK(ql_linear(c, weights[w], path, QL_DTYPE_F32, M, K, x, N, ref,
                    NULL) == 0);
      memset(y_inline, 0, sizeof y_inline);
      CHK(ql_linear_ze(c, weights[w], path, QL_DTYPE_F32, M, K, &xs, N, NULL,
                       y_inline, &res) == 0);
      CHK(strcmp(res.impl, p ? "ze.linear_aq" : "ze.linear_wo") == 0);
      CHK(memcmp(y_inline, ref, sizeof ref) == 0);
      CHK(ql_linear_ze(c, weights[w], path, QL_DTYPE_F32, M, K, &xs, N, &ys,
                       NULL, &res) == 0);
      memset(y_dev, 0, sizeof y_dev);
      zc_copy(&z, 0, y_dev, buf + 8192, yb);
      CHK(memcmp(y_dev, ref, sizeof ref) == 0);
    }
  }

  /* LinearMulti, raw, from a second session with its own import of the
   * same allocation: both y in device memory, each the inline result. */
  {
    td_session rs;
    uint64_t rid = 0, y_off[2] = {8192, 12288};
    float ref[2][M * N];
    CHK(td_session_open(d, &rs) == 0);
    CHK(raw_import(&rs, ex.fd, ex.handle, sizeof ex.handle, ex.device,
                   &rid) == 0);
    CHK(rid != 0 && rid != id);
    for (int w = 0; w < 2; w++)
      CHK(ql_linear(c, weights[w], QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, M, K,
                    x, N, ref[w], NULL) == 0);
    CHK(raw_multi(d, &rs, rid, xb, yb, y_off) == 0);
    for (int w = 0; w < 2; w++) {
      memset(y_dev, 0, sizeof y_dev);
      zc_copy(&z, 0, y_dev, buf + y_off[w], yb);
      CHK(memcmp(y_dev, ref[w], sizeof y_dev) == 0);
    }
    /* Another session's id is not found; a y past the real end is not
     * written. */
    CHK(raw_multi(d, &rs, id, xb, yb, y_off) == QL_ENOTFOUND);
    uint64_t past_end[2] = {8192, size - yb + 4};
    CHK(raw_multi(d, &rs, rid, xb, yb, past_end) == QL_EINVAL);
    td_session_close(&rs);
  }

  /* Hostile slices and imports; the daemon keeps serving after each. */
  ql_ze_slice xs = {id, 0, xb}, ys = {id, 8192, yb};
  ql_ze_slice past = {id, size - xb + 4, xb};
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &past, N, NULL,
                   y_inline, NULL) == QL_EINVAL);
  CHK(strstr(ql_errmsg(), "do not fit") != NULL);
  ql_ze_slice wrap = {id, UINT64_MAX - 3, xb};
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &wrap, N, NULL,
                   y_inline, NULL) == QL_EINVAL);
  ql_ze_slice yover = {id, 4 * K, yb}; /* starts inside x */
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &xs, N, &yover,
                   NULL, NULL) == QL_EINVAL);
  CHK(strstr(ql_errmsg(), "overlap") != NULL);
  ql_ze_slice yother = {id1, 0, yb}; /* on ze:1, x on ze:0 */
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &xs, N,
                   &yother, NULL, NULL) == QL_EINVAL);
  CHK(strstr(ql_errmsg(), "one device") != NULL);
  ql_ze_slice unknown = {id + 1000, 0, xb};
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &unknown, N,
                   NULL, y_inline, NULL) == QL_ENOTFOUND);
  /* Not a memfd of the driver; a handle of no allocation. */
  int pfd[2];
  CHK(pipe(pfd) == 0);
  CHK(ql_ze_import(c, pfd[0], ex.handle, ex.device, &other, NULL) ==
      QL_EINVAL);
  close(pfd[0]);
  close(pfd[1]);
  /* The handle's bytes after the descriptor are not the client's to
   * choose: a pool offset (which compute-runtime adds to the imported
   * pointer unchecked), a memory type and the rest are set aside, and the
   * import is the whole allocation. */
  unsigned char odd[QL_ZE_IPC_HANDLE_BYTES];
  uint64_t pool_off = 4096, odd_size = 0;
  memcpy(odd, ex.handle, sizeof odd);
  memset(odd + 8, 0x5a, sizeof odd - 8);
  memcpy(odd + 8, &pool_off, sizeof pool_off);
  CHK(ql_ze_import(c, ex.fd, odd, ex.device, &other, &odd_size) == 0);
  CHK(odd_size == ex.alloc_size);
  CHK(ql_ze_release(c, other) == 0);
  /* No such device; a device that takes no imports. */
  CHK(ql_ze_import(c, ex.fd, ex.handle, "ze:7", &other, NULL) ==
      QL_ENOTFOUND);
  CHK(ql_ze_import(c, ex.fd, ex.handle, "cpu", &other, NULL) == QL_ENOTSUP);
  /* Another session's import is not found in this one. */
  ql_client *c2 = td_connect(d);
  uint64_t id2 = 0;
  CHK(ql_ze_import(c2, ex.fd, ex.handle, ex.device, &id2, NULL) == 0);
  ql_ze_slice theirs = {id2, 0, xb};
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &theirs, N,
                   NULL, y_inline, NULL) == QL_ENOTFOUND);
  CHK(ql_ze_release(c, id2) == QL_ENOTFOUND);
  CHK(ql_linear_ze(c2, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &theirs, N,
                   NULL, y_inline, NULL) == 0);
  ql_close(c2);
  /* Still serving, in place. */
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &xs, N, &ys,
                   NULL, NULL) == 0);
  /* Released: gone for requests, and a second release is refused. */
  CHK(ql_ze_release(c, id1) == 0);
  CHK(ql_ze_release(c, id1) == QL_ENOTFOUND);
  ql_ze_slice released = {id1, 0, xb};
  CHK(ql_linear_ze(c, "wq4", QL_PATH_AUTO, QL_DTYPE_F32, M, K, &released, N,
                   NULL, y_inline, NULL) == QL_ENOTFOUND);

  /* The session's end closes the import: the daemon lets go of the
   * memfd, descriptor and mapping. */
  struct stat st;
  CHK(fstat(ex.fd, &st) == 0);
  CHK(holds_file(d->pid, st.st_dev, st.st_ino));
  ql_close(c);
  CHK(lets_go(d->pid, st.st_dev, st.st_ino));
  struct stat st1;
  CHK(fstat(ex1.fd, &st1) == 0);
  CHK(!holds_file(d->pid, st1.st_dev, st1.st_ino)); /* released before */
  zeMemFree(z.ctx, buf);
  zeMemFree(z.ctx, buf1);
  td_layer_free(&l);
}

/* Imports on two ze devices, results against the inline replies, the
 * hostile cases, release and the end of the session. */
START_TEST(imports_and_linear) {
  td d;
  ze_env("2");
  td_start(&d, NULL);
  int status = run_child(child_linear, &d);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the client failed (status %d): see its stderr", status);
  /* The daemon serves on. */
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ql_close(c);
  char *log = td_read_log(&d);
  ck_assert_msg(strstr(log, "a Level Zero call refused") == NULL, "%s", log);
  ck_assert_ptr_nonnull(strstr(log, "imported a Level Zero IPC allocation"));
  ck_assert_ptr_nonnull(strstr(log, "closed a Level Zero IPC allocation"));
  free(log);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Raw session packets: an import without its descriptor, or with a handle
 * of the wrong size, is refused; a descriptor sent with another packet is
 * closed, not kept. */
START_TEST(raw_imports) {
  td d;
  td_session s;
  ze_env("1");
  td_start(&d, NULL);
  ck_assert_int_eq(td_session_open(&d, &s), 0);
  Qlinear__V1__SessionRequest req;
  Qlinear__V1__ImportZeIpcRequest ir;
  uint8_t handle[QL_ZE_IPC_HANDLE_BYTES] = {0};
  qlinear__v1__session_request__init(&req);
  qlinear__v1__import_ze_ipc_request__init(&ir);
  ir.ipc_handle.data = handle;
  ir.ipc_handle.len = sizeof handle;
  ir.device = "ze:0";
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC;
  req.import_ze_ipc = &ir;
  Qlinear__V1__SessionResponse *r = td_session_call(&s, &req, NULL, TMO);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_EINVAL);
  ck_assert_ptr_nonnull(strstr(r->status->message, "no descriptor"));
  qlinear__v1__session_response__free_unpacked(r, NULL);
  ir.ipc_handle.len = 63;
  r = td_session_call(&s, &req, NULL, TMO);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_EINVAL);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  /* A descriptor with a 63-byte handle, or with a packet that is no
   * import, is closed before the reply. */
  char tmpl[] = "/tmp/test_ze_ipc.XXXXXX";
  int tfd = mkstemp(tmpl);
  struct stat st;
  ck_assert_int_ge(tfd, 0);
  unlink(tmpl);
  ck_assert_int_eq(fstat(tfd, &st), 0);
  r = td_session_call_fd(&s, &req, tfd, NULL, TMO);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_EINVAL);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  ck_assert(!holds_file(d.pid, st.st_dev, st.st_ino));
  Qlinear__V1__ReleaseImportRequest rr;
  qlinear__v1__release_import_request__init(&rr);
  rr.import_id = 12345;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT;
  req.release_import = &rr;
  r = td_session_call_fd(&s, &req, tfd, NULL, TMO);
  ck_assert_ptr_nonnull(r);
  ck_assert_int_eq(r->status->code, QL_ENOTFOUND);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  ck_assert(!holds_file(d.pid, st.st_dev, st.st_ino));
  /* A regular file is not the memory of a handle. */
  ck_assert_int_eq(raw_import(&s, tfd, handle, sizeof handle, "ze:0", NULL),
                   QL_EINVAL);
  ck_assert(!holds_file(d.pid, st.st_dev, st.st_ino));
  close(tfd);
  td_session_close(&s);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* In a child: device 0's context, an 8 KiB allocation on it (in *buf)
 * whose first 4 KiB are exported as ex, and a new client of d. */
static ql_client *export_page(const td *d, zc *z, void **buf,
                              ql_ze_export *ex) {
  zc_init(z, 1);
  *buf = zc_alloc(z, 0, 8192);
  CHK(ql_ze_export_ptr(z->ctx, *buf, 4096, ex) == 0);
  return td_connect(d);
}

/* The child of no_driver_ipc. */
static void child_no_ipc(const td *d) {
  zc z;
  ql_ze_export ex;
  uint64_t id = 0;
  struct stat st;
  void *buf = NULL;
  ql_client *c = export_page(d, &z, &buf, &ex);
  CHK(ql_ze_import(c, ex.fd, ex.handle, ex.device, &id, NULL) == QL_ENOTSUP);
  CHK(strstr(ql_errmsg(), "no memory IPC") != NULL && id == 0);
  /* The refused descriptor is closed before the reply. */
  CHK(fstat(ex.fd, &st) == 0);
  CHK(!holds_file(d->pid, st.st_dev, st.st_ino));
  ql_close(c);
  zeMemFree(z.ctx, buf);
}

/* A driver that advertises no memory IPC (zeDriverGetIpcProperties):
 * imports are QL_ENOTSUP and leave nothing open. */
START_TEST(no_driver_ipc) {
  td d;
  ze_env("1");
  setenv("QL_ZE_TEST_IPC", "0", 1);
  td_start(&d, NULL);
  int status = run_child(child_no_ipc, &d);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the client failed (status %d): see its stderr", status);
  unsetenv("QL_ZE_TEST_IPC");
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The daemon's log as a new string (the child's copy of read_log). */
static char *log_text(const td *d) {
  FILE *f = fopen(d->log, "r");
  CHK(f != NULL);
  char *buf = malloc(1 << 20);
  CHK(buf != NULL);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* The child of held_while_running: requests with x in an import until one
 * does not come back within the client's time limit (the driver hangs the
 * device, and the daemon waits the kernel timeout for it), then the
 * session ends with that request still running. */
static void child_held(const td *d) {
  zc z;
  ql_ze_export ex;
  uint64_t id = 0;
  const size_t xb = M * K * sizeof(float);
  float x[M * K], y[M * N];
  uint64_t seed = 11;
  struct stat st;
  td_layer l;

  unsetenv("QL_ZE_TEST_FAULT"); /* the fault is the daemon's */
  zc_init(&z, 1);
  td_randn(&seed, x, M * K, 1.0f);
  unsigned char *buf = zc_alloc(&z, 0, 8192);
  zc_copy(&z, 0, buf, x, xb);
  CHK(ql_ze_export_ptr(z.ctx, buf, xb, &ex) == 0);
  CHK(fstat(ex.fd, &st) == 0);
  ql_client *owner = td_connect(d);
  load_weights(owner, &l);
  ql_connect_opts o = {0};
  o.timeout_ms = 1000;
  ql_client *c = NULL;
  CHK(ql_connect(d->address, &o, &c) == 0);
  CHK(ql_ze_import(c, ex.fd, ex.handle, ex.device, &id, NULL) == 0);
  ql_ze_slice xs = {id, 0, xb};
  int rc = 0;
  for (int i = 0; i < 500 && rc == 0; i++)
    rc = ql_linear_ze(c, "wq4", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, M, K, &xs,
                      N, NULL, y, NULL);
  CHK(rc == QL_ETIMEDOUT);
  ql_close(c);
  /* The import closes when that request ends (the kernel timeout fails
   * it), after the session's end has let its hold go. */
  char *log = NULL;
  for (int i = 0; i < 6000; i++) {
    free(log);
    log = log_text(d);
    if (strstr(log, "closed a Level Zero IPC allocation") != NULL)
      break;
    usleep(10000);
  }
  const char *ended = strstr(log, "1 IPC allocation let go");
  const char *closed = strstr(log, "closed a Level Zero IPC allocation");
  CHK(ended != NULL && closed != NULL);
  CHK(ended < closed);
  CHK(lets_go(d->pid, st.st_dev, st.st_ino));
  free(log);
  ql_close(owner);
  td_layer_free(&l);
}

/* An import is not closed under a request that uses it: the session ends
 * while its request waits on a hung device, and the import closes only
 * when that request has failed. */
START_TEST(held_while_running) {
  td d;
  const char *args[] = {"--kernel-timeout-ms", "3000ms", NULL};
  ze_env("1");
  setenv("QL_ZE_TEST_FAULT", "0:150:hang", 1);
  td_start(&d, args);
  int status = run_child(child_held, &d);
  unsetenv("QL_ZE_TEST_FAULT");
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the client failed (status %d): see its stderr", status);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* The child of killed_client: imports, says so, and waits to be killed. */
static int kill_pipe[2];
static void child_killed(const td *d) {
  zc z;
  ql_ze_export ex;
  uint64_t id = 0;
  struct stat st;
  void *buf = NULL;
  ql_client *c = export_page(d, &z, &buf, &ex);
  CHK(ql_ze_import(c, ex.fd, ex.handle, ex.device, &id, NULL) == 0);
  CHK(fstat(ex.fd, &st) == 0);
  CHK(write(kill_pipe[1], &st, sizeof st) == (ssize_t)sizeof st);
  for (;;)
    pause();
}

/* A client killed with SIGKILL while it has an import: the daemon lets go
 * of the memory and serves on. */
START_TEST(killed_client) {
  td d;
  struct stat st;
  ze_env("1");
  td_start(&d, NULL);
  ck_assert_int_eq(pipe(kill_pipe), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(kill_pipe[0]);
    child_killed(&d);
    _exit(0);
  }
  close(kill_pipe[1]);
  ck_assert_int_eq(read(kill_pipe[0], &st, sizeof st), (ssize_t)sizeof st);
  ck_assert(holds_file(d.pid, st.st_dev, st.st_ino));
  ck_assert_int_eq(kill(pid, SIGKILL), 0);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status));
  ck_assert(lets_go(d.pid, st.st_dev, st.st_ino));
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ze_ipc");
  TCase *tc = tcase_create("ze_ipc");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, imports_and_linear);
  tcase_add_test(tc, raw_imports);
  tcase_add_test(tc, no_driver_ipc);
  tcase_add_test(tc, held_while_running);
  tcase_add_test(tc, killed_client);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
