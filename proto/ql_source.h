/*
 * ql_source.h - the source digest: what binds a weight's name to the
 * content a load sent (DESIGN §8, docs/security.md).
 *
 * The daemon hashes, with SHA-256, a fixed header describing the load (the
 * WeightSpec and PackedSpec fields the content depends on, and for float
 * loads the version of the daemon's quantization rules) followed by every
 * byte of the upload stream, in order. A client can compute the same value
 * before it sends anything (libqlinear: ql_source_digest_float() and
 * ql_source_digest_packed()), so it can name a weight after it.
 *
 * A name that ends in QL_SOURCE_NAME_TAG and 64 lowercase hex digits is
 * content-addressed: the daemon accepts a load under it only when those
 * digits are the source digest of what it received, so whoever loads such
 * a name first, the weight behind it is the content the name says.
 *
 * Shared by the daemon and libqlinear; plain C, no hashing here (each side
 * hashes with libcrypto).
 */
#ifndef QL_SOURCE_H
#define QL_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One packed array of a load, as its ArraySpec declares it. */
typedef struct ql_source_array {
  uint32_t present; /* 0: absent (the other fields are 0) */
  uint32_t dtype;   /* ArrayDType */
  uint32_t ndim;    /* 1 or 2 */
  uint64_t shape[2]; /* shape[1] is 1 when ndim is 1 */
} ql_source_array;

/* The fields of a load that its content depends on, as sent. */
typedef struct ql_source_spec {
  uint32_t packed;            /* 1: already-quantized arrays */
  uint32_t quantizer_version; /* float loads: the daemon's rules; packed: 0 */
  uint32_t format, group_size;
  uint32_t dtype;             /* float data's DType; packed: 0 */
  uint32_t has_bias, policy, scale_dtype, asymmetric;
  uint32_t zero_kind;         /* packed only; float: 0 */
  uint64_t n, k;
  ql_source_array arrays[4];  /* packed: qdata, scale, zero, bias */
} ql_source_spec;

/* The header's size: a 16-byte magic, 10 u32, 2 u64, 4 arrays of 3 u32
 * and 2 u64, all little-endian. */
#define QL_SOURCE_HEADER_BYTES (16 + 10 * 4 + 2 * 8 + 4 * (3 * 4 + 2 * 8))

/* The name suffix of a content-addressed name, before the 64 hex digits. */
#define QL_SOURCE_NAME_TAG ".src-"

/* Writes the header of s into out (QL_SOURCE_HEADER_BYTES bytes). */
void ql_source_header(const ql_source_spec *s,
                      uint8_t out[QL_SOURCE_HEADER_BYTES]);

/* 1 when name is content-addressed, with its digest (32 bytes) in out;
 * else 0 (out untouched). */
int ql_source_name_digest(const char *name, uint8_t out[32]);

#ifdef __cplusplus
}
#endif

#endif /* QL_SOURCE_H */
