/*
 * ocl_backend.c - the ze backend's kernels (the .cl files of kernels/ze/)
 * run through OpenCL, registered as a "ze" backend (ql__backend_ze_ocl):
 * the host that 'make check' uses to run every ze kernel through the
 * conformance harness on the CPU, with PoCL
 * (tests/conformance/test_conformance_ze). It is linked into the test
 * programs only (Makefile.am, "Level Zero"); the daemon's ze backend is the
 * Level Zero host code of backend.c, which loads the SPIR-V built from the
 * same sources and mirrors these ops.
 *
 * The kernels are built from source at run time, once per process (the
 * harness forks its workers before any kernel runs, so each builds its
 * own), from QL_ZE_KERNEL_DIR with the options of the SPIR-V build that
 * matter for the numbers: OpenCL C 1.2 and correctly rounded f32 divide
 * (quantize_rows is bit-exact only with it). PoCL 3.1 has no sub-groups,
 * so this runs the local-memory path of common.clh.
 *
 * Ops mirror kernels/cuda/backend.cpp: the same argument checks as the
 * reference, NaN/Inf in x failing a linear call before y is written (a
 * check kernel first), and quantize_rows failing as the reference does
 * (the first offending value of the first offending row decides between
 * QL_ENONFINITE and QL_EINVAL). Every device output has a guard after its
 * end that is checked when it is read back: a kernel that writes past an
 * output fails the call with QL_EINTERNAL and says so on stderr.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ql_ze.h"
#include "registry.h"

#ifndef QL_ZE_KERNEL_DIR
#error "QL_ZE_KERNEL_DIR: the directory of the .cl sources (Makefile.am)"
#endif

/* ql_ze.h repeats these numbers for the OpenCL C side. */
_Static_assert(QL_ZE_DT_F32 == QL_DTYPE_F32 && QL_ZE_DT_F16 == QL_DTYPE_F16 &&
                   QL_ZE_DT_BF16 == QL_DTYPE_BF16,
               "ql_ze.h dtypes");
_Static_assert(QL_ZE_FMT_Q4G == QL_FORMAT_Q4G &&
                   QL_ZE_FMT_Q8C == QL_FORMAT_Q8C &&
                   QL_ZE_FMT_Q8B == QL_FORMAT_Q8B &&
                   QL_ZE_FMT_F8R == QL_FORMAT_F8R,
               "ql_ze.h formats");
_Static_assert(QL_ZE_QROWS_I8 == QL_QROWS_I8 &&
                   QL_ZE_QROWS_E4M3 == QL_QROWS_E4M3,
               "ql_ze.h quantize_rows kinds");

/* ---- the OpenCL state of this process ---- */

enum {
  K_QROWS,
  K_FINITE,
  K_WO_Q4G,
  K_WO_Q8C,
  K_WO_Q8B,
  K_WO_F8R,
  K_AQ_Q8C,
  K_AQ_Q4G,
  K_COUNT
};

static const struct {
  const char *name;
  int source; /* index into sources[] */
} kernels[K_COUNT] = {
    {"ql_ze_quantize_rows", 0}, {"ql_ze_check_finite", 0},
    {"ql_ze_wo_q4g", 1},        {"ql_ze_wo_q8c", 1},
    {"ql_ze_wo_q8b", 1},        {"ql_ze_wo_f8r", 1},
    {"ql_ze_aq_q8c", 2},        {"ql_ze_aq_q4g", 2},
};

/* One program per file, as the SPIR-V build makes one module per file. */
static const char *const sources[] = {"quantize_rows.cl", "linear_wo.cl",
                                      "linear_aq.cl"};
#define NSOURCES (sizeof sources / sizeof sources[0])

static const char build_options[] =
    "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt -I" QL_ZE_KERNEL_DIR;

/* QL_ZE_CL_OPTIONS in the environment is appended to the build options:
 * the mutation test (tests/conformance/test_ze_mutants.sh) builds the
 * kernels with one QL_ZE_MUT_* bug each that way. */
#define EXTRA_OPTIONS_ENV "QL_ZE_CL_OPTIONS"

static struct {
  pthread_once_t once;
  pthread_mutex_t mu; /* kernels' arguments are shared state */
  int rc;             /* 0, or why the state could not be built */
  cl_context ctx;
  cl_command_queue queue;
  cl_program prog[NSOURCES];
  cl_kernel k[K_COUNT];
} g = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, 0, NULL, NULL, {NULL},
       {NULL}};

/* The whole text of file name in QL_ZE_KERNEL_DIR, NUL-terminated. */
static char *read_source(const char *name) {
  char path[4096];
  FILE *f;
  char *buf = NULL;
  long len;

  snprintf(path, sizeof path, "%s/%s", QL_ZE_KERNEL_DIR, name);
  if ((f = fopen(path, "rb")) == NULL) {
    fprintf(stderr, "ze(opencl): cannot open %s\n", path);
    return NULL;
  }
  if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) != NULL) {
    if (fread(buf, 1, (size_t)len, f) == (size_t)len) {
      buf[len] = '\0';
    } else {
      free(buf);
      buf = NULL;
    }
  }
  fclose(f);
  if (buf == NULL)
    fprintf(stderr, "ze(opencl): cannot read %s\n", path);
  return buf;
}

/* The first device of the first platform that has one. */
static cl_int pick_device(cl_device_id *dev) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(16, plats, &np);

  if (err != CL_SUCCESS)
    return err;
  for (cl_uint i = 0; i < np && i < 16; i++)
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, dev, NULL) ==
        CL_SUCCESS)
      return CL_SUCCESS;
  return CL_DEVICE_NOT_FOUND;
}

static void init_once(void) {
  char options[sizeof build_options + 512];
  cl_device_id dev;
  cl_device_fp_config fp = 0;
  cl_int err;

  g.rc = QL_EINTERNAL;
  if ((err = pick_device(&dev)) != CL_SUCCESS) {
    fprintf(stderr,
            "ze(opencl): no OpenCL device (error %d); make check runs the ze "
            "kernels on PoCL: install pocl-opencl-icd (deploy/bootstrap)\n",
            (int)err);
    return;
  }
  /* Without a correctly rounded divide the flag is not honoured and
   * quantize_rows cannot be bit-exact (OpenCL 1.2 §4.2, table 4.3,
   * CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT). */
  clGetDeviceInfo(dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
  if (!(fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT)) {
    fprintf(stderr, "ze(opencl): the device has no correctly rounded f32 "
                    "divide: quantize_rows could not be bit-exact\n");
    return;
  }
  g.ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err != CL_SUCCESS)
    goto cl_fail;
  g.queue = clCreateCommandQueue(g.ctx, dev, 0, &err);
  if (err != CL_SUCCESS)
    goto cl_fail;
  {
    const char *extra = getenv(EXTRA_OPTIONS_ENV);
    snprintf(options, sizeof options, "%s %s", build_options,
             extra != NULL ? extra : "");
  }
  for (size_t i = 0; i < NSOURCES; i++) {
    char *src = read_source(sources[i]);
    const char *s = src;
    if (src == NULL)
      return;
    g.prog[i] = clCreateProgramWithSource(g.ctx, 1, &s, NULL, &err);
    free(src);
    if (err != CL_SUCCESS)
      goto cl_fail;
    err = clBuildProgram(g.prog[i], 1, &dev, options, NULL, NULL);
    if (err != CL_SUCCESS) {
      char log[16384] = "";
      clGetProgramBuildInfo(g.prog[i], dev, CL_PROGRAM_BUILD_LOG,
                            sizeof log - 1, log, NULL);
      fprintf(stderr, "ze(opencl): building %s failed (%d):\n%s\n",
              sources[i], (int)err, log);
      return;
    }
  }
  for (int i = 0; i < K_COUNT; i++) {
    g.k[i] = clCreateKernel(g.prog[kernels[i].source], kernels[i].name, &err);
    if (err != CL_SUCCESS)
      goto cl_fail;
  }
  g.rc = 0;
  return;
cl_fail:
  fprintf(stderr, "ze(opencl): setting up the device failed (error %d)\n",
          (int)err);
}

/* 0 when the kernels are ready (and then g.mu is held), else the error. */
static int ocl_enter(void) {
  pthread_once(&g.once, init_once);
  if (g.rc != 0)
    return g.rc;
  pthread_mutex_lock(&g.mu);
  return 0;
}

static void ocl_leave(void) { pthread_mutex_unlock(&g.mu); }

/* ---- buffers ---- */

/* Bytes after every output buffer, filled with GUARD_BYTE and checked on
 * read-back. */
#define GUARD 64
#define GUARD_BYTE 0xA5

static int mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a)
    return 0;
  *out = a * b;
  return 1;
}

/* A read-only buffer holding a copy of src[0..n). */
static cl_mem buf_in(const void *src, size_t n) {
  cl_int err;
  return clCreateBuffer(g.ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n,
                        (void *)src, &err);
}

/* An output buffer of n bytes plus the guard, starting as init[0..n)
 * (zeros when init is NULL), so that what a kernel leaves unwritten comes
 * back as it was. */
static cl_mem buf_out(const void *init, size_t n) {
  unsigned char *tmp = malloc(n + GUARD);
  cl_mem m;
  cl_int err;

  if (tmp == NULL)
    return NULL;
  if (init != NULL)
    memcpy(tmp, init, n);
  else
    memset(tmp, 0, n);
  memset(tmp + n, GUARD_BYTE, GUARD);
  m = clCreateBuffer(g.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                     n + GUARD, tmp, &err);
  free(tmp);
  return err == CL_SUCCESS ? m : NULL;
}

/* Reads n bytes of m into dst (NULL: only the guard is checked). */
static int buf_read(cl_mem m, void *dst, size_t n, const char *what) {
  unsigned char *tmp = malloc(n + GUARD);
  int rc = 0;

  if (tmp == NULL)
    return QL_ENOMEM;
  if (clEnqueueReadBuffer(g.queue, m, CL_TRUE, 0, n + GUARD, tmp, 0, NULL,
                          NULL) != CL_SUCCESS) {
    rc = QL_EINTERNAL;
  } else {
    for (size_t i = 0; i < GUARD; i++)
      if (tmp[n + i] != GUARD_BYTE) {
        fprintf(stderr, "ze(opencl): a kernel wrote past %s (%zu bytes)\n",
                what, n);
        rc = QL_EINTERNAL;
        break;
      }
    if (rc == 0 && dst != NULL)
      memcpy(dst, tmp, n);
  }
  free(tmp);
  return rc;
}

static void buf_free(cl_mem m) {
  if (m != NULL)
    clReleaseMemObject(m);
}

/* clSetKernelArg for a run of arguments, keeping the first error. */
typedef struct kargs {
  cl_kernel k;
  cl_uint i;
  cl_int err;
} kargs;

static void karg(kargs *a, size_t size, const void *v) {
  cl_int e = clSetKernelArg(a->k, a->i++, size, v);
  if (a->err == CL_SUCCESS)
    a->err = e;
}
static void karg_l(kargs *a, int64_t v) {
  cl_long l = v;
  karg(a, sizeof l, &l);
}
static void karg_i(kargs *a, int v) {
  cl_int i = v;
  karg(a, sizeof i, &i);
}
/* A buffer, or NULL (OpenCL 1.2 §5.7.2: a NULL arg_value gives the kernel a
 * NULL pointer). */
static void karg_m(kargs *a, cl_mem m) {
  karg(a, sizeof(cl_mem), m != NULL ? (const void *)&m : NULL);
}

/* Enqueues kernel k over global[0..dims) in work-groups of local[]. */
static int launch(const kargs *a, cl_uint dims, const size_t *global,
                  const size_t *local) {
  if (a->err != CL_SUCCESS ||
      clEnqueueNDRangeKernel(g.queue, a->k, dims, NULL, global, local, 0,
                             NULL, NULL) != CL_SUCCESS)
    return QL_EINTERNAL;
  return 0;
}

/* ---- the layout "ze-1" (ql_ze.h) ---- */

typedef struct packed {
  int format, sdt, asym;
  int64_t n, k, groups;
  uint32_t gs;
  int64_t ldq;                  /* bytes between rows of q */
  cl_mem q, scale, zero, bias;  /* zero, bias: NULL when the weight has none */
  size_t bytes;
} packed;

static int64_t row_bytes(const ql_qweight *w) {
  return w->format == QL_FORMAT_Q4G ? w->k / 2 + (w->k & 1) : w->k;
}

static int packed_matches(const packed *p, const ql_qweight *w) {
  return p->format == (int)w->format && p->n == w->n && p->k == w->k &&
         p->groups == w->groups && p->gs == w->group_size &&
         p->sdt == (int)w->scale_dtype && p->asym == w->asymmetric &&
         (p->zero != NULL) == (w->zero != NULL) &&
         (p->bias != NULL) == (w->bias != NULL);
}

static void free_packed(void *pp) {
  packed *p = pp;
  if (p == NULL)
    return;
  buf_free(p->q);
  buf_free(p->scale);
  buf_free(p->zero);
  buf_free(p->bias);
  free(p);
}

/* Builds w's layout on the device; g.mu held. Rows of codes padded with
 * zeros to QL_ZE_ROW_ALIGN bytes, scale and zero transposed from [G, N]
 * to [N, G] in their dtype, bias copied. */
static int make_packed(const ql_qweight *w, packed **out) {
  size_t n, gg, ssz, rb, ldq, qb, sb;
  unsigned char *hq = NULL, *hs = NULL, *hz = NULL;
  packed *p = NULL;
  int rc;

  *out = NULL;
  if ((rc = ql_qweight_check(w)) != 0)
    return rc;
  n = (size_t)w->n;
  gg = (size_t)w->groups;
  ssz = ql_dtype_size(w->scale_dtype);
  rb = (size_t)row_bytes(w);
  ldq = (rb + QL_ZE_ROW_ALIGN - 1) / QL_ZE_ROW_ALIGN * QL_ZE_ROW_ALIGN;
  if (!mul_size(n, ldq, &qb) || !mul_size(n, gg, &sb) ||
      !mul_size(sb, ssz, &sb))
    return QL_ESHAPE;
  rc = QL_ENOMEM;
  if ((p = calloc(1, sizeof *p)) == NULL || (hq = calloc(1, qb)) == NULL ||
      (hs = malloc(sb)) == NULL ||
      (w->zero != NULL && (hz = malloc(sb)) == NULL))
    goto fail;
  for (size_t r = 0; r < n; r++)
    memcpy(hq + r * ldq, w->qdata + r * rb, rb);
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < gg; j++) {
      memcpy(hs + (r * gg + j) * ssz,
             (const unsigned char *)w->scale + (j * n + r) * ssz, ssz);
      if (hz != NULL)
        memcpy(hz + (r * gg + j) * ssz,
               (const unsigned char *)w->zero + (j * n + r) * ssz, ssz);
    }
  p->format = (int)w->format;
  p->sdt = (int)w->scale_dtype;
  p->asym = w->asymmetric;
  p->n = w->n;
  p->k = w->k;
  p->groups = w->groups;
  p->gs = w->group_size;
  p->ldq = (int64_t)ldq;
  p->bytes = qb + sb * (hz != NULL ? 2 : 1) +
             (w->bias != NULL ? n * sizeof(float) : 0);
  rc = QL_EINTERNAL;
  if ((p->q = buf_in(hq, qb)) == NULL || (p->scale = buf_in(hs, sb)) == NULL ||
      (hz != NULL && (p->zero = buf_in(hz, sb)) == NULL) ||
      (w->bias != NULL &&
       (p->bias = buf_in(w->bias, n * sizeof(float))) == NULL))
    goto fail;
  *out = p;
  p = NULL;
  rc = 0;
fail:
  free(hq);
  free(hs);
  free(hz);
  free_packed(p);
  return rc;
}

static int repack(ql_repack_args *a) {
  packed *p = NULL;
  int rc;

  if (a == NULL || a->w == NULL)
    return QL_EINVAL;
  a->packed = NULL;
  a->packed_bytes = 0;
  if ((rc = ocl_enter()) != 0)
    return rc;
  rc = make_packed(a->w, &p);
  ocl_leave();
  if (rc == 0) {
    a->packed = p;
    a->packed_bytes = p->bytes + sizeof *p;
  }
  return rc;
}

/* ---- linear ops ---- */

/* The argument checks of kernels/reference.c op_args(). */
static int linear_args(const ql_linear_args *a, size_t *mk) {
  size_t mn, bytes;
  int rc;

  if (a == NULL || a->w == NULL || a->x == NULL || a->y == NULL)
    return QL_EINVAL;
  if ((rc = ql_qweight_check(a->w)) != 0)
    return rc;
  if (ql_dtype_size(a->dt) == 0)
    return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX)
    return QL_ESHAPE;
  if (!mul_size((size_t)a->m, (size_t)a->w->k, mk) ||
      !mul_size(*mk, sizeof(float), &bytes) ||
      !mul_size((size_t)a->m, (size_t)a->w->n, &mn) ||
      !mul_size(mn, sizeof(float), &bytes))
    return QL_ESHAPE;
  return 0;
}

/* The caller's layout, or one made for this call in *tmp. g.mu held. */
static int layout_for(const ql_linear_args *a, const packed **p, packed **tmp) {
  *tmp = NULL;
  if (a->packed != NULL) {
    *p = a->packed;
    return packed_matches(*p, a->w) ? 0 : QL_EINVAL;
  }
  {
    int rc = make_packed(a->w, tmp);
    *p = *tmp;
    return rc;
  }
}

/* QL_ENONFINITE when x [count] of dtype dt holds NaN or ±Inf. */
static int check_finite(int dt, cl_mem x, size_t count) {
  size_t groups = (count + QL_ZE_QWG - 1) / QL_ZE_QWG, global, local;
  cl_mem bad = buf_out(NULL, sizeof(cl_int));
  cl_int hbad = 0;
  kargs ka = {g.k[K_FINITE], 0, CL_SUCCESS};
  int rc;

  if (bad == NULL)
    return QL_EINTERNAL;
  if (groups > 256) /* each work-item strides over the rest */
    groups = 256;
  global = groups * QL_ZE_QWG;
  local = QL_ZE_QWG;
  karg_i(&ka, dt);
  karg_l(&ka, (int64_t)count);
  karg_m(&ka, x);
  karg_m(&ka, bad);
  rc = launch(&ka, 1, &global, &local);
  if (rc == 0)
    rc = buf_read(bad, &hbad, sizeof hbad, "the finiteness flag");
  buf_free(bad);
  if (rc == 0 && hbad)
    rc = QL_ENONFINITE;
  return rc;
}

/* The 2-D range of the linear kernels (ql_ze.h). */
static int launch_linear(const kargs *ka, int64_t n, int64_t m) {
  size_t global[2], local[2] = {QL_ZE_WG, 1};
  global[0] = (size_t)((n + QL_ZE_NG - 1) / QL_ZE_NG) * QL_ZE_WG;
  global[1] = (size_t)((m + QL_ZE_MT - 1) / QL_ZE_MT);
  return launch(ka, 2, global, local);
}

static int run_wo(const ql_linear_args *a) {
  static const int kid[] = {[QL_FORMAT_Q4G] = K_WO_Q4G,
                            [QL_FORMAT_Q8C] = K_WO_Q8C,
                            [QL_FORMAT_Q8B] = K_WO_Q8B,
                            [QL_FORMAT_F8R] = K_WO_F8R};
  const packed *p;
  packed *tmp = NULL;
  cl_mem x = NULL, y = NULL;
  size_t mk, esz, yb;
  int rc;

  if ((rc = linear_args(a, &mk)) != 0)
    return rc;
  esz = ql_dtype_size(a->dt);
  yb = (size_t)a->m * (size_t)a->w->n * esz;
  if ((rc = ocl_enter()) != 0)
    return rc;
  if ((rc = layout_for(a, &p, &tmp)) != 0)
    goto out;
  rc = QL_EINTERNAL;
  if ((x = buf_in(a->x, mk * esz)) == NULL)
    goto out;
  /* NaN/Inf fail the call before y is written (DESIGN §4). */
  if ((rc = check_finite((int)a->dt, x, mk)) != 0)
    goto out;
  rc = QL_EINTERNAL;
  if ((y = buf_out(a->y, yb)) == NULL)
    goto out;
  {
    kargs ka = {g.k[kid[p->format]], 0, CL_SUCCESS};
    karg_l(&ka, p->n);
    karg_l(&ka, p->k);
    karg_l(&ka, (int64_t)p->gs);
    karg_l(&ka, p->groups);
    karg_i(&ka, (int)a->dt);
    karg_i(&ka, p->sdt);
    karg_m(&ka, p->q);
    karg_l(&ka, p->ldq);
    karg_m(&ka, p->scale);
    karg_m(&ka, p->zero);
    karg_m(&ka, p->bias);
    karg_m(&ka, x);
    karg_l(&ka, a->m);
    karg_m(&ka, y);
    if ((rc = launch_linear(&ka, p->n, a->m)) == 0)
      rc = buf_read(y, a->y, yb, "y");
  }
out:
  buf_free(x);
  buf_free(y);
  free_packed(tmp);
  ocl_leave();
  return rc;
}

/*
 * Runs ql_ze_quantize_rows on m rows of x (dtype xdt, the rule of src)
 * into the device buffers xq, sx, gsum (may be NULL) and returns what the
 * reference would: 0, QL_ENONFINITE or QL_EINVAL, decided by the first
 * offending row's first offending value. g.mu held.
 */
static int quantize(int kind, int xdt, int src, cl_mem x, int64_t m,
                    int64_t k, int64_t gs, int64_t groups, cl_mem xq,
                    cl_mem sx, cl_mem gsum) {
  size_t sbytes = (size_t)m * sizeof(cl_long);
  size_t global = (size_t)m * QL_ZE_QWG, local = QL_ZE_QWG;
  cl_long *hs = malloc(sbytes);
  cl_mem st = buf_out(NULL, sbytes);
  kargs ka = {g.k[K_QROWS], 0, CL_SUCCESS};
  int rc = QL_EINTERNAL;

  if (hs == NULL || st == NULL)
    goto out;
  karg_i(&ka, kind);
  karg_i(&ka, xdt);
  karg_i(&ka, src);
  karg_l(&ka, k);
  karg_l(&ka, gs);
  karg_l(&ka, groups);
  karg_m(&ka, x);
  karg_m(&ka, xq);
  karg_m(&ka, sx);
  karg_m(&ka, gsum);
  karg_m(&ka, st);
  if ((rc = launch(&ka, 1, &global, &local)) != 0 ||
      (rc = buf_read(st, hs, sbytes, "the row status")) != 0)
    goto out;
  for (int64_t r = 0; r < m && rc == 0; r++)
    if (hs[r] != 0)
      rc = (hs[r] & 3) == QL_ZE_ST_NONFINITE ? QL_ENONFINITE : QL_EINVAL;
out:
  free(hs);
  buf_free(st);
  return rc;
}

static int supports_aq(const ql_kernel_impl *im, ql_format f, int64_t m,
                       int64_t n, int64_t k) {
  (void)im;
  (void)m;
  (void)n;
  /* q8c sums all of K in an int32 (DESIGN §4) */
  return f != QL_FORMAT_Q8C || k <= QL_AQ_Q8C_MAX_K;
}

static int run_aq(const ql_linear_args *a) {
  const packed *p;
  packed *tmp = NULL;
  cl_mem x = NULL, xq = NULL, sx = NULL, gsum = NULL, y = NULL;
  size_t mk, esz, yb, mg = 0;
  int q4g, rc;

  if ((rc = linear_args(a, &mk)) != 0)
    return rc;
  if (a->w->format != QL_FORMAT_Q4G && a->w->format != QL_FORMAT_Q8C)
    return QL_ENOTSUP;
  if (a->w->format == QL_FORMAT_Q8C && a->w->k > QL_AQ_Q8C_MAX_K)
    return QL_ESHAPE;
  q4g = a->w->format == QL_FORMAT_Q4G;
  if (q4g && !mul_size((size_t)a->m, (size_t)a->w->groups, &mg))
    return QL_ESHAPE;
  esz = ql_dtype_size(a->dt);
  yb = (size_t)a->m * (size_t)a->w->n * esz;
  if ((rc = ocl_enter()) != 0)
    return rc;
  if ((rc = layout_for(a, &p, &tmp)) != 0)
    goto out;
  rc = QL_EINTERNAL;
  if ((x = buf_in(a->x, mk * esz)) == NULL ||
      (xq = buf_out(NULL, mk)) == NULL ||
      (sx = buf_out(NULL, (size_t)a->m * sizeof(float))) == NULL ||
      (q4g && (gsum = buf_out(NULL, mg * sizeof(cl_int))) == NULL))
    goto out;
  /* x in dt, quantized with dt's rule: what ql_linear_aq_ref does. */
  rc = quantize(QL_ZE_QROWS_I8, (int)a->dt, (int)a->dt, x, a->m, p->k,
                q4g ? (int64_t)p->gs : p->k, q4g ? p->groups : 1, xq, sx,
                gsum);
  if (rc != 0)
    goto out;
  rc = QL_EINTERNAL;
  if ((y = buf_out(a->y, yb)) == NULL)
    goto out;
  {
    kargs ka = {g.k[q4g ? K_AQ_Q4G : K_AQ_Q8C], 0, CL_SUCCESS};
    karg_l(&ka, p->n);
    karg_l(&ka, p->k);
    if (q4g) {
      karg_l(&ka, (int64_t)p->gs);
      karg_l(&ka, p->groups);
    }
    karg_i(&ka, (int)a->dt);
    karg_i(&ka, p->sdt);
    karg_m(&ka, p->q);
    karg_l(&ka, p->ldq);
    karg_m(&ka, p->scale);
    if (q4g)
      karg_m(&ka, p->zero);
    karg_m(&ka, p->bias);
    karg_m(&ka, xq);
    karg_m(&ka, sx);
    if (q4g)
      karg_m(&ka, gsum);
    karg_l(&ka, a->m);
    karg_m(&ka, y);
    if ((rc = launch_linear(&ka, p->n, a->m)) == 0)
      rc = buf_read(y, a->y, yb, "y");
  }
  /* the intermediate outputs' guards too */
  if (rc == 0)
    rc = buf_read(xq, NULL, mk, "xq");
  if (rc == 0)
    rc = buf_read(sx, NULL, (size_t)a->m * sizeof(float), "sx");
  if (rc == 0 && gsum != NULL)
    rc = buf_read(gsum, NULL, mg * sizeof(cl_int), "gsum");
out:
  buf_free(x);
  buf_free(xq);
  buf_free(sx);
  buf_free(gsum);
  buf_free(y);
  free_packed(tmp);
  ocl_leave();
  return rc;
}

/* ---- quantize_rows ---- */

/* The argument checks of ql_quantize_rows_i8_src / _e4m3_src and of
 * ql_qrows_args (registry.h). */
static int qrows_args(const ql_qrows_args *a, ql_dtype *src, int64_t *groups,
                      size_t *mk, size_t *mg) {
  if (a == NULL || a->x == NULL || a->xq == NULL || a->sx == NULL)
    return QL_EINVAL;
  if (a->kind != QL_QROWS_I8 && a->kind != QL_QROWS_E4M3)
    return QL_EINVAL;
  if (a->kind == QL_QROWS_E4M3 && a->gsum != NULL)
    return QL_EINVAL;
  if (a->kind == QL_QROWS_I8 && a->gs < 1)
    return QL_EINVAL;
  *src = (int)a->src == 0 ? QL_DTYPE_F32 : a->src;
  if (!ql_dtype_valid((int)*src))
    return QL_EDTYPE;
  if (a->m < 1 || a->m > QL_DIM_MAX || a->k < 1 || a->k > QL_DIM_MAX)
    return QL_ESHAPE;
  *groups = a->kind == QL_QROWS_I8 ? (a->k + a->gs - 1) / a->gs : 1;
  if (!mul_size((size_t)a->m, (size_t)a->k, mk) ||
      !mul_size((size_t)a->m, (size_t)*groups, mg) ||
      !mul_size(*mk, sizeof(float), &(size_t){0}) ||
      !mul_size(*mg, sizeof(int32_t), &(size_t){0}))
    return QL_ESHAPE;
  if (a->gsum != NULL &&
      ((int64_t)a->gs < a->k ? (int64_t)a->gs : a->k) > QL_QROWS_MAX_GROUP)
    return QL_ESHAPE;
  return 0;
}

static int run_qrows(const ql_qrows_args *a) {
  cl_mem x = NULL, xq = NULL, sx = NULL, gsum = NULL;
  size_t mk, mg, sb;
  int64_t groups;
  ql_dtype src;
  int rc;

  if ((rc = qrows_args(a, &src, &groups, &mk, &mg)) != 0)
    return rc;
  sb = (size_t)a->m * sizeof(float);
  if ((rc = ocl_enter()) != 0)
    return rc;
  rc = QL_EINTERNAL;
  /* Outputs start as the caller's bytes: what the kernel leaves unwritten
   * comes back unchanged, and a caller that prefilled them sees it. */
  if ((x = buf_in(a->x, mk * sizeof(float))) == NULL ||
      (xq = buf_out(a->xq, mk)) == NULL || (sx = buf_out(a->sx, sb)) == NULL ||
      (a->gsum != NULL &&
       (gsum = buf_out(a->gsum, mg * sizeof(int32_t))) == NULL))
    goto out;
  rc = quantize(a->kind == QL_QROWS_I8 ? QL_ZE_QROWS_I8 : QL_ZE_QROWS_E4M3,
                QL_ZE_DT_F32, (int)src, x, a->m, a->k,
                a->kind == QL_QROWS_I8 ? (int64_t)a->gs : a->k, groups, xq, sx,
                gsum);
  {
    /* read back even after a refusal: the outputs are then unspecified,
     * but the guards still say whether a kernel overran them */
    int r2 = buf_read(xq, a->xq, mk, "xq");
    if (r2 == 0)
      r2 = buf_read(sx, a->sx, sb, "sx");
    if (r2 == 0 && gsum != NULL)
      r2 = buf_read(gsum, a->gsum, mg * sizeof(int32_t), "gsum");
    if (r2 != 0)
      rc = r2;
  }
out:
  buf_free(x);
  buf_free(xq);
  buf_free(sx);
  buf_free(gsum);
  ocl_leave();
  return rc;
}

/* ---- registration ---- */

#define FMTS_WO QL_ALL_FORMATS
#define FMTS_AQ (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C))
#define FMTS_QROWS                                                             \
  (QL_FMT_BIT(QL_FORMAT_Q4G) | QL_FMT_BIT(QL_FORMAT_Q8C) |                     \
   QL_FMT_BIT(QL_FORMAT_F8R))

static const ql_kernel_impl impls[] = {
    {.name = "ze.repack",
     .op = QL_OP_REPACK,
     .formats = FMTS_WO,
     .dtypes = QL_ALL_DTYPES,
     .fn.repack = repack,
     .free_packed = free_packed},
    {.name = "ze.linear_wo",
     .op = QL_OP_LINEAR_WO,
     .formats = FMTS_WO,
     .dtypes = QL_ALL_DTYPES,
     .fn.linear = run_wo},
    {.name = "ze.linear_aq",
     .op = QL_OP_LINEAR_AQ,
     .formats = FMTS_AQ,
     .dtypes = QL_ALL_DTYPES,
     .supports = supports_aq,
     .fn.linear = run_aq},
    {.name = "ze.quantize_rows",
     .op = QL_OP_QUANTIZE_ROWS,
     .formats = FMTS_QROWS,
     .dtypes = QL_ALL_DTYPES,
     .fn.quantize_rows = run_qrows},
};

const ql_backend ql__backend_ze_ocl = {.name = "ze",
                                       .impls = impls,
                                       .n_impls =
                                           sizeof impls / sizeof impls[0]};
