/*
 * safetensors.h - a reader of safetensors files (and of the
 * model.safetensors.index.json that lists a sharded checkpoint's files),
 * for `qlinearctl import`.
 *
 * The format: an 8-byte little-endian header length L, L bytes of JSON
 * (an object: tensor name -> {"dtype", "shape", "data_offsets": [begin,
 * end]}, plus an optional "__metadata__" object of strings), then the data;
 * offsets count from the end of the header.
 *
 * ql__st_parse() is the parser of untrusted input: the header length is
 * checked against the file size before the JSON is read, and every tensor's
 * dtype, shape, offsets and byte count (overflow-checked), and the absence
 * of overlaps between tensors, before any tensor's data pointer is handed
 * out. It never asserts and never reads outside [buf, buf + len).
 */
#ifndef QL_SAFETENSORS_H
#define QL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define QL__ST_MAX_DIMS 8
/* A header larger than this is refused (the format's own reader caps it
 * at 100 MB too). */
#define QL__ST_MAX_HEADER (100u << 20)

/* Element types, as the header spells them ("F32", "BF16", ...). */
typedef enum ql__st_dtype {
  QL__ST_BOOL = 1,
  QL__ST_U8,
  QL__ST_I8,
  QL__ST_F8_E4M3,
  QL__ST_F8_E5M2,
  QL__ST_I16,
  QL__ST_U16,
  QL__ST_F16,
  QL__ST_BF16,
  QL__ST_I32,
  QL__ST_U32,
  QL__ST_F32,
  QL__ST_I64,
  QL__ST_U64,
  QL__ST_F64,
} ql__st_dtype;

/* One tensor. data points into the parsed buffer (or the mapping) and is
 * valid while the file is; it need not be aligned: read through memcpy. */
typedef struct ql__st_tensor {
  char *name;
  ql__st_dtype dtype;
  int ndim;                         /* 0 (a scalar) .. QL__ST_MAX_DIMS */
  uint64_t shape[QL__ST_MAX_DIMS];
  uint64_t offset;                  /* from the start of the file */
  uint64_t bytes;                   /* elements · element size */
  const unsigned char *data;
} ql__st_tensor;

/* A parsed file: tensors in the header's order, the metadata strings. */
typedef struct ql__st_file {
  size_t n_tensors;
  ql__st_tensor *tensors;
  size_t n_meta;
  char **meta_keys, **meta_values;
  /* Set by ql__st_open(): the read-only mapping that the data points into
   * (NULL after ql__st_parse(), whose caller keeps the buffer). */
  void *map;
  size_t map_len;
} ql__st_file;

/* Size in bytes of one element; 0 for a value outside the enum. */
size_t ql__st_dtype_size(ql__st_dtype dt);
/* "F32", "BF16", ...; "?" for a value outside the enum. */
const char *ql__st_dtype_name(ql__st_dtype dt);

/*
 * Parses the len bytes at buf as a safetensors file. On success *out is a
 * new file the caller frees with ql__st_free(); its data pointers borrow
 * buf, which must outlive it. On failure returns QL_EBADFILE (structure,
 * JSON, offsets, overlap, header vs file size), QL_EDTYPE (an unknown
 * dtype), QL_ESHAPE (a shape that does not match its byte count) or
 * QL_ENOMEM, writes a message to err naming the tensor, and *out is NULL.
 */
int ql__st_parse(const void *buf, size_t len, ql__st_file **out, char *err,
                 size_t errlen);

/* Maps the file at path read-only and parses it. The same errors, plus
 * QL_EIO when the file cannot be opened, read or mapped. */
int ql__st_open(const char *path, ql__st_file **out, char *err,
                size_t errlen);

/* Frees a file (unmapping it when ql__st_open() mapped it). NULL-safe. */
void ql__st_free(ql__st_file *f);

/* The tensor called name, or NULL. */
const ql__st_tensor *ql__st_find(const ql__st_file *f, const char *name);

/* The metadata value of key, or NULL. */
const char *ql__st_meta(const ql__st_file *f, const char *key);

/*
 * Reads a sharded checkpoint's index (model.safetensors.index.json:
 * {"weight_map": {tensor: shard file}}) of len bytes at buf. On success
 * *files holds the distinct shard file names (*n_files of them, in order of
 * first appearance; malloc'd, freed with ql__st_strv_free()). A shard name
 * must be a plain file name (no '/', not "." or ".."): it is opened beside
 * the index. QL_EBADFILE with a message otherwise, and for an index that
 * names no tensor.
 */
int ql__st_index_parse(const void *buf, size_t len, char ***files,
                       size_t *n_files, char *err, size_t errlen);

/* Checks that every tensor a sharded checkpoint's index (buf, len bytes)
 * names is in the shard it names: holds(arg, shard, tensor) says whether
 * the shard (a plain file name, as the index has it) holds that tensor.
 * 0, or QL_EBADFILE with err naming the first one that is not (a shard of
 * another revision, a truncated download: the checkpoint is not whole). */
int ql__st_index_check(const void *buf, size_t len,
                       int (*holds)(void *arg, const char *shard,
                                    const char *tensor),
                       void *arg, char *err, size_t errlen);
void ql__st_strv_free(char **v, size_t n);

#endif /* QL_SAFETENSORS_H */
