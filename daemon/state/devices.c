/* devices.c - see devices.h. */
#include <stdio.h>
#include <string.h>

#include "conf.h"
#include "state/devices.h"
#include "log.h"
#include "qlineard.h"

/* Adds one device; 0 or an error (the table is full, the worker did not
 * start). */
static int add(ql__server *s, const ql_backend *b, int ordinal,
               const ql_device_desc *info) {
  ql__device *d;
  int rc;
  if (s->n_dev >= QL__MAX_DEVICES) {
    ql__warn("%s: more than %d devices; %s is not served", b->name,
             QL__MAX_DEVICES, info != NULL ? info->alias : b->name);
    return 0;
  }
  d = &s->dev[s->n_dev];
  memset(d, 0, sizeof *d);
  d->index = s->n_dev;
  d->b = b;
  d->ordinal = ordinal;
  if (info == NULL) {
    d->host = 1;
    snprintf(d->name, sizeof d->name, "%s", b->name);
    snprintf(d->alias, sizeof d->alias, "%s", b->name);
  } else {
    snprintf(d->name, sizeof d->name, "%s", info->name);
    snprintf(d->alias, sizeof d->alias, "%s", info->alias);
    d->memory = info->memory_bytes;
    ql__notice("device %s: %s (%s), %zu MiB, peak memory bandwidth %.0f "
               "GB/s%s%.*s", d->alias, info->model, d->name,
               info->memory_bytes >> 20,
               (double)info->peak_bytes_per_s / 1e9,
               info->note[0] ? "; " : "", (int)sizeof info->note, info->note);
  }
  /* The CPU's kernels already use every core: one batch at a time; so
   * does a backend that serializes its calls (device_lanes). */
  d->lanes = s->cfg.batches_in_flight;
  if (d->host || b->device_lanes <= 1)
    d->lanes = 1;
  else if (d->lanes > b->device_lanes)
    d->lanes = b->device_lanes;
  /* The loop gives a worker at most a batch per lane and one measurement
   * (calibrate.c runs one at a time): its queue is bounded by that, not
   * by max_queue, which bounds the requests waiting in each scheduler
   * queue. A batch refused here would fail requests no queue refused. */
  if ((rc = ql__worker_create(s->loop, d->alias, (size_t)d->lanes + 1,
                              d->lanes, &d->worker)) != 0)
    return rc;
  if (!d->host)
    ql__info("device %s: %u batch%s in flight", d->alias, d->lanes,
             d->lanes == 1 ? "" : "es");
  s->n_dev++;
  return 0;
}

int ql__devices_open(ql__server *s, const ql_backend_config *bc) {
  size_t nb;
  const ql_backend *const *bs = ql_backends(&nb);
  int rc;
  s->n_dev = 0;
  for (size_t i = 0; i < nb; i++) {
    const ql_backend *b = bs[i];
    if (ql_backend_check(b) != 0) {
      ql__err("backend %s is malformed; not served", b->name);
      continue;
    }
    if (b != s->cpu_backend && b->configure != NULL &&
        (rc = b->configure(bc)) != 0) {
      ql__err("backend %s: %s; not served", b->name, ql_strerror(rc));
      continue;
    }
    if (b->device_count == NULL) {
      if ((rc = add(s, b, 0, NULL)) != 0)
        goto fail;
      continue;
    }
    const char *why = NULL;
    int n = b->device_count(&why);
    if (n <= 0) {
      ql__notice("%s: no device: %s", b->name,
                 why != NULL ? why : ql_strerror(n));
      continue;
    }
    for (int o = 0; o < n; o++) {
      ql_device_desc info;
      memset(&info, 0, sizeof info);
      if ((rc = b->device_info(o, &info)) != 0) {
        ql__err("%s: device %d: %s; not served", b->name, o, ql_strerror(rc));
        continue;
      }
      if ((rc = add(s, b, o, &info)) != 0)
        goto fail;
    }
  }
  for (unsigned d = 0; d < s->n_dev; d++)
    if (s->dev[d].host && strcmp(s->dev[d].b->name, "cpu") == 0)
      s->cpu = &s->dev[d];
  if (s->cpu == NULL) {
    ql__err("the cpu backend is missing");
    rc = QL_EINTERNAL;
    goto fail;
  }
  char err[256];
  if ((rc = ql__devices_set_budgets(s, &s->cfg, err, sizeof err)) != 0) {
    ql__err("%s", err);
    goto fail;
  }
  return 0;
fail:
  ql__err("cannot start the devices: %s", ql_strerror(rc));
  ql__devices_close(s);
  ql__devices_free(s);
  return rc;
}

/* pct hundredths of a percent of mem, without overflow for any size_t. */
static size_t share(size_t mem, uint32_t pct) {
  uint64_t m = mem;
  uint64_t v = m / 10000 * pct + m % 10000 * pct / 10000;
  return v == 0 && mem > 0 ? 1 : (size_t)v; /* 0 would mean "no limit" */
}

int ql__devices_set_budgets(ql__server *s, const ql__config *cfg, char *err,
                            size_t errlen) {
  size_t budget[QL__MAX_DEVICES];
  int from[QL__MAX_DEVICES]; /* the item that set it, or -1 */
  char why[160];
  for (unsigned d = 0; d < s->n_dev; d++) {
    budget[d] = s->dev[d].host ? 0 : share(s->dev[d].memory,
                                           cfg->accel_budget_percent);
    from[d] = -1;
  }
  for (unsigned i = 0; i < cfg->device_budget_bytes.n; i++) {
    const char *item = cfg->device_budget_bytes.item[i];
    char name[QL_CONFIG_ITEM_MAX];
    uint64_t bytes;
    /* The parser checked the items; a failure here is one it let by. */
    if (ql__config_device_budget(item, name, sizeof name, &bytes, why,
                                 sizeof why) != 0) {
      snprintf(err, errlen, "device_budget_bytes: %s", why);
      return QL_EINVAL;
    }
    ql__device *d = ql__device_find(s, name);
    if (d == NULL || d->host) {
      ql__warn("device_budget_bytes: no accelerator '%s' here; its budget "
               "is ignored", name);
      continue;
    }
    if (from[d->index] >= 0) {
      snprintf(err, errlen, "device_budget_bytes: '%s' and '%s' name the "
               "same device %s", cfg->device_budget_bytes.item[from[d->index]],
               item, d->alias);
      return QL_EINVAL;
    }
    if (bytes > d->memory)
      ql__warn("device_budget_bytes: %s: %llu bytes, more than its %zu "
               "bytes of memory (loads past the memory fail when the "
               "device refuses them)", d->alias, (unsigned long long)bytes,
               d->memory);
    budget[d->index] = bytes > SIZE_MAX ? SIZE_MAX : (size_t)bytes;
    from[d->index] = (int)i;
  }
  for (unsigned d = 0; d < s->n_dev; d++) {
    if (s->dev[d].host)
      continue;
    if (s->dev[d].budget != budget[d])
      ql__info("device %s: weight budget %zu bytes (%s)", s->dev[d].alias,
               budget[d], from[d] >= 0 ? "device_budget_bytes"
                                       : "accel_budget_percent");
    s->dev[d].budget = budget[d];
    ql__weight_store_set_device_budget(s->weights, d, budget[d]);
  }
  return 0;
}

void ql__devices_close(ql__server *s) {
  for (unsigned d = 0; d < s->n_dev; d++)
    if (s->dev[d].worker != NULL)
      ql__worker_close(s->dev[d].worker);
}

void ql__devices_free(ql__server *s) {
  for (unsigned d = 0; d < s->n_dev; d++) {
    ql__worker_free(s->dev[d].worker);
    s->dev[d].worker = NULL;
  }
}

unsigned ql__devices_host_register(ql__server *s, void *p, size_t len,
                                   const ql_backend **out, unsigned max) {
  unsigned n = 0;
  for (unsigned d = 0; d < s->n_dev && n < max; d++) {
    const ql_backend *b = s->dev[d].b;
    int seen = 0, rc;
    if (b->host_register == NULL)
      continue;
    /* Once per backend (registration is for all its devices): at its
     * first device. */
    for (unsigned e = 0; e < d; e++)
      seen |= s->dev[e].b == b;
    if (seen)
      continue;
    if ((rc = b->host_register(p, len)) != 0) {
      ql__debug("%s: host memory of %zu bytes not registered (%s); its "
                "tensors are staged", b->name, len, ql_strerror(rc));
      continue;
    }
    out[n++] = b;
  }
  return n;
}

int ql__devices_host_register_wanted(const ql__server *s) {
  for (unsigned d = 0; d < s->n_dev; d++)
    if (s->dev[d].b->host_register != NULL)
      return 1;
  return 0;
}

void ql__devices_host_unregister(void *p, const ql_backend *const *bs,
                                 unsigned n) {
  for (unsigned i = 0; i < n; i++)
    bs[i]->host_unregister(p);
}

ql__device *ql__device_find(ql__server *s, const char *name) {
  for (unsigned d = 0; d < s->n_dev; d++)
    if (strcmp(s->dev[d].name, name) == 0 ||
        strcmp(s->dev[d].alias, name) == 0)
      return &s->dev[d];
  return NULL;
}

static void place(const ql__device *d, ql__placement *pl) {
  struct ql__place *p = &pl->at[pl->n++];
  p->dev = d->index;
  p->b = d->b;
  p->ordinal = d->ordinal;
  p->host = d->host;
}

int ql__devices_placement(const ql__server *s, ql__placement *pl) {
  memset(pl, 0, sizeof *pl);
  for (unsigned d = 0; d < s->n_dev; d++)
    if (!s->dev[d].host && !s->dev[d].failed)
      place(&s->dev[d], pl);
  if (pl->n == 0 && s->cpu != NULL && !s->cpu->failed)
    place(s->cpu, pl);
  return pl->n > 0 ? 0 : QL_EDEVICE;
}

int ql__devices_resolve(ql__server *s, char *const *names, size_t n,
                        uint64_t *mask, char *err, size_t errlen) {
  uint64_t m = 0;
  for (size_t i = 0; i < n; i++) {
    ql__device *d = ql__device_find(s, names[i]);
    if (d == NULL) {
      char present[256];
      ql__devices_list(s, ~(uint64_t)0, present, sizeof present);
      snprintf(err, errlen, "no device '%.64s' (devices: %s)", names[i],
               present);
      return QL_ENOTFOUND;
    }
    if (m >> d->index & 1) {
      snprintf(err, errlen, "device %s is named twice", d->alias);
      return QL_EINVAL;
    }
    if (d->failed) {
      snprintf(err, errlen, "device %s is out of service", d->alias);
      return QL_EDEVICE;
    }
    m |= (uint64_t)1 << d->index;
  }
  *mask = m;
  return 0;
}

int ql__devices_placement_mask(const ql__server *s, uint64_t mask,
                               ql__placement *pl, char *err, size_t errlen) {
  memset(pl, 0, sizeof *pl);
  for (unsigned d = 0; d < s->n_dev; d++) {
    if (!(mask >> d & 1))
      continue;
    if (s->dev[d].failed) {
      snprintf(err, errlen, "device %s is out of service", s->dev[d].alias);
      return QL_EDEVICE;
    }
    place(&s->dev[d], pl);
  }
  if (pl->n == 0) {
    snprintf(err, errlen, "no device named");
    return QL_EINVAL;
  }
  return 0;
}

void ql__device_fail(ql__server *s, ql__device *d, int rc) {
  char why[160] = "";
  (void)s;
  if (d->failed)
    return;
  d->failed = 1;
  if (d->b->device_error == NULL ||
      d->b->device_error(d->ordinal, why, sizeof why) == 0 || why[0] == '\0')
    snprintf(why, sizeof why, "%s", ql_strerror(rc));
  ql__err("device %s (%s) is out of service: %s; its requests fail, the "
          "other devices keep serving", d->alias, d->name, why);
}

void ql__devices_list(const ql__server *s, uint64_t mask, char *buf,
                      size_t len) {
  size_t at = 0;
  if (len == 0)
    return;
  buf[0] = '\0';
  for (unsigned d = 0; d < s->n_dev && at < len; d++) {
    if (!(mask >> d & 1))
      continue;
    int n = snprintf(buf + at, len - at, "%s%s", at ? ", " : "",
                     s->dev[d].alias);
    if (n < 0)
      break;
    at += (size_t)n;
  }
}

uint64_t ql__devices_failed(const ql__server *s) {
  uint64_t m = 0;
  for (unsigned d = 0; d < s->n_dev; d++)
    if (s->dev[d].failed)
      m |= (uint64_t)1 << d;
  return m;
}
