/*
 * test_ckpt_import.c - GPTQ and AWQ layers converted to the canonical form
 * (client/ctl/ckpt_import.c).
 *
 * The checkpoints in tests/data/ckpt/ were packed by auto-gptq 0.7.1 and
 * autoawq 0.2.9 (tests/data/make_ckpt.py); beside each is the packer's own
 * dequantization. Each is converted here, imported as the daemon imports a
 * packed weight (kernels/import.c) and dequantized by the reference
 * (ql_qweight_dequantize): the result must equal the packer's, bit for
 * bit, in f32 and (rounded) in f16.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_import.h"
#include "import.h"
#include "npy.h"
#include "ql_kernels.h"
#include "safetensors.h"
#include "testutil.h"

#define LAYER "model.layers.0.mlp.down_proj"

static const struct ckpt_case {
  const char *dir;
  ql__ck_method method;
  int bits;
  uint32_t group;     /* canonical group chosen */
  int sym;            /* all zero points at the midpoint */
  int needs_config;   /* the tensors alone cannot tell (v2) */
} cases[] = {
    {"gptq4_sym_g128", QL__CK_GPTQ, 4, 128, 1, 0},
    {"gptq4_asym_g64", QL__CK_GPTQ, 4, 64, 0, 0},
    {"gptq4_asym_g32_v2", QL__CK_GPTQ, 4, 32, 0, 1},
    {"gptq4_asym_perchannel", QL__CK_GPTQ, 4, 128, 0, 0},
    {"gptq8_sym_g128", QL__CK_GPTQ, 8, 128, 1, 0},
    {"gptq8_asym_g64", QL__CK_GPTQ, 8, 64, 0, 0},
    {"awq4_g128", QL__CK_AWQ, 4, 128, 0, 0},
    {"awq4_g64", QL__CK_AWQ, 4, 64, 0, 0},
};

static char data_dir[4096];

static void *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s (set QL_TEST_DATA)", path);
  fseek(f, 0, SEEK_END);
  long l = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = tu_xmalloc((size_t)l + 1);
  ck_assert_int_eq(fread(b, 1, (size_t)l, f), (size_t)l);
  fclose(f);
  *len = (size_t)l;
  return b;
}

static ql__st_file *open_st(const char *dir, const char *file) {
  char path[4400], err[256];
  ql__st_file *f = NULL;
  snprintf(path, sizeof path, "%s/ckpt/%s/%s", data_dir, dir, file);
  int rc = ql__st_open(path, &f, err, sizeof err);
  ck_assert_msg(rc == 0, "%s: %s", path, err);
  return f;
}

static void read_config(const char *dir, ql__ck_config *cfg) {
  char path[4400], err[256];
  size_t len;
  snprintf(path, sizeof path, "%s/ckpt/%s/config.json", data_dir, dir);
  void *b = read_all(path, &len);
  ck_assert_msg(ql__ck_config_parse(b, len, cfg, err, sizeof err) == 0, "%s",
                err);
  free(b);
}

static void layer_of(const ql__st_file *f, ql__ck_layer *l) {
  l->name = LAYER;
  l->qweight = ql__st_find(f, LAYER ".qweight");
  l->qzeros = ql__st_find(f, LAYER ".qzeros");
  l->scales = ql__st_find(f, LAYER ".scales");
  l->g_idx = ql__st_find(f, LAYER ".g_idx");
  l->check_only = 0;
}

/* Imports the canonical arrays as the daemon does and dequantizes them. */
static float *dequant(const ql__ck_canon *c) {
  ql_import_desc d = {0};
  ql_qweight *w = NULL;
  char err[256];
  size_t ssz = ql_array_dtype_size(c->scale_dtype);
  d.format = c->format;
  d.group_size = c->group_size;
  d.n = (int64_t)c->n;
  d.k = (int64_t)c->k;
  d.asymmetric = c->asymmetric;
  d.zero_kind = QL_ZERO_FLOAT;
  d.qdata = (ql_array){c->qdata, c->qdata_bytes, c->qdata_dtype, 2,
                       {(int64_t)c->n,
                        (int64_t)(c->format == QL_FORMAT_Q4G
                                      ? c->qdata_bytes / c->n
                                      : c->k)}};
  d.scale = (ql_array){c->scale, c->scale_bytes, c->scale_dtype, 2,
                       {(int64_t)c->groups, (int64_t)c->n}};
  if (c->zero != NULL)
    d.zero = (ql_array){c->zero, c->scale_bytes, c->scale_dtype, 2,
                        {(int64_t)c->groups, (int64_t)c->n}};
  ck_assert_uint_eq(c->scale_bytes, c->groups * c->n * ssz);
  int rc = ql_qweight_import(&d, &w, err, sizeof err);
  ck_assert_msg(rc == 0, "import: %d %s", rc, err);
  float *out = tu_xmalloc(c->n * c->k * sizeof(float));
  ck_assert_int_eq(ql_qweight_dequantize(w, out), 0);
  ql_qweight_free(w);
  return out;
}

static void check_case(const struct ckpt_case *c, int use_config) {
  ql__st_file *m = open_st(c->dir, "model.safetensors");
  ql__st_file *r = open_st(c->dir, "ref.safetensors");
  ql__ck_config cfg;
  ql__ck_layer l;
  ql__ck_canon can;
  char err[256];

  read_config(c->dir, &cfg);
  layer_of(m, &l);
  /* The check an import makes before any upload: the conversion's sizes
   * and metadata, no arrays. */
  ql__ck_canon chk;
  l.check_only = 1;
  int rc = ql__ck_convert(&l, use_config ? &cfg : NULL, &chk, err, sizeof err);
  ck_assert_msg(rc == 0, "%s: check: %d %s", c->dir, rc, err);
  ck_assert_ptr_null(chk.qdata);
  ck_assert_ptr_null(chk.scale);
  ck_assert_ptr_null(chk.zero);
  l.check_only = 0;
  rc = ql__ck_convert(&l, use_config ? &cfg : NULL, &can, err, sizeof err);
  ck_assert_msg(rc == 0, "%s: %d %s", c->dir, rc, err);
  ck_assert_uint_eq(chk.qdata_bytes, can.qdata_bytes);
  ck_assert_uint_eq(chk.scale_bytes, can.scale_bytes);
  ck_assert_int_eq(chk.scale_dtype, can.scale_dtype);
  ck_assert_int_eq(chk.has_zero, can.zero != NULL);
  ck_assert_int_eq(chk.asymmetric, can.asymmetric);
  ck_assert_uint_eq(chk.groups, can.groups);
  ck_assert_int_eq(can.method, c->method);
  ck_assert_int_eq(can.bits, c->bits);
  ck_assert_uint_eq(can.group_size, c->group);
  ck_assert_int_eq(can.symmetric_src, c->sym);
  /* Symmetric: the f16 scale is kept; otherwise exact f32. */
  ck_assert_int_eq(can.scale_dtype, c->sym ? QL_ADT_F16 : QL_ADT_F32);

  const ql__st_tensor *d32 = ql__st_find(r, "deq_f32");
  const ql__st_tensor *d16 = ql__st_find(r, "deq_f16");
  ck_assert_ptr_nonnull(d32);
  ck_assert_ptr_nonnull(d16);
  ck_assert_uint_eq(d32->shape[0], can.n);
  ck_assert_uint_eq(d32->shape[1], can.k);
  float *ours = dequant(&can);
  size_t diff32 = 0, diff16 = 0, first = (size_t)-1;
  for (size_t i = 0; i < can.n * can.k; i++) {
    float ref;
    uint16_t h;
    memcpy(&ref, d32->data + 4 * i, 4);
    memcpy(&h, d16->data + 2 * i, 2);
    if (tu_f32_bits(ours[i]) != tu_f32_bits(ref)) {
      diff32++;
      if (first == (size_t)-1)
        first = i;
    }
    diff16 += ql_f32_to_f16(ours[i]) != h;
  }
  ck_assert_msg(diff32 == 0 && diff16 == 0,
                "%s%s: %zu f32 and %zu f16 values differ from the packer's "
                "dequantization (first at %zu)",
                c->dir, use_config ? "" : " (no config)", diff32, diff16,
                first);
  free(ours);
  ql__ck_canon_free(&can);
  ql__st_free(m);
  ql__st_free(r);
}

START_TEST(test_packers) { check_case(&cases[_i], 1); }
END_TEST

/* The tensors alone decide, except the zero-point convention of a v2
 * file, which only the config tells. */
START_TEST(test_packers_no_config) {
  if (cases[_i].needs_config)
    return;
  check_case(&cases[_i], 0);
}
END_TEST

START_TEST(test_act_order_refused) {
  ql__st_file *m = open_st("gptq4_actorder", "model.safetensors");
  ql__ck_config cfg;
  ql__ck_layer l;
  ql__ck_canon can;
  char err[256];
  read_config("gptq4_actorder", &cfg);
  layer_of(m, &l);
  l.check_only = 1; /* refused by the check before any upload */
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err),
                   QL_ENOTSUP);
  l.check_only = 0;
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err),
                   QL_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(err, LAYER ".g_idx"));
  ck_assert_ptr_nonnull(strstr(err, "act-order"));
  ck_assert_ptr_null(can.qdata);
  ql__st_free(m);
}
END_TEST

/* A config that contradicts the tensors is an error naming the tensor. */
START_TEST(test_config_disagrees) {
  ql__st_file *m = open_st("gptq4_asym_g64", "model.safetensors");
  ql__ck_config cfg;
  ql__ck_layer l;
  ql__ck_canon can;
  char err[256];
  read_config("gptq4_asym_g64", &cfg);
  layer_of(m, &l);
  cfg.method = QL__CK_AWQ;
  strcpy(cfg.method_name, "awq");
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err),
                   QL_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, LAYER ".qweight"));
  read_config("gptq4_asym_g64", &cfg);
  cfg.bits = 8;
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err),
                   QL_EFORMAT);
  read_config("gptq4_asym_g64", &cfg);
  cfg.group_size = 32;
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err),
                   QL_ESHAPE);
  ck_assert_ptr_nonnull(strstr(err, LAYER ".scales"));
  read_config("gptq4_asym_g64", &cfg);
  cfg.sym = 1;
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err),
                   QL_EFORMAT);
  /* Missing tensors and wrong dtypes. */
  read_config("gptq4_asym_g64", &cfg);
  ql__ck_layer l2 = l;
  l2.qzeros = NULL;
  ck_assert_int_eq(ql__ck_convert(&l2, &cfg, &can, err, sizeof err),
                   QL_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, ".qzeros"));
  l2 = l;
  l2.scales = l.qweight;
  ck_assert_int_eq(ql__ck_convert(&l2, &cfg, &can, err, sizeof err),
                   QL_EDTYPE);
  ck_assert_ptr_nonnull(strstr(err, ".scales"));
  ql__st_free(m);
}
END_TEST

/*
 * The v1 zero-point offset is undone word by word (gptqmodel's rule), so a
 * zero point of 0, which borrowed from its neighbour when the v1 file was
 * written, comes back as 0 and the neighbour as itself.
 */
START_TEST(test_v1_borrow) {
  static const int z[8] = {0, 5, 15, 8, 1, 0, 0, 3};
  uint32_t v2 = 0, v1, qw[4 * 8];
  uint16_t sc[8];
  for (int i = 0; i < 8; i++) {
    v2 |= (uint32_t)z[i] << (4 * i);
    sc[i] = ql_f32_to_f16(0.5f + (float)i / 16);
  }
  v1 = v2 - 0x11111111u;
  for (int i = 0; i < 32; i++)
    qw[i] = 0x76543210u + (uint32_t)i;
  ql__st_tensor tq = {.name = "q", .dtype = QL__ST_I32, .ndim = 2,
                      .shape = {4, 8}, .bytes = sizeof qw,
                      .data = (const unsigned char *)qw};
  ql__st_tensor tz = {.name = "z", .dtype = QL__ST_I32, .ndim = 2,
                      .shape = {1, 1}, .bytes = 4,
                      .data = (const unsigned char *)&v1};
  ql__st_tensor ts = {.name = "s", .dtype = QL__ST_F16, .ndim = 2,
                      .shape = {1, 8}, .bytes = sizeof sc,
                      .data = (const unsigned char *)sc};
  ql__ck_layer l = {"x", &tq, &tz, &ts, NULL, 0};
  ql__ck_config cfg = {.present = 1, .method = QL__CK_GPTQ, .bits = 4,
                       .group_size = 32, .sym = -1, .desc_act = -1};
  ql__ck_canon can;
  char err[256];
  strcpy(cfg.method_name, "gptq");
  ck_assert_msg(ql__ck_convert(&l, &cfg, &can, err, sizeof err) == 0, "%s",
                err);
  for (int i = 0; i < 8; i++) {
    float s = ql_f16_to_f32(sc[i]);
    ck_assert_float_eq(((float *)can.scale)[i], s);
    ck_assert_float_eq(((float *)can.zero)[i], (float)(8 - z[i]) * s);
  }
  /* The same word read as v2 is taken as it is. */
  ql__ck_canon_free(&can);
  cfg.gptq_v2 = 1;
  tz.data = (const unsigned char *)&v2;
  ck_assert_int_eq(ql__ck_convert(&l, &cfg, &can, err, sizeof err), 0);
  for (int i = 0; i < 8; i++)
    ck_assert_float_eq(((float *)can.zero)[i],
                       (float)(8 - z[i]) * ql_f16_to_f32(sc[i]));
  /* qdata: u = nibble k%8 of word k/8, q = u - 8. */
  for (int n = 0; n < 8; n++)
    for (int k = 0; k < 32; k++) {
      int u = (int)((qw[(k / 8) * 8 + n] >> (4 * (k % 8))) & 0xF);
      uint8_t b = ((uint8_t *)can.qdata)[n * 16 + k / 2];
      int q = (k & 1) ? b >> 4 : b & 0xF;
      ck_assert_int_eq(q, (u - 8) & 0xF);
    }
  ql__ck_canon_free(&can);
}
END_TEST

START_TEST(test_config_parse) {
  ql__ck_config c;
  char err[256];
  static const char a[] = "{\"quantization_config\":{\"quant_method\":\"gptq\","
                          "\"bits\":4,\"group_size\":-1,\"sym\":false,"
                          "\"desc_act\":true,\"checkpoint_format\":\"gptq_v2\"}}";
  ck_assert_int_eq(ql__ck_config_parse(a, strlen(a), &c, err, sizeof err), 0);
  ck_assert_int_eq(c.present, 1);
  ck_assert_int_eq(c.method, QL__CK_GPTQ);
  ck_assert_int_eq(c.group_size, -1);
  ck_assert_int_eq(c.sym, 0);
  ck_assert_int_eq(c.desc_act, 1);
  ck_assert_int_eq(c.gptq_v2, 1);
  static const char b[] = "{\"bits\":8,\"group_size\":128,\"sym\":true}";
  ck_assert_int_eq(ql__ck_config_parse(b, strlen(b), &c, err, sizeof err), 0);
  ck_assert_int_eq(c.present, 1);
  ck_assert_int_eq(c.bits, 8);
  ck_assert_int_eq(c.method, QL__CK_UNKNOWN);
  static const char n[] = "{\"model_type\":\"llama\"}";
  ck_assert_int_eq(ql__ck_config_parse(n, strlen(n), &c, err, sizeof err), 0);
  ck_assert_int_eq(c.present, 0);
  static const char *bad[] = {"{\"bits\":\"4\"}", "{\"sym\":1}",
                              "{\"group_size\":0}", "{",
                              "{\"quantization_config\":3}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_int_eq(
        ql__ck_config_parse(bad[i], strlen(bad[i]), &c, err, sizeof err),
        QL_EBADFILE);
}
END_TEST

/* ---- TorchAO subclasses saved by TorchAO's serializer (tests/data/
 * make_torchao_st.py), against TorchAO's dequantization in golden/. */

#define TAO_LAYER "model.layers.0.self_attn.o_proj"

static const struct tao_case {
  const char *name;
  ql_format format;
  uint32_t group;
  ql_zero_kind zk;
} tao_cases[] = {
    {"q4g_g128_bf16", QL_FORMAT_Q4G, 128, QL_ZERO_FLOAT},
    {"q4g_g32_bf16", QL_FORMAT_Q4G, 32, QL_ZERO_FLOAT},
    {"q4i_g128_f16", QL_FORMAT_Q4G, 128, QL_ZERO_INT},
    {"q8c_bf16", QL_FORMAT_Q8C, 0, QL_ZERO_FLOAT},
    {"f8r_f32", QL_FORMAT_F8R, 0, QL_ZERO_FLOAT},
};

static const ql__st_tensor *find_in(void *arg, const char *name) {
  return ql__st_find(arg, name);
}

static ql_array arr_of(const ql__ck_array *a) {
  ql_array r = {a->data, a->bytes, a->dtype, a->ndim,
                {(int64_t)a->shape[0], (int64_t)a->shape[1]}};
  return r;
}

START_TEST(test_torchao) {
  const struct tao_case *c = &tao_cases[_i];
  char path[4400], err[256];
  ql__st_file *f = NULL;
  ql__ck_torchao t;
  snprintf(path, sizeof path, "%s/torchao/%s.safetensors", data_dir, c->name);
  ck_assert_msg(ql__st_open(path, &f, err, sizeof err) == 0, "%s", err);
  const char *meta = ql__st_meta(f, TAO_LAYER ".weight");
  ck_assert_ptr_nonnull(meta);
  int rc = ql__ck_torchao_layer(TAO_LAYER, meta, find_in, f, &t, err,
                                sizeof err);
  ck_assert_msg(rc == 0, "%s: %s", c->name, err);
  ck_assert_int_eq(t.format, c->format);
  ck_assert_uint_eq(t.group_size, c->group);
  ck_assert_int_eq(t.zero_kind, c->zk);
  ck_assert_ptr_null(c->format == QL_FORMAT_Q4G ? NULL : t.zero.data);

  ql_import_desc d = {0};
  ql_qweight *w = NULL;
  d.format = t.format;
  d.group_size = t.group_size;
  d.n = (int64_t)t.n;
  d.k = (int64_t)t.k;
  d.zero_kind = t.zero_kind;
  d.qdata = arr_of(&t.qdata);
  d.scale = arr_of(&t.scale);
  if (t.zero.data != NULL)
    d.zero = arr_of(&t.zero);
  rc = ql_qweight_import(&d, &w, err, sizeof err);
  ck_assert_msg(rc == 0, "%s: import %d %s", c->name, rc, err);
  float *ours = tu_xmalloc(t.n * t.k * sizeof(float));
  ck_assert_int_eq(ql_qweight_dequantize(w, ours), 0);

  ql__npy ref;
  snprintf(path, sizeof path, "%s/golden/%s/w_deq.npy", data_dir, c->name);
  ck_assert_msg(ql__npy_load(path, &ref, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(ref.count, t.n * t.k);
  size_t diff = 0;
  for (size_t i = 0; i < ref.count; i++) {
    float r;
    memcpy(&r, (const char *)ref.data + 4 * i, 4);
    diff += tu_f32_bits(r) != tu_f32_bits(ours[i]);
  }
  ck_assert_msg(diff == 0, "%s: %zu values differ from TorchAO's", c->name,
                diff);
  ql__npy_free(&ref);
  free(ours);
  ql_qweight_free(w);
  ql__st_free(f);
}
END_TEST

static const char *tao_meta_bad[][2] = {
    {"{\"_type\":\"NVFP4Tensor\",\"_data\":{},\"_tensor_data_names\":[]}",
     "NVFP4Tensor is not supported"},
    {"{\"_type\":\"Int4Tensor\",\"_data\":{\"block_size\":[1,128],"
     "\"shape\":[12,256]},\"_tensor_data_names\":[\"qdata\",\"scale\","
     "\"zero_point\",\"act_pre_scale\"]}",
     "act_pre_scale"},
    {"{\"_type\":\"Int4Tensor\",\"_data\":{\"block_size\":[1,48],"
     "\"shape\":[12,256]},\"_tensor_data_names\":[\"qdata\",\"scale\","
     "\"zero_point\"]}",
     "group 48"},
    {"{\"_type\":\"Int4Tensor\",\"_data\":{\"block_size\":[1,128],"
     "\"shape\":[13,256]},\"_tensor_data_names\":[\"qdata\",\"scale\","
     "\"zero_point\"]}",
     "shape does not match"},
    {"{\"_type\":\"Int4Tensor\"}", "not a TorchAO"},
    {"nope", "bad JSON"},
};

START_TEST(test_torchao_bad) {
  char path[4400], err[256];
  ql__st_file *f = NULL;
  ql__ck_torchao t;
  snprintf(path, sizeof path, "%s/torchao/q4g_g128_bf16.safetensors",
           data_dir);
  ck_assert_msg(ql__st_open(path, &f, err, sizeof err) == 0, "%s", err);
  int rc = ql__ck_torchao_layer(TAO_LAYER, tao_meta_bad[_i][0], find_in, f,
                                &t, err, sizeof err);
  ck_assert_int_ne(rc, 0);
  ck_assert_msg(strstr(err, tao_meta_bad[_i][1]) != NULL, "'%s' lacks '%s'",
                err, tao_meta_bad[_i][1]);
  ck_assert_ptr_null(t.qdata.data);
  /* A missing part is named. */
  rc = ql__ck_torchao_layer("model.other", ql__st_meta(f, TAO_LAYER ".weight"),
                            find_in, f, &t, err, sizeof err);
  ck_assert_int_eq(rc, QL_EBADFILE);
  ck_assert_ptr_nonnull(strstr(err, "model.other._weight_qdata: missing"));
  ql__st_free(f);
}
END_TEST

static Suite *ck_suite(void) {
  Suite *s = suite_create("ckpt_import");
  TCase *tc = tcase_create("packers");
  size_t nc = sizeof cases / sizeof cases[0];
  tcase_add_loop_test(tc, test_packers, 0, (int)nc);
  tcase_add_loop_test(tc, test_packers_no_config, 0, (int)nc);
  tcase_add_test(tc, test_act_order_refused);
  tcase_add_test(tc, test_config_disagrees);
  suite_add_tcase(s, tc);
  tc = tcase_create("rules");
  tcase_add_test(tc, test_v1_borrow);
  tcase_add_test(tc, test_config_parse);
  suite_add_tcase(s, tc);
  tc = tcase_create("torchao");
  tcase_add_loop_test(tc, test_torchao, 0,
                      (int)(sizeof tao_cases / sizeof tao_cases[0]));
  tcase_add_loop_test(tc, test_torchao_bad, 0,
                      (int)(sizeof tao_meta_bad / sizeof tao_meta_bad[0]));
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *d = getenv("QL_TEST_DATA");
  snprintf(data_dir, sizeof data_dir, "%s",
           d != NULL && d[0] != '\0' ? d : "tests/data");
  return tu_run_suite(ck_suite(), CK_NORMAL);
}
