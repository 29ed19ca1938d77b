/* weights.c - see weights.h. */
#include <stdlib.h>
#include <string.h>


#include "state/store.h"
#include "heap.h"
#include "state/weights.h"

#define NBUCKETS 1024

struct ql__weight_store {
  ql__weight *buckets[NBUCKETS];
  size_t count;
  size_t bytes;  /* sum of bytes of the weights in the store */
  size_t budget; /* 0: no limit */
  size_t dev_bytes[QL__MAX_DEVICES];  /* layouts outside host memory */
  size_t dev_budget[QL__MAX_DEVICES]; /* 0: no limit */
  /* Weights removed by name but still referenced: counted in bytes and
   * dev_bytes until freed (ql__weight.counted_in), linked by next. */
  ql__weight *retired;
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

void ql__weight_store_set_device_budget(ql__weight_store *s, unsigned dev,
                                        size_t budget) {
  if (dev < QL__MAX_DEVICES)
    s->dev_budget[dev] = budget;
}

size_t ql__weight_store_device_bytes(const ql__weight_store *s, unsigned dev) {
  return dev < QL__MAX_DEVICES ? s->dev_bytes[dev] : 0;
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
  /* Retired weights still held outlive the store: they no longer count. */
  for (ql__weight *w = s->retired, *next; w != NULL; w = next) {
    next = w->next;
    w->counted_in = NULL;
    w->next = NULL;
  }
  free(s);
}

uint32_t ql__weight_crossover_rows(const ql__weight *w, int dev,
                                   uint32_t fixed, uint32_t dflt,
                                   int *measured) {
  if (measured != NULL)
    *measured = 0;
  if (fixed != 0)
    return fixed;
  /* Device indices are bits of w->devices, accelerators first. */
  for (unsigned d = 0; dev < 0 && d < QL__MAX_DEVICES; d++)
    if (w->devices >> d & 1)
      dev = (int)d;
  if (dev >= 0 && dev < QL__MAX_DEVICES && (w->crossover_known >> dev & 1)) {
    if (measured != NULL)
      *measured = 1;
    return w->crossover[dev];
  }
  return dflt;
}

int ql__weight_create(const char *name, ql_qweight *q, ql_path policy,
                      const ql__placement *pl, ql__weight **out) {
  return ql__weight_create_known(name, q, policy, pl, NULL, NULL, out);
}

/* Layout l of w from the store's cache: 1 when adopted. */
static int adopt_cached(const ql__weight *w, ql__weight_layout *l,
                        const ql_kernel_impl *rp, ql__store *cache) {
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
  l->packed = packed;
  l->packed_bytes = bytes;
  l->layout_map = map;
  return 1;
}

int ql__weight_cache_layout(const ql__weight *w, ql__store *cache) {
  int rc = 0;
  for (unsigned d = 0; cache != NULL && d < QL__MAX_DEVICES; d++) {
    const ql__weight_layout *l = &w->lay[d];
    const ql_kernel_impl *rp = l->repack;
    const void *data;
    size_t len;
    if (!(w->devices >> d & 1) || rp == NULL || l->layout_map != NULL ||
        rp->image == NULL || rp->layout_id == NULL ||
        rp->image(l->packed, &data, &len) != 0)
      continue;
    int r = ql__store_layout_put(cache, w->digest, rp->layout_id, data, len);
    if (rc == 0)
      rc = r;
  }
  return rc;
}

/* Frees the layouts of w (each after nothing borrows it any more). */
static void free_layouts(ql__weight *w) {
  for (unsigned d = 0; d < QL__MAX_DEVICES; d++) {
    ql__weight_layout *l = &w->lay[d];
    if (l->repack != NULL)
      l->repack->free_packed(l->packed);
    ql__store_layout_unmap(l->layout_map); /* after the layout borrowing it */
    memset(l, 0, sizeof *l);
  }
  w->devices = 0;
}

/*
 * Makes w's layout on the device of p: the registry picks the backend's
 * repack when it has one for this format and shape, else the generic (no
 * layout: the canonical form is read).
 */
static int make_layout(ql__weight *w, const struct ql__place *p,
                       ql__store *cache) {
  const ql_qweight *q = w->q;
  ql__weight_layout *l = &w->lay[p->dev];
  int rc;
  if (p->b != NULL && p->b->device_bind != NULL &&
      (rc = p->b->device_bind(p->ordinal)) != 0)
    return rc;
  const ql_kernel_impl *rp =
      ql_dispatch(p->b, QL_OP_REPACK, q->format, QL_DTYPE_F32, 0, q->n, q->k);
  if (rp != NULL && rp != ql_generic_impl(QL_OP_REPACK)) {
    if (!adopt_cached(w, l, rp, cache)) {
      ql_repack_args ra = {q, NULL, 0};
      if ((rc = rp->fn.repack(&ra)) != 0)
        return rc;
      l->packed = ra.packed;
      l->packed_bytes = ra.packed_bytes;
    }
    l->repack = rp;
  }
  w->devices |= (uint64_t)1 << p->dev;
  l->host = p->host;
  if (p->host)
    w->bytes += l->packed_bytes;
  else
    w->dev_bytes += l->packed_bytes;
  return 0;
}

int ql__weight_create_known(const char *name, ql_qweight *q, ql_path policy,
                            const ql__placement *pl,
                            const uint8_t digest[QL_DIGEST_BYTES],
                            ql__store *cache, ql__weight **out) {
  int rc;
  *out = NULL;
  if (strlen(name) >= sizeof((ql__weight *)0)->name)
    return QL_ENAME;
  if (pl == NULL || pl->n == 0 || pl->n > QL__MAX_DEVICES)
    return QL_EINVAL;
  ql__weight *w = calloc(1, sizeof *w);
  if (w == NULL)
    return QL_ENOMEM;
  if (digest != NULL) {
    memcpy(w->digest, digest, QL_DIGEST_BYTES);
  } else if ((rc = ql__qweight_digest(q, w->digest)) != 0) {
    free(w);
    return rc;
  }
  /* A content-addressed name says what was loaded under it: a stored
   * weight's name was checked when it was loaded. */
  w->has_source = ql_source_name_digest(name, w->source);
  w->q = q;
  w->bytes = q->qdata_bytes + q->scale_bytes * (q->zero ? 2 : 1) +
             (q->bias ? (size_t)q->n * sizeof(float) : 0);
  for (unsigned i = 0; i < pl->n; i++) {
    if (pl->at[i].dev >= QL__MAX_DEVICES ||
        (w->devices >> pl->at[i].dev & 1)) {
      rc = QL_EINVAL;
      goto fail;
    }
    if ((rc = make_layout(w, &pl->at[i], cache)) != 0)
      goto fail;
  }
  if (cache != NULL)
    (void)ql__weight_cache_layout(w, cache);
  strcpy(w->name, name);
  w->policy = policy;
  w->refs = 1;
  for (unsigned d = 0; d < QL__MAX_DEVICES; d++)
    w->stats[d].impl = "";
  *out = w;
  return 0;
fail:
  free_layouts(w);
  free(w); /* q stays the caller's */
  return rc;
}

ql__weight *ql__weight_store_get(ql__weight_store *s, const char *name) {
  for (ql__weight *w = s->buckets[bucket_of(name)]; w; w = w->next)
    if (strcmp(w->name, name) == 0)
      return w;
  return NULL;
}

/* Adds (add 1) or takes away w's layouts outside host memory. */
static void device_bytes(ql__weight_store *s, const ql__weight *w, int add) {
  for (unsigned d = 0; d < QL__MAX_DEVICES; d++)
    if ((w->devices >> d & 1) && !w->lay[d].host) {
      if (add)
        s->dev_bytes[d] += w->lay[d].packed_bytes;
      else
        s->dev_bytes[d] -= w->lay[d].packed_bytes;
    }
}

/* Takes retired w out of the byte counts of the store it was removed
 * from. */
static void uncount(ql__weight *w) {
  ql__weight_store *s = w->counted_in;
  for (ql__weight **pp = &s->retired; *pp; pp = &(*pp)->next) {
    if (*pp == w) {
      *pp = w->next;
      break;
    }
  }
  w->next = NULL;
  w->counted_in = NULL;
  s->bytes -= w->bytes;
  device_bytes(s, w, 0);
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
  /* A weight removed by name and still counted (held) that comes back
   * is counted once: the budgets are checked without its own bytes. */
  int again = w->counted_in == s;
  size_t used = s->bytes - (again ? w->bytes : 0);
  if (s->budget != 0 && (w->bytes > s->budget || used > s->budget - w->bytes))
    return QL_ENOMEM;
  for (unsigned d = 0; d < QL__MAX_DEVICES; d++) {
    size_t need = w->lay[d].packed_bytes, cap = s->dev_budget[d];
    if ((w->devices >> d & 1) && cap != 0 && !w->lay[d].host &&
        (need > cap || s->dev_bytes[d] - (again ? need : 0) > cap - need))
      return QL_ENOMEM;
  }
  if (w->counted_in != NULL)
    uncount(w);
  size_t b = bucket_of(w->name);
  w->next = s->buckets[b];
  s->buckets[b] = w;
  w->in_store = 1;
  w->refs++;
  s->count++;
  s->bytes += w->bytes;
  device_bytes(s, w, 1);
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
      w->in_store = 0;
      s->count--;
      /* Its bytes count until its memory goes: at once, or when the last
       * session or job holding it lets go (ql__weight_unref). */
      w->counted_in = s;
      w->next = s->retired;
      s->retired = w;
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
  if (w->counted_in != NULL)
    uncount(w);
  if (w->on_free != NULL)
    w->on_free(w, w->on_free_arg);
  size_t bytes = w->bytes + w->dev_bytes;
  free_layouts(w);
  ql_qweight_free(w->q);
  free(w);
  ql__heap_release(bytes);
}

void ql__weight_add_loader(ql__weight *w, uid_t uid) {
  for (int i = 0; i < w->n_loaders; i++)
    if (w->loaders[i] == uid)
      return;
  if (w->n_loaders < QL__WEIGHT_LOADERS)
    w->loaders[w->n_loaders++] = uid;
}

int ql__weight_holdable(const ql__weight *w, uid_t uid) {
  uint8_t d[QL_DIGEST_BYTES];
  if (w->pinned || ql_source_name_digest(w->name, d))
    return 1;
  for (int i = 0; i < w->n_loaders; i++)
    if (w->loaders[i] == uid)
      return 1;
  return 0;
}
