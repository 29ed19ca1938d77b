/* weights.c - see weights.h. */
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "store.h"
#include "weights.h"

#define NBUCKETS 1024

struct ql__weight_store {
  ql__weight *buckets[NBUCKETS];
  size_t count;
  size_t bytes;  /* sum of bytes of the weights in the store */
  size_t budget; /* 0: no limit */
  void (*on_free)(ql__weight *w, void *arg);
  void *on_free_arg;
};

void ql__weight_store_set_free_hook(ql__weight_store *s,
                                    void (*fn)(ql__weight *w, void *arg),
                                    void *arg) {
  s->on_free = fn;
  s->on_free_arg = arg;
}

/* FNV-1a: names are short and come from authenticated local clients; the
 * table only needs to spread them. */
static size_t bucket_of(const char *name) {
  uint32_t h = 2166136261u;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    h = (h ^ *p) * 16777619u;
  return h % NBUCKETS;
}

int ql__weight_store_create(size_t budget, ql__weight_store **out) {
  *out = calloc(1, sizeof **out);
  if (*out == NULL)
    return QL_ENOMEM;
  (*out)->budget = budget;
  return 0;
}

void ql__weight_store_set_budget(ql__weight_store *s, size_t budget) {
  s->budget = budget;
}

size_t ql__weight_store_bytes(const ql__weight_store *s) { return s->bytes; }
size_t ql__weight_store_budget(const ql__weight_store *s) {
  return s->budget;
}

void ql__weight_store_free(ql__weight_store *s) {
  if (s == NULL)
    return;
  for (size_t b = 0; b < NBUCKETS; b++) {
    ql__weight *w = s->buckets[b];
    while (w != NULL) {
      ql__weight *next = w->next;
      w->in_store = 0;
      w->next = NULL;
      ql__weight_unref(w);
      w = next;
    }
  }
  free(s);
}

int ql__weight_digest(const ql_qweight *q, uint8_t out[QL_DIGEST_BYTES]) {
  int rc = QL_EINTERNAL;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == NULL)
    return QL_ENOMEM;
  uint64_t hdr[7] = {1 /* layout version */, (uint64_t)q->format,
                     q->group_size, (uint64_t)q->n, (uint64_t)q->k,
                     (uint64_t)q->scale_dtype, q->bias != NULL};
  unsigned int len = 0;
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
      EVP_DigestUpdate(ctx, "qlinear-weight", 14) != 1 ||
      EVP_DigestUpdate(ctx, hdr, sizeof hdr) != 1 ||
      EVP_DigestUpdate(ctx, q->qdata, q->qdata_bytes) != 1 ||
      EVP_DigestUpdate(ctx, q->scale, q->scale_bytes) != 1)
    goto done;
  if (q->zero != NULL && EVP_DigestUpdate(ctx, q->zero, q->scale_bytes) != 1)
    goto done;
  if (q->bias != NULL &&
      EVP_DigestUpdate(ctx, q->bias, (size_t)q->n * sizeof(float)) != 1)
    goto done;
  if (EVP_DigestFinal_ex(ctx, out, &len) != 1 || len != QL_DIGEST_BYTES)
    goto done;
  rc = 0;
done:
  EVP_MD_CTX_free(ctx);
  return rc;
}

int ql__weight_create(const char *name, ql_qweight *q, ql_path policy,
                      const ql_backend *b, ql__weight **out) {
  return ql__weight_create_known(name, q, policy, b, NULL, NULL, out);
}

/* The layout of w from the store's cache: 1 when adopted. */
static int adopt_cached(ql__weight *w, const ql_kernel_impl *rp,
                        ql__store *cache) {
  const void *data;
  size_t len, bytes = 0;
  void *map, *packed = NULL;
  if (cache == NULL || rp->adopt == NULL || rp->layout_id == NULL ||
      ql__store_layout_map(cache, w->digest, rp->layout_id, &data, &len,
                           &map) != 0)
    return 0;
  if (rp->adopt(w->q, data, len, &packed, &bytes) != 0) {
    ql__store_layout_unmap(map);
    return 0;
  }
  w->packed = packed;
  w->packed_bytes = bytes;
  w->layout_map = map;
  return 1;
}

int ql__weight_cache_layout(const ql__weight *w, ql__store *cache) {
  const void *data;
  size_t len;
  const ql_kernel_impl *rp = w->repack;
  if (cache == NULL || rp == NULL || w->layout_map != NULL ||
      rp->image == NULL || rp->layout_id == NULL ||
      rp->image(w->packed, &data, &len) != 0)
    return 0;
  return ql__store_layout_put(cache, w->digest, rp->layout_id, data, len);
}

int ql__weight_create_known(const char *name, ql_qweight *q, ql_path policy,
                            const ql_backend *b,
                            const uint8_t digest[QL_DIGEST_BYTES],
                            ql__store *cache, ql__weight **out) {
  int rc;
  *out = NULL;
  if (strlen(name) >= sizeof((ql__weight *)0)->name)
    return QL_ENAME;
  ql__weight *w = calloc(1, sizeof *w);
  if (w == NULL)
    return QL_ENOMEM;
  if (digest != NULL) {
    memcpy(w->digest, digest, QL_DIGEST_BYTES);
  } else if ((rc = ql__weight_digest(q, w->digest)) != 0) {
    free(w);
    return rc;
  }
  /* The device layout: the registry picks the backend's repack when it
   * has one for this format and shape, else the generic (no layout). */
  const ql_kernel_impl *rp =
      ql_dispatch(b, QL_OP_REPACK, q->format, QL_DTYPE_F32, 0, q->n, q->k);
  w->q = q;
  if (rp != NULL && rp != ql_generic_impl(QL_OP_REPACK) &&
      adopt_cached(w, rp, cache)) {
    w->repack = rp;
  } else if (rp != NULL && rp != ql_generic_impl(QL_OP_REPACK)) {
    ql_repack_args ra = {q, NULL, 0};
    if ((rc = rp->fn.repack(&ra)) != 0) {
      free(w);
      return rc;
    }
    w->packed = ra.packed;
    w->packed_bytes = ra.packed_bytes;
    w->repack = rp;
    if (cache != NULL)
      (void)ql__weight_cache_layout(w, cache);
  }
  strcpy(w->name, name);
  w->policy = policy;
  w->bytes = q->qdata_bytes + q->scale_bytes * (q->zero ? 2 : 1) +
             (q->bias ? (size_t)q->n * sizeof(float) : 0) + w->packed_bytes;
  w->refs = 1;
  w->stats.impl = "";
  *out = w;
  return 0;
}

ql__weight *ql__weight_store_get(ql__weight_store *s, const char *name) {
  for (ql__weight *w = s->buckets[bucket_of(name)]; w; w = w->next)
    if (strcmp(w->name, name) == 0)
      return w;
  return NULL;
}

int ql__weight_store_insert(ql__weight_store *s, ql__weight *w,
                            ql__weight **existing) {
  *existing = NULL;
  ql__weight *old = ql__weight_store_get(s, w->name);
  if (old != NULL) {
    if (memcmp(old->digest, w->digest, QL_DIGEST_BYTES) != 0)
      return QL_EEXIST;
    *existing = old;
    return 0;
  }
  if (s->budget != 0 &&
      (w->bytes > s->budget || s->bytes > s->budget - w->bytes))
    return QL_ENOMEM;
  size_t b = bucket_of(w->name);
  w->next = s->buckets[b];
  s->buckets[b] = w;
  w->in_store = 1;
  w->refs++;
  s->count++;
  s->bytes += w->bytes;
  w->on_free = s->on_free;
  w->on_free_arg = s->on_free_arg;
  return 0;
}

int ql__weight_store_remove(ql__weight_store *s, const char *name) {
  ql__weight **pp = &s->buckets[bucket_of(name)];
  for (; *pp; pp = &(*pp)->next) {
    ql__weight *w = *pp;
    if (strcmp(w->name, name) == 0) {
      *pp = w->next;
      w->next = NULL;
      w->in_store = 0;
      s->count--;
      s->bytes -= w->bytes;
      ql__weight_unref(w);
      return 0;
    }
  }
  return QL_ENOTFOUND;
}

int ql__weight_store_drop_unheld(ql__weight_store *s, ql__weight *w) {
  if (w->pinned || w->storing || w->holders > 0 || !w->in_store ||
      ql__weight_store_get(s, w->name) != w)
    return 0;
  ql__weight_store_remove(s, w->name);
  return 1;
}

void ql__weight_store_foreach(ql__weight_store *s,
                              void (*fn)(ql__weight *, void *), void *arg) {
  for (size_t b = 0; b < NBUCKETS; b++)
    for (ql__weight *w = s->buckets[b]; w; w = w->next)
      fn(w, arg);
}

size_t ql__weight_store_count(const ql__weight_store *s) { return s->count; }

void ql__weight_ref(ql__weight *w) { w->refs++; }

void ql__weight_unref(ql__weight *w) {
  if (w == NULL || --w->refs > 0)
    return;
  if (w->on_free != NULL)
    w->on_free(w, w->on_free_arg);
  if (w->repack != NULL)
    w->repack->free_packed(w->packed);
  ql__store_layout_unmap(w->layout_map); /* after the layout borrowing it */
  ql_qweight_free(w->q);
  free(w);
}
