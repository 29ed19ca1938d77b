/*
 * npy.h - a small reader and writer of NumPy .npy files for qlinearctl.
 *
 * Only what qlinearctl moves around is supported by default: little-endian
 * '<f4', '<f2' and '<u2' (raw 16-bit words, which the caller may treat as
 * bf16), C order, one or two dimensions. A caller that handles packed
 * arrays (weight import, the golden-vector tests) asks for more with
 * ql__npy_parse_types(): '|i1', '|u1' and '<i4'. Reading accepts format
 * versions 1.0, 2.0 and 3.0; writing produces 1.0, as numpy does for such
 * arrays.
 *
 * ql__npy_parse() is the parser of untrusted input: every length, the
 * header syntax and the shape arithmetic are checked against the buffer,
 * and a failure returns QL_EBADFILE with the reason in the caller's buffer.
 */
#ifndef QL_NPY_H
#define QL_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "ql_defs.h"

/* Element types (the 'descr' of the header). */
typedef enum ql__npy_type {
  QL__NPY_F32 = 1, /* '<f4' */
  QL__NPY_F16 = 2, /* '<f2' */
  QL__NPY_U16 = 3, /* '<u2': 16-bit words, bf16 if the caller says so */
} ql__npy_type;

/* The types only ql__npy_parse_types() returns, and only when asked for.
 * They are values of ql__npy_type but deliberately not enumerators, so that
 * a switch written for the three default types (qlinearctl's) stays
 * exhaustive under -Wswitch. */
#define QL__NPY_I8 ((ql__npy_type)4)  /* '|i1' */
#define QL__NPY_U8 ((ql__npy_type)5)  /* '|u1': bytes (float8 codes, ...) */
#define QL__NPY_I32 ((ql__npy_type)6) /* '<i4' */

/* Sets of types, for ql__npy_parse_types(): a bit per type. */
#define QL__NPY_BIT(t) (1u << (unsigned)(t))
#define QL__NPY_DEFAULT_TYPES                                                  \
  (QL__NPY_BIT(QL__NPY_F32) | QL__NPY_BIT(QL__NPY_F16) |                       \
   QL__NPY_BIT(QL__NPY_U16))
#define QL__NPY_ALL_TYPES                                                      \
  (QL__NPY_DEFAULT_TYPES | QL__NPY_BIT(QL__NPY_I8) |                           \
   QL__NPY_BIT(QL__NPY_U8) | QL__NPY_BIT(QL__NPY_I32))

/* A parsed array. data is not necessarily aligned to its element type. */
typedef struct ql__npy {
  ql__npy_type type;
  size_t elem_size;   /* 4, 2 or 1 */
  int ndim;           /* 1 or 2 */
  uint64_t shape[2];  /* shape[1] is 1 when ndim is 1 */
  uint64_t count;     /* elements: shape[0] * shape[1] */
  const void *data;   /* count * elem_size bytes */
  size_t data_len;    /* count * elem_size */
  void *owned;        /* the file contents held by ql__npy_load(), or NULL */
} ql__npy;

/* The element size of a type (any of the six), 0 for an unknown one. */
size_t ql__npy_type_size(ql__npy_type type);
/* The header's descr string of a type ("<f4"), or NULL. */
const char *ql__npy_type_descr(ql__npy_type type);
/* The packed-array type (QL_ADT_*) of an array of type: '<u2' taken as
 * bf16, '|u1' as float8 e4m3 codes when u8_is_f8, else bytes; 0 for an
 * unknown type. */
int ql__npy_adt(ql__npy_type type, int u8_is_f8);

/*
 * Parses the .npy file in buf[0..len). On success *out describes the array
 * and out->data points into buf (borrowed: valid while buf is), out->owned
 * is NULL. On failure returns QL_EBADFILE and writes the reason into
 * err[0..errlen) (err may be NULL); *out is then zeroed. Accepts the
 * default types only (QL__NPY_DEFAULT_TYPES).
 */
int ql__npy_parse(const void *buf, size_t len, ql__npy *out, char *err,
                  size_t errlen);

/* ql__npy_parse() accepting the element types in the set types (bits
 * QL__NPY_BIT(t); bits of no type are ignored): a file of any other type
 * fails with QL_EBADFILE and a reason listing the accepted ones. Every
 * other check is the same. */
int ql__npy_parse_types(const void *buf, size_t len, unsigned types,
                        ql__npy *out, char *err, size_t errlen);

/*
 * Reads and parses the file at path. On success out->owned holds the file's
 * contents, which out->data points into; release them with ql__npy_free().
 * Fails with QL_EIO (cannot read, reason in err), QL_ENOMEM or QL_EBADFILE.
 * ql__npy_load() accepts the default types, ql__npy_load_types() the set
 * types as ql__npy_parse_types() does.
 */
int ql__npy_load(const char *path, ql__npy *out, char *err, size_t errlen);
int ql__npy_load_types(const char *path, unsigned types, ql__npy *out,
                       char *err, size_t errlen);

/* Frees what ql__npy_load() allocated and zeroes *a. NULL-safe, and safe on
 * a zeroed or parsed (not loaded) struct. */
void ql__npy_free(ql__npy *a);

/*
 * Encodes an array as a version 1.0 .npy file in memory: shape has ndim (1
 * or 2) entries, data holds their product of elements of type. On success
 * *out is a malloc'd buffer of *out_len bytes owned by the caller. Returns
 * QL_EINVAL for bad arguments or sizes that overflow, QL_ENOMEM.
 */
int ql__npy_encode(ql__npy_type type, int ndim, const uint64_t *shape,
                   const void *data, void **out, size_t *out_len, char *err,
                   size_t errlen);

/* Writes ql__npy_encode()'s result to path (replacing the file). Returns 0,
 * QL_EINVAL, QL_ENOMEM or QL_EIO with the reason in err; a partly written
 * file is removed. */
int ql__npy_write(const char *path, ql__npy_type type, int ndim,
                  const uint64_t *shape, const void *data, char *err,
                  size_t errlen);

#endif /* QL_NPY_H */
