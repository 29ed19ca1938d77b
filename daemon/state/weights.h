/*
 * weights.h - the resident weight store: weights by name, shared by every
 * client, with a reference count so a weight being computed on survives an
 * unload. Loop thread only, except that a worker may read the immutable
 * fields (q, policy) of a weight it holds a reference to.
 */
#ifndef QL_WEIGHTS_H
#define QL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ql_kernels.h"
#include "state/digest.h"
#include "registry.h"

/* Devices one daemon serves (devices.h); weights keep a layout on each. */
#define QL__MAX_DEVICES 16

/* Counters of one weight on one device. */
typedef struct ql__weight_stats {
  /* Atomic: a device worker that replies to a request itself (route.h,
   * early) counts it before the reply goes, so that a Stats request the
   * client sends after its reply always includes it. */
  _Atomic uint64_t requests; /* linear requests answered */
  _Atomic uint64_t rows;     /* activation rows computed */
  uint64_t batches;    /* kernel launches */
  uint64_t wo_batches; /* launches on the weight-only path */
  uint64_t aq_batches; /* launches on the activation-quantized path */
  uint64_t queue_ns;   /* time spent waiting for the worker */
  uint64_t kernel_ns;  /* time spent in kernels */
  const char *_Atomic impl; /* implementation of the last launch
                               (static) */
} ql__weight_stats;

/* A weight's layout on one device, made at load by that device's repack
 * op (registry.h). */
typedef struct ql__weight_layout {
  void *packed;                 /* NULL when the generic repack ran (the
                                   canonical form is read, in host memory) */
  const ql_kernel_impl *repack; /* frees packed; NULL: nothing to free */
  size_t packed_bytes;
  void *layout_map;             /* the cached image packed borrows, or NULL
                                   (ql__store_layout_map) */
  int host;                     /* packed is in host memory */
} ql__weight_layout;

/* Where a load makes a weight resident: daemon devices (their index in
 * the server's table) and what runs there. */
typedef struct ql__placement {
  unsigned n;
  struct ql__place {
    unsigned dev;          /* < QL__MAX_DEVICES, each at most once */
    const ql_backend *b;   /* its backend */
    int ordinal;           /* the backend's number for it */
    int host;              /* its layouts live in host memory: counted in
                              ql__weight.bytes and the host budget */
  } at[QL__MAX_DEVICES];
} ql__placement;

/* How many loader uids a weight remembers. */
#define QL__WEIGHT_LOADERS 16

typedef struct ql__weight {
  char name[256];
  ql_qweight *q;                   /* canonical form, owned */
  uint64_t devices;                /* bit d: resident on device d */
  ql__weight_layout lay[QL__MAX_DEVICES]; /* by device; see devices */
  ql_path policy;                  /* AUTO, WEIGHT_ONLY or ACT_QUANT */
  uint8_t digest[QL_DIGEST_BYTES]; /* SHA-256 of the canonical form */
  /* The source digest (ql_source.h) of what its load sent: the commit's
   * own, or a content-addressed name's (a stored weight). has_source: 0
   * when neither is known. */
  uint8_t source[QL_DIGEST_BYTES];
  int has_source;
  /* The uids whose sessions loaded this content (the first
   * QL__WEIGHT_LOADERS): they may hold it by a plain name without a
   * digest (ql__weight_holdable()). */
  uid_t loaders[QL__WEIGHT_LOADERS];
  int n_loaders;
  size_t bytes;                    /* host bytes: the canonical arrays and
                                      the layouts of host devices */
  size_t dev_bytes;                /* layouts on other devices, summed */
  int refs;                        /* the store's + one per queued job */
  int in_store;                    /* still reachable by name */
  int holders;                     /* sessions holding it (session.c) */
  int pinned;                      /* loaded through the admin socket:
                                      stays without session holders */
  int persistent;                  /* its file is in the state directory */
  int placed;                      /* its load named its devices (kept in
                                      its stored file), rather than taking
                                      the default placement */
  int storing;                     /* a store write of it is running */
  ql__weight_stats stats[QL__MAX_DEVICES]; /* by device */
  /* The scheduler's queue keys, one per (activation dtype, path): one
   * launch takes one dtype and runs one path (linear_impl.h: N_KEYS). */
  char sched_key[8];
  /* The measured crossover of its shape on each device (calibrate.h),
   * valid where bit d of crossover_known is set. */
  uint32_t crossover[QL__MAX_DEVICES];
  uint64_t crossover_known;
  /* Bit d: its shape's crossover on device d is being (or is to be)
   * measured (calibrate.c): AUTO requests wait until it is known or
   * given up (admit.c), so that none is answered by a crossover about to
   * change. */
  uint64_t crossover_pending;
  /* Bit d: an AUTO request was routed by its crossover on device d: from
   * then on that crossover stays for the weight's life there (a later
   * measurement does not apply), so the same request always gets the
   * same path, kernel and bytes. */
  uint64_t crossover_used;
  /* Called with the weight before it is freed (its last reference gone),
   * when it was ever in a store: set from the store's hook at insert. */
  void (*on_free)(struct ql__weight *w, void *arg);
  void *on_free_arg;
  /* The store whose byte counts still include it: removed by name while
   * sessions or jobs held it, its memory stays in use (and under the
   * budgets) until its last reference goes. NULL otherwise. */
  struct ql__weight_store *counted_in;
  struct ql__weight *next;         /* hash chain / list link */
} ql__weight;

typedef struct ql__weight_store ql__weight_store;

/* budget: resident bytes (ql__weight.bytes summed over the weights in the
 * store) the store may hold; 0 for no limit. */
int ql__weight_store_create(size_t budget, ql__weight_store **out);

/* fn(w, arg) runs when a weight that was inserted in s is freed (loop
 * thread), e.g. to forget its queues. NULL: nothing. */
void ql__weight_store_set_free_hook(ql__weight_store *s,
                                    void (*fn)(ql__weight *w, void *arg),
                                    void *arg);

/* Changes the budget (SIGHUP); weights already in the store stay even if
 * they now exceed it. */
void ql__weight_store_set_budget(ql__weight_store *s, size_t budget);

/* The budget of the layouts on device dev that are not in host memory (a
 * GPU's memory); 0 for no limit. */
void ql__weight_store_set_device_budget(ql__weight_store *s, unsigned dev,
                                        size_t budget);
/* Layout bytes resident on device dev outside host memory. */
size_t ql__weight_store_device_bytes(const ql__weight_store *s, unsigned dev);

/* Bytes of the weights in the store (with those removed by name that are
 * still held: their memory is still in use), and the budget (0: none). */
size_t ql__weight_store_bytes(const ql__weight_store *s);
size_t ql__weight_store_budget(const ql__weight_store *s);
/* Drops the store's references; weights still held by jobs stay alive
 * until those jobs release them. Safe on NULL. */
void ql__weight_store_free(ql__weight_store *s);

/*
 * Builds a weight around q (digest and sizes computed here) and makes its
 * layout on every device of pl through the registry (each device bound
 * first). On success the weight owns q and *out has one reference, held by
 * the caller; on failure q is untouched and still the caller's, and no
 * layout is left anywhere. Safe on any thread: it touches no shared state.
 */
int ql__weight_create(const char *name, ql_qweight *q, ql_path policy,
                      const ql__placement *pl, ql__weight **out);

/* As ql__weight_create() with the digest already known (a store file's,
 * which ql__store_parse() has just verified): it is not computed again.
 * With a store (may be NULL), a device layout is mapped from its cache
 * when there, else made and written to the cache (ql__store_layout_*). */
struct ql__store;
int ql__weight_create_known(const char *name, ql_qweight *q, ql_path policy,
                            const ql__placement *pl,
                            const uint8_t digest[QL_DIGEST_BYTES],
                            struct ql__store *cache, ql__weight **out);

/* Writes w's device layouts to the store's layout cache where one can be
 * cached and did not come from there. 0 or the cache's error (only worth
 * a log line). Any thread: w is not changed. */
int ql__weight_cache_layout(const ql__weight *w, struct ql__store *cache);

/*
 * Inserts w under its name. If a weight of that name exists with the same
 * digest, nothing is inserted, *existing is set to the resident one and 0
 * is returned (the caller then releases w). Another digest gives
 * QL_EEXIST; a weight that would take the store past its budget, or a
 * device past its own, gives QL_ENOMEM. On success the store takes its own reference.
 */
int ql__weight_store_insert(ql__weight_store *s, ql__weight *w,
                            ql__weight **existing);

/* Records that a session of uid loaded w's content (at most
 * QL__WEIGHT_LOADERS uids are kept; more are not recorded). */
void ql__weight_add_loader(ql__weight *w, uid_t uid);

/*
 * Whether a session of uid may hold w by name without naming a digest:
 * when w's name is content-addressed (its content is what the name says,
 * whoever loaded it), w was loaded through the admin socket (the admin is
 * trusted), or uid loaded this content itself. Another user's weight under
 * a plain name could be anything: that one is held by digest only.
 */
int ql__weight_holdable(const ql__weight *w, uid_t uid);

/* The weight of that name, or NULL. No reference is taken. */
ql__weight *ql__weight_store_get(ql__weight_store *s, const char *name);

/* Removes the weight from the store (by name: nothing finds it any more)
 * and drops the store's reference. Its bytes stay counted against the
 * budgets until its last reference goes. */
int ql__weight_store_remove(ql__weight_store *s, const char *name);

/* Removes w from s when nothing keeps it resident: no session holds it,
 * the admin socket neither keeps it nor is storing it, and it is still the
 * weight stored under its name. 1 when it was removed, else 0. */
int ql__weight_store_drop_unheld(ql__weight_store *s, ql__weight *w);

/* Calls fn for every weight, in no particular order. */
void ql__weight_store_foreach(ql__weight_store *s,
                              void (*fn)(ql__weight *, void *), void *arg);
size_t ql__weight_store_count(const ql__weight_store *s);

/*
 * The crossover AUTO requests of w use on device dev now (dev < 0: on the
 * first device that holds it, accelerators first): fixed when it is not 0
 * (the config's crossover_rows), else the measured one calibrate.c gave
 * w there, else dflt (crossover_default_rows). *measured (may be NULL) is
 * 1 for a measured one, 0 for the default or the fixed value.
 */
uint32_t ql__weight_crossover_rows(const ql__weight *w, int dev,
                                   uint32_t fixed, uint32_t dflt,
                                   int *measured);

void ql__weight_ref(ql__weight *w);
/* Drops one reference; the last one frees the weight. Safe on NULL. */
void ql__weight_unref(ql__weight *w);

#endif /* QL_WEIGHTS_H */
