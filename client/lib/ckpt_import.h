/*
 * ckpt_import.h - GPTQ and AWQ checkpoint layers converted to qlinear's
 * canonical packed form (DESIGN §4), exactly, and TorchAO weights saved by
 * TorchAO's safetensors serializer mapped to it, for `qlinearctl import`.
 *
 * A quantized layer X is the tensors X.qweight, X.qzeros, X.scales (and for
 * GPTQ X.g_idx). Which packing it is comes from the tensors' shapes,
 * checked against the checkpoint's quantization_config when there is one
 * (ckpt_import.c says how); anything that fits neither is an error naming
 * the tensor.
 */
#ifndef QL_CKPT_IMPORT_H
#define QL_CKPT_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "ql_defs.h"
#include "safetensors.h"

typedef enum ql__ck_method {
  QL__CK_UNKNOWN = 0,
  QL__CK_GPTQ = 1,
  QL__CK_AWQ = 2,
} ql__ck_method;

/* What a checkpoint's quantization_config says; every field may be
 * unknown (the tensors then decide alone). */
typedef struct ql__ck_config {
  int present;           /* 1: a quantization_config was found */
  ql__ck_method method;  /* from quant_method; UNKNOWN if absent */
  char method_name[32];  /* quant_method as written ("" if absent) */
  int bits;              /* 0: unknown */
  int64_t group_size;    /* 0: unknown, -1: one group per row */
  int sym;               /* -1 unknown, 0, 1 */
  int desc_act;          /* -1 unknown, 0, 1 */
  int gptq_v2;           /* 1: checkpoint_format "gptq_v2" (no offset) */
  int awq_gemv;          /* 1: AWQ version "gemv" (not supported) */
} ql__ck_config;

/* The tensors of one quantized layer, borrowed from parsed files. g_idx
 * may be NULL. */
typedef struct ql__ck_layer {
  const char *name; /* the layer prefix X, for messages */
  const ql__st_tensor *qweight, *qzeros, *scales, *g_idx;
  /* 1: ql__ck_convert() checks everything it would refuse and fills the
   * canonical form's metadata and sizes, but leaves its arrays NULL. An
   * import checks every layer so before its first upload, then converts
   * each just before uploading it: its heap is one layer, not the model. */
  int check_only;
} ql__ck_layer;

/* A canonical weight's arrays, as ql_load_packed() takes them (DESIGN §4:
 * q4g qdata [N, K/2] u8, scale and zero [G, N]; q8b qdata [N, K] i8,
 * scale (and zero) [G, N]). Owned: freed with ql__ck_canon_free(). */
typedef struct ql__ck_canon {
  ql__ck_method method;
  int bits;              /* 4 or 8 */
  int gptq_v2;           /* the zero-point convention that was applied */
  ql_format format;      /* QL_FORMAT_Q4G or QL_FORMAT_Q8B */
  uint32_t group_size;   /* canonical group (32..256) */
  uint32_t src_group;    /* the checkpoint's group (K for one per row) */
  uint64_t n, k, groups; /* groups = ceil(K / group_size) */
  int asymmetric;        /* q8b with a zero array */
  int has_zero;          /* a zero array (q4g, or asymmetric q8b) */
  int symmetric_src;     /* every zero point was the midpoint */
  void *qdata;
  size_t qdata_bytes;
  int qdata_dtype;       /* QL_ADT_U8 (q4g) or QL_ADT_I8 (q8b) */
  void *scale, *zero;    /* zero NULL for symmetric q8b */
  int scale_dtype;       /* QL_ADT_F16/BF16 (kept) or QL_ADT_F32 */
  size_t scale_bytes;    /* of scale, and of zero when present */
} ql__ck_canon;

/*
 * Parses config.json ({"quantization_config": {...}}) or AutoGPTQ's
 * quantize_config.json (the same fields at the top level). A file with no
 * quantization fields leaves out->present 0. QL_EBADFILE for bad JSON or a
 * field of the wrong type.
 */
int ql__ck_config_parse(const void *buf, size_t len, ql__ck_config *out,
                        char *err, size_t errlen);

/*
 * Detects the layer's packing from its tensors (and cfg, which may be
 * NULL or not present) and converts it. On success *out owns the canonical
 * arrays. On failure returns QL_EFORMAT (not GPTQ/AWQ, or disagreeing with
 * the config), QL_ESHAPE, QL_EDTYPE, QL_ENOTSUP (act-order, unsupported bits
 * or group size, AWQ GEMV), QL_ENONFINITE, QL_ENOMEM, with a message naming
 * the tensor, and *out is zeroed.
 */
int ql__ck_convert(const ql__ck_layer *layer, const ql__ck_config *cfg,
                   ql__ck_canon *out, char *err, size_t errlen);

void ql__ck_canon_free(ql__ck_canon *c);

/* One array of a TorchAO weight, borrowed from a parsed file. */
typedef struct ql__ck_array {
  const void *data;
  size_t bytes;
  int dtype;         /* a ql_array_dtype */
  int ndim;          /* 1 or 2 */
  uint64_t shape[2];
} ql__ck_array;

/*
 * A TorchAO tensor subclass saved to safetensors by TorchAO's serializer
 * (torchao/prototype/safetensors: tensors "<X>._weight_<part>", and under
 * the metadata key "<X>.weight" the subclass's JSON: "_type", "_data" with
 * block_size (and shape), "_tensor_data_names"), as the packed arrays that
 * ql_load_packed() takes. They need no conversion: TorchAO's packed form is
 * the canonical one (DESIGN §4); the daemon checks every array again.
 */
typedef struct ql__ck_torchao {
  char type[32];          /* "Int4Tensor", ... */
  ql_format format;
  uint32_t group_size;    /* q4g; 0 otherwise */
  uint64_t n, k;
  ql_zero_kind zero_kind; /* QL_ZERO_INT for Int4PlainInt32Tensor */
  ql__ck_array qdata, scale, zero; /* zero.data NULL: none */
} ql__ck_torchao;

/* Finds a tensor by name in the checkpoint (for ql__ck_torchao_layer). */
typedef const ql__st_tensor *(*ql__ck_find_fn)(void *arg, const char *name);

/*
 * Reads the TorchAO weight "<x>.weight" whose subclass JSON is meta (the
 * metadata value), finding its "<x>._weight_<part>" tensors through find.
 * Int4Tensor (plain int4, float zero point) and Int4PlainInt32Tensor
 * become q4g, Int8Tensor with per-row blocks and an all-zero zero_point
 * q8c, Float8Tensor with per-row blocks f8r. Other subclasses, granularities
 * or tensor parts (act_pre_scale, ...) are QL_ENOTSUP; bad JSON or a
 * missing part QL_EBADFILE; each with a message naming the tensor.
 */
int ql__ck_torchao_layer(const char *x, const char *meta, ql__ck_find_fn find,
                         void *arg, ql__ck_torchao *out, char *err,
                         size_t errlen);

#endif /* QL_CKPT_IMPORT_H */
