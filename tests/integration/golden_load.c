/* golden_load.c - see golden_load.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "golden_load.h"
#include "npy.h"

/* Array name of a golden case, loaded (any npy type); aborts if missing. */
static void load_arr(const char *cas, const char *name, ql__npy *a) {
  const char *data = getenv("QL_TEST_DATA");
  char path[1024], err[256] = "";
  ck_assert_msg(data != NULL, "QL_TEST_DATA is not set");
  snprintf(path, sizeof path, "%s/golden/%s/%s.npy", data, cas, name);
  ck_assert_msg(ql__npy_load_types(path, QL__NPY_ALL_TYPES, a, err,
                                   sizeof err) == 0,
                "%s: %s", path, err);
}

/* A golden array as a packed array: bf16 travels as '<u2' bits, float8
 * codes as '|u1'. */
static ql_packed_array packed(const ql__npy *a, int f8) {
  ql_packed_array p = {a->data, ql__npy_adt(a->type, f8), a->ndim,
                       {a->shape[0], a->ndim == 2 ? a->shape[1] : 0}};
  return p;
}

int td_torchao_identity(ql_client *c, const char *devices) {
  static const struct {
    const char *cas;
    ql_format f;
    uint32_t gs;
  } cases[] = {
      {"q8c_bf16", QL_FORMAT_Q8C, 0},       {"f8r_bf16", QL_FORMAT_F8R, 0},
      {"q4g_g128_bf16", QL_FORMAT_Q4G, 128}, {"q8c_f16", QL_FORMAT_Q8C, 0},
      {"f8r_f16", QL_FORMAT_F8R, 0},        {"q4g_g128_f16", QL_FORMAT_Q4G, 128},
  };
  int n = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ql__npy w, q, s, z;
    ql_load_desc ld;
    ql_packed_desc pd;
    ql_weight_info a, b;
    int shared = -1, rc, q4 = cases[i].f == QL_FORMAT_Q4G;
    char name[64];

    load_arr(cases[i].cas, "w", &w);
    load_arr(cases[i].cas, "qdata", &q);
    load_arr(cases[i].cas, "scale", &s);
    memset(&z, 0, sizeof z);
    if (q4)
      load_arr(cases[i].cas, "zero", &z);
    ck_assert(w.ndim == 2 && (w.type == QL__NPY_U16 || w.type == QL__NPY_F16));
    snprintf(name, sizeof name, "torchao/%s", cases[i].cas);

    memset(&ld, 0, sizeof ld);
    ld.name = name;
    ld.format = cases[i].f;
    ld.group_size = cases[i].gs;
    ld.n = w.shape[0];
    ld.k = w.shape[1];
    ld.dtype = w.type == QL__NPY_U16 ? QL_DTYPE_BF16 : QL_DTYPE_F16;
    ld.data = w.data;
    ld.devices = devices;
    rc = ql_load_float(c, &ld, &a, &shared);
    ck_assert_msg(rc == 0, "%s: load: %s: %s", name, ql_strerror(rc),
                  ql_errmsg());
    ck_assert_int_eq(shared, 0);
    /* TorchAO keeps q8c and f8r scales as f32, q4g's in the weight's
     * dtype. */
    ck_assert_int_eq(a.scale_dtype, (q4 ? (int)ld.dtype : QL_DTYPE_F32));

    memset(&pd, 0, sizeof pd);
    pd.name = name;
    pd.format = cases[i].f;
    pd.group_size = cases[i].gs;
    pd.n = ld.n;
    pd.k = ld.k;
    pd.qdata = packed(&q, cases[i].f == QL_FORMAT_F8R);
    pd.scale = packed(&s, 0);
    if (q4)
      pd.zero = packed(&z, 0);
    pd.devices = devices;
    rc = ql_load_packed(c, &pd, &b, &shared);
    ck_assert_msg(rc == 0, "%s: TorchAO's tensors: %s: %s", name,
                  ql_strerror(rc), ql_errmsg());
    ck_assert_msg(shared == 1, "%s: TorchAO's tensors are another weight",
                  name);
    ck_assert(memcmp(a.digest, b.digest, sizeof a.digest) == 0);
    ck_assert_str_eq(a.devices, b.devices);
    ck_assert_int_eq(ql_unload(c, name), 0);
    ql__npy_free(&w);
    ql__npy_free(&q);
    ql__npy_free(&s);
    ql__npy_free(&z);
    n++;
  }
  return n;
}
