/*
 * ckpt_import.c - GPTQ and AWQ layers to the canonical q4g/q8b form
 * (ckpt_import.h).
 *
 * The packings, read from the packers' source (auto-gptq 0.7.1
 * nn_modules/qlinear/qlinear_cuda.py pack(), gptqmodel utils/model.py,
 * autoawq 0.2.9 modules/linear/gemm.py from_linear(), utils/packing_utils.py):
 *
 * GPTQ, b = 4 or 8 bits, p = 32/b values per int32 word:
 *   qweight i32 [K/p, N]: u(k, n) = word[k/p][n] >> (b·(k%p)) & (2^b - 1),
 *     i.e. packed along K, the lowest bits first.
 *   qzeros i32 [G, N/p]: packed along N the same way.
 *   scales f16 [G, N]; g_idx i32 [K] (the group of each column k).
 *   x̂ = (u - z)·s with z the zero point of column k's group.
 *   The zero-point convention: AutoGPTQ wrote z - 1 ("v1", still what
 *   checkpoint_format "gptq" means); gptqmodel keeps z itself internally
 *   ("gptq_v2") and converts on save and load by subtracting/adding
 *   0x11111111 (4 bits) or 0x01010101 (8 bits) to each packed word, modulo
 *   2^32. We decode v1 the same way, word by word, because that is the
 *   exact inverse of the conversion that writes v1 files with a zero point
 *   of 0 (nibble 0 - 1 borrows from its neighbour, and only the word-wise
 *   addition carries it back). Decoding nibble by nibble (stored + 1) gives
 *   the same z for every nibble that did not borrow, i.e. for every file
 *   whose zero points are all >= 1, which includes every symmetric one.
 *   With no quantization_config, v1 is assumed: it is what every GPTQ
 *   writer saves unless asked otherwise.
 * AWQ GEMM (4 bits):
 *   qweight i32 [K, N/8]: packed along N; nibble i of word [k][j] holds
 *     column 8j + order[i], order = [0, 2, 4, 6, 1, 3, 5, 7].
 *   qzeros i32 [G, N/8]: the same order. scales f16 [G, N].
 *   x̂ = (u - z)·s, no offset on z.
 *
 * Canonical form (DESIGN §4): q4g q = u - 8, x̂ = q·scale + zero, so
 * zero = (8 - z)·s; q8b q = u - 128, zero = (128 - z)·s. When every z is
 * the midpoint (symmetric checkpoints) zero is 0 and the scale keeps its
 * own dtype (f16 stays f16: converting to bf16 would lose precision).
 * Otherwise scale and zero are stored in f32: with an f16 (11-bit) or bf16
 * scale, (mid - z)·s needs at most 9 + 11 bits and is exact in f32, q·s is
 * exact, and their sum is (u - z)·s, which has at most 20 significant bits
 * and so is exact too: the canonical weight dequantizes to the packer's
 * (u - z)·s bit for bit (tests/unit/test_ckpt_import.c checks it against
 * the packers' own dequantization). An f16 zero would round.
 *
 * Groups: a checkpoint group size that is a multiple of a canonical one
 * (32, 64, 128, 256; the largest that divides is used), or one group per
 * row (group_size -1), maps exactly by repeating each group's scale and
 * zero over the canonical groups inside it. Others are QL_ENOTSUP.
 *
 * Act-order (desc_act: a g_idx that is not k / group_size) is refused with
 * an error naming the g_idx tensor: the canonical form needs the columns of
 * a group to be contiguous, which would need K permuted and the same
 * permutation applied to every activation inside the daemon.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt_import.h"

__attribute__((format(printf, 4, 5))) static int fail(char *err,
                                                      size_t errlen, int rc,
                                                      const char *fmt, ...) {
  if (err != NULL && errlen > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return rc;
}

/* ------------------------------------------------------------ config */

static int get_int(json_t *qc, const char *key, int64_t *out, char *err,
                   size_t errlen) {
  json_t *v = json_object_get(qc, key);
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_integer(v))
    return fail(err, errlen, QL_EBADFILE, "quantization_config: '%s' is not "
                "an integer", key);
  *out = json_integer_value(v);
  return 1;
}

static int get_bool(json_t *qc, const char *key, int *out, char *err,
                    size_t errlen) {
  json_t *v = json_object_get(qc, key);
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_boolean(v))
    return fail(err, errlen, QL_EBADFILE, "quantization_config: '%s' is not "
                "true or false", key);
  *out = json_is_true(v);
  return 1;
}

static const char *get_str(json_t *qc, const char *key) {
  return json_string_value(json_object_get(qc, key));
}

int ql__ck_config_parse(const void *buf, size_t len, ql__ck_config *out,
                        char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root, *qc;
  int64_t v = 0;
  const char *s;
  int rc;

  memset(out, 0, sizeof *out);
  out->sym = out->desc_act = -1;
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return fail(err, errlen, QL_EBADFILE, "bad JSON at byte %d: %s",
                jerr.position, jerr.text);
  qc = json_object_get(root, "quantization_config");
  if (qc == NULL)
    qc = root; /* quantize_config.json: the fields at the top level */
  rc = fail(err, errlen, QL_EBADFILE, "quantization_config: not an object");
  if (!json_is_object(qc))
    goto done;
  if ((s = get_str(qc, "quant_method")) != NULL) {
    snprintf(out->method_name, sizeof out->method_name, "%s", s);
    out->method = strcmp(s, "gptq") == 0  ? QL__CK_GPTQ
                  : strcmp(s, "awq") == 0 ? QL__CK_AWQ
                                          : QL__CK_UNKNOWN;
    out->present = 1;
  }
  if ((rc = get_int(qc, "bits", &v, err, errlen)) < 0)
    goto done;
  if (rc == 1) {
    if (v < 1 || v > 16) {
      rc = fail(err, errlen, QL_EBADFILE, "quantization_config: bits %lld",
                (long long)v);
      goto done;
    }
    out->bits = (int)v;
    out->present = 1;
  }
  if ((rc = get_int(qc, "group_size", &v, err, errlen)) < 0)
    goto done;
  if (rc == 1) {
    if (v == 0 || v < -1 || v > (1 << 30)) {
      rc = fail(err, errlen, QL_EBADFILE, "quantization_config: group_size "
                "%lld", (long long)v);
      goto done;
    }
    out->group_size = v;
  }
  if ((rc = get_bool(qc, "sym", &out->sym, err, errlen)) < 0 ||
      (rc = get_bool(qc, "desc_act", &out->desc_act, err, errlen)) < 0)
    goto done;
  /* gptqmodel writes checkpoint_format (older versions: format). */
  if ((s = get_str(qc, "checkpoint_format")) != NULL ||
      (s = get_str(qc, "format")) != NULL)
    out->gptq_v2 = strcmp(s, "gptq_v2") == 0;
  if ((s = get_str(qc, "version")) != NULL)
    out->awq_gemv = strcasecmp(s, "gemv") == 0 || strcasecmp(s, "gemv_fast") == 0;
  rc = 0;
done:
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------ helpers */

static uint32_t word(const ql__st_tensor *t, uint64_t row, uint64_t col) {
  uint32_t w;
  memcpy(&w, t->data + 4 * (row * t->shape[1] + col), 4);
  return w;
}

static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1F,
           m = h & 0x3FF, bits;
  float f;
  if (e == 0) { /* zero or subnormal: m·2^-24, exact in f32 */
    f = ldexpf((float)m, -24);
    return sign ? -f : f;
  }
  if (e == 31)
    bits = sign | 0x7F800000u | (m << 13);
  else
    bits = sign | ((e + 112) << 23) | (m << 13);
  memcpy(&f, &bits, 4);
  return f;
}

/* Element i of a float scale tensor, widened to f32 (exact). */
static float scale_at(const ql__st_tensor *t, uint64_t i) {
  uint16_t h;
  uint32_t b;
  float f;
  switch (t->dtype) {
  case QL__ST_F16:
    memcpy(&h, t->data + 2 * i, 2);
    return f16_to_f32(h);
  case QL__ST_BF16:
    memcpy(&h, t->data + 2 * i, 2);
    b = (uint32_t)h << 16;
    memcpy(&f, &b, 4);
    return f;
  default:
    memcpy(&f, t->data + 4 * i, 4);
    return f;
  }
}

static int adt_of(ql__st_dtype dt) {
  return dt == QL__ST_F16 ? QL_ADT_F16 : dt == QL__ST_BF16 ? QL_ADT_BF16
                                                           : QL_ADT_F32;
}

static int is_2d(const ql__st_tensor *t) { return t != NULL && t->ndim == 2; }

void ql__ck_canon_free(ql__ck_canon *c) {
  if (c == NULL)
    return;
  free(c->qdata);
  free(c->scale);
  free(c->zero);
  memset(c, 0, sizeof *c);
}

/* AWQ's nibble order: nibble i holds column order[i]; inv[c] is the nibble
 * of column c. */
static const unsigned awq_inv[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* ------------------------------------------------------------ convert */

int ql__ck_convert(const ql__ck_layer *l, const ql__ck_config *cfg,
                   ql__ck_canon *out, char *err, size_t errlen) {
  static const ql__ck_config none = {.sym = -1, .desc_act = -1};
  const ql__st_tensor *qw = l->qweight, *qz = l->qzeros, *sc = l->scales,
                      *gi = l->g_idx;
  const char *name = l->name;
  ql__ck_method method;
  uint64_t n, k, g, gs, cg, ng, per, nn, kk, gg;
  uint32_t mask, step = 0;
  int bits, rc, mid, sym = 1;
  float *fs = NULL;
  int32_t *zp = NULL;

  memset(out, 0, sizeof *out);
  if (cfg == NULL || !cfg->present)
    cfg = &none;

  /* ---- the tensors' dtypes and ranks */
  if (!is_2d(qw) || qw->dtype != QL__ST_I32)
    return fail(err, errlen, qw == NULL ? QL_EFORMAT : QL_EDTYPE,
                "%s.qweight: %s, expected a 2-D I32 tensor", name,
                qw == NULL ? "missing" : "wrong dtype or rank");
  if (!is_2d(qz) || qz->dtype != QL__ST_I32)
    return fail(err, errlen, qz == NULL ? QL_EFORMAT : QL_EDTYPE,
                "%s.qzeros: %s, expected a 2-D I32 tensor", name,
                qz == NULL ? "missing" : "wrong dtype or rank");
  if (!is_2d(sc) || (sc->dtype != QL__ST_F16 && sc->dtype != QL__ST_BF16 &&
                     sc->dtype != QL__ST_F32))
    return fail(err, errlen, sc == NULL ? QL_EFORMAT : QL_EDTYPE,
                "%s.scales: %s, expected a 2-D F16, BF16 or F32 tensor", name,
                sc == NULL ? "missing" : "wrong dtype or rank");
  if (gi != NULL && (gi->ndim != 1 || gi->dtype != QL__ST_I32))
    return fail(err, errlen, QL_EDTYPE, "%s.g_idx: expected a 1-D I32 "
                "tensor", name);
  g = sc->shape[0];
  n = sc->shape[1];
  if (g == 0 || n == 0)
    return fail(err, errlen, QL_ESHAPE, "%s.scales: empty shape", name);

  /* ---- which packing: the shapes decide, the config must agree */
  if (qw->shape[1] == n)
    method = QL__CK_GPTQ;
  else if (qw->shape[1] * 8 == n && gi == NULL)
    method = QL__CK_AWQ;
  else
    return fail(err, errlen, QL_EFORMAT, "%s.qweight: shape [%llu,%llu] with "
                "scales [%llu,%llu] is neither GPTQ ([K*bits/32, N]) nor AWQ "
                "GEMM ([K, N/8])", name, (unsigned long long)qw->shape[0],
                (unsigned long long)qw->shape[1], (unsigned long long)g,
                (unsigned long long)n);
  if (cfg->method_name[0] != '\0' && cfg->method != method)
    return fail(err, errlen, QL_EFORMAT, "%s.qweight: packed as %s, but "
                "quantization_config says quant_method \"%s\"", name,
                method == QL__CK_GPTQ ? "GPTQ" : "AWQ GEMM",
                cfg->method_name);
  if (method == QL__CK_AWQ && cfg->awq_gemv)
    return fail(err, errlen, QL_ENOTSUP, "%s.qweight: AWQ GEMV packing is "
                "not supported (GEMM is)", name);

  /* ---- bits and K */
  if (method == QL__CK_AWQ) {
    bits = 4;
    if (cfg->bits != 0 && cfg->bits != 4)
      return fail(err, errlen, QL_ENOTSUP, "%s.qweight: AWQ with %d bits is "
                  "not supported", name, cfg->bits);
    k = qw->shape[0];
  } else {
    if (gi != NULL && gi->shape[0] > 0) {
      k = gi->shape[0];
      if ((qw->shape[0] * 32) % k != 0)
        return fail(err, errlen, QL_ESHAPE, "%s.qweight: %llu rows do not "
                    "pack K = %llu (from g_idx) at any bit width", name,
                    (unsigned long long)qw->shape[0], (unsigned long long)k);
      bits = (int)(qw->shape[0] * 32 / k);
      if (cfg->bits != 0 && cfg->bits != bits)
        return fail(err, errlen, QL_EFORMAT, "%s.qweight: packs %d bits per "
                    "value, quantization_config says %d", name, bits,
                    cfg->bits);
    } else if (cfg->bits != 0) {
      bits = cfg->bits;
      if (bits != 4 && bits != 8)
        return fail(err, errlen, QL_ENOTSUP, "%s.qweight: %d-bit GPTQ is not "
                    "supported (4 and 8 are)", name, bits);
      k = qw->shape[0] * (uint64_t)(32 / bits);
    } else {
      return fail(err, errlen, QL_EFORMAT, "%s.qweight: the bit width cannot "
                  "be told: no g_idx and no quantization_config", name);
    }
  }
  if (bits != 4 && bits != 8)
    return fail(err, errlen, QL_ENOTSUP, "%s.qweight: %d-bit values are not "
                "supported (4 and 8 are)", name, bits);
  per = 32 / (uint64_t)bits;
  mask = (1u << bits) - 1;
  mid = 1 << (bits - 1);
  if (k == 0 || k > (1ull << 31) || n > (1ull << 31))
    return fail(err, errlen, QL_ESHAPE, "%s: K = %llu, N = %llu out of "
                "range", name, (unsigned long long)k, (unsigned long long)n);
  if (method == QL__CK_GPTQ && (k % per != 0 || qw->shape[0] != k / per))
    return fail(err, errlen, QL_ESHAPE, "%s.qweight: %llu rows, expected "
                "K*bits/32 = %llu", name, (unsigned long long)qw->shape[0],
                (unsigned long long)(k / per));
  if (n % per != 0 || qz->shape[0] != g || qz->shape[1] != n / per)
    return fail(err, errlen, QL_ESHAPE, "%s.qzeros: shape [%llu,%llu], "
                "expected [%llu,%llu]", name, (unsigned long long)qz->shape[0],
                (unsigned long long)qz->shape[1], (unsigned long long)g,
                (unsigned long long)(n / per));

  /* ---- the checkpoint's group size */
  if (g == 1) {
    gs = k; /* one group per row (group_size -1), or a single group */
    if (cfg->group_size > 0 && (uint64_t)cfg->group_size < k)
      return fail(err, errlen, QL_ESHAPE, "%s.scales: 1 group, but "
                  "group_size %lld needs %llu", name,
                  (long long)cfg->group_size,
                  (unsigned long long)((k + (uint64_t)cfg->group_size - 1) /
                                       (uint64_t)cfg->group_size));
  } else if (cfg->group_size > 0) {
    gs = (uint64_t)cfg->group_size;
    if ((k + gs - 1) / gs != g)
      return fail(err, errlen, QL_ESHAPE, "%s.scales: %llu groups, but K = "
                  "%llu with group_size %llu needs %llu", name,
                  (unsigned long long)g, (unsigned long long)k,
                  (unsigned long long)gs,
                  (unsigned long long)((k + gs - 1) / gs));
  } else {
    if (cfg->group_size == -1 || k % g != 0)
      return fail(err, errlen, QL_ESHAPE, "%s.scales: %llu groups do not "
                  "divide K = %llu%s", name, (unsigned long long)g,
                  (unsigned long long)k,
                  cfg->group_size == -1 ? " (group_size is -1)" : "");
    gs = k / g;
  }
  if (gs < k) {
    for (cg = 256; cg >= 32 && gs % cg != 0; cg /= 2)
      ;
  } else {
    cg = 128; /* one group per row: any canonical group repeats it */
  }
  if (cg < 32)
    return fail(err, errlen, QL_ENOTSUP, "%s.scales: group size %llu is not "
                "a multiple of 32, 64, 128 or 256", name,
                (unsigned long long)gs);

  /* ---- g_idx: trivial (k / gs) or refused */
  if (gi != NULL && gi->shape[0] > 0) {
    if (gi->shape[0] != k)
      return fail(err, errlen, QL_ESHAPE, "%s.g_idx: %llu entries, K is "
                  "%llu", name, (unsigned long long)gi->shape[0],
                  (unsigned long long)k);
    for (kk = 0; kk < k; kk++) {
      int32_t v;
      memcpy(&v, gi->data + 4 * kk, 4);
      if (v < 0 || (uint64_t)v >= g)
        return fail(err, errlen, QL_EBADFILE, "%s.g_idx: entry %llu is %d, "
                    "outside [0, %llu)", name, (unsigned long long)kk, v,
                    (unsigned long long)g);
      if ((uint64_t)v != kk / gs)
        return fail(err, errlen, QL_ENOTSUP, "%s.g_idx: act-order (desc_act) "
                    "checkpoint: column %llu is in group %d, not %llu; "
                    "act-order is not supported (quantize without desc_act, "
                    "or with static_groups)", name, (unsigned long long)kk, v,
                    (unsigned long long)(kk / gs));
    }
  }

  /* ---- zero points, decoded once: zp[g·N + n] */
  if (method == QL__CK_GPTQ && !cfg->gptq_v2)
    step = bits == 4 ? 0x11111111u : 0x01010101u;
  ng = (k + cg - 1) / cg;
  if ((zp = malloc(g * n * sizeof *zp)) == NULL ||
      (fs = malloc(g * n * sizeof *fs)) == NULL) {
    rc = fail(err, errlen, QL_ENOMEM, "out of memory");
    goto fail;
  }
  for (gg = 0; gg < g; gg++)
    for (nn = 0; nn < n; nn++) {
      uint32_t w = word(qz, gg, nn / per) + step; /* modulo 2^32 */
      unsigned pos = method == QL__CK_AWQ ? awq_inv[nn % 8]
                                          : (unsigned)(nn % per);
      zp[gg * n + nn] = (int32_t)((w >> (bits * pos)) & mask);
      if (zp[gg * n + nn] != mid)
        sym = 0;
      fs[gg * n + nn] = scale_at(sc, gg * n + nn);
      if (!isfinite(fs[gg * n + nn])) {
        rc = fail(err, errlen, QL_ENONFINITE, "%s.scales: %g at [%llu,%llu]",
                  name, (double)fs[gg * n + nn], (unsigned long long)gg,
                  (unsigned long long)nn);
        goto fail;
      }
    }
  if (cfg->sym == 1 && !sym) {
    rc = fail(err, errlen, QL_EFORMAT, "%s.qzeros: quantization_config says "
              "sym, but the zero points are not all %d", name, mid);
    goto fail;
  }

  out->method = method;
  out->bits = bits;
  out->gptq_v2 = method == QL__CK_GPTQ && cfg->gptq_v2;
  out->format = bits == 4 ? QL_FORMAT_Q4G : QL_FORMAT_Q8B;
  out->group_size = (uint32_t)cg;
  out->src_group = (uint32_t)gs;
  out->n = n;
  out->k = k;
  out->groups = ng;
  out->symmetric_src = sym;
  out->asymmetric = bits == 8 && !sym;

  /* ---- the arrays' sizes; a check alone ends here, having allocated
   * nothing that outlives the call */
  out->has_zero = bits == 4 || !sym;
  out->scale_dtype = sym ? adt_of(sc->dtype) : QL_ADT_F32;
  out->scale_bytes = ng * n * (sym ? ql__st_dtype_size(sc->dtype) : 4);
  if (bits == 4) {
    size_t rowb = (size_t)(k / 2 + (k & 1)); /* odd K: a zero pad nibble */
    out->qdata_dtype = QL_ADT_U8;
    out->qdata_bytes = n * rowb;
  } else {
    out->qdata_dtype = QL_ADT_I8;
    out->qdata_bytes = n * k;
  }
  if (l->check_only) {
    free(zp);
    free(fs);
    return 0;
  }

  /* ---- scale and zero [ng, N]: kept dtype when symmetric, else f32 */
  {
    int keep = sym;
    size_t esz = keep ? ql__st_dtype_size(sc->dtype) : 4;
    if ((out->scale = malloc(out->scale_bytes)) == NULL ||
        (out->has_zero && (out->zero = calloc(1, out->scale_bytes)) == NULL)) {
      rc = fail(err, errlen, QL_ENOMEM, "out of memory");
      goto fail;
    }
    for (gg = 0; gg < ng; gg++) {
      uint64_t src = gg * cg / gs; /* the checkpoint group holding it */
      for (nn = 0; nn < n; nn++) {
        uint64_t i = gg * n + nn, s = src * n + nn;
        if (keep) {
          memcpy((unsigned char *)out->scale + i * esz, sc->data + s * esz,
                 esz);
        } else {
          float z = (float)(mid - zp[s]) * fs[s]; /* exact, see the top */
          ((float *)out->scale)[i] = fs[s];
          ((float *)out->zero)[i] = z;
        }
      }
    }
  }

  /* ---- qdata */
  if ((out->qdata = calloc(1, out->qdata_bytes)) == NULL) {
    rc = fail(err, errlen, QL_ENOMEM, "out of memory");
    goto fail;
  }
  {
    unsigned char *q = out->qdata;
    for (kk = 0; kk < k; kk++)
      for (nn = 0; nn < n; nn++) {
        uint32_t u;
        if (method == QL__CK_AWQ)
          u = (word(qw, kk, nn / 8) >> (4 * awq_inv[nn % 8])) & 0xFu;
        else
          u = (word(qw, kk / per, nn) >> (bits * (kk % per))) & mask;
        if (bits == 4) /* q = u - 8 is the nibble u ^ 8; even k low */
          q[nn * (k / 2 + (k & 1)) + kk / 2] |= (uint8_t)((u ^ 8u) << ((kk & 1) * 4));
        else
          q[nn * k + kk] = (uint8_t)(u ^ 0x80u); /* (int8)(u - 128) */
      }
  }
  free(zp);
  free(fs);
  return 0;

fail:
  free(zp);
  free(fs);
  ql__ck_canon_free(out);
  return rc;
}

/* ------------------------------------------------------------ TorchAO */

/*
 * TorchAO's safetensors form (torchao/prototype/safetensors/
 * safetensors_support.py flatten_tensor_state_dict): a subclass weight
 * "<X>.weight" is saved as one tensor per inner tensor, "<X>._weight_qdata",
 * "<X>._weight_scale", "<X>._weight_zero_point", and the metadata key
 * "<X>.weight" holds {"_type": class, "_data": {attributes: block_size,
 * shape, ...}, "_tensor_data_names": [the inner tensors present]}.
 */

static int st_adt(ql__st_dtype dt) {
  switch (dt) {
  case QL__ST_F32:
    return QL_ADT_F32;
  case QL__ST_F16:
    return QL_ADT_F16;
  case QL__ST_BF16:
    return QL_ADT_BF16;
  case QL__ST_I8:
    return QL_ADT_I8;
  case QL__ST_U8:
    return QL_ADT_U8;
  case QL__ST_I32:
    return QL_ADT_I32;
  case QL__ST_F8_E4M3:
    return QL_ADT_F8E4M3;
  default:
    return 0;
  }
}

/* A JSON list of two non-negative integers. */
static int pair(json_t *v, int64_t out[2]) {
  if (!json_is_array(v) || json_array_size(v) != 2)
    return -1;
  for (size_t i = 0; i < 2; i++) {
    json_t *e = json_array_get(v, i);
    if (!json_is_integer(e) || json_integer_value(e) < 0)
      return -1;
    out[i] = json_integer_value(e);
  }
  return 0;
}

static int tao_array(const char *x, const char *part, ql__ck_find_fn find,
                     void *arg, ql__ck_array *a, char *err, size_t errlen) {
  char name[1200];
  const ql__st_tensor *t;
  snprintf(name, sizeof name, "%s._weight_%s", x, part);
  if ((t = find(arg, name)) == NULL)
    return fail(err, errlen, QL_EBADFILE, "%s: missing (named in the "
                "metadata of %s.weight)", name, x);
  if (t->ndim != 1 && t->ndim != 2)
    return fail(err, errlen, QL_ESHAPE, "%s: %d dimensions, expected 1 or 2",
                name, t->ndim);
  if ((a->dtype = st_adt(t->dtype)) == 0)
    return fail(err, errlen, QL_EDTYPE, "%s: dtype %s", name,
                ql__st_dtype_name(t->dtype));
  a->data = t->data;
  a->bytes = (size_t)t->bytes;
  a->ndim = t->ndim;
  a->shape[0] = t->shape[0];
  a->shape[1] = t->ndim == 2 ? t->shape[1] : 0;
  return 0;
}

int ql__ck_torchao_layer(const char *x, const char *meta, ql__ck_find_fn find,
                         void *arg, ql__ck_torchao *out, char *err,
                         size_t errlen) {
  json_error_t jerr;
  json_t *root, *data, *names, *v;
  const char *type;
  int64_t block[2], shape[2] = {-1, -1};
  int has_zero = 0, rc;
  size_t i;

  memset(out, 0, sizeof *out);
  root = json_loads(meta, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return fail(err, errlen, QL_EBADFILE, "%s.weight: metadata: bad JSON at "
                "byte %d: %s", x, jerr.position, jerr.text);
  type = json_string_value(json_object_get(root, "_type"));
  data = json_object_get(root, "_data");
  names = json_object_get(root, "_tensor_data_names");
  rc = fail(err, errlen, QL_EBADFILE, "%s.weight: metadata is not a TorchAO "
            "tensor subclass description (_type, _data, _tensor_data_names)",
            x);
  if (type == NULL || !json_is_object(data) || !json_is_array(names))
    goto done;
  snprintf(out->type, sizeof out->type, "%s", type);
  if (strcmp(type, "Int4Tensor") == 0 ||
      strcmp(type, "Int4PlainInt32Tensor") == 0) {
    out->format = QL_FORMAT_Q4G;
    out->zero_kind = type[4] == 'P' ? QL_ZERO_INT : QL_ZERO_FLOAT;
  } else if (strcmp(type, "Int8Tensor") == 0) {
    out->format = QL_FORMAT_Q8C;
  } else if (strcmp(type, "Float8Tensor") == 0) {
    out->format = QL_FORMAT_F8R;
  } else {
    rc = fail(err, errlen, QL_ENOTSUP, "%s.weight: TorchAO %.32s is not "
              "supported (Int4Tensor, Int4PlainInt32Tensor, Int8Tensor and "
              "Float8Tensor are)", x, type);
    goto done;
  }
  /* Every inner tensor present must be one we place: an act_pre_scale or
   * a static activation scale would change the layer's meaning. */
  json_array_foreach(names, i, v) {
    const char *s = json_string_value(v);
    if (s == NULL)
      goto done;
    if (strcmp(s, "zero_point") == 0 && out->format != QL_FORMAT_F8R) {
      has_zero = 1;
      continue;
    }
    if (strcmp(s, "qdata") != 0 && strcmp(s, "scale") != 0) {
      rc = fail(err, errlen, QL_ENOTSUP, "%s._weight_%.32s: TorchAO %s with "
                "%.32s is not supported", x, s, type, s);
      goto done;
    }
  }
  if (pair(json_object_get(data, "block_size"), block) != 0) {
    rc = fail(err, errlen, QL_ENOTSUP, "%s.weight: TorchAO %s: block_size "
              "is not [rows, cols] (only 2-D weights are imported)", x, type);
    goto done;
  }
  if ((v = json_object_get(data, "shape")) != NULL && pair(v, shape) != 0)
    goto done;
  if ((rc = tao_array(x, "qdata", find, arg, &out->qdata, err, errlen)) ||
      (rc = tao_array(x, "scale", find, arg, &out->scale, err, errlen)) ||
      (has_zero &&
       (rc = tao_array(x, "zero_point", find, arg, &out->zero, err, errlen))))
    goto done;
  if (out->qdata.ndim != 2) {
    rc = fail(err, errlen, QL_ESHAPE, "%s._weight_qdata: expected 2-D", x);
    goto done;
  }
  out->n = out->qdata.shape[0];
  out->k = out->format == QL_FORMAT_Q4G ? (uint64_t)shape[1]
                                        : out->qdata.shape[1];
  if (out->format == QL_FORMAT_Q4G &&
      (shape[0] < 0 || (uint64_t)shape[0] != out->n)) {
    rc = fail(err, errlen, QL_ESHAPE, "%s.weight: TorchAO %s: shape does not "
              "match %s._weight_qdata", x, type, x);
    goto done;
  }
  if (block[0] != 1 ||
      (out->format != QL_FORMAT_Q4G && (uint64_t)block[1] != out->k)) {
    rc = fail(err, errlen, QL_ENOTSUP, "%s.weight: TorchAO %s with "
              "block_size [%lld, %lld]: only per-row%s blocks are supported",
              x, type, (long long)block[0], (long long)block[1],
              out->format == QL_FORMAT_Q4G ? " groups ([1, group])" : "");
    goto done;
  }
  if (out->format == QL_FORMAT_Q4G) {
    if (block[1] != 32 && block[1] != 64 && block[1] != 128 &&
        block[1] != 256) {
      rc = fail(err, errlen, QL_ENOTSUP, "%s.weight: TorchAO %s with group "
                "%lld: q4g groups are 32, 64, 128 or 256", x, type,
                (long long)block[1]);
      goto done;
    }
    out->group_size = (uint32_t)block[1];
  }
  /* Int8Tensor keeps a zero_point even for its symmetric mapping; q8c has
   * none, so it must be all zero, and is left out. */
  if (out->format == QL_FORMAT_Q8C && has_zero) {
    const unsigned char *z = out->zero.data;
    size_t esz = ql_array_dtype_size(out->zero.dtype);
    if (out->zero.dtype != QL_ADT_I8 && out->zero.dtype != QL_ADT_I32) {
      rc = fail(err, errlen, QL_EDTYPE, "%s._weight_zero_point: expected "
                "I8 or I32", x);
      goto done;
    }
    for (i = 0; i < out->zero.bytes; i++)
      if (z[i] != 0) {
        rc = fail(err, errlen, QL_ENOTSUP, "%s._weight_zero_point: non-zero "
                  "at [%zu]: asymmetric int8 is not supported", x, i / esz);
        goto done;
      }
    memset(&out->zero, 0, sizeof out->zero);
  }
  rc = 0;
done:
  json_decref(root);
  if (rc != 0)
    memset(out, 0, sizeof *out);
  return rc;
}
