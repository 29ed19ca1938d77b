/* calibrate.c - see calibrate.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dispatch/calibrate.h"
#include "dispatch/xover.h"
#include "crossover.h"
#include "state/devices.h"
#include "dispatch/linear.h"
#include "log.h"

#define CACHE_FILE "crossover.json"
#define MAX_FILE (1u << 20)
/* Time one (shape, device)'s measurement may take, and its sizes: M = 1,
 * 2, 4 ... MAX_M. */
#define BUDGET_NS ((uint64_t)3000000000u)
#define MAX_M 512

/* A (weight, device) waiting for its measurement. */
typedef struct pending {
  ql__weight *w; /* one reference */
  unsigned dev;
} pending;

struct ql__calib {
  ql__xover_entry *e;
  size_t n, cap;
  pending *pending;
  size_t n_pending, cap_pending;
  int started; /* READY: measure */
  int busy;    /* a measurement on a device's worker */
  char path[PATH_MAX + 32]; /* the cache file, or "" */
};

/* ------------------------------------------------------------ the file */

static void load_file(struct ql__calib *c) {
  char err[160];
  struct stat st;
  int fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno != ENOENT)
      ql__warn("crossover cache %s: %s", c->path, strerror(errno));
    return;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
      (uint64_t)st.st_size > MAX_FILE) {
    ql__warn("crossover cache %s: not a regular file of at most 1 MiB; "
             "measuring again", c->path);
    close(fd);
    return;
  }
  char *buf = malloc((size_t)st.st_size + 1);
  ssize_t got = buf ? read(fd, buf, (size_t)st.st_size) : -1;
  close(fd);
  if (got != (ssize_t)st.st_size) {
    free(buf);
    ql__warn("crossover cache %s: cannot read it", c->path);
    return;
  }
  ql__xover_entry *e;
  size_t n;
  if (ql__xover_parse(buf, (size_t)got, &e, &n, err, sizeof err) != 0) {
    ql__warn("crossover cache %s: %s; measuring again", c->path, err);
  } else {
    free(c->e);
    c->e = e;
    c->n = c->cap = n;
    ql__info("crossover cache %s: %zu shape%s", c->path, n,
             n == 1 ? "" : "s");
  }
  free(buf);
}

/* Rewrites the cache (temp file, fsync, rename): a lost write only costs
 * a measurement at the next start. It stays within what load_file()
 * reads: past MAX_FILE the oldest shapes are forgotten (measured again
 * when they come back), where the whole cache would have been. */
static void save_file(struct ql__calib *c) {
  char tmp[sizeof c->path + 8];
  char *text = NULL;
  size_t kept = 0;
  int fd = -1;
  if (c->path[0] == '\0' || ql__xover_dump(c->e, c->n, MAX_FILE, &text,
                                           &kept) != 0)
    goto done;
  if (kept < c->n) {
    ql__notice("crossover cache %s: %zu oldest shape%s left out to stay "
               "within 1 MiB", c->path, c->n - kept,
               c->n - kept == 1 ? "" : "s");
    memmove(c->e, c->e + (c->n - kept), kept * sizeof *c->e);
    c->n = kept;
  }
  snprintf(tmp, sizeof tmp, "%s.tmp", c->path);
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
  size_t len = strlen(text);
  if (fd < 0 || write(fd, text, len) != (ssize_t)len || fsync(fd) != 0 ||
      rename(tmp, c->path) != 0) {
    ql__warn("crossover cache %s: cannot write it: %s", c->path,
             strerror(errno));
    unlink(tmp);
  }
done:
  if (fd >= 0)
    close(fd);
  free(text);
}

/* ------------------------------------------------------------ the table */

/* What the times of w on device d depend on. The CPU's keys carry no
 * device: caches written before other devices were measured stay valid. */
static void shape_key(const ql__server *s, const ql__weight *w,
                      const ql__device *d, char *buf, size_t len) {
  const ql_qweight *q = w->q;
  const ql_kernel_impl *wo = ql_dispatch(d->b, QL_OP_LINEAR_WO, q->format,
                                         QL_DTYPE_F32, 1, q->n, q->k);
  const ql_kernel_impl *aq = ql_dispatch(d->b, QL_OP_LINEAR_AQ, q->format,
                                         QL_DTYPE_F32, 1, q->n, q->k);
  snprintf(buf, len, "%s%s%s %s f%d g%u a%d s%d %lldx%lld",
           d == s->cpu ? "" : d->name, d == s->cpu ? "" : " ",
           wo ? wo->name : "-", aq ? aq->name : "-", (int)q->format,
           q->group_size, q->asymmetric, (int)q->scale_dtype,
           (long long)q->n, (long long)q->k);
}

static const ql__xover_entry *lookup(const struct ql__calib *c,
                                     const char *key) {
  for (size_t i = 0; i < c->n; i++)
    if (strcmp(c->e[i].key, key) == 0)
      return &c->e[i];
  return NULL;
}

/* Appends a copy of *e; the table's copy, or NULL when out of memory. */
static const ql__xover_entry *remember(struct ql__calib *c,
                                       const ql__xover_entry *e) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 8;
    ql__xover_entry *grown = realloc(c->e, cap * sizeof *grown);
    if (grown == NULL)
      return NULL;
    c->e = grown;
    c->cap = cap;
  }
  c->e[c->n] = *e;
  return &c->e[c->n++];
}

int ql__calibrate_open(ql__server *s) {
  struct ql__calib *c = calloc(1, sizeof *c);
  if (c == NULL)
    return QL_ENOMEM;
  if (s->cfg.state_dir[0] != '\0') {
    snprintf(c->path, sizeof c->path, "%s/" CACHE_FILE, s->cfg.state_dir);
    load_file(c);
  }
  s->calib = c;
  return 0;
}

void ql__calibrate_close(ql__server *s) {
  struct ql__calib *c = s->calib;
  if (c == NULL)
    return;
  for (size_t i = 0; i < c->n_pending; i++)
    ql__weight_unref(c->pending[i].w);
  free(c->pending);
  free(c->e);
  free(c);
  s->calib = NULL;
}

int ql__calibrate_busy(const ql__server *s) {
  return s->calib != NULL && s->calib->busy;
}

/* Gives w its shape's crossover on device dev unless it has one, and its
 * launch times there to the scheduler, which sizes prefill chunks by
 * them. */
/* w's crossover on dev is no longer to be measured (known, or given up):
 * the requests waiting for it go on. */
static void not_pending(ql__server *s, ql__weight *w, unsigned dev) {
  uint64_t bit = (uint64_t)1 << dev;
  if (!(w->crossover_pending & bit))
    return;
  w->crossover_pending &= ~bit;
  ql__linear_crossover_ready(s, w);
}

static void set_known(ql__server *s, ql__weight *w, unsigned dev,
                      const ql__xover_entry *e) {
  uint64_t bit = (uint64_t)1 << dev;
  /* One already known stays, and so does the default one that answered
   * requests while nothing was measured (crossover_used). */
  if (!(w->crossover_known & bit) && !(w->crossover_used & bit)) {
    w->crossover[dev] = e->rows;
    w->crossover_known |= bit;
    ql__linear_set_times(s, w, dev, e->m, e->wo_ns, e->aq_ns, e->n);
  }
  not_pending(s, w, dev);
}

typedef struct apply_ctx {
  ql__server *s;
  const ql__device *d;
  const ql__xover_entry *e;
} apply_ctx;

static void apply_one(ql__weight *w, void *arg) {
  apply_ctx *a = arg;
  char key[QL_XOVER_KEY_MAX];
  unsigned dev = a->d->index;
  if (!(w->devices >> dev & 1) || (w->crossover_known >> dev & 1))
    return;
  shape_key(a->s, w, a->d, key, sizeof key);
  if (strcmp(key, a->e->key) == 0)
    set_known(a->s, w, dev, a->e);
}

/* A (shape, device) is known: kept, given to every weight of that shape on
 * that device, and written to the cache file. */
static void learned(ql__server *s, const ql__device *d,
                    const ql__xover_entry *e) {
  struct ql__calib *c = s->calib;
  const ql__xover_entry *kept = remember(c, e);
  if (kept == NULL)
    return;
  apply_ctx a = {s, d, kept};
  ql__weight_store_foreach(s->weights, apply_one, &a);
  save_file(c);
}

/* The entry of key: rows, and the times of res (NULL: none). */
static void make_entry(ql__xover_entry *e, const char *key, uint32_t rows,
                       const ql_crossover *res) {
  memset(e, 0, sizeof *e);
  snprintf(e->key, sizeof e->key, "%s", key);
  e->rows = rows;
  for (int i = 0; res != NULL && i < res->n && e->n < QL_XOVER_POINTS; i++) {
    double wo = res->wo_ns[i], aq = res->aq_ns[i];
    if (!(wo >= 1) || res->m[i] < 1 || res->m[i] > (int64_t)QL_XOVER_MAX_M)
      continue;
    e->m[e->n] = (uint32_t)res->m[i];
    e->wo_ns[e->n] = wo > (double)QL_XOVER_MAX_NS ? QL_XOVER_MAX_NS
                                                   : (uint64_t)wo;
    e->aq_ns[e->n] = !(aq >= 1)                   ? 0
                     : aq > (double)QL_XOVER_MAX_NS ? QL_XOVER_MAX_NS
                                                    : (uint64_t)aq;
    e->n++;
  }
}

/* ------------------------------------------------------- measurements */

/*
 * One (shape, device) measurement: a job on the device's worker that times
 * one size (M rows, both paths) and comes back; the loop submits it again
 * for the next size until MAX_M or BUDGET_NS, so the device's batches run
 * between sizes.
 */
typedef struct measure_job {
  ql__job job;
  ql__server *s;
  ql__device *d;
  ql__weight *w; /* one reference */
  char key[QL_XOVER_KEY_MAX];
  ql_crossover res;  /* the sizes timed so far */
  int64_t m;         /* the size this run times */
  uint64_t spent_ns; /* worker time of the sizes timed so far */
  int rc;
} measure_job;

static void next_measurement(ql__server *s);

/* Worker thread of d. */
static void measure_run(ql__job *job) {
  measure_job *mj = (measure_job *)job;
  const ql__device *d = mj->d;
  double wo = 0, aq = 0;
  if (d->b->device_bind != NULL &&
      (mj->rc = d->b->device_bind(d->ordinal)) != 0)
    return;
  mj->rc = ql_crossover_time(d->b, mj->w->q, mj->w->lay[d->index].packed,
                             QL_DTYPE_F32, mj->m, &wo, &aq);
  if (mj->rc == 0) {
    int i = mj->res.n;
    mj->res.m[i] = mj->m;
    mj->res.wo_ns[i] = wo;
    mj->res.aq_ns[i] = aq;
    mj->res.n++;
  }
}

/* Loop thread: the size just timed is in; on to the next one, or to the
 * result. */
static void measure_done(ql__job *job) {
  measure_job *mj = (measure_job *)job;
  ql__server *s = mj->s;
  struct ql__calib *c = s->calib;
  ql__device *d = mj->d;
  mj->spent_ns += job->end_ns - job->start_ns;
  /* The budget bounds the sizes: the ones timed when it ran out decide. */
  int finished = mj->rc == 0 && (mj->m >= MAX_M ||
                                 mj->res.n >= QL_CROSSOVER_SIZES ||
                                 mj->spent_ns > BUDGET_NS);
  if (mj->rc == 0 && !finished && !s->stopping && !d->failed &&
      mj->w->in_store) {
    mj->m *= 2;
    if ((mj->rc = ql__worker_submit(d->worker, &mj->job)) == 0)
      return;
  }
  c->busy = 0;
  if (mj->rc == QL_EDEVICE)
    ql__device_fail(s, d, mj->rc);
  if (!finished) {
    /* Cut short (an error, the weight gone, the daemon stopping): nothing
     * is kept; another weight of the shape measures it again. */
    if (mj->rc != 0 && !s->stopping)
      ql__warn("crossover of %s on %s: not measured (%s)", mj->w->name,
               d->alias, ql_strerror(mj->rc));
    /* Its requests go on with the default (another weight of the shape
     * may measure it later; this one keeps what it answered with). */
    not_pending(s, mj->w, d->index);
  } else if (lookup(c, mj->key) == NULL) {
    uint32_t rows = ql_crossover_choose(&mj->res);
    char what[64] = "never";
    if (rows != QL_CROSSOVER_NEVER)
      snprintf(what, sizeof what, "from %u rows", rows);
    ql__notice("crossover of %s (%lldx%lld) on %s: activation-quantized %s "
               "(%d sizes timed)", mj->w->name, (long long)mj->w->q->n,
               (long long)mj->w->q->k, d->alias, what, mj->res.n);
    ql__xover_entry e;
    make_entry(&e, mj->key, rows, &mj->res);
    learned(s, d, &e);
  }
  ql__weight_unref(mj->w);
  free(mj);
  if (!s->stopping)
    next_measurement(s);
}

/* Starts the next pending (shape, device) that is still unknown and still
 * has a resident weight, on a device in service. */
static void next_measurement(ql__server *s) {
  struct ql__calib *c = s->calib;
  while (c->started && !c->busy && c->n_pending > 0) {
    pending p = c->pending[0];
    memmove(c->pending, c->pending + 1,
            --c->n_pending * sizeof *c->pending);
    ql__device *d = &s->dev[p.dev];
    char key[QL_XOVER_KEY_MAX];
    shape_key(s, p.w, d, key, sizeof key);
    const ql__xover_entry *e = lookup(c, key);
    measure_job *mj = NULL;
    if (e != NULL) {
      /* Measured for another weight of its shape meanwhile. */
      set_known(s, p.w, p.dev, e);
    } else if (!p.w->in_store || d->failed) {
      /* Gone, or nothing to measure on. */
      not_pending(s, p.w, p.dev);
    } else if (ql_dispatch(d->b, QL_OP_LINEAR_AQ, p.w->q->format,
                           QL_DTYPE_F32, 1, p.w->q->n, p.w->q->k) == NULL) {
      /* No activation-quantized path there: nothing to time. */
      ql__xover_entry ne;
      make_entry(&ne, key, QL_CROSSOVER_NEVER, NULL);
      learned(s, d, &ne);
    } else if ((mj = calloc(1, sizeof *mj)) != NULL) {
      snprintf(mj->key, sizeof mj->key, "%s", key);
      mj->s = s;
      mj->d = d;
      mj->w = p.w;
      mj->m = 1;
      mj->job.run = measure_run;
      mj->job.done = measure_done;
      if (ql__worker_submit(d->worker, &mj->job) == 0) {
        c->busy = 1;
        continue; /* the job holds p.w's reference */
      }
      free(mj);
      not_pending(s, p.w, p.dev);
    } else {
      not_pending(s, p.w, p.dev);
    }
    ql__weight_unref(p.w);
  }
}

void ql__calibrate_start(ql__server *s) {
  if (s->calib == NULL)
    return;
  s->calib->started = 1;
  next_measurement(s);
}

static void calibrate(ql__server *s, ql__weight *w, const uid_t *uid);

void ql__calibrate_weight(ql__server *s, ql__weight *w) {
  calibrate(s, w, NULL);
}

void ql__calibrate_weight_by(ql__server *s, ql__weight *w, uid_t uid) {
  calibrate(s, w, &uid);
}

/* uid NULL: not counted against a user (the admin socket, the store). */
static void calibrate(ql__server *s, ql__weight *w, const uid_t *uid) {
  struct ql__calib *c = s->calib;
  char key[QL_XOVER_KEY_MAX];
  if (c == NULL)
    return;
  for (unsigned d = 0; d < s->n_dev; d++) {
    if (!(w->devices >> d & 1) || (w->crossover_known >> d & 1))
      continue;
    shape_key(s, w, &s->dev[d], key, sizeof key);
    const ql__xover_entry *e = lookup(c, key);
    if (e != NULL) {
      set_known(s, w, d, e);
      continue;
    }
    if (s->cfg.crossover_rows != 0)
      continue; /* fixed by the config: nothing to measure */
    int queued = 0; /* (a reload that unfixes the crossover asks again) */
    for (size_t i = 0; i < c->n_pending && !queued; i++)
      queued = c->pending[i].w == w && c->pending[i].dev == d;
    if (queued)
      continue;
    /* A stream of loads of new shapes would keep the device measuring. */
    if (uid != NULL &&
        !ql__tenant_calib_take(&s->tenants, *uid, ql__now_ns())) {
      ql__tenant_refused(&s->tenants, *uid, "crossover measurements");
      continue;
    }
    if (c->n_pending == c->cap_pending) {
      size_t cap = c->cap_pending ? 2 * c->cap_pending : 8;
      pending *p = realloc(c->pending, cap * sizeof *p);
      if (p == NULL)
        continue; /* measured when another weight of its shape comes */
      c->pending = p;
      c->cap_pending = cap;
    }
    ql__weight_ref(w);
    c->pending[c->n_pending].w = w;
    c->pending[c->n_pending].dev = d;
    c->n_pending++;
    w->crossover_pending |= (uint64_t)1 << d;
  }
  next_measurement(s);
}
