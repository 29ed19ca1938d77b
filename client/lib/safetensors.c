/*
 * safetensors.c - the safetensors reader of `qlinearctl import`
 * (safetensors.h).
 *
 * The order of the checks is the point: the 8-byte length against the file
 * size first (a header "larger than the file" never reaches the JSON
 * parser), then the JSON (jansson, duplicate keys refused: two entries for
 * one name would make "which one is the tensor" ambiguous), then each
 * entry's dtype, shape and offsets against the data size, with every
 * product overflow-checked, and last the tensors sorted by offset so that
 * overlapping ranges are found. Gaps between tensors are allowed (the
 * format's writers never leave any, but they are harmless to a reader);
 * overlaps are not, since writing one tensor would change another.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ql_defs.h"
#include "safetensors.h"

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

static const struct {
  const char *name;
  ql__st_dtype dt;
  size_t size;
} dtypes[] = {
    {"BOOL", QL__ST_BOOL, 1},         {"U8", QL__ST_U8, 1},
    {"I8", QL__ST_I8, 1},             {"F8_E4M3", QL__ST_F8_E4M3, 1},
    {"F8_E5M2", QL__ST_F8_E5M2, 1},   {"I16", QL__ST_I16, 2},
    {"U16", QL__ST_U16, 2},           {"F16", QL__ST_F16, 2},
    {"BF16", QL__ST_BF16, 2},         {"I32", QL__ST_I32, 4},
    {"U32", QL__ST_U32, 4},           {"F32", QL__ST_F32, 4},
    {"I64", QL__ST_I64, 8},           {"U64", QL__ST_U64, 8},
    {"F64", QL__ST_F64, 8},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

size_t ql__st_dtype_size(ql__st_dtype dt) {
  for (size_t i = 0; i < N_DTYPES; i++)
    if (dtypes[i].dt == dt)
      return dtypes[i].size;
  return 0;
}

const char *ql__st_dtype_name(ql__st_dtype dt) {
  for (size_t i = 0; i < N_DTYPES; i++)
    if (dtypes[i].dt == dt)
      return dtypes[i].name;
  return "?";
}

void ql__st_strv_free(char **v, size_t n) {
  if (v == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

void ql__st_free(ql__st_file *f) {
  if (f == NULL)
    return;
  for (size_t i = 0; i < f->n_tensors; i++)
    free(f->tensors[i].name);
  free(f->tensors);
  ql__st_strv_free(f->meta_keys, f->n_meta);
  ql__st_strv_free(f->meta_values, f->n_meta);
  if (f->map != NULL)
    munmap(f->map, f->map_len);
  free(f);
}

/* A JSON integer in [0, INT64_MAX] (jansson's json_int_t is long long). */
static int get_u64(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return -1;
  *out = (uint64_t)json_integer_value(v);
  return 0;
}

/* One header entry: {"dtype", "shape", "data_offsets"} and nothing else
 * the reader would silently ignore. data_len is the size of the data
 * section (the file less the header). */
static int parse_entry(const char *name, json_t *e, uint64_t data_len,
                       ql__st_tensor *t, char *err, size_t errlen) {
  json_t *dt = json_object_get(e, "dtype"), *shape, *offs;
  const char *key;
  json_t *val;
  uint64_t count = 1, b, en, esz = 0;
  size_t i;

  if (!json_is_object(e))
    return fail(err, errlen, QL_EBADFILE, "tensor '%s': not a JSON object",
                name);
  json_object_foreach(e, key, val) {
    if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
        strcmp(key, "data_offsets") != 0)
      return fail(err, errlen, QL_EBADFILE, "tensor '%s': unknown field '%s'",
                  name, key);
  }
  if (!json_is_string(dt))
    return fail(err, errlen, QL_EBADFILE, "tensor '%s': no dtype string",
                name);
  for (i = 0; i < N_DTYPES; i++)
    if (strcmp(json_string_value(dt), dtypes[i].name) == 0) {
      t->dtype = dtypes[i].dt;
      esz = dtypes[i].size;
    }
  if (esz == 0)
    return fail(err, errlen, QL_EDTYPE, "tensor '%s': unknown dtype '%.32s'",
                name, json_string_value(dt));
  shape = json_object_get(e, "shape");
  if (!json_is_array(shape))
    return fail(err, errlen, QL_EBADFILE, "tensor '%s': no shape array",
                name);
  if (json_array_size(shape) > QL__ST_MAX_DIMS)
    return fail(err, errlen, QL_ESHAPE, "tensor '%s': %zu dimensions, at "
                "most %d", name, json_array_size(shape), QL__ST_MAX_DIMS);
  t->ndim = (int)json_array_size(shape);
  for (i = 0; i < json_array_size(shape); i++) {
    uint64_t d;
    if (get_u64(json_array_get(shape, i), &d) != 0)
      return fail(err, errlen, QL_ESHAPE, "tensor '%s': dimension %zu is not "
                  "a non-negative integer", name, i);
    t->shape[i] = d;
    if (d != 0 && count > UINT64_MAX / d)
      return fail(err, errlen, QL_ESHAPE, "tensor '%s': shape overflows",
                  name);
    count *= d;
  }
  if (count > UINT64_MAX / esz)
    return fail(err, errlen, QL_ESHAPE, "tensor '%s': shape overflows", name);
  offs = json_object_get(e, "data_offsets");
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      get_u64(json_array_get(offs, 0), &b) != 0 ||
      get_u64(json_array_get(offs, 1), &en) != 0)
    return fail(err, errlen, QL_EBADFILE, "tensor '%s': data_offsets is not "
                "[begin, end] of non-negative integers", name);
  if (b > en || en > data_len)
    return fail(err, errlen, QL_EBADFILE, "tensor '%s': data_offsets [%llu, "
                "%llu] outside the %llu data bytes of the file", name,
                (unsigned long long)b, (unsigned long long)en,
                (unsigned long long)data_len);
  if (en - b != count * esz)
    return fail(err, errlen, QL_ESHAPE, "tensor '%s': %llu bytes, but its "
                "shape of %s needs %llu", name, (unsigned long long)(en - b),
                ql__st_dtype_name(t->dtype),
                (unsigned long long)(count * esz));
  t->offset = b; /* relative for now; made absolute by the caller */
  t->bytes = en - b;
  return 0;
}

static int by_offset(const void *a, const void *b) {
  const ql__st_tensor *x = *(const ql__st_tensor *const *)a;
  const ql__st_tensor *y = *(const ql__st_tensor *const *)b;
  if (x->offset != y->offset)
    return x->offset < y->offset ? -1 : 1;
  return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

int ql__st_parse(const void *buf, size_t len, ql__st_file **out, char *err,
                 size_t errlen) {
  const unsigned char *p = buf;
  ql__st_file *f = NULL;
  ql__st_tensor **order = NULL;
  json_t *root = NULL, *val;
  json_error_t jerr;
  const char *key;
  uint64_t hlen = 0, data_len;
  size_t nt = 0, nm = 0, i;
  int rc;

  if (out == NULL)
    return fail(err, errlen, QL_EINVAL, "no output");
  *out = NULL;
  if (buf == NULL && len > 0)
    return fail(err, errlen, QL_EINVAL, "no buffer");
  if (len < 8)
    return fail(err, errlen, QL_EBADFILE, "%zu bytes: shorter than the "
                "8-byte header length", len);
  for (i = 0; i < 8; i++)
    hlen |= (uint64_t)p[i] << (8 * i);
  if (hlen > len - 8)
    return fail(err, errlen, QL_EBADFILE, "header of %llu bytes is larger "
                "than the %zu bytes that follow it (truncated file?)",
                (unsigned long long)hlen, len - 8);
  if (hlen > QL__ST_MAX_HEADER)
    return fail(err, errlen, QL_EBADFILE, "header of %llu bytes, at most %u",
                (unsigned long long)hlen, QL__ST_MAX_HEADER);
  if (hlen < 2)
    return fail(err, errlen, QL_EBADFILE, "header of %llu bytes cannot hold "
                "a JSON object", (unsigned long long)hlen);
  data_len = len - 8 - hlen;

  root = json_loadb((const char *)p + 8, (size_t)hlen,
                    JSON_REJECT_DUPLICATES,
                    &jerr);
  if (root == NULL) {
    rc = fail(err, errlen, QL_EBADFILE, "header: bad JSON at byte %d: %s",
              jerr.position, jerr.text);
    goto fail;
  }
  if (!json_is_object(root)) {
    rc = fail(err, errlen, QL_EBADFILE, "header: not a JSON object");
    goto fail;
  }
  rc = fail(err, errlen, QL_ENOMEM, "out of memory");
  if ((f = calloc(1, sizeof *f)) == NULL)
    goto fail;
  /* Count first, so that the arrays are allocated once. */
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0)
      nm = json_is_object(val) ? json_object_size(val) : 0;
    else
      nt++;
  }
  if ((nt > 0 && ((f->tensors = calloc(nt, sizeof *f->tensors)) == NULL ||
                  (order = calloc(nt, sizeof *order)) == NULL)) ||
      (nm > 0 && ((f->meta_keys = calloc(nm, sizeof(char *))) == NULL ||
                  (f->meta_values = calloc(nm, sizeof(char *))) == NULL)))
    goto fail;

  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      const char *mk;
      json_t *mv;
      if (!json_is_object(val)) {
        rc = fail(err, errlen, QL_EBADFILE, "__metadata__: not an object");
        goto fail;
      }
      json_object_foreach(val, mk, mv) {
        if (!json_is_string(mv)) {
          rc = fail(err, errlen, QL_EBADFILE, "__metadata__: value of "
                    "'%.64s' is not a string", mk);
          goto fail;
        }
        rc = fail(err, errlen, QL_ENOMEM, "out of memory");
        if ((f->meta_keys[f->n_meta] = strdup(mk)) == NULL ||
            (f->meta_values[f->n_meta++] = strdup(json_string_value(mv))) ==
                NULL)
          goto fail;
      }
      continue;
    }
    ql__st_tensor *t = &f->tensors[f->n_tensors];
    if ((rc = parse_entry(key, val, data_len, t, err, errlen)) != 0)
      goto fail;
    if ((t->name = strdup(key)) == NULL) {
      rc = fail(err, errlen, QL_ENOMEM, "out of memory");
      goto fail;
    }
    order[f->n_tensors++] = t;
  }

  /* Overlaps: sorted by offset, each tensor must end before the next one
   * begins. Empty tensors occupy nothing and overlap nothing. */
  if (f->n_tensors > 1) /* order is NULL when there are none */
    qsort(order, f->n_tensors, sizeof *order, by_offset);
  {
    const ql__st_tensor *prev = NULL;
    for (i = 0; i < f->n_tensors; i++) {
      const ql__st_tensor *t = order[i];
      if (t->bytes == 0)
        continue;
      if (prev != NULL && t->offset < prev->offset + prev->bytes) {
        rc = fail(err, errlen, QL_EBADFILE, "tensors '%s' and '%s' overlap "
                  "(data_offsets [%llu, %llu] and [%llu, %llu])", prev->name,
                  t->name, (unsigned long long)prev->offset,
                  (unsigned long long)(prev->offset + prev->bytes),
                  (unsigned long long)t->offset,
                  (unsigned long long)(t->offset + t->bytes));
        goto fail;
      }
      prev = t;
    }
  }
  for (i = 0; i < f->n_tensors; i++) {
    f->tensors[i].offset += 8 + hlen;
    f->tensors[i].data = p + f->tensors[i].offset;
  }
  free(order);
  json_decref(root);
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  *out = f;
  return 0;

fail:
  free(order);
  json_decref(root);
  ql__st_free(f);
  return rc;
}

int ql__st_open(const char *path, ql__st_file **out, char *err,
                size_t errlen) {
  struct stat st;
  void *map = NULL;
  int fd, rc;

  if (out == NULL)
    return fail(err, errlen, QL_EINVAL, "no output");
  *out = NULL;
  /* O_NONBLOCK: opening a FIFO (a checkpoint is untrusted: an archive
   * can hold one) would wait for a writer; it is refused below. */
  if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0)
    return fail(err, errlen, QL_EIO, "cannot open: %s", strerror(errno));
  if (fstat(fd, &st) != 0) {
    rc = fail(err, errlen, QL_EIO, "cannot stat: %s", strerror(errno));
    close(fd);
    return rc;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return fail(err, errlen, QL_EIO, "not a regular file");
  }
  if (st.st_size > 0) {
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      rc = fail(err, errlen, QL_EIO, "cannot map: %s", strerror(errno));
      close(fd);
      return rc;
    }
  }
  close(fd);
  if ((rc = ql__st_parse(map, (size_t)st.st_size, out, err, errlen)) != 0) {
    if (map != NULL)
      munmap(map, (size_t)st.st_size);
    return rc;
  }
  (*out)->map = map;
  (*out)->map_len = (size_t)st.st_size;
  return 0;
}

const ql__st_tensor *ql__st_find(const ql__st_file *f, const char *name) {
  for (size_t i = 0; f != NULL && i < f->n_tensors; i++)
    if (strcmp(f->tensors[i].name, name) == 0)
      return &f->tensors[i];
  return NULL;
}

const char *ql__st_meta(const ql__st_file *f, const char *key) {
  for (size_t i = 0; f != NULL && i < f->n_meta; i++)
    if (strcmp(f->meta_keys[i], key) == 0)
      return f->meta_values[i];
  return NULL;
}

int ql__st_index_parse(const void *buf, size_t len, char ***files,
                       size_t *n_files, char *err, size_t errlen) {
  json_t *root, *map, *val;
  json_error_t jerr;
  const char *key;
  char **v = NULL;
  size_t n = 0, i;
  int rc;

  *files = NULL;
  *n_files = 0;
  root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return fail(err, errlen, QL_EBADFILE, "bad JSON at byte %d: %s",
                jerr.position, jerr.text);
  map = json_object_get(root, "weight_map");
  if (!json_is_object(map)) {
    rc = fail(err, errlen, QL_EBADFILE, "no \"weight_map\" object");
    goto fail;
  }
  if (json_object_size(map) == 0) {
    rc = fail(err, errlen, QL_EBADFILE, "\"weight_map\" names no tensor");
    goto fail;
  }
  if ((v = calloc(json_object_size(map), sizeof *v)) == NULL) {
    rc = fail(err, errlen, QL_ENOMEM, "out of memory");
    goto fail;
  }
  json_object_foreach(map, key, val) {
    const char *s = json_string_value(val);
    if (s == NULL || s[0] == '\0' || strchr(s, '/') != NULL ||
        strcmp(s, ".") == 0 || strcmp(s, "..") == 0) {
      rc = fail(err, errlen, QL_EBADFILE, "weight_map: tensor '%.128s': "
                "shard is not a plain file name", key);
      goto fail;
    }
    for (i = 0; i < n && strcmp(v[i], s) != 0; i++)
      ;
    if (i < n)
      continue;
    if ((v[n] = strdup(s)) == NULL) {
      rc = fail(err, errlen, QL_ENOMEM, "out of memory");
      goto fail;
    }
    n++;
  }
  json_decref(root);
  *files = v;
  *n_files = n;
  return 0;

fail:
  ql__st_strv_free(v, n);
  json_decref(root);
  return rc;
}

int ql__st_index_check(const void *buf, size_t len,
                       int (*holds)(void *arg, const char *shard,
                                    const char *tensor),
                       void *arg, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr), *val;
  const char *key;
  int rc = 0;
  if (root == NULL)
    return fail(err, errlen, QL_EBADFILE, "bad JSON at byte %d: %s",
                jerr.position, jerr.text);
  json_t *map = json_object_get(root, "weight_map");
  if (!json_is_object(map)) {
    rc = fail(err, errlen, QL_EBADFILE, "no \"weight_map\" object");
    goto done;
  }
  json_object_foreach(map, key, val) {
    const char *shard = json_string_value(val);
    if (shard == NULL || !holds(arg, shard, key)) {
      rc = fail(err, errlen, QL_EBADFILE, "weight_map: tensor '%.128s' is "
                "not in its shard %.128s", key, shard ? shard : "(none)");
      goto done;
    }
  }
done:
  json_decref(root);
  return rc;
}
