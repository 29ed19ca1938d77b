/*
 * stats.c - libqlinear: ql_stats.
 */
#include "internal.h"

/* ------------------------------------------------------------ stats */

/* ql_stats_info and its per-weight array in one allocation, so that one free()
 * releases both; the users follow the weights (w[n_per_weight] on). */
struct stats_block {
  ql_stats_info s;
  ql_weight_stats w[];
};
_Static_assert(sizeof(ql_weight_stats) % _Alignof(ql_user_stats) == 0,
               "the users after the weights are aligned");

QL_EXPORT int ql_stats(ql_client *c, ql_stats_info **out) {
  Qlinear__V1__StatsRequest sr = QLINEAR__V1__STATS_REQUEST__INIT;
  Request req = QLINEAR__V1__REQUEST__INIT;
  Response *resp = NULL;
  struct stats_block *b = NULL;
  int rv;

  ql__err_clear();
  if (out != NULL)
    *out = NULL;
  if (c == NULL || out == NULL)
    return ql__err_set(QL_EINVAL, "client or output is NULL");
  req.body_case = QLINEAR__V1__REQUEST__BODY_STATS;
  req.stats = &sr;
  if ((rv = ql__call(c, &req, QLINEAR__V1__RESPONSE__BODY_STATS, c->timeout_ms,
                     &resp)) != 0)
    goto fail;

  const Qlinear__V1__StatsResponse *st = resp->stats;
  size_t n = st->n_per_weight, nu = st->n_users;
  if (n > (SIZE_MAX - sizeof *b) / sizeof b->w[0] / 2 ||
      nu > (SIZE_MAX - sizeof *b) / sizeof(ql_user_stats) / 2) {
    rv = ql__err_set(QL_EPROTO, "%zu per-weight and %zu user entries", n,
                     nu);
    goto fail;
  }
  if ((b = calloc(1, sizeof *b + n * sizeof b->w[0] +
                         nu * sizeof(ql_user_stats))) == NULL) {
    rv = ql__err_set(QL_ENOMEM, "allocating statistics of %zu weights", n);
    goto fail;
  }
  b->s.uptime_ns = st->uptime_ns;
  b->s.requests = st->requests;
  b->s.errors = st->errors;
  b->s.bytes_in = st->bytes_in;
  b->s.bytes_out = st->bytes_out;
  b->s.weights = st->weights;
  b->s.uploads_in_progress = st->uploads_in_progress;
  b->s.n_per_weight = n;
  b->s.per_weight = n > 0 ? b->w : NULL;
  b->s.sessions = st->sessions;
  b->s.regions = st->regions;
  b->s.region_bytes = st->region_bytes;
  b->s.persistent_weights = st->persistent_weights;
  b->s.rings = st->rings;
  b->s.ring_requests = st->ring_requests;
  b->s.n_devices_total = st->n_devices;
  for (size_t i = 0; i < st->n_devices && i < QL_MAX_DEVICES; i++) {
    const Qlinear__V1__DeviceStats *ds = st->devices[i];
    if (ds == NULL) {
      rv = ql__err_set(QL_EPROTO, "empty device entry");
      goto fail;
    }
    ql__copy_str(b->s.devices[i].device, sizeof b->s.devices[i].device,
                 ds->device);
    b->s.devices[i].bytes_resident = ds->bytes_resident;
    b->s.devices[i].budget_bytes = ds->budget_bytes;
    b->s.n_devices = i + 1;
  }
  for (size_t i = 0; i < n; i++) {
    const Qlinear__V1__WeightStats *ws = st->per_weight[i];
    ql_weight_stats *o = &b->w[i];
    if (ws == NULL) {
      rv = ql__err_set(QL_EPROTO, "empty per-weight entry");
      goto fail;
    }
    if ((rv = ql__copy_name(o->weight, ws->weight, "weight")) != 0)
      goto fail;
    ql__copy_str(o->device, sizeof o->device, ws->device);
    o->requests = ws->requests;
    o->rows = ws->rows;
    o->batches = ws->batches;
    o->wo_batches = ws->wo_batches;
    o->aq_batches = ws->aq_batches;
    o->queue_ns = ws->queue_ns;
    o->kernel_ns = ws->kernel_ns;
    ql__copy_str(o->impl, sizeof o->impl, ws->impl);
    o->bytes_resident = ws->bytes_resident;
    o->expired = ws->expired;
    o->crossover_rows = ws->crossover_rows;
    o->crossover_measured = ws->crossover_measured ? 1 : 0;
    for (size_t b = 0; b < ws->n_queue_hist && b < QL_HIST_BUCKETS; b++)
      o->queue_hist[b] = ws->queue_hist[b];
    for (size_t b = 0; b < ws->n_kernel_hist && b < QL_HIST_BUCKETS; b++)
      o->kernel_hist[b] = ws->kernel_hist[b];
  }
  /* (ql_weight_stats is a multiple of 8 bytes: the users stay aligned.) */
  ql_user_stats *users = (ql_user_stats *)(void *)(b->w + n);
  for (size_t i = 0; i < nu; i++) {
    const Qlinear__V1__UserStats *us = st->users[i];
    if (us == NULL) {
      rv = ql__err_set(QL_EPROTO, "empty user entry");
      goto fail;
    }
    users[i] = (ql_user_stats){us->uid, us->sessions, us->queued_requests,
                               us->queued_bytes, us->uploads,
                               us->upload_bytes, us->refused};
  }
  b->s.n_users = nu;
  b->s.users = nu > 0 ? users : NULL;
  qlinear__v1__response__free_unpacked(resp, NULL);
  *out = &b->s;
  return 0;

fail:
  free(b);
  if (resp != NULL)
    qlinear__v1__response__free_unpacked(resp, NULL);
  return rv;
}
