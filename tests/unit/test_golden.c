/*
 * test_golden.c - qlinear against the golden vectors TorchAO produced
 * (tests/data/golden/, written by tests/data/make_golden.py; each case's
 * meta.txt names the TorchAO function that made it).
 *
 * Four checks per case, each a loop test over the cases of index.txt:
 *   quantize  (a) ql_qweight_quantize() on the same f32/bf16/f16 weight
 *                 gives TorchAO's qdata, scale and zero bit for bit, with
 *                 the default scale dtype in the dtype TorchAO stores
 *                 them in, and the same weight as ql_qweight_import() of
 *                 TorchAO's tensors (one digest, one resident copy);
 *   import    (b) ql_qweight_import() of TorchAO's packed tensors (canonical
 *                 and integer-zero-point forms) dequantizes to TorchAO's
 *                 dequantized weight: bit for bit, except q4g with f32
 *                 scales, where TorchAO's own dequantization evaluates
 *                 another formula (bound below);
 *   linear    (c) ql_linear_wo_ref (and ql_linear_aq_ref for the AQ cases)
 *                 on the imported weight against TorchAO's product in f64,
 *                 within a K-dependent fp32 bound (for a bf16/f16 request,
 *                 the f32 value it rounds once);
 *   act       (d) ql_quantize_rows_i8_src / ql_quantize_rows_e4m3_src with
 *                 the activation's dtype give TorchAO's per-token
 *                 activation quantization bit for bit.
 * Where TorchAO and DESIGN §4 disagree, these tests follow TorchAO.
 *
 * The data directory is $QL_TEST_DATA (make check sets it), else
 * tests/data below the current directory. A missing or empty golden
 * directory fails the run: it never skips.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "npy.h"
#include "ql_kernels.h"
#include "testutil.h"

#define MAX_CASES 64
#define U32 0x1p-24 /* unit roundoff of f32 */

static char golden_dir[4096];
static char cases[MAX_CASES][64];
static int ncases;
static char index_error[4608];

/* ------------------------------------------------------------ loading */

typedef struct meta {
  char key[32][40];
  char val[32][512];
  int n;
} meta;

static void load_meta(const char *c, meta *m) {
  char path[4400], line[600];
  FILE *f;

  snprintf(path, sizeof path, "%s/%s/meta.txt", golden_dir, c);
  f = fopen(path, "r");
  REQUIRE(f != NULL, "%s: cannot open", path);
  m->n = 0;
  while (fgets(line, sizeof line, f) != NULL && m->n < 32) {
    char *eq = strchr(line, '=');
    size_t l = strlen(line);
    if (l > 0 && line[l - 1] == '\n')
      line[--l] = '\0';
    if (eq == NULL || line[0] == '#')
      continue;
    *eq = '\0';
    snprintf(m->key[m->n], sizeof m->key[0], "%.39s", line);
    snprintf(m->val[m->n], sizeof m->val[0], "%.511s", eq + 1);
    m->n++;
  }
  fclose(f);
}

static const char *get(const meta *m, const char *key) {
  for (int i = 0; i < m->n; i++)
    if (strcmp(m->key[i], key) == 0)
      return m->val[i];
  ck_abort_msg("meta.txt lacks %s", key);
  return NULL;
}

static int64_t get_int(const meta *m, const char *key) {
  return strtoll(get(m, key), NULL, 10);
}

static int is(const meta *m, const char *key, const char *val) {
  return strcmp(get(m, key), val) == 0;
}

static ql_dtype dtype_of(const char *s) {
  if (strcmp(s, "f32") == 0)
    return QL_DTYPE_F32;
  if (strcmp(s, "f16") == 0)
    return QL_DTYPE_F16;
  if (strcmp(s, "bf16") == 0)
    return QL_DTYPE_BF16;
  ck_abort_msg("unknown dtype %s", s);
  return QL_DTYPE_F32;
}

/* An array of a case, its data copied to an aligned buffer (a->data points
 * there; free with unload()). */
typedef struct arr {
  ql__npy npy;
  void *data;
  size_t bytes;
} arr;

static void load(const char *c, const char *name, arr *a) {
  char path[4400], err[256];

  snprintf(path, sizeof path, "%s/%s/%s.npy", golden_dir, c, name);
  int rv = ql__npy_load_types(path, QL__NPY_ALL_TYPES, &a->npy, err,
                              sizeof err);
  REQUIRE(rv == 0, "%s: %s", path, err);
  a->bytes = a->npy.data_len;
  a->data = tu_xmalloc(a->bytes + 1);
  memcpy(a->data, a->npy.data, a->bytes);
}

static void unload(arr *a) {
  ql__npy_free(&a->npy);
  free(a->data);
  a->data = NULL;
}

/* The ql_array_dtype of a golden array: '<u2' always holds bf16 here, and
 * '|u1' float8 codes where the caller says so. */
static int adt(const arr *a, int u8_is_f8) {
  int t = ql__npy_adt(a->npy.type, u8_is_f8);
  ck_assert_msg(t != 0, "golden array of npy type %d", (int)a->npy.type);
  return t;
}

static ql_array as_array(const arr *a, int u8_is_f8) {
  ql_array r;
  memset(&r, 0, sizeof r);
  r.data = a->data;
  r.bytes = a->bytes;
  r.dtype = adt(a, u8_is_f8);
  r.ndim = a->npy.ndim;
  r.shape[0] = (int64_t)a->npy.shape[0];
  r.shape[1] = (int64_t)a->npy.shape[1];
  return r;
}

/* A float array (f32, f16 or bf16) widened to f32. */
static float *widen(const arr *a) {
  size_t n = a->npy.count;
  float *f = tu_xmalloc((n + 1) * sizeof *f);
  ql_to_f32((ql_dtype)adt(a, 0), a->data, f, n);
  return f;
}

static void check_shape(const arr *a, const char *what, uint64_t d0,
                        uint64_t d1) {
  REQUIRE(a->npy.shape[0] == d0 && a->npy.shape[1] == d1,
          "%s: shape [%llu,%llu], expected [%llu,%llu]", what,
          (unsigned long long)a->npy.shape[0],
          (unsigned long long)a->npy.shape[1], (unsigned long long)d0,
          (unsigned long long)d1);
}

/* ------------------------------------------------------------ a case */

enum kind { Q4G, Q4I, Q8C, F8R };

typedef struct gcase {
  const char *name;
  meta m;
  enum kind kind;
  int64_t n, k, mm, gs, groups;
  ql_dtype src;
  arr w, x;
} gcase;

static void open_case(int i, gcase *c) {
  memset(c, 0, sizeof *c);
  c->name = cases[i];
  load_meta(c->name, &c->m);
  c->n = get_int(&c->m, "n");
  c->k = get_int(&c->m, "k");
  c->mm = get_int(&c->m, "m");
  c->gs = get_int(&c->m, "group_size");
  c->groups = (c->k + c->gs - 1) / c->gs;
  c->src = dtype_of(get(&c->m, "src_dtype"));
  if (is(&c->m, "format", "q4g"))
    c->kind = is(&c->m, "zero_kind", "int") ? Q4I : Q4G;
  else if (is(&c->m, "format", "q8c"))
    c->kind = Q8C;
  else if (is(&c->m, "format", "f8r"))
    c->kind = F8R;
  else
    ck_abort_msg("%s: unknown format %s", c->name, get(&c->m, "format"));
  load(c->name, "w", &c->w);
  load(c->name, "x", &c->x);
  check_shape(&c->w, "w", (uint64_t)c->n, (uint64_t)c->k);
  check_shape(&c->x, "x", (uint64_t)c->mm, (uint64_t)c->k);
  REQUIRE(adt(&c->w, 0) == (int)c->src, "%s: w is not %s", c->name,
          get(&c->m, "src_dtype"));
}

static void close_case(gcase *c) {
  unload(&c->w);
  unload(&c->x);
}

static ql_format format_of(const gcase *c) {
  return c->kind == Q8C ? QL_FORMAT_Q8C
         : c->kind == F8R ? QL_FORMAT_F8R
                          : QL_FORMAT_Q4G;
}

/* Imports the TorchAO tensors of a case: the canonical float-zero form of
 * q4g (qdata i8 [N, K/2], scale and zero [G, N]), the integer form of the
 * XPU int4 tensor (qdata i32 [N, K/8], zero_point i8 [G, N]), q8c and f8r
 * (scale [N, 1]). suffix picks the f8r variant ("" or "_nolb"). */
static int import_torchao(const gcase *c, const char *suffix, ql_qweight **w,
                          char *err, size_t errlen) {
  arr q, s, z = {0};
  char qn[32], sn[32];
  ql_import_desc d;
  int rc;

  snprintf(qn, sizeof qn, "qdata%s", suffix);
  snprintf(sn, sizeof sn, "scale%s", suffix);
  load(c->name, qn, &q);
  load(c->name, sn, &s);
  memset(&d, 0, sizeof d);
  d.format = format_of(c);
  d.group_size = (uint32_t)c->gs;
  d.n = c->n;
  d.k = c->k;
  d.zero_kind = c->kind == Q4I ? QL_ZERO_INT : QL_ZERO_FLOAT;
  d.qdata = as_array(&q, c->kind == F8R);
  d.scale = as_array(&s, 0);
  if (c->kind == Q4G || c->kind == Q4I) {
    load(c->name, c->kind == Q4I ? "zero_point" : "zero", &z);
    d.zero = as_array(&z, 0);
  }
  rc = ql_qweight_import(&d, w, err, errlen);
  unload(&q);
  unload(&s);
  if (z.data != NULL)
    unload(&z);
  return rc;
}

/* Lists up to 4 differing positions of two byte arrays into msg. */
static size_t diff_bytes(const uint8_t *a, const uint8_t *b, size_t n,
                         size_t cols, char *msg, size_t len) {
  size_t nd = 0, at = 0;
  msg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (a[i] == b[i])
      continue;
    if (nd++ < 4 && at < len) {
      int w = snprintf(msg + at, len - at, " [%zu,%zu] ours 0x%02x TorchAO "
                       "0x%02x;", i / cols, i % cols, a[i], b[i]);
      at += w > 0 ? (size_t)w : 0;
    }
  }
  return nd;
}

/* Compares n f32 values bit for bit (ours widened from its dtype). */
static size_t diff_f32(const float *a, const float *b, size_t n, size_t cols,
                       char *msg, size_t len) {
  size_t nd = 0, at = 0;
  msg[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (tu_f32_bits(a[i]) == tu_f32_bits(b[i]))
      continue;
    if (nd++ < 4 && at < len) {
      int w = snprintf(msg + at, len - at, " [%zu,%zu] ours %.9g (0x%08x) "
                       "TorchAO %.9g (0x%08x);", i / cols, i % cols,
                       (double)a[i], tu_f32_bits(a[i]), (double)b[i],
                       tu_f32_bits(b[i]));
      at += w > 0 ? (size_t)w : 0;
    }
  }
  return nd;
}

/* Rows listed in a meta value "0,3" as a mask. */
static void row_list(const char *s, int *mask, int64_t rows) {
  memset(mask, 0, (size_t)rows * sizeof *mask);
  while (*s) {
    char *end;
    long r = strtol(s, &end, 10);
    if (end == s)
      break;
    REQUIRE(r >= 0 && r < rows, "row list %s out of range", s);
    mask[r] = 1;
    s = *end == ',' ? end + 1 : end;
  }
}

/* ------------------------------------------------------------ index */

START_TEST(test_index) {
  int seen[4] = {0}, bf16 = 0, f32 = 0, aq16[2] = {0, 0};
  int half[4][2] = {{0}}; /* [kind][f16?]: 16-bit weights TorchAO quantized */

  REQUIRE(index_error[0] == '\0', "golden vectors: %s", index_error);
  REQUIRE(ncases >= 8, "golden vectors: only %d cases in %s/index.txt",
          ncases, golden_dir);
  for (int i = 0; i < ncases; i++) {
    gcase c;
    open_case(i, &c);
    seen[c.kind]++;
    bf16 += c.src == QL_DTYPE_BF16;
    f32 += c.src == QL_DTYPE_F32;
    if (c.src != QL_DTYPE_F32)
      half[c.kind][c.src == QL_DTYPE_F16]++;
    if (strstr(get(&c.m, "cases"), "aq") != NULL &&
        c.src != QL_DTYPE_F32) /* activations TorchAO scaled in 16 bits */
      aq16[c.src == QL_DTYPE_F16]++;
    REQUIRE(get(&c.m, "torchao_fn")[0] != '\0', "%s: no torchao_fn",
            c.name);
    close_case(&c);
  }
  REQUIRE(seen[Q4G] >= 4 && seen[Q4I] >= 2 && seen[Q8C] >= 2 &&
              seen[F8R] >= 2,
          "golden vectors: a format is missing (q4g %d, q4g int %d, q8c %d, "
          "f8r %d)", seen[Q4G], seen[Q4I], seen[Q8C], seen[F8R]);
  REQUIRE(bf16 > 0 && f32 > 0, "golden vectors: no bf16 or no f32 input");
  for (int kd = Q4G; kd <= F8R; kd++) {
    if (kd == Q4I)
      continue;
    REQUIRE(half[kd][0] >= 2 && half[kd][1] >= 2,
            "golden vectors: %s weights from bf16 %d, from f16 %d cases (a "
            "small and a wide one of each wanted)",
            kd == Q4G ? "q4g" : kd == Q8C ? "q8c" : "f8r", half[kd][0],
            half[kd][1]);
  }
  REQUIRE(aq16[0] >= 2 && aq16[1] >= 2,
          "golden vectors: AQ cases with bf16 %d, with f16 %d activations "
          "(q8c and f8r each wanted)", aq16[0], aq16[1]);
}
END_TEST

/* ------------------------------------------------------------ (a) */

/*
 * Quantizes the case's weight with scale dtype sdt (0: the format's
 * default) and compares with TorchAO's qdata, scale and zero: 0 when all
 * match, else the number of differing elements with the first few in msg.
 * TorchAO stores q8c and f8r scales as f32 whatever the weight's dtype, so
 * scales and zeros are compared as f32 values. *wout (if not NULL) gets
 * the weight.
 */
static size_t quantize_diff(const gcase *c, ql_dtype sdt, char *msg,
                            size_t len, ql_qweight **wout) {
  ql_quant_params p;
  ql_qweight *w = NULL;
  arr q, s, z;
  size_t nd, ns, cols = c->kind == Q4G ? (size_t)c->n : 1;
  char sub[900];

  memset(&p, 0, sizeof p);
  p.format = format_of(c);
  p.group_size = (uint32_t)c->gs;
  p.scale_dtype = sdt;
  int rc = ql_qweight_quantize(&p, c->n, c->k, c->src, c->w.data, NULL, &w);
  REQUIRE(rc == 0, "%s: quantize failed (%d)", c->name, rc);

  /* qdata: for f8r the main variant (hp_value_lb 1e-12) */
  load(c->name, "qdata", &q);
  REQUIRE(q.bytes == w->qdata_bytes, "%s: qdata %zu bytes, ours %zu",
          c->name, q.bytes, w->qdata_bytes);
  nd = diff_bytes(w->qdata, q.data, q.bytes, q.bytes / (size_t)c->n, sub,
                  sizeof sub);
  snprintf(msg, len, "qdata:%s", sub);
  unload(&q);

  load(c->name, "scale", &s);
  if ((int)sdt == 0) /* the default keeps TorchAO's dtype (so its bytes) */
    REQUIRE(adt(&s, 0) == (int)w->scale_dtype &&
                dtype_of(get(&c->m, "scale_dtype")) == w->scale_dtype,
            "%s: scales stored as %s, TorchAO stores %s (meta: %s)", c->name,
            tu_dtype_name(w->scale_dtype),
            tu_dtype_name((ql_dtype)adt(&s, 0)), get(&c->m, "scale_dtype"));
  ns = s.npy.count;
  REQUIRE(ns * ql_dtype_size(w->scale_dtype) == w->scale_bytes,
          "%s: scale has %zu values, ours %zu bytes", c->name, ns,
          w->scale_bytes);
  float *ts = widen(&s), *os = tu_xmalloc(ns * sizeof *os);
  ql_to_f32(w->scale_dtype, w->scale, os, ns);
  size_t nds = diff_f32(os, ts, ns, cols, sub, sizeof sub);
  if (nds != 0 && strlen(msg) < len)
    snprintf(msg + strlen(msg), len - strlen(msg), " scale:%s", sub);
  nd += nds;
  free(ts);
  free(os);
  unload(&s);

  if (c->kind == Q4G) {
    load(c->name, "zero", &z);
    float *tz = widen(&z), *oz = tu_xmalloc(ns * sizeof *oz);
    ql_to_f32(w->scale_dtype, w->zero, oz, ns);
    size_t ndz = diff_f32(oz, tz, ns, cols, sub, sizeof sub);
    if (ndz != 0 && strlen(msg) < len)
      snprintf(msg + strlen(msg), len - strlen(msg), " zero:%s", sub);
    nd += ndz;
    free(tz);
    free(oz);
    unload(&z);
  }
  if (wout != NULL)
    *wout = w;
  else
    ql_qweight_free(w);
  return nd;
}

/*
 * The default quantization of a case (whose values and scale dtype
 * quantize_diff() found to be TorchAO's) is the weight ql_qweight_import()
 * makes of TorchAO's packed tensors: every field the daemon's digest
 * covers (daemon/state/weights.c) is equal, so a load() and a load_packed() of
 * it share one copy.
 */
static void same_weight_as_torchao(const gcase *c, const ql_qweight *w) {
  ql_qweight *imp = NULL;
  char err[256] = "";

  int rc = import_torchao(c, "", &imp, err, sizeof err);
  REQUIRE(rc == 0, "%s: import (%d): %s", c->name, rc, err);
  REQUIRE(imp->format == w->format && imp->group_size == w->group_size &&
              imp->n == w->n && imp->k == w->k &&
              imp->scale_dtype == w->scale_dtype &&
              imp->asymmetric == w->asymmetric &&
              (imp->zero == NULL) == (w->zero == NULL) &&
              (imp->bias == NULL) == (w->bias == NULL),
          "%s: imported: format %d gs %u scale %s; quantized: format %d gs "
          "%u scale %s", c->name, (int)imp->format, imp->group_size,
          tu_dtype_name(imp->scale_dtype), (int)w->format, w->group_size,
          tu_dtype_name(w->scale_dtype));
  REQUIRE(imp->qdata_bytes == w->qdata_bytes &&
              memcmp(imp->qdata, w->qdata, w->qdata_bytes) == 0,
          "%s: imported qdata differs from ours", c->name);
  REQUIRE(imp->scale_bytes == w->scale_bytes &&
              memcmp(imp->scale, w->scale, w->scale_bytes) == 0,
          "%s: imported scale differs from ours", c->name);
  REQUIRE(w->zero == NULL || memcmp(imp->zero, w->zero, w->scale_bytes) == 0,
          "%s: imported zero differs from ours", c->name);
  ql_qweight_free(imp);
}

/*
 * (a) Our quantizer on TorchAO's input gives TorchAO's bytes: first with
 * the scale dtype TorchAO computes in (the weight's own: Int4Tensor does
 * scale.to(w.dtype); choose_qparams_affine and _choose_scale_float8 divide
 * amax in the weight's dtype and only then convert to f32), then with the
 * format's default scale dtype, which must agree with TorchAO too.
 */
START_TEST(test_quantize) {
  gcase c;
  ql_qweight *w = NULL, *wd = NULL;
  char msg[1024];
  size_t nd;

  open_case(_i, &c);
  if (c.kind == Q4I) { /* TorchAO's other int4 rule; we only import it */
    close_case(&c);
    return;
  }
  nd = quantize_diff(&c, c.src, msg, sizeof msg, &w);
  REQUIRE(nd == 0, "%s: with %s scales, %zu values differ from TorchAO: %s",
          c.name, tu_dtype_name(c.src), nd, msg);
  nd = quantize_diff(&c, (ql_dtype)0, msg, sizeof msg, &wd);
  REQUIRE(nd == 0, "%s: with the default scale dtype, %zu values differ "
          "from TorchAO (with %s scales none does): %s", c.name, nd,
          tu_dtype_name(c.src), msg);
  same_weight_as_torchao(&c, wd);
  ql_qweight_free(wd);
  float *os = tu_xmalloc((size_t)c.n * sizeof *os);

  /* f8r: TorchAO's default (no hp_value_lb) agrees except on the rows it
   * fills with NaN codes (all-zero rows), where ours are zero codes. */
  ql_to_f32(w->scale_dtype, w->scale, os, c.kind == Q4G ? 0 : (size_t)c.n);
  if (c.kind == F8R) {
    arr q0, s0;
    int *nanrow = tu_xmalloc((size_t)c.n * sizeof *nanrow);
    row_list(get(&c.m, "nolb_nan_weight_rows"), nanrow, c.n);
    load(c.name, "qdata_nolb", &q0);
    load(c.name, "scale_nolb", &s0);
    for (int64_t r = 0; r < c.n; r++) {
      const uint8_t *tq = (const uint8_t *)q0.data + r * c.k;
      const uint8_t *oq = w->qdata + r * c.k;
      float t0 = ((const float *)s0.data)[r];
      for (int64_t i = 0; i < c.k; i++) {
        if (nanrow[r]) {
          REQUIRE((tq[i] & 0x7f) == 0x7f && oq[i] == 0,
                  "%s: row %lld [%lld]: TorchAO 0x%02x (NaN expected), ours "
                  "0x%02x (0 expected)", c.name, (long long)r, (long long)i,
                  tq[i], oq[i]);
        } else {
          REQUIRE(tq[i] == oq[i], "%s: nolb row %lld [%lld]: ours 0x%02x, "
                  "TorchAO 0x%02x", c.name, (long long)r, (long long)i,
                  oq[i], tq[i]);
        }
      }
      REQUIRE(nanrow[r] ? t0 == 0.0f : tu_f32_bits(t0) == tu_f32_bits(os[r]),
              "%s: nolb scale row %lld: TorchAO %g, ours %g", c.name,
              (long long)r, (double)t0, (double)os[r]);
    }
    free(nanrow);
    unload(&q0);
    unload(&s0);
  }
  free(os);
  ql_qweight_free(w);
  close_case(&c);
}
END_TEST

/* ------------------------------------------------------------ (b) */

/*
 * Bound for q4g with f32 scales, whose TorchAO dequantization
 * (_int4_row_dequantize_zp) rounds (q + 8)·s, z - 8·s and their sum, while
 * the canonical q·s + z rounds q·s and the sum. Both approximate the exact
 * v = q·s + z; the difference is at most
 *   u·(|q·s| + |(q + 8)·s| + |z - 8·s| + 2·|v|)·(1 + 4u),  u = 2^-24.
 */
static double q4g_dequant_bound(int q, double s, double z) {
  double v = q * s + z;
  return U32 * (fabs(q * s) + fabs((q + 8) * s) + fabs(z - 8 * s) +
                2 * fabs(v)) *
         (1 + 4 * U32);
}

START_TEST(test_import) {
  gcase c;
  ql_qweight *w = NULL, *w2 = NULL;
  arr deq;
  char err[256], msg[1024];
  size_t nk;
  int rc;

  open_case(_i, &c);
  rc = import_torchao(&c, "", &w, err, sizeof err);
  REQUIRE(rc == 0, "%s: import failed (%d): %s", c.name, rc, err);
  load(c.name, "w_deq", &deq);
  check_shape(&deq, "w_deq", (uint64_t)c.n, (uint64_t)c.k);
  nk = (size_t)(c.n * c.k);
  float *ours = tu_xmalloc(nk * sizeof *ours);
  const float *theirs = deq.data;
  REQUIRE(ql_qweight_dequantize(w, ours) == 0, "%s: dequantize", c.name);

  if (c.kind == Q4G && c.src == QL_DTYPE_F32) {
    /* another formula: bounded, and the bound is not vacuous */
    size_t rb = (size_t)(c.k / 2 + (c.k & 1)), nexact = 0;
    for (size_t i = 0; i < nk; i++) {
      size_t r = i / (size_t)c.k, kk = i % (size_t)c.k;
      size_t g = kk / (size_t)c.gs;
      int q = tu_s4_at(w->qdata + r * rb, (int64_t)kk);
      double s = ((const float *)w->scale)[g * (size_t)c.n + r];
      double z = ((const float *)w->zero)[g * (size_t)c.n + r];
      double b = q4g_dequant_bound(q, s, z);
      REQUIRE(fabs((double)ours[i] - (double)theirs[i]) <= b,
              "%s: dequant [%zu,%zu] ours %.9g TorchAO %.9g, bound %.3g",
              c.name, r, kk, (double)ours[i], (double)theirs[i], b);
      nexact += tu_f32_bits(ours[i]) == tu_f32_bits(theirs[i]);
    }
    REQUIRE(nexact > nk / 2, "%s: only %zu of %zu exact", c.name, nexact,
            nk);
  } else {
    size_t nd = diff_f32(ours, theirs, nk, (size_t)c.k, msg, sizeof msg);
    REQUIRE(nd == 0, "%s: %zu dequantized values differ:%s", c.name, nd,
            msg);
  }

  if (c.kind == Q4I) {
    /* the conversion gives exactly the canonical arrays of the script */
    arr cq, cs, cz;
    ql_import_desc d;
    load(c.name, "canon_qdata", &cq);
    load(c.name, "canon_scale", &cs);
    load(c.name, "canon_zero", &cz);
    REQUIRE(w->scale_dtype == QL_DTYPE_F32, "%s: scale dtype", c.name);
    REQUIRE(cq.bytes == w->qdata_bytes &&
                memcmp(cq.data, w->qdata, cq.bytes) == 0,
            "%s: converted qdata differs", c.name);
    REQUIRE(cs.bytes == w->scale_bytes &&
                memcmp(cs.data, w->scale, cs.bytes) == 0,
            "%s: converted scale differs", c.name);
    REQUIRE(cz.bytes == w->scale_bytes &&
                memcmp(cz.data, w->zero, cz.bytes) == 0,
            "%s: converted zero differs", c.name);
    /* the canonical arrays import as the float form */
    memset(&d, 0, sizeof d);
    d.format = QL_FORMAT_Q4G;
    d.group_size = (uint32_t)c.gs;
    d.n = c.n;
    d.k = c.k;
    d.qdata = as_array(&cq, 0);
    d.scale = as_array(&cs, 0);
    d.zero = as_array(&cz, 0);
    rc = ql_qweight_import(&d, &w2, err, sizeof err);
    REQUIRE(rc == 0, "%s: canonical import (%d): %s", c.name, rc, err);
    REQUIRE(memcmp(w2->qdata, w->qdata, w->qdata_bytes) == 0 &&
                memcmp(w2->zero, w->zero, w->scale_bytes) == 0,
            "%s: canonical import differs", c.name);
    ql_qweight_free(w2);
    w2 = NULL;
    unload(&cq);
    unload(&cs);
    unload(&cz);

    /* the same integer form packed as u8 [N, K/2]: the int32 words'
     * little-endian bytes (the XPU kernel's own input) */
    arr q, s, z;
    load(c.name, "qdata", &q);
    load(c.name, "scale", &s);
    load(c.name, "zero_point", &z);
    uint8_t *u8 = tu_xmalloc(q.bytes);
    for (size_t i = 0; i < q.bytes / 4; i++) {
      uint32_t v;
      memcpy(&v, (const uint8_t *)q.data + 4 * i, 4);
      for (int b = 0; b < 4; b++)
        u8[4 * i + (size_t)b] = (uint8_t)(v >> (8 * b));
    }
    memset(&d, 0, sizeof d);
    d.format = QL_FORMAT_Q4G;
    d.group_size = (uint32_t)c.gs;
    d.n = c.n;
    d.k = c.k;
    d.zero_kind = QL_ZERO_INT;
    d.qdata = (ql_array){u8, q.bytes, QL_ADT_U8, 2, {c.n, c.k / 2}};
    d.scale = as_array(&s, 0);
    d.zero = as_array(&z, 0);
    rc = ql_qweight_import(&d, &w2, err, sizeof err);
    REQUIRE(rc == 0, "%s: u8 import (%d): %s", c.name, rc, err);
    REQUIRE(memcmp(w2->qdata, w->qdata, w->qdata_bytes) == 0,
            "%s: u8 packing imports differently", c.name);
    ql_qweight_free(w2);
    free(u8);
    unload(&q);
    unload(&s);
    unload(&z);
  }

  if (c.kind == F8R && get(&c.m, "nolb_nan_weight_rows")[0] != '\0') {
    /* TorchAO's default variant holds NaN codes: refused, naming qdata */
    ql_qweight *wn = (ql_qweight *)1;
    rc = import_torchao(&c, "_nolb", &wn, err, sizeof err);
    REQUIRE(rc == QL_ENONFINITE && wn == NULL &&
                strncmp(err, "qdata: NaN code", 15) == 0,
            "%s: nolb import gave %d: %s", c.name, rc, err);
  } else if (c.kind == F8R) {
    /* no all-zero row (the f16 cases): both variants are the same weight */
    ql_qweight *wn = NULL;
    rc = import_torchao(&c, "_nolb", &wn, err, sizeof err);
    REQUIRE(rc == 0, "%s: nolb import failed (%d): %s", c.name, rc, err);
    REQUIRE(memcmp(wn->qdata, w->qdata, w->qdata_bytes) == 0 &&
                wn->scale_bytes == w->scale_bytes &&
                memcmp(wn->scale, w->scale, w->scale_bytes) == 0,
            "%s: the nolb weight differs", c.name);
    ql_qweight_free(wn);
  }
  free(ours);
  unload(&deq);
  ql_qweight_free(w);
  close_case(&c);
}
END_TEST

/* ------------------------------------------------------------ (c) */

/* v rounded to dt (nearest even) and widened back. */
static float narrow(ql_dtype dt, float v) {
  uint16_t h;
  if (dt == QL_DTYPE_F32)
    return v;
  ql_from_f32(dt, &v, &h, 1);
  return ql_load_f32(dt, &h, 0);
}

/* One rounded f32 operation each; volatile stops contraction into FMA. */
static float mul32(float a, float b) {
  volatile float r = a * b;
  return r;
}
static float add32(float a, float b) {
  volatile float r = a + b;
  return r;
}

/*
 * y against ref (TorchAO's f64 product rounded to f32), per element:
 *   |y - ref| <= c·Σk |a_k|·m_k + Σk |a_k|·|Δb_k| + u·|ref|
 * where a, b are the factors TorchAO multiplied, m_k = |b_k| or, for our
 * q4g WO (the zero factored out of each group, ql_linear_wo_ref), mb_k =
 * |q·s| + |z|, Δb how far our weight is from TorchAO's (0 where the
 * import is exact), c = γ(K + extra) = n·u/(1 - n·u): fp32 accumulation
 * plus `extra` roundings (the AQ path's scale products; q4g's G group
 * sums).
 */
static void check_product(const gcase *c, const char *what, const float *y,
                          const float *ref, const double *a, const float *b,
                          const float *bours, const double *mb,
                          double extra) {
  double k = (double)c->k + extra, gk = k * U32 / (1 - k * U32);
  for (int64_t m = 0; m < c->mm; m++)
    for (int64_t n = 0; n < c->n; n++) {
      double mag = 0, dw = 0;
      for (int64_t i = 0; i < c->k; i++) {
        double ai = a[m * c->k + i], bi = b[n * c->k + i];
        mag += fabs(ai) * (mb != NULL ? mb[n * c->k + i] : fabs(bi));
        dw += fabs(ai) * fabs(bi - (double)bours[n * c->k + i]);
      }
      double r = ref[m * c->n + n], got = y[m * c->n + n];
      double bound = gk * mag + dw + U32 * fabs(r);
      REQUIRE(fabs(got - r) <= bound,
              "%s %s: y[%lld,%lld] = %.9g, TorchAO %.9g, |diff| %.3g > bound "
              "%.3g (K %lld)", c->name, what, (long long)m, (long long)n, got,
              r, fabs(got - r), bound, (long long)c->k);
    }
}

/*
 * The AQ product of DESIGN §4 (q8c and f8r, no bias) in f32, before its
 * rounding to the output dtype, on the rows quantized with the
 * activation's dtype: q8c (float)Σk xq·wq · (sx·sw); f8r Σk in f32 in
 * increasing k, then · (sx·sw). ql_linear_aq_ref must give this value
 * rounded once to that dtype, and the value itself must be within the f32
 * bound of TorchAO's product.
 */
static void aq_formula(const gcase *c, const ql_qweight *w, const float *xf,
                       float *y) {
  size_t mk = (size_t)(c->mm * c->k), k = (size_t)c->k;
  uint8_t *xq = tu_xmalloc(mk);
  float *sx = tu_xmalloc((size_t)c->mm * sizeof *sx);
  int rc = c->kind == F8R
               ? ql_quantize_rows_e4m3_src(c->src, xf, c->mm, c->k, xq, sx)
               : ql_quantize_rows_i8_src(c->src, xf, c->mm, c->k,
                                         (uint32_t)c->k, (int8_t *)xq, sx,
                                         NULL);
  REQUIRE(rc == 0, "%s: quantize_rows (%d)", c->name, rc);
  REQUIRE(c->kind == F8R || c->kind == Q8C, "%s: AQ formula for q8c and f8r "
          "only", c->name);
  for (int64_t m = 0; m < c->mm; m++)
    for (int64_t n = 0; n < c->n; n++) {
      const uint8_t *xr = xq + (size_t)m * k, *wr = w->qdata + (size_t)n * k;
      float sw = ql_load_f32(w->scale_dtype, w->scale, (size_t)n), acc = 0;
      if (c->kind == F8R) {
        for (size_t i = 0; i < k; i++)
          acc = add32(acc, mul32(ql_e4m3_to_f32(xr[i]),
                                 ql_e4m3_to_f32(wr[i])));
      } else {
        int32_t dot = 0;
        for (size_t i = 0; i < k; i++)
          dot += (int32_t)(int8_t)xr[i] * (int8_t)wr[i];
        acc = (float)dot;
      }
      y[m * c->n + n] = mul32(acc, mul32(sx[m], sw));
    }
  free(xq);
  free(sx);
}

START_TEST(test_linear) {
  gcase c;
  ql_qweight *w = NULL;
  arr deq, yw;
  char err[256];
  int rc;

  open_case(_i, &c);
  rc = import_torchao(&c, "", &w, err, sizeof err);
  REQUIRE(rc == 0, "%s: import failed (%d): %s", c.name, rc, err);
  load(c.name, "w_deq", &deq);
  load(c.name, "y_wo", &yw);
  size_t mk = (size_t)(c.mm * c.k), mn = (size_t)(c.mm * c.n);
  float *xf = widen(&c.x), *wours = tu_xmalloc((size_t)(c.n * c.k) * 4);
  float *y = tu_xmalloc(mn * sizeof *y);
  double *xd = tu_xmalloc(mk * sizeof *xd);
  REQUIRE(ql_qweight_dequantize(w, wours) == 0, "dequantize");
  for (size_t i = 0; i < mk; i++)
    xd[i] = xf[i];

  /* weight-only, in f32 (a bf16 x is widened exactly) */
  rc = ql_linear_wo_ref(w, QL_DTYPE_F32, xf, c.mm, y);
  REQUIRE(rc == 0, "%s: wo_ref failed (%d)", c.name, rc);
  double *mb = NULL, ex = 0;
  if (w->format == QL_FORMAT_Q4G) {
    size_t rowbytes = (size_t)(c.k / 2 + (c.k & 1));
    mb = tu_xmalloc((size_t)(c.n * c.k) * sizeof *mb);
    for (int64_t n = 0; n < c.n; n++)
      for (int64_t i = 0; i < c.k; i++) {
        size_t si = (size_t)(i / w->group_size * c.n + n);
        unsigned nib = (w->qdata[(size_t)n * rowbytes + (size_t)(i / 2)] >>
                        ((i & 1) * 4)) & 0xFu;
        mb[n * c.k + i] =
            fabs(((int)(nib ^ 8u) - 8) *
                 (double)ql_load_f32(w->scale_dtype, w->scale, si)) +
            fabs((double)ql_load_f32(w->scale_dtype, w->zero, si));
      }
    ex = (double)w->groups + 3;
  } else if (w->format == QL_FORMAT_Q8C) {
    ex = 2; /* s·Σx·q: the scale, and ŵ = fl(q·s) is not what is summed */
  }
  check_product(&c, "wo", y, yw.data, xd, deq.data, wours, mb, ex);
  free(mb);
  /* in the source dtype: the same sums, one rounding at the end */
  if (c.src != QL_DTYPE_F32) {
    uint16_t *y16 = tu_xmalloc(mn * 2);
    rc = ql_linear_wo_ref(w, c.src, c.x.data, c.mm, y16);
    REQUIRE(rc == 0, "%s: wo_ref %s failed (%d)", c.name,
            tu_dtype_name(c.src), rc);
    for (size_t i = 0; i < mn; i++) {
      uint16_t want = c.src == QL_DTYPE_BF16 ? ql_f32_to_bf16(y[i])
                                             : ql_f32_to_f16(y[i]);
      REQUIRE(y16[i] == want, "%s: wo %s y[%zu] 0x%04x, f32 result rounds "
              "to 0x%04x", c.name, tu_dtype_name(c.src), i, y16[i], want);
    }
    free(y16);
  }

  /* activation-quantized: against TorchAO's dequantized activation times
   * its dequantized weight; a, the activation factor, is TorchAO's x̂ */
  if (strstr(get(&c.m, "cases"), "aq") != NULL) {
    arr xq, sx, ya;
    load(c.name, "xq", &xq);
    load(c.name, "sx", &sx);
    load(c.name, "y_aq", &ya);
    for (size_t i = 0; i < mk; i++) {
      size_t r = i / (size_t)c.k;
      double q = c.kind == F8R ? ql_e4m3_to_f32(((const uint8_t *)xq.data)[i])
                               : ((const int8_t *)xq.data)[i];
      /* TorchAO's dequantize: q·scale rounded to f32 */
      xd[i] = (float)(q * ((const float *)sx.data)[r]);
    }
    /* In the activation's own dtype, as a client sends it: its scales are
     * computed in that dtype, as TorchAO's are. The f32 value before the
     * output's rounding, float(acc)·(sx·sw): two roundings on our side, x̂
     * and ŵ rounded on TorchAO's: 5u beyond the accumulation term. */
    unsigned char *yd = tu_xmalloc(mn * 4);
    aq_formula(&c, w, xf, y);
    check_product(&c, "aq", y, ya.data, xd, deq.data, wours, NULL, 5);
    rc = ql_linear_aq_ref(w, c.src, c.x.data, c.mm, yd);
    REQUIRE(rc == 0, "%s: aq_ref failed (%d)", c.name, rc);
    for (size_t i = 0; i < mn; i++) {
      float got = ql_load_f32(c.src, yd, i), want = narrow(c.src, y[i]);
      REQUIRE(tu_f32_bits(got) == tu_f32_bits(want),
              "%s: aq_ref %s y[%zu] = %a, the AQ formula rounds to %a",
              c.name, tu_dtype_name(c.src), i, (double)got, (double)want);
    }
    free(yd);
    unload(&xq);
    unload(&sx);
    unload(&ya);
  }
  free(xf);
  free(wours);
  free(y);
  free(xd);
  unload(&deq);
  unload(&yw);
  ql_qweight_free(w);
  close_case(&c);
}
END_TEST

/* ------------------------------------------------------------ (d) */

START_TEST(test_act) {
  gcase c;
  arr xq, sx;
  char msg[1024];
  size_t nd;

  open_case(_i, &c);
  if (strstr(get(&c.m, "cases"), "aq") == NULL) {
    close_case(&c);
    return;
  }
  size_t mk = (size_t)(c.mm * c.k), m = (size_t)c.mm;
  float *xf = widen(&c.x), *s = tu_xmalloc(m * sizeof *s);
  uint8_t *q = tu_xmalloc(mk);
  load(c.name, "xq", &xq);
  load(c.name, "sx", &sx);
  check_shape(&sx, "sx", m, 1);
  if (c.kind == Q8C) {
    int32_t *gsum = tu_xmalloc(m * sizeof *gsum);
    int rc = ql_quantize_rows_i8_src(c.src, xf, c.mm, c.k, (uint32_t)c.k,
                                     (int8_t *)q, s, gsum);
    REQUIRE(rc == 0, "%s: quantize_rows_i8 (%d)", c.name, rc);
    for (size_t r = 0; r < m; r++) {
      int32_t sum = 0;
      for (size_t i = 0; i < (size_t)c.k; i++)
        sum += ((const int8_t *)q)[r * (size_t)c.k + i];
      REQUIRE(gsum[r] == sum, "%s: gsum[%zu] %d, Σxq %d", c.name, r, gsum[r],
              sum);
    }
    free(gsum);
  } else {
    int rc = ql_quantize_rows_e4m3_src(c.src, xf, c.mm, c.k, q, s);
    REQUIRE(rc == 0, "%s: quantize_rows_e4m3 (%d)", c.name, rc);
  }
  nd = diff_f32(s, sx.data, m, 1, msg, sizeof msg);
  REQUIRE(nd == 0, "%s: %zu activation scales differ:%s", c.name, nd, msg);
  nd = diff_bytes(q, xq.data, mk, (size_t)c.k, msg, sizeof msg);
  REQUIRE(nd == 0, "%s: %zu activation codes differ:%s", c.name, nd, msg);

  if (c.kind == F8R) {
    /* TorchAO's default (no lower bound): NaN codes for an all-zero row */
    arr q0, s0;
    int *nanrow = tu_xmalloc(m * sizeof *nanrow);
    row_list(get(&c.m, "nolb_nan_act_rows"), nanrow, c.mm);
    load(c.name, "xq_nolb", &q0);
    load(c.name, "sx_nolb", &s0);
    for (size_t i = 0; i < mk; i++) {
      uint8_t t = ((const uint8_t *)q0.data)[i];
      if (nanrow[i / (size_t)c.k])
        REQUIRE((t & 0x7f) == 0x7f && q[i] == 0,
                "%s: nolb activation [%zu]: TorchAO 0x%02x, ours 0x%02x",
                c.name, i, t, q[i]);
      else
        REQUIRE(t == q[i], "%s: nolb activation [%zu]: TorchAO 0x%02x, ours "
                "0x%02x", c.name, i, t, q[i]);
    }
    free(nanrow);
    unload(&q0);
    unload(&s0);
  }
  free(xf);
  free(s);
  free(q);
  unload(&xq);
  unload(&sx);
  close_case(&c);
}
END_TEST

/* ------------------------------------------------------------ main */

/* Reads golden/index.txt into cases[]; on failure index_error says why
 * (test_index then fails: a missing directory never skips). */
static void read_index(void) {
  const char *dir = getenv("QL_TEST_DATA");
  char path[4400], line[256];
  FILE *f;

  snprintf(golden_dir, sizeof golden_dir, "%s/golden",
           dir != NULL && dir[0] != '\0' ? dir : "tests/data");
  snprintf(path, sizeof path, "%s/index.txt", golden_dir);
  if ((f = fopen(path, "r")) == NULL) {
    snprintf(index_error, sizeof index_error,
             "cannot open %s (set QL_TEST_DATA to the tests/data directory)",
             path);
    return;
  }
  while (fgets(line, sizeof line, f) != NULL) {
    size_t l = strcspn(line, "\r\n");
    line[l] = '\0';
    if (l == 0 || line[0] == '#')
      continue;
    if (ncases == MAX_CASES || l >= sizeof cases[0]) {
      snprintf(index_error, sizeof index_error, "%s: too many cases or a "
               "name too long", path);
      break;
    }
    memcpy(cases[ncases++], line, l + 1);
  }
  fclose(f);
}

static Suite *golden_suite(void) {
  Suite *s = suite_create("golden");
  TCase *tc = tcase_create("index");
  tcase_add_test(tc, test_index);
  suite_add_tcase(s, tc);

  tc = tcase_create("quantize");
  tcase_add_loop_test(tc, test_quantize, 0, ncases);
  suite_add_tcase(s, tc);
  tc = tcase_create("import");
  tcase_add_loop_test(tc, test_import, 0, ncases);
  suite_add_tcase(s, tc);
  tc = tcase_create("linear");
  tcase_add_loop_test(tc, test_linear, 0, ncases);
  suite_add_tcase(s, tc);
  tc = tcase_create("act");
  tcase_add_loop_test(tc, test_act, 0, ncases);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  read_index();
  return tu_run_suite(golden_suite(), CK_VERBOSE);
}
