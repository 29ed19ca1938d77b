/*
 * test_cuda_ipc.c - Linear requests whose x and y are in the client's CUDA
 * device memory (CUDA IPC, DESIGN §7), end to end: this process is the
 * client, with device memory of the emulated CUDA runtime
 * (kernels/cuda/emu_runtime.h: memfd-backed allocations that another
 * process maps through their IPC handles), and $QLINEARD_CUDAEMU the
 * daemon, on the same emulated GPUs. The slices are made by
 * <qlinear/qlinear_cuda.h>, compiled here unchanged against the emulated
 * runtime (tests/integration/cuda_emu_include/).
 *
 * What it checks: y written into device memory (or inline) equals the
 * inline request's reply byte for byte, weight-only and
 * activation-quantized (q8c too from the rows where inline batches run
 * on cuBLASLt's IMMA), with a ready event, and for LinearMulti (one y
 * slice per weight, on the second GPU); each allocation is opened
 * once per session however many requests use it, stays mapped in the
 * daemon while the session lives and is unmapped when it ends; hostile
 * slices (handles of the wrong length, garbage or freed allocations,
 * slices past the allocation's real end, offsets that overflow, the wrong
 * device, garbage event handles, overlapping x and y) get their error
 * codes and the daemon keeps serving; a client killed with SIGKILL while
 * its request runs leaves no mapping in the daemon, which closes the
 * import only once the request has finished.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "harness.h"
#include "qlinear/qlinear.h"
#include "qlinear/qlinear_cuda.h"
#include "testutil.h"

#define N 48
#define K 200
#define M 5
#define TMO 20000

/* Mappings in process pid of memory that process owner allocated on the
 * emulated runtime with cudaMalloc. */
static int mappings_of(pid_t pid, pid_t owner) {
  return td_emu_mappings(pid, "ql-emu-cuda", owner);
}

/* Waits (up to 20 s) until the daemon maps none of owner's memory. */
static int wait_unmapped(const td *d, pid_t owner) {
  for (int i = 0; i < 400; i++) {
    if (mappings_of(d->pid, owner) == 0)
      return 1;
    usleep(50000);
  }
  return 0;
}

/* Two emulated GPUs, here and in the daemon: the same UUIDs on both sides,
 * as two processes on one machine see the same GPUs. */
static void start(td *d, const char *const *args) {
  td_cuda_env("2", NULL);
  td_start(d, args);
}

/* A device buffer of bytes, filled from host data when src is not NULL. */
static unsigned char *dev_alloc(size_t bytes, const void *src, size_t at,
                                size_t len) {
  void *p = NULL;
  ck_assert_int_eq(cudaMalloc(&p, bytes), cudaSuccess);
  if (src != NULL)
    ck_assert_int_eq(cudaMemcpy((unsigned char *)p + at, src, len,
                                cudaMemcpyHostToDevice),
                     cudaSuccess);
  return p;
}

static void dev_read(void *dst, const void *src, size_t len) {
  ck_assert_int_eq(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost),
                   cudaSuccess);
}

/* The CudaIpcSlice message of s (pointing into s). */
static void slice_msg(const ql_cuda_slice *s, Qlinear__V1__CudaIpcSlice *m) {
  qlinear__v1__cuda_ipc_slice__init(m);
  m->mem_handle.data = (uint8_t *)s->mem_handle;
  m->mem_handle.len = sizeof s->mem_handle;
  m->offset = s->offset;
  m->length = s->length;
  m->device = (char *)s->device;
  if (s->has_ready_event) {
    m->ready_event.data = (uint8_t *)s->ready_event;
    m->ready_event.len = sizeof s->ready_event;
  }
}

/* A raw Linear request of M rows with x (and y, may be NULL: inline) as
 * CUDA IPC slices, on the harness's session. Returns the status code; msg
 * gets the message. */
static int raw_linear(const td *d, const char *weight, const char *device,
                      const Qlinear__V1__CudaIpcSlice *xs,
                      const Qlinear__V1__CudaIpcSlice *ys, char *msg,
                      size_t msglen) {
  Qlinear__V1__Request req;
  Qlinear__V1__LinearRequest lin;
  Qlinear__V1__Tensor xt;
  uint64_t shape[2] = {M, K};
  td_linear_request(&req, &lin, &xt, shape, weight, device,
                    QL_PATH_WEIGHT_ONLY);
  xt.data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
  xt.cuda_ipc = (Qlinear__V1__CudaIpcSlice *)xs;
  lin.y_out_cuda = (Qlinear__V1__CudaIpcSlice *)ys;
  req.request_id = 91;
  Qlinear__V1__Response *r = td_call(d, &req, TMO);
  ck_assert_ptr_nonnull(r);
  int rc = r->status->code;
  snprintf(msg, msglen, "%s", r->status->message ? r->status->message : "");
  if (rc == 0 && ys != NULL) {
    /* The slice asked for, with no handle in it. */
    ck_assert_int_eq(r->linear->y->data_case,
                     QLINEAR__V1__TENSOR__DATA_CUDA_IPC);
    ck_assert_uint_eq(r->linear->y->cuda_ipc->offset, ys->offset);
    ck_assert_uint_eq(r->linear->y->cuda_ipc->length, ys->length);
    ck_assert_uint_eq(r->linear->y->cuda_ipc->mem_handle.len, 0);
  }
  qlinear__v1__response__free_unpacked(r, NULL);
  return rc;
}

/* y in device memory, and inline, equal the inline request's bytes, on
 * both paths, with a ready event; each allocation is opened once per
 * session, mapped while it lives and unmapped when it ends. */
START_TEST(round_trip) {
  td d;
  start(&d, NULL);
  ql_client *c = td_connect(&d);
  ql_hello_info h;
  ck_assert_int_eq(ql_hello(c, &h), 0);
  ck_assert_str_eq(h.devices[0].alias, "cuda:0");
  td_layer l;
  td_layer_make(&l, N, K, 7, 1);
  ck_assert_int_eq(td_load(c, "ipc/q4", &l, QL_FORMAT_Q4G, 64, 0, NULL, NULL),
                   0);
  float x[M * K], want[M * N], got[M * N], aq[M * N];
  uint64_t seed = 42;
  td_randn(&seed, x, M * K, 1.0f);
  ck_assert_int_eq(ql_linear(c, "ipc/q4", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                             M, K, x, N, want, NULL),
                   0);
  ck_assert_int_eq(ql_linear(c, "ipc/q4", QL_PATH_ACT_QUANT, QL_DTYPE_F32, M,
                             K, x, N, aq, NULL),
                   0);

  /* x at an offset inside a larger allocation (as a caching allocator
   * hands out), y in another. */
  ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
  unsigned char *xa = dev_alloc(4096 + sizeof x, x, 512, sizeof x);
  unsigned char *ya = dev_alloc(256 + sizeof want, NULL, 0, 0);
  cudaEvent_t ev;
  ck_assert_int_eq(cudaEventCreateWithFlags(
                       &ev, cudaEventInterprocess | cudaEventDisableTiming),
                   cudaSuccess);
  ck_assert_int_eq(cudaEventRecord(ev, 0), cudaSuccess);
  ql_cuda_slice xs, ys;
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&xs, xa + 512, sizeof x, ev), 0);
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&ys, ya + 256, sizeof want, NULL),
                   0);
  ck_assert_uint_eq(xs.offset, 512);
  ck_assert_uint_eq(xs.length, sizeof x);
  ck_assert_int_eq(xs.has_ready_event, 1);
  ck_assert_uint_eq(ys.offset, 256);
  /* The helper names the device as the daemon does. */
  ck_assert_str_eq(xs.device, h.devices[0].name);

  ql_linear_result res;
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(cudaMemsetAsync(ya, 0x7f, 256 + sizeof want, 0),
                     cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(0), cudaSuccess);
    ck_assert_int_eq(ql_linear_cuda(c, "ipc/q4", QL_PATH_WEIGHT_ONLY,
                                    QL_DTYPE_F32, M, K, &xs, N, &ys, NULL,
                                    &res),
                     0);
    ck_assert_str_eq(res.impl, "cuda.linear_wo");
    dev_read(got, ya + 256, sizeof got);
    ck_assert_msg(memcmp(got, want, sizeof got) == 0,
                  "y in device memory is not the inline reply (call %d)", i);
    unsigned char before[256];
    dev_read(before, ya, sizeof before);
    for (size_t b = 0; b < sizeof before; b++)
      ck_assert_uint_eq(before[b], 0x7f); /* nothing outside the slice */
  }
  /* y inline, x in device memory. */
  memset(got, 0, sizeof got);
  ck_assert_int_eq(ql_linear_cuda(c, "ipc/q4", QL_PATH_WEIGHT_ONLY,
                                  QL_DTYPE_F32, M, K, &xs, N, NULL, got, NULL),
                   0);
  ck_assert(memcmp(got, want, sizeof got) == 0);
  /* Activation-quantized: the tensor-core kernel, on the allocation's
   * device. */
  ck_assert_int_eq(ql_linear_cuda(c, "ipc/q4", QL_PATH_ACT_QUANT,
                                  QL_DTYPE_F32, M, K, &xs, N, &ys, NULL,
                                  &res),
                   0);
  ck_assert_str_eq(res.impl, "cuda.linear_aq");
  dev_read(got, ya + 256, sizeof got);
  ck_assert_msg(memcmp(got, aq, sizeof got) == 0,
                "AQ y in device memory is not the inline reply");

  /* Opened once each for this session, and mapped in the daemon. */
  char *log = td_read_log(&d);
  ck_assert_int_eq(td_count(log, "opened a CUDA IPC allocation"), 2);
  ck_assert_int_eq(td_count(log, "closed a CUDA IPC allocation"), 0);
  free(log);
  ck_assert_int_eq(ql_emu_cuda_ipc_mapped_in(d.pid, xa), 1);
  ck_assert_int_eq(ql_emu_cuda_ipc_mapped_in(d.pid, ya), 1);
  ck_assert_int_eq(ql_emu_cuda_ipc_mapped_in(getpid(), xa), 1);

  /* Another session opens them for itself. */
  ql_client *c2 = td_connect(&d);
  ck_assert_int_eq(ql_linear_cuda(c2, "ipc/q4", QL_PATH_WEIGHT_ONLY,
                                  QL_DTYPE_F32, M, K, &xs, N, NULL, got, NULL),
                   0);
  ck_assert(memcmp(got, want, sizeof got) == 0);
  log = td_read_log(&d);
  ck_assert_int_eq(td_count(log, "opened a CUDA IPC allocation"), 3);
  free(log);
  ql_close(c2);
  ql_close(c);
  /* The sessions ended: every import is closed and unmapped. */
  ck_assert(wait_unmapped(&d, getpid()));
  ck_assert_int_eq(ql_emu_cuda_ipc_mapped_in(d.pid, xa), 0);
  ck_assert_int_eq(ql_emu_cuda_ipc_mapped_in(d.pid, ya), 0);
  int closed = 0;
  for (int i = 0; i < 400 && closed < 3; i++) {
    log = td_read_log(&d);
    closed = td_count(log, "closed a CUDA IPC allocation");
    free(log);
    if (closed < 3)
      usleep(20000);
  }
  ck_assert_int_eq(closed, 3);
  ck_assert_int_eq(td_stop(&d), 0);
  cudaEventDestroy(ev);
  cudaFree(xa);
  cudaFree(ya);
  td_layer_free(&l);
}
END_TEST

/* q8c activation-quantized from the rows where the daemon runs inline
 * batches on cuBLASLt's IMMA (QL_CUDA_IMMA_MIN_ROWS unset: 16), which
 * reads host memory only: with x and y in device memory our tensor-core
 * kernel runs them, with the inline reply's bytes; AUTO takes the inline
 * request's path, and its bytes. */
START_TEST(q8c_aq_imma_rows) {
  static const uint64_t rows[] = {16, 17, 64};
  const uint64_t most = 64;
  td d;
  unsetenv("QL_CUDA_IMMA_MIN_ROWS");
  start(&d, NULL);
  setenv("QL_CUDA_IMMA_MIN_ROWS", "0", 1);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 13, 1);
  ck_assert_int_eq(td_load(c, "ipc/q8i", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                   0);
  float *x = tu_xmalloc(most * K * sizeof(float));
  float *want = tu_xmalloc(most * N * sizeof(float));
  float *got = tu_xmalloc(most * N * sizeof(float));
  uint64_t seed = 47;
  td_randn(&seed, x, most * K, 1.0f);
  ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
  unsigned char *xa = dev_alloc(most * K * sizeof(float), x, 0,
                                most * K * sizeof(float));
  unsigned char *ya = dev_alloc(most * N * sizeof(float), NULL, 0, 0);
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const uint64_t m = rows[i];
    const size_t yb = m * N * sizeof(float);
    const ql_path paths[] = {QL_PATH_ACT_QUANT, QL_PATH_AUTO};
    ql_cuda_slice xs, ys;
    ck_assert_int_eq(
        ql_cuda_slice_from_ptr(&xs, xa, m * K * sizeof(float), NULL), 0);
    ck_assert_int_eq(ql_cuda_slice_from_ptr(&ys, ya, yb, NULL), 0);
    for (size_t p = 0; p < 2; p++) {
      ql_linear_result inl, res;
      ck_assert_int_eq(ql_linear(c, "ipc/q8i", paths[p], QL_DTYPE_F32, m, K,
                                 x, N, want, &inl),
                       0);
      if (paths[p] == QL_PATH_ACT_QUANT)
        ck_assert_str_eq(inl.impl, "cuda.cublaslt.linear_aq");
      ck_assert_int_eq(cudaMemsetAsync(ya, 0x7f, yb, 0), cudaSuccess);
      ck_assert_int_eq(cudaStreamSynchronize(0), cudaSuccess);
      int rc = ql_linear_cuda(c, "ipc/q8i", paths[p], QL_DTYPE_F32, m, K,
                              &xs, N, &ys, NULL, &res);
      ck_assert_msg(rc == 0, "M=%u, path %d: %d", (unsigned)m, (int)paths[p],
                    rc);
      ck_assert_int_eq(res.path, inl.path);
      if (res.path == QL_PATH_ACT_QUANT)
        ck_assert_str_eq(res.impl, "cuda.linear_aq");
      dev_read(got, ya, yb);
      ck_assert_msg(memcmp(got, want, yb) == 0,
                    "M=%u, path %d: y in device memory is not the inline "
                    "reply",
                    (unsigned)m, (int)paths[p]);
    }
  }
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  cudaFree(xa);
  cudaFree(ya);
  free(x);
  free(want);
  free(got);
  td_layer_free(&l);
}
END_TEST

/* LinearMulti with x in device memory and one y slice per weight there
 * (raw: the library has no multi call for device tensors): each y equals
 * the inline LinearMulti's, and the reply names the slices. */
START_TEST(multi) {
  td d;
  start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l1, l2;
  td_layer_make(&l1, N, K, 11, 1);
  td_layer_make(&l2, N, K, 12, 0);
  ck_assert_int_eq(td_load(c, "ipc/m1", &l1, QL_FORMAT_Q4G, 32, 0, NULL,
                           NULL),
                   0);
  ck_assert_int_eq(td_load(c, "ipc/m2", &l2, QL_FORMAT_F8R, 0, 0, NULL, NULL),
                   0);
  float x[M * K], w1[M * N], w2[M * N], got[M * N];
  uint64_t seed = 46, n[2] = {N, N};
  const char *names[2] = {"ipc/m1", "ipc/m2"};
  void *ys_in[2] = {w1, w2};
  td_randn(&seed, x, M * K, 1.0f);
  ck_assert_int_eq(ql_linear_multi(c, 2, names, QL_PATH_WEIGHT_ONLY,
                                   QL_DTYPE_F32, M, K, x, n, ys_in, NULL),
                   0);
  ck_assert_int_eq(cudaSetDevice(1), cudaSuccess); /* on the second GPU */
  unsigned char *xa = dev_alloc(sizeof x, x, 0, sizeof x);
  unsigned char *ya = dev_alloc(2 * sizeof got, NULL, 0, 0);
  ql_cuda_slice xs, y1, y2;
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&xs, xa, sizeof x, NULL), 0);
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&y1, ya, sizeof got, NULL), 0);
  ck_assert_int_eq(
      ql_cuda_slice_from_ptr(&y2, ya + sizeof got, sizeof got, NULL), 0);
  ck_assert_str_ne(xs.device, ""); /* cuda:1's UUID name */

  Qlinear__V1__Request req;
  Qlinear__V1__LinearMultiRequest lm;
  Qlinear__V1__Tensor xt;
  Qlinear__V1__CudaIpcSlice mx, m1, m2, *pys[2] = {&m1, &m2};
  uint64_t shape[2] = {M, K};
  slice_msg(&xs, &mx);
  slice_msg(&y1, &m1);
  slice_msg(&y2, &m2);
  qlinear__v1__request__init(&req);
  qlinear__v1__linear_multi_request__init(&lm);
  qlinear__v1__tensor__init(&xt);
  xt.dtype = QLINEAR__V1__DTYPE__DTYPE_F32;
  xt.shape = shape;
  xt.n_shape = 2;
  xt.data_case = QLINEAR__V1__TENSOR__DATA_CUDA_IPC;
  xt.cuda_ipc = &mx;
  lm.weights = (char **)names;
  lm.n_weights = 2;
  lm.x = &xt;
  lm.path = QLINEAR__V1__PATH__PATH_WEIGHT_ONLY;
  lm.y_out_cuda = pys;
  lm.n_y_out_cuda = 2;
  req.request_id = 92;
  req.body_case = QLINEAR__V1__REQUEST__BODY_LINEAR_MULTI;
  req.linear_multi = &lm;
  Qlinear__V1__Response *r = td_call(&d, &req, TMO);
  ck_assert_ptr_nonnull(r);
  ck_assert_msg(r->status->code == 0, "%s", r->status->message);
  ck_assert_uint_eq(r->linear_multi->n_results, 2);
  for (size_t i = 0; i < 2; i++) {
    const Qlinear__V1__Tensor *y = r->linear_multi->results[i]->y;
    ck_assert_int_eq(y->data_case, QLINEAR__V1__TENSOR__DATA_CUDA_IPC);
    ck_assert_uint_eq(y->cuda_ipc->offset, i * sizeof got);
    ck_assert_uint_eq(y->cuda_ipc->mem_handle.len, 0);
    ck_assert_str_eq(r->linear_multi->results[i]->impl, "cuda.linear_wo");
  }
  qlinear__v1__response__free_unpacked(r, NULL);
  dev_read(got, ya, sizeof got);
  ck_assert_msg(memcmp(got, w1, sizeof got) == 0, "multi: weight 1");
  dev_read(got, ya + sizeof got, sizeof got);
  ck_assert_msg(memcmp(got, w2, sizeof got) == 0, "multi: weight 2");
  /* One import for x, one for both y slices. */
  char *log = td_read_log(&d);
  ck_assert_int_eq(td_count(log, "opened a CUDA IPC allocation"), 2);
  ck_assert_ptr_nonnull(strstr(log, "opened a CUDA IPC allocation of 4000 "
                                    "bytes on cuda:1"));
  free(log);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  cudaFree(xa);
  cudaFree(ya);
  td_layer_free(&l1);
  td_layer_free(&l2);
}
END_TEST

/* Every hostile slice gets its error; the daemon keeps serving. */
START_TEST(hostile_slices) {
  td d;
  start(&d, NULL);
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 8, 0);
  ck_assert_int_eq(td_load(c, "ipc/q8", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                   0);
  float x[M * K], want[M * N], got[M * N];
  uint64_t seed = 43;
  td_randn(&seed, x, M * K, 1.0f);
  ck_assert_int_eq(ql_linear(c, "ipc/q8", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                             M, K, x, N, want, NULL),
                   0);
  ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
  /* x ends exactly at the allocation's end; y in another allocation. */
  const size_t xsize = 1024 + sizeof x;
  unsigned char *xa = dev_alloc(xsize, x, 1024, sizeof x);
  unsigned char *ya = dev_alloc(sizeof want, NULL, 0, 0);
  unsigned char *gone = dev_alloc(4096, NULL, 0, 0);
  ql_cuda_slice xs, ys, gs;
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&xs, xa + 1024, sizeof x, NULL), 0);
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&ys, ya, sizeof want, NULL), 0);
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&gs, gone, 4096, NULL), 0);
  ck_assert_int_eq(cudaFree(gone), cudaSuccess);
  /* Past the allocation's end, the helper refuses locally. */
  ql_cuda_slice tmp;
  ck_assert_int_eq(ql_cuda_slice_from_ptr(&tmp, xa + 1028, sizeof x, NULL),
                   QL_EINVAL);

  Qlinear__V1__CudaIpcSlice mx, my;
  char msg[512];
  struct {
    const char *what;
    int rc;
    const char *in_msg;
  } cases[] = {
      {"short handle", QL_EINVAL, "64 bytes"},
      {"garbage handle", QL_EINVAL, "cannot open the CUDA IPC memory handle"},
      {"freed allocation", QL_EINVAL, "cannot open"},
      {"past the real end", QL_EINVAL, "do not fit the CUDA allocation"},
      {"overflowing offset", QL_EINVAL, "do not fit the CUDA allocation"},
      {"wrong request device", QL_EINVAL, "asks for device 'cuda:1'"},
      {"cpu slice", QL_ENOTSUP, "takes no CUDA IPC memory"},
      {"unknown device", QL_ENOTFOUND, "no device 'cuda:7'"},
      {"x and y on two devices", QL_EINVAL, "a request runs on one device"},
      {"short event", QL_EINVAL, "event handle has 64 bytes"},
      {"garbage event", QL_EINVAL, "cannot open the ready event"},
      {"y of the wrong length", QL_ESHAPE, "y_out_cuda slice holds"},
      {"y past the end", QL_EINVAL, "do not fit the CUDA allocation"},
      {"x and y overlap", QL_EINVAL, "overlap"},
  };
  uint8_t junk[QL_CUDA_IPC_HANDLE_BYTES];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)(i * 37 + 11);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *dev = NULL;
    const Qlinear__V1__CudaIpcSlice *yp = &my;
    slice_msg(&xs, &mx);
    slice_msg(&ys, &my);
    switch (i) {
    case 0:
      mx.mem_handle.len = 63;
      break;
    case 1:
      mx.mem_handle.data = junk;
      break;
    case 2:
      slice_msg(&gs, &mx);
      mx.length = sizeof x;
      break;
    case 3: /* 4 bytes past the end of the real allocation */
      mx.offset = xsize - sizeof x + 4;
      break;
    case 4:
      mx.offset = UINT64_MAX - 3; /* aligned; offset + length wraps */
      break;
    case 5:
      dev = "cuda:1";
      break;
    case 6:
      mx.device = "cpu";
      yp = NULL;
      break;
    case 7:
      mx.device = "cuda:7";
      break;
    case 8:
      my.device = "cuda:1";
      break;
    case 9:
      mx.ready_event.data = junk;
      mx.ready_event.len = 10;
      break;
    case 10:
      mx.ready_event.data = junk;
      mx.ready_event.len = sizeof junk;
      break;
    case 11:
      my.length = sizeof want - 4;
      break;
    case 12:
      my.offset = 4;
      break;
    case 13: /* y over x, in x's allocation */
      my.mem_handle.data = mx.mem_handle.data;
      my.offset = 1024 + 4 * K;
      if (my.offset + my.length > xsize)
        my.offset = xsize - my.length;
      break;
    }
    int rc = raw_linear(&d, "ipc/q8", dev, &mx, yp, msg, sizeof msg);
    ck_assert_msg(rc == cases[i].rc, "%s: %d (%s), want %d", cases[i].what,
                  rc, msg, cases[i].rc);
    ck_assert_msg(strstr(msg, cases[i].in_msg) != NULL,
                  "%s: message \"%s\" lacks \"%s\"", cases[i].what, msg,
                  cases[i].in_msg);
    /* No address in a message. */
    ck_assert_msg(strstr(msg, "0x") == NULL, "%s: \"%s\"", cases[i].what,
                  msg);
    /* Served meanwhile, and right. */
    ck_assert_int_eq(ql_linear(c, "ipc/q8", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                               M, K, x, N, got, NULL),
                     0);
    ck_assert(memcmp(got, want, sizeof got) == 0);
  }
  /* The slice that ends exactly at the allocation's end is fine, by alias
   * and with the request naming the same device. */
  slice_msg(&xs, &mx);
  slice_msg(&ys, &my);
  mx.device = "cuda:0";
  ck_assert_int_eq(raw_linear(&d, "ipc/q8", "cuda:0", &mx, &my, msg,
                              sizeof msg),
                   0);
  dev_read(got, ya, sizeof got);
  ck_assert(memcmp(got, want, sizeof got) == 0);
  /* The library's own checks, before anything is sent. */
  tmp = xs;
  tmp.length -= 4;
  ck_assert_int_eq(ql_linear_cuda(c, "ipc/q8", QL_PATH_AUTO, QL_DTYPE_F32, M,
                                  K, &tmp, N, &ys, NULL, NULL),
                   QL_ESHAPE);
  tmp = xs;
  tmp.offset += 2;
  ck_assert_int_eq(ql_linear_cuda(c, "ipc/q8", QL_PATH_AUTO, QL_DTYPE_F32, M,
                                  K, &tmp, N, &ys, NULL, NULL),
                   QL_EINVAL);
  tmp = ys;
  snprintf(tmp.device, sizeof tmp.device, "cuda:1");
  ck_assert_int_eq(ql_linear_cuda(c, "ipc/q8", QL_PATH_AUTO, QL_DTYPE_F32, M,
                                  K, &xs, N, &tmp, NULL, NULL),
                   QL_EINVAL);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  cudaFree(xa);
  cudaFree(ya);
  td_layer_free(&l);
}
END_TEST

/* A client killed with SIGKILL while its request runs: the daemon keeps
 * the import until the request ends, then closes it; nothing of the
 * client stays mapped, and the daemon serves on. */
START_TEST(kill9_mid_flight) {
  td d;
  setenv("QL_TEST_KERNEL_DELAY_MS", "3000", 1);
  start(&d, NULL);
  unsetenv("QL_TEST_KERNEL_DELAY_MS");
  ql_client *c = td_connect(&d);
  td_layer l;
  td_layer_make(&l, N, K, 9, 0);
  ck_assert_int_eq(td_load(c, "ipc/k9", &l, QL_FORMAT_Q8C, 0, 0, NULL, NULL),
                   0);
  /* The client is this program again, with a fresh libqlinear:
   * nanomsg does not survive fork(). */
  int out[2];
  ck_assert_int_eq(pipe(out), 0);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl("/proc/self/exe", "/proc/self/exe", "ipc-client", d.address,
          (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  char g;
  ck_assert_int_eq(read(out[0], &g, 1), 1);
  ck_assert_int_eq(g, 'g');
  close(out[0]);
  /* The import is opened at arrival, before the batch sleeps. */
  int opened = 0;
  for (int i = 0; i < 400 && opened < 2; i++) {
    char *log = td_read_log(&d);
    opened = td_count(log, "opened a CUDA IPC allocation");
    free(log);
    if (opened < 2)
      usleep(20000);
  }
  ck_assert_int_eq(opened, 2);
  ck_assert_int_eq(mappings_of(d.pid, child), 2);
  kill(child, SIGKILL);
  int st;
  ck_assert_int_eq(waitpid(child, &st, 0), child);
  ck_assert(WIFSIGNALED(st));
  ck_assert(wait_unmapped(&d, child));
  /* The session ended first; the imports closed after, when the request
   * that used them finished. */
  char *log = td_read_log(&d);
  const char *ended = strstr(log, "2 IPC allocations let go");
  const char *closed = strstr(log, "closed a CUDA IPC allocation");
  ck_assert_ptr_nonnull(ended);
  ck_assert_ptr_nonnull(closed);
  ck_assert_msg(ended < closed, "an import closed before its request ended");
  ck_assert_int_eq(td_count(log, "closed a CUDA IPC allocation"), 2);
  free(log);
  /* Still serving. */
  float x[M * K], y[M * N];
  uint64_t seed = 45;
  td_randn(&seed, x, M * K, 1.0f);
  ck_assert_int_eq(ql_linear(c, "ipc/k9", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32,
                             M, K, x, N, y, NULL),
                   0);
  ql_close(c);
  ck_assert_int_eq(td_stop(&d), 0);
  td_layer_free(&l);
}
END_TEST

/*
 * The client of kill9_mid_flight (argv: "ipc-client" address): x and y in
 * its device memory, one request, which it never sees answered. Writes
 * 'g' to stdout just before sending it.
 */
static int ipc_client(const char *address) {
  float x[M * K], y[M * N];
  uint64_t seed = 44;
  ql_client *c = NULL;
  void *xa = NULL, *ya = NULL;
  ql_cuda_slice xs, ys;
  td_randn(&seed, x, M * K, 1.0f);
  if (ql_connect(address, NULL, &c) != 0 ||
      cudaMalloc(&xa, sizeof x) != cudaSuccess ||
      cudaMalloc(&ya, sizeof y) != cudaSuccess ||
      cudaMemcpy(xa, x, sizeof x, cudaMemcpyHostToDevice) != cudaSuccess ||
      ql_cuda_slice_from_ptr(&xs, xa, sizeof x, NULL) != 0 ||
      ql_cuda_slice_from_ptr(&ys, ya, sizeof y, NULL) != 0)
    return 2;
  if (write(1, "g", 1) != 1)
    return 3;
  ql_linear_cuda(c, "ipc/k9", QL_PATH_WEIGHT_ONLY, QL_DTYPE_F32, M, K, &xs, N,
                 &ys, NULL, NULL);
  return 4;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "ipc-client") == 0)
    return ipc_client(argv[2]);
  Suite *s = suite_create("cuda_ipc");
  TCase *tc = tcase_create("cuda_ipc");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, q8c_aq_imma_rows);
  tcase_add_test(tc, multi);
  tcase_add_test(tc, hostile_slices);
  tcase_add_test(tc, kill9_mid_flight);
  suite_add_tcase(s, tc);
  return td_run_suite(s);
}
