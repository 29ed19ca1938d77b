/* calibrate.c - see calibrate.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "calibrate.h"
#include "xover.h"
#include "crossover.h"
#include "log.h"

#define CACHE_FILE "crossover.json"
#define MAX_FILE (1u << 20)
/* Time one shape's measurement may take. */
#define BUDGET_NS ((uint64_t)3000000000u)

struct ql__calib {
  ql__xover_entry *e;
  size_t n, cap;
  ql__weight **pending; /* one reference each */
  size_t n_pending, cap_pending;
  int started; /* READY: measure */
  int busy;    /* a measurement in the thread pool */
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
 * a measurement at the next start. */
static void save_file(struct ql__calib *c) {
  char tmp[sizeof c->path + 8];
  json_t *root = json_object(), *obj = json_object();
  char *text = NULL;
  int fd = -1;
  if (c->path[0] == '\0' || root == NULL || obj == NULL)
    goto done;
  for (size_t i = 0; i < c->n; i++)
    json_object_set_new(obj, c->e[i].key, json_integer(c->e[i].rows));
  json_object_set_new(root, "version", json_integer(QL_XOVER_VERSION));
  json_object_set(root, "crossover", obj);
  if ((text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS)) == NULL)
    goto done;
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
  json_decref(obj);
  json_decref(root);
}

/* ------------------------------------------------------------ the table */

/* What a weight's times depend on. */
static void shape_key(const ql__server *s, const ql__weight *w, char *buf,
                      size_t len) {
  const ql_qweight *q = w->q;
  const ql_kernel_impl *wo = ql_dispatch(s->cpu_backend, QL_OP_LINEAR_WO,
                                         q->format, QL_DTYPE_F32, 1, q->n,
                                         q->k);
  const ql_kernel_impl *aq = ql_dispatch(s->cpu_backend, QL_OP_LINEAR_AQ,
                                         q->format, QL_DTYPE_F32, 1, q->n,
                                         q->k);
  snprintf(buf, len, "%s %s f%d g%u a%d s%d %lldx%lld",
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

static int remember(struct ql__calib *c, const char *key, uint32_t rows) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 8;
    ql__xover_entry *e = realloc(c->e, cap * sizeof *e);
    if (e == NULL)
      return QL_ENOMEM;
    c->e = e;
    c->cap = cap;
  }
  snprintf(c->e[c->n].key, sizeof c->e[c->n].key, "%s", key);
  c->e[c->n].rows = rows;
  c->n++;
  return 0;
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
    ql__weight_unref(c->pending[i]);
  free(c->pending);
  free(c->e);
  free(c);
  s->calib = NULL;
}

int ql__calibrate_busy(const ql__server *s) {
  return s->calib != NULL && s->calib->busy;
}

uint32_t ql__calibrate_rows(const ql__server *s, const ql__weight *w,
                            int *measured) {
  if (measured != NULL)
    *measured = 0;
  if (s->cfg.crossover_rows != 0)
    return s->cfg.crossover_rows;
  if (w->crossover_known) {
    if (measured != NULL)
      *measured = 1;
    return w->crossover;
  }
  return s->cfg.crossover_default_rows;
}

/* Gives w its shape's crossover unless it has one. */
static void set_known(ql__weight *w, uint32_t rows) {
  if (w->crossover_known)
    return;
  w->crossover = rows;
  w->crossover_known = 1;
}

/* ------------------------------------------------------- measurements */

typedef struct measure_work {
  uv_work_t work;
  ql__server *s;
  ql__weight *w; /* one reference */
  char key[QL_XOVER_KEY_MAX];
  ql_crossover res;
  int rc;
} measure_work;

static void next_measurement(ql__server *s);

static void measure_run(uv_work_t *work) {
  measure_work *m = work->data;
  m->rc = ql_crossover_measure(m->s->cpu_backend, m->w->q,
                               m->w->lay[m->s->cpu->index].packed,
                               QL_DTYPE_F32, 512, BUDGET_NS, &m->res);
}

typedef struct apply_ctx {
  const ql__server *s;
  const char *key;
  uint32_t rows;
} apply_ctx;

static void apply_one(ql__weight *w, void *arg) {
  apply_ctx *a = arg;
  char key[QL_XOVER_KEY_MAX];
  if (w->crossover_known)
    return;
  shape_key(a->s, w, key, sizeof key);
  if (strcmp(key, a->key) == 0)
    set_known(w, a->rows);
}

static void measure_done(uv_work_t *work, int status) {
  measure_work *m = work->data;
  ql__server *s = m->s;
  struct ql__calib *c = s->calib;
  c->busy = 0;
  if (status != 0 || m->rc != 0) {
    ql__warn("crossover of %s: not measured (%s)", m->w->name,
             ql_strerror(status != 0 ? QL_EINTERNAL : m->rc));
  } else if (lookup(c, m->key) == NULL && remember(c, m->key, m->res.rows) ==
                                              0) {
    char what[64] = "never";
    if (m->res.rows != QL_CROSSOVER_NEVER)
      snprintf(what, sizeof what, "from %u rows", m->res.rows);
    ql__notice("crossover of %s (%lldx%lld): activation-quantized %s "
               "(%d sizes timed)", m->w->name, (long long)m->w->q->n,
               (long long)m->w->q->k, what, m->res.n);
    apply_ctx a = {s, m->key, m->res.rows};
    ql__weight_store_foreach(s->weights, apply_one, &a);
    save_file(c);
  }
  ql__weight_unref(m->w);
  free(m);
  if (!s->stopping)
    next_measurement(s);
}

/* Starts the next pending shape that is still unknown and still has a
 * resident weight. */
static void next_measurement(ql__server *s) {
  struct ql__calib *c = s->calib;
  while (c->started && !c->busy && c->n_pending > 0) {
    ql__weight *w = c->pending[0];
    memmove(c->pending, c->pending + 1,
            --c->n_pending * sizeof *c->pending);
    measure_work *m = calloc(1, sizeof *m);
    if (m == NULL) { /* measured when another weight of its shape comes */
      ql__weight_unref(w);
      continue;
    }
    shape_key(s, w, m->key, sizeof m->key);
    const ql__xover_entry *e = lookup(c, m->key);
    if (!w->in_store || e != NULL) {
      /* Gone, or measured for another weight of its shape meanwhile. */
      if (e != NULL)
        set_known(w, e->rows);
      free(m);
      ql__weight_unref(w);
      continue;
    }
    m->s = s;
    m->w = w;
    m->work.data = m;
    if (uv_queue_work(s->loop, &m->work, measure_run, measure_done) != 0) {
      free(m);
      ql__weight_unref(w);
      continue;
    }
    c->busy = 1;
  }
}

void ql__calibrate_start(ql__server *s) {
  if (s->calib == NULL)
    return;
  s->calib->started = 1;
  next_measurement(s);
}

void ql__calibrate_weight(ql__server *s, ql__weight *w) {
  struct ql__calib *c = s->calib;
  char key[QL_XOVER_KEY_MAX];
  /* Measured on the CPU only, for the weights it holds; the others keep
   * the configured default. */
  if (c == NULL || w->crossover_known || !(w->devices >> s->cpu->index & 1))
    return;
  shape_key(s, w, key, sizeof key);
  const ql__xover_entry *e = lookup(c, key);
  if (e != NULL) {
    set_known(w, e->rows);
    return;
  }
  if (s->cfg.crossover_rows != 0)
    return; /* fixed by the config: nothing to measure */
  if (c->n_pending == c->cap_pending) {
    size_t cap = c->cap_pending ? 2 * c->cap_pending : 8;
    ql__weight **p = realloc(c->pending, cap * sizeof *p);
    if (p == NULL)
      return; /* measured later, when another weight of its shape comes */
    c->pending = p;
    c->cap_pending = cap;
  }
  ql__weight_ref(w);
  c->pending[c->n_pending++] = w;
  next_measurement(s);
}
