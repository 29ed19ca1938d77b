/*
 * qlinear_ckpt.h - quantized checkpoint layers (GPTQ, AWQ) converted to
 * the packed form ql_load_packed() takes, exactly: the conversion
 * `qlinearctl import` does (docs/import.md), for loaders that read the
 * checkpoint themselves (the Python package's from_pretrained).
 *
 * A conversion needs no daemon and no connection. Thread-safe; the error
 * message of a failure is ql_errmsg()'s.
 */
#ifndef QLINEAR_CKPT_H
#define QLINEAR_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include <qlinear/qlinear.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a checkpoint layer as its file holds it: borrowed,
 * row-major, little-endian. */
typedef struct ql_ckpt_tensor {
  const void *data;
  uint64_t bytes;    /* bytes at data: exactly the shape's */
  int dtype;         /* a ql_array_dtype: QL_ADT_I32 for qweight, qzeros
                        and g_idx; QL_ADT_F16, BF16 or F32 for scales */
  int ndim;          /* 1 or 2 */
  uint64_t shape[2]; /* shape[1] ignored when ndim is 1 */
} ql_ckpt_tensor;

/* A converted layer. desc is ql_load_packed()'s argument once its name is
 * set (and its policy, devices, ... if wanted): its arrays point into this
 * same allocation, which the caller frees with ql_free(). */
typedef struct ql_ckpt_layer {
  ql_packed_desc desc; /* format q4g (4 bits) or q8b (8 bits), name NULL */
  int method;          /* 1: GPTQ, 2: AWQ (GEMM packing) */
  int bits;            /* 4 or 8 */
  uint32_t src_group;  /* the checkpoint's group size (K: one per row) */
  int symmetric;       /* every zero point was the midpoint: the scales
                          kept their dtype and zero is all 0 */
} ql_ckpt_layer;

/*
 * Converts the quantized layer called layer (its prefix X, for messages)
 * from its tensors X.qweight, X.qzeros, X.scales and, for GPTQ, X.g_idx
 * (NULL when the file has none). config (len bytes, may be NULL) is the
 * checkpoint's config.json ({"quantization_config": {...}}) or AutoGPTQ's
 * quantize_config.json: its quant_method, bits, group_size, sym, desc_act,
 * checkpoint_format and version are checked against the tensors (GPTQ's
 * v1 zero points are decoded as gptqmodel does). On success *out is the
 * caller's. QL_EFORMAT (neither packing, or one the config disagrees
 * with), QL_ESHAPE, QL_EDTYPE, QL_ENOTSUP (act-order, other bits or group
 * sizes, AWQ's GEMV packing), QL_EBADFILE (bad JSON), QL_ENONFINITE,
 * QL_ENOMEM, QL_EINVAL, each with a message naming the tensor; *out is
 * NULL then.
 */
QL_EXPORT int ql_ckpt_convert(const char *layer, const ql_ckpt_tensor *qweight,
                              const ql_ckpt_tensor *qzeros,
                              const ql_ckpt_tensor *scales,
                              const ql_ckpt_tensor *g_idx, const char *config,
                              size_t len, ql_ckpt_layer **out);

#ifdef __cplusplus
}
#endif
#endif /* QLINEAR_CKPT_H */
