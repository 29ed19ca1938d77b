/*
 * store.h - the persistent weight store (DESIGN §8): canonical quantized
 * weights as safetensors files in the daemon's state directory, written
 * atomically, read back at start through the same validation as a client
 * import.
 *
 * Layout of the state directory (one qlineard per directory, enforced with
 * an flock on the directory for the store's life):
 *
 *   <digest>-<tag>.safetensors   one file per stored name. <digest> is the
 *       64 hex digits of the weight's content digest (ql__qweight_digest),
 *       <tag> the first 32 hex digits of SHA-256("qlinear-store-name\0" +
 *       name). The client's name never becomes a path (names hold '/'),
 *       yet the file of a name is found without an index: two names with
 *       the same content get two files (no sharing on disk, so removing
 *       one name never touches another's file), and a name has at most one
 *       file (a put of a name stored with other content is QL_EEXIST).
 *   <digest>.<layout id>.layout  a device layout of that content, cached
 *       (ql__store_layout_put) so a restart maps it instead of repacking;
 *       removed with the last file of its digest, or at start when that is
 *       gone.
 *   <file>.tmp-<pid>.<seq>       a write in progress; removed at open.
 *   <file>.corrupt-<UTC time>    a file that failed validation, moved aside
 *   <file>.duplicate-<UTC time>  a second valid file for an already loaded
 *                                name (only a hand-copied file can do that)
 *
 * There is no separate index file: each file's __metadata__ holds its name,
 * and the directory is scanned at start. One atomic rename is then the only
 * commit point of a put, and no index can disagree with the files.
 *
 * File format (safetensors: an 8-byte little-endian header length N, N
 * bytes of JSON, then the data section). The writer pads the JSON with
 * spaces so that the data starts at a multiple of 64 bytes and orders the
 * tensors bias (F32 [N]), scale, zero (F32/F16/BF16, [G, N] or [N]), qdata
 * (U8 [N, ceil(K/2)] for q4g, I8 [N, K] for q8c/q8b, F8_E4M3 [N, K] for
 * f8r), so every array is aligned to its element size in the file.
 * __metadata__ (all strings): qlinear_store_version "1", name, format
 * (q4g/q8c/q8b/f8r), group_size, n, k, asymmetric ("0"/"1"), scale_dtype
 * (f32/f16/bf16), digest (64 lowercase hex digits), policy
 * (auto/weight_only/act_quant).
 *
 * Threads: ql__store_put() and ql__store_remove() may run on any thread and
 * concurrently with each other for different names (the caller serializes
 * operations on one name, as the resident weight store already does);
 * ql__store_load_all() runs once at start, before the others.
 */
#ifndef QL_STORE_H
#define QL_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "ql_kernels.h"
#include "state/digest.h"

/* Largest JSON header accepted (ours are under 2 KiB). */
#define QL_STORE_MAX_HEADER ((uint64_t)65536)
/* The data section starts at a multiple of this (writer only). */
#define QL_STORE_ALIGN 64
#define QL_STORE_VERSION "1"

typedef struct ql__store ql__store;

/*
 * Opens the store in state_dir, creating the directory (mode 0750; its
 * parent must exist) when missing. Takes an exclusive flock on it
 * (QL_EIO "in use" when another process holds it) and removes temporary
 * files left by an interrupted put. On success *out is a store the caller
 * frees with ql__store_close(); on failure *out is NULL and err says why:
 * QL_EINVAL (bad arguments, not a directory), QL_ENOMEM, QL_EIO.
 */
int ql__store_open(const char *state_dir, ql__store **out, char *err,
                   size_t errlen);

/* Releases the lock and frees s. Safe on NULL. */
void ql__store_close(ql__store *s);

/* The directory the store was opened on. */
const char *ql__store_dir(const ql__store *s);

/*
 * Called by ql__store_load_all() once per valid stored weight. The callback
 * takes ownership of q when it returns 0; on any other value the store
 * frees q (and keeps the file: it is valid, only not loaded this time).
 */
typedef int (*ql__store_load_cb)(void *arg, const char *name, ql_qweight *q,
                                 ql_path policy,
                                 const uint8_t digest[QL_DIGEST_BYTES],
                                 const char *devices);

/*
 * Loads every <digest>-<tag>.safetensors file, in file name order: maps it
 * read-only, validates it (ql__store_parse), checks its file name against
 * its name and digest, and hands the weight to cb. A corrupt, truncated or
 * misnamed file is logged (ql__warn) and renamed <file>.corrupt-<time>; a
 * second valid file for a name already loaded is renamed
 * <file>.duplicate-<time>; a file that cannot be read for lack of memory or
 * an I/O error is logged and left alone. None of these stops the others.
 * Returns the number of weights cb accepted, or a negative QL_E* code when
 * the directory itself cannot be read.
 */
int ql__store_load_all(ql__store *s, ql__store_load_cb cb, void *arg);

/*
 * Writes q (canonical, checked with ql_qweight_check) under name
 * (ql__name_valid) with its digest (must equal ql__qweight_digest(q): it is
 * recomputed and compared, since a wrong one would make the file fail at
 * the next start) and path policy. Atomic and durable when it returns 0:
 * a temp file in the directory (O_CREAT|O_EXCL, 0640), every byte written,
 * fsync, rename, fsync of the directory; after a crash the directory holds
 * the old state or the new one. Putting the same (name, content) again
 * rewrites the file the same way. q stays the caller's. devices (NULL or
 * "": none) is the placement the load named, device names joined by ','
 * (printable, no blank, shorter than QL_STORE_DEVICES_MAX), kept as the
 * metadata "devices" for the next start.
 * Errors: QL_ENAME, QL_EINVAL (bad weight, policy, digest or devices), QL_EEXIST
 * (name stored with other content: remove it first), QL_ENOMEM,
 * QL_EEXHAUSTED (disk full or quota), QL_EIO; err (may be NULL) says why.
 * On error the put is not acknowledged and the temp file is gone; only
 * when the final fsync of the directory fails (QL_EIO) may the renamed
 * file survive, which at worst loads a weight nobody was told about.
 */
int ql__store_put(ql__store *s, const char *name, const ql_qweight *q,
                  const uint8_t digest[QL_DIGEST_BYTES], ql_path policy,
                  const char *devices, char *err, size_t errlen);

/*
 * Removes the stored file(s) of name (unlink, then fsync of the directory;
 * a failed fsync is logged, the files being gone). 0, QL_ENOTFOUND when
 * nothing is stored under name, QL_ENAME, QL_EIO.
 */
int ql__store_remove(ql__store *s, const char *name);

/*
 * The layout cache. ql__store_layout_map() maps the cached image of
 * (digest, layout_id) read-only: on success *data and *len point into a
 * mapping that stays valid until ql__store_layout_unmap(*map) (an unlink of
 * the file does not end it). QL_ENOTFOUND when there is none (a malformed
 * one is removed and reported as none), QL_EINVAL for a bad layout_id
 * ([A-Za-z0-9_-]{1,31}), QL_ENOMEM. ql__store_layout_put() writes an
 * image atomically (temp file, fsync, rename); a failure is only a missed
 * cache: 0 or a QL_E* code for the log. Both may run on any thread.
 */
int ql__store_layout_map(ql__store *s, const uint8_t digest[QL_DIGEST_BYTES],
                         const char *layout_id, const void **data,
                         size_t *len, void **map);
void ql__store_layout_unmap(void *map); /* safe on NULL */
int ql__store_layout_put(ql__store *s, const uint8_t digest[QL_DIGEST_BYTES],
                         const char *layout_id, const void *data, size_t len);

/* ---- internals, exposed for the tests and the fuzz target ---- */

/* Checks a layout file's first head_len bytes (its header: 96) against the
 * file's size and the layout id wanted: 0 with *data_len, the image's
 * bytes, or QL_EBADFILE. Reads nothing past the header. */
int ql__store_layout_check(const uint8_t *head, size_t head_len,
                           uint64_t file_size, const char *layout_id,
                           uint64_t *data_len);

/* The longest "devices" metadata value, NUL included: 16 names of up to
 * 63 bytes and their commas. */
#define QL_STORE_DEVICES_MAX 1040

/* A weight as a store file holds it. */
typedef struct ql__stored_weight {
  char name[256];
  ql_qweight *q; /* owned by whoever called ql__store_parse() */
  ql_path policy;
  uint8_t digest[QL_DIGEST_BYTES];
  /* The devices the load named (device names joined by ','), or "" when
   * it named none: the default placement. Metadata "devices", optional. */
  char devices[QL_STORE_DEVICES_MAX];
} ql__stored_weight;

/*
 * Validates the complete contents of a store file (buf, len) and builds
 * the weight it holds. Nothing in the data section is read before the
 * header has been checked against len: header length at least 2, at most
 * QL_STORE_MAX_HEADER and len - 8; the JSON an object (no duplicate keys)
 * with only the tensors qdata, scale, zero, bias and __metadata__; each
 * tensor a known dtype, 1 or 2 dimensions, data_offsets inside the data
 * section whose size is shape product × element size; the tensors tiling
 * the data section exactly (no overlap, gap or trailing byte); every
 * metadata field present, well formed and consistent with the tensors.
 * The arrays then go through ql_qweight_import() (the checks of a client
 * import), and the digest of the result must equal the metadata's.
 * On success fills *out (out->q is the caller's). On failure out->q is
 * NULL and the return is QL_EBADFILE (the file is bad; err says where),
 * QL_ENOMEM or QL_EINTERNAL (not the file's fault). Never logs.
 */
int ql__store_parse(const uint8_t *buf, size_t len, ql__stored_weight *out,
                    char *err, size_t errlen);

/*
 * Serializes the safetensors header of a store file for (name, q, digest,
 * policy): the 8-byte length and the padded JSON, *hdr_len bytes in a new
 * buffer *hdr the caller frees. The data section follows it: bias, scale,
 * zero, qdata, each as in q. 0, QL_EINVAL or QL_ENOMEM; nothing is
 * validated beyond what the encoding needs (ql__store_put does that).
 */
int ql__store_header(const char *name, const ql_qweight *q,
                     const uint8_t digest[QL_DIGEST_BYTES], ql_path policy,
                     const char *devices, uint8_t **hdr, size_t *hdr_len);

/* The file name (without directory) of (name, digest), as described
 * above: 64 + 1 + 32 hex digits + ".safetensors" and a NUL fit in buf
 * (QL_STORE_FILE_NAME_MAX). 0, or QL_EINTERNAL if hashing fails. */
#define QL_STORE_FILE_NAME_MAX 112
int ql__store_file_name(const char *name,
                        const uint8_t digest[QL_DIGEST_BYTES],
                        char buf[QL_STORE_FILE_NAME_MAX]);

#endif /* QL_STORE_H */
