/* scheduler.c - see scheduler.h. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch/scheduler.h"

/* The two classes of queue, in priority order. */
enum { DEC = 0, PRE = 1, NCLASS = 2 };

/*
 * A small open-addressing table from uint64_t keys to uint64_t values with
 * linear probing and backward-shift deletion (no tombstones). It maps a
 * session id to its request count and, per device, a weight key to its
 * slot. The capacity is a power of two and at least twice the entries.
 */
typedef struct map {
  uint64_t *key;
  uint64_t *val;
  uint8_t *used;
  size_t cap, n;
} map;

#define MAP_NONE SIZE_MAX
#define MAP_MIN_CAP 16

/* A queue: the waiting requests of one (weight, device, class). */
struct ql__sched_queue {
  struct slot *slot;
  int cls;                    /* DEC or PRE */
  ql__sched_req *head, *tail; /* FIFO, linked through req->next */
  size_t n;                   /* waiting requests, a partly started head too */
  uint64_t rows;              /* rows not yet dispatched */
  uint64_t ns_per_row;        /* cost estimate */
  int measured;               /* ns_per_row has seen a measurement or a set */
  /* A lower bound of the deadlines of the waiting requests with none of
   * their rows started; 0 = there are none. Removing a request can leave
   * it low, which only costs a scan. */
  uint64_t min_deadline;
  uint32_t running; /* batches dispatched, not yet completed */
  /* The decode hold (decode_hold_us): the rows the next launch waits for
   * (0: none); the completion that set it; when the wait began, which it
   * is counted from (the completion when rows were waiting then, else the
   * first row back; 0: no row yet); holds still to skip since one ran
   * out, and how many ran out in a row. */
  uint32_t hold_rows;
  uint64_t hold_set;
  uint64_t hold_from;
  uint32_t hold_skip;
  uint32_t hold_misses;
  /* Launch times: point b holds a launch of rows in [2^b, 2^(b+1)) (the
   * last point: that many or more), from the calibration or from launches
   * seen; rows 0 = no point. See launch_ns(). */
  struct {
    uint32_t rows;
    uint64_t ns;
  } curve[QL_SCHED_CURVE_POINTS];
  /* In the device's list of its class while n > 0. */
  struct ql__sched_queue *act_prev, *act_next;
};
typedef struct ql__sched_queue queue;

/* Everything about one (weight, device). */
typedef struct slot {
  const void *weight;
  unsigned device;
  queue q[NCLASS];
  ql__sched_stats stats;
} slot;

typedef struct device {
  map slots;             /* weight key -> slot * */
  queue *active[NCLASS]; /* queues with waiting requests */
  uint64_t queued_cost;  /* estimated ns of the rows waiting */
  uint64_t running_cost; /* estimated ns of the batches running */
  uint32_t running[NCLASS]; /* batches of each class running */
  uint64_t decode_ns;    /* now_ns of the last decode submit; 0: none */
} device;

struct ql__sched {
  ql__sched_config cfg;
  uint64_t delay_ns;
  uint64_t hold_ns; /* decode_hold_us */
  device dev[QL_SCHED_MAX_DEVICES];
  map sessions; /* session id -> requests in the scheduler */
  uint64_t seq; /* submits so far */
};

/* A list handed back, in order: append at the tail. */
typedef struct list {
  ql__sched_req *head, **tailp;
} list;

/* ------------------------------------------------------------------ map */

static uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  return k ^ (k >> 33);
}

static void map_free(map *m) {
  free(m->key);
  free(m->val);
  free(m->used);
  memset(m, 0, sizeof *m);
}

static int map_alloc(map *m, size_t cap) {
  m->key = calloc(cap, sizeof *m->key);
  m->val = calloc(cap, sizeof *m->val);
  m->used = calloc(cap, 1);
  m->cap = cap;
  m->n = 0;
  if (m->key == NULL || m->val == NULL || m->used == NULL) {
    map_free(m);
    return QL_ENOMEM;
  }
  return 0;
}

static size_t map_find(const map *m, uint64_t key) {
  if (m->cap == 0)
    return MAP_NONE;
  size_t mask = m->cap - 1;
  for (size_t i = (size_t)mix(key) & mask; m->used[i]; i = (i + 1) & mask)
    if (m->key[i] == key)
      return i;
  return MAP_NONE;
}

/* Puts a key known to be absent; there must be room (map_reserve). */
static void map_insert(map *m, uint64_t key, uint64_t val) {
  size_t mask = m->cap - 1, i = (size_t)mix(key) & mask;
  assert(2 * (m->n + 1) <= m->cap);
  while (m->used[i])
    i = (i + 1) & mask;
  m->used[i] = 1;
  m->key[i] = key;
  m->val[i] = val;
  m->n++;
}

/* Makes room for one more entry, so the next map_insert cannot fail. On
 * failure the map is unchanged. */
static int map_reserve(map *m) {
  if (2 * (m->n + 1) <= m->cap)
    return 0;
  size_t cap = m->cap ? 2 * m->cap : MAP_MIN_CAP;
  map old = *m, grown;
  if (cap < m->cap || map_alloc(&grown, cap) != 0)
    return QL_ENOMEM;
  for (size_t i = 0; i < old.cap; i++)
    if (old.used[i])
      map_insert(&grown, old.key[i], old.val[i]);
  map_free(&old);
  *m = grown;
  return 0;
}

/* Deletes entry i and shifts back the entries of its probe run that would
 * no longer be found past the hole. */
static void map_delete(map *m, size_t i) {
  size_t mask = m->cap - 1, j = i;
  m->used[i] = 0;
  m->n--;
  for (;;) {
    j = (j + 1) & mask;
    if (!m->used[j])
      return;
    size_t home = (size_t)mix(m->key[j]) & mask;
    /* Entry j may fill the hole at i unless its home lies cyclically in
     * (i, j]. */
    if ((i < j) ? (home > i && home <= j) : (home > i || home <= j))
      continue;
    m->key[i] = m->key[j];
    m->val[i] = m->val[j];
    m->used[i] = 1;
    m->used[j] = 0;
    i = j;
  }
}

/* ------------------------------------------------------------- helpers */

/* A queue index (DEC, PRE) and the public class, both ways. */
static int class_index(ql__sched_class c) {
  return c == QL_SCHED_PREFILL ? PRE : DEC;
}

static ql__sched_class index_class(int i) {
  return i == PRE ? QL_SCHED_PREFILL : QL_SCHED_DECODE;
}

static uint64_t clamp_rate(uint64_t ns) {
  return ns < 1                         ? 1
         : ns > QL_SCHED_MAX_NS_PER_ROW ? QL_SCHED_MAX_NS_PER_ROW
                                        : ns;
}

static uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void list_init(list *l) {
  l->head = NULL;
  l->tailp = &l->head;
}

static void list_push(list *l, ql__sched_req *r) {
  r->next = NULL;
  *l->tailp = r;
  l->tailp = &r->next;
}

unsigned ql__sched_hist_bucket(uint64_t ns) {
  unsigned b = 0;
  ns >>= 10;
  while (ns != 0 && b < QL_SCHED_HIST_BUCKETS - 1) {
    b++;
    ns >>= 1;
  }
  return b;
}

uint64_t ql__sched_hist_lower_ns(unsigned bucket) {
  if (bucket == 0 || bucket >= QL_SCHED_HIST_BUCKETS)
    return 0;
  return (uint64_t)1 << (bucket + 9);
}

/* The most rows of one launch from a queue of class cls, whatever the
 * time: max_batch_rows, and prefill_chunk_rows for prefill. */
static uint32_t batch_cap(const ql__sched *s, int cls) {
  uint32_t cap = s->cfg.max_batch_rows;
  if (cls == PRE && s->cfg.prefill_chunk_rows != 0 &&
      s->cfg.prefill_chunk_rows < cap)
    cap = s->cfg.prefill_chunk_rows;
  return cap;
}

/* ---------------------------------------------------------- launch time */

static unsigned curve_point(uint32_t rows) {
  unsigned b = 0;
  while (rows > 1 && b < QL_SCHED_CURVE_POINTS - 1) {
    rows >>= 1;
    b++;
  }
  return b;
}

/*
 * The estimated time of a launch of m rows from q: piecewise linear
 * between the points of its curve. Below its first point it is that
 * point's time and past its last one it grows in proportion to the rows
 * from there; both overestimate a cost that is a fixed part plus a part
 * per row, so a chunk sized by them errs on the short side. Without a
 * point it is m times ns_per_row.
 */
static uint64_t launch_ns(const queue *q, uint32_t m) {
  int lo = -1, hi = -1;
  for (int b = 0; b < QL_SCHED_CURVE_POINTS; b++) {
    if (q->curve[b].rows == 0)
      continue;
    if (q->curve[b].rows <= m)
      lo = b;
    if (q->curve[b].rows >= m && hi < 0)
      hi = b;
  }
  if (lo < 0 && hi < 0)
    return (uint64_t)m * q->ns_per_row;
  if (lo < 0)
    return q->curve[hi].ns;
  uint64_t r0 = q->curve[lo].rows, t0 = q->curve[lo].ns;
  if (hi < 0) /* t0 <= 2^40 and m < 2^32: no overflow */
    return t0 / r0 * m + t0 % r0 * m / r0;
  uint64_t r1 = q->curve[hi].rows, t1 = q->curve[hi].ns;
  if (r1 == r0)
    return t0;
  if (t1 >= t0)
    return t0 + (t1 - t0) * (m - r0) / (r1 - r0);
  return t0 - (t0 - t1) * (m - r0) / (r1 - r0);
}

/* A launch of m rows of q took ns: the point of its size moves to m rows
 * and a quarter of the way from the curve's estimate there to ns. */
static void curve_learn(queue *q, uint32_t m, uint64_t ns) {
  unsigned b = curve_point(m);
  if (ns > QL_SCHED_MAX_LAUNCH_NS)
    ns = QL_SCHED_MAX_LAUNCH_NS;
  if (q->curve[b].rows != 0) {
    uint64_t est = launch_ns(q, m);
    if (est > QL_SCHED_MAX_LAUNCH_NS)
      est = QL_SCHED_MAX_LAUNCH_NS;
    ns = (3 * est + ns) / 4;
  }
  q->curve[b].rows = m;
  q->curve[b].ns = ns;
}

/* Whether decode work is waiting, running or was submitted within the
 * last QL_SCHED_DECODE_WINDOW_NS on dv: a stream of decode requests
 * leaves gaps between them, and a prefill started whole in one of them
 * would hold up the next request for all its rows. */
static int decode_active(const device *dv, uint64_t now_ns) {
  return dv->active[DEC] != NULL || dv->running[DEC] > 0 ||
         (dv->decode_ns != 0 && now_ns >= dv->decode_ns &&
          now_ns - dv->decode_ns < QL_SCHED_DECODE_WINDOW_NS);
}

/*
 * The most rows of the next prefill launch from q at now_ns (DESIGN §6).
 * While no decode work is about, the whole request (batch_cap). With
 * decode about on a device of one lane, the largest row count whose
 * estimated launch time fits prefill_chunk_us (at least one row), so a
 * decode request arriving waits at most one such launch. A device of
 * several lanes keeps one free for decode instead (ql__sched_next), and
 * runs prefill whole.
 */
static uint32_t prefill_rows(const ql__sched *s, const queue *q,
                             uint64_t now_ns) {
  uint32_t cap = batch_cap(s, PRE);
  const device *dv = &s->dev[q->slot->device];
  unsigned lanes = s->cfg.lanes[q->slot->device];
  if (s->cfg.prefill_chunk_us == 0 || lanes > 1 ||
      s->cfg.stops[q->slot->device] || !decode_active(dv, now_ns))
    return cap;
  uint64_t budget = s->cfg.prefill_chunk_us * 1000u;
  if (launch_ns(q, cap) <= budget)
    return cap;
  uint32_t lo = 1, hi = cap; /* launch_ns(hi) > budget */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (launch_ns(q, mid) <= budget)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static slot *slot_find(const ql__sched *s, unsigned d, const void *weight) {
  size_t i = map_find(&s->dev[d].slots, (uint64_t)(uintptr_t)weight);
  return i == MAP_NONE ? NULL : (slot *)(uintptr_t)s->dev[d].slots.val[i];
}

/* The slot of (weight, d), made on first use; NULL when out of memory. */
static slot *slot_get(ql__sched *s, unsigned d, const void *weight) {
  slot *sl = slot_find(s, d, weight);
  if (sl != NULL)
    return sl;
  if (map_reserve(&s->dev[d].slots) != 0)
    return NULL;
  if ((sl = calloc(1, sizeof *sl)) == NULL)
    return NULL;
  sl->weight = weight;
  sl->device = d;
  for (int c = 0; c < NCLASS; c++) {
    sl->q[c].slot = sl;
    sl->q[c].cls = c;
    sl->q[c].ns_per_row = s->cfg.default_ns_per_row;
  }
  map_insert(&s->dev[d].slots, (uint64_t)(uintptr_t)weight,
             (uint64_t)(uintptr_t)sl);
  return sl;
}

static void activate(device *dv, queue *q) {
  q->act_prev = NULL;
  q->act_next = dv->active[q->cls];
  if (q->act_next != NULL)
    q->act_next->act_prev = q;
  dv->active[q->cls] = q;
}

static void deactivate(device *dv, queue *q) {
  if (q->act_prev != NULL)
    q->act_prev->act_next = q->act_next;
  else
    dv->active[q->cls] = q->act_next;
  if (q->act_next != NULL)
    q->act_next->act_prev = q->act_prev;
  q->act_prev = q->act_next = NULL;
}

/* One request fewer for session (handed back). */
static void session_release(ql__sched *s, uint64_t session) {
  size_t i = map_find(&s->sessions, session);
  assert(i != MAP_NONE && s->sessions.val[i] > 0);
  if (--s->sessions.val[i] == 0)
    map_delete(&s->sessions, i);
}

/* Whether r is handed back now: no rows running, and either all computed
 * or the rest given up (status set by a removal). */
static int is_finished(const ql__sched_req *r) {
  return r->done == r->dispatched &&
         (r->dispatched == r->rows || r->status != 0);
}

/*
 * Takes r, which follows prev (NULL: r is the head), out of q with status
 * code. It goes to out if none of its rows is running; otherwise it is cut
 * short and complete() hands it back when its running rows are done.
 */
static void unqueue(ql__sched *s, queue *q, ql__sched_req *prev,
                    ql__sched_req *r, int code, list *out) {
  device *dv = &s->dev[q->slot->device];
  uint32_t left = r->rows - r->dispatched;
  if (prev != NULL)
    prev->next = r->next;
  else
    q->head = r->next;
  if (q->tail == r)
    q->tail = prev;
  q->n--;
  q->rows -= left;
  dv->queued_cost -= (uint64_t)left * r->charge;
  if (q->n == 0)
    deactivate(dv, q);
  r->next = NULL;
  r->status = code;
  if (is_finished(r)) {
    session_release(s, r->session);
    list_push(out, r);
  }
}

/*
 * Moves the requests of q whose deadline is due and none of whose rows has
 * started to out (QL_EDEADLINE), and makes min_deadline exact again. A
 * request whose rows have started runs to its end: answering it late is
 * better than throwing away the rows computed.
 */
static void expire_queue(ql__sched *s, queue *q, uint64_t now_ns, list *out) {
  if (q->min_deadline == 0 || q->min_deadline > now_ns)
    return;
  uint64_t min = 0;
  ql__sched_req *prev = NULL, *r = q->head;
  while (r != NULL) {
    ql__sched_req *next = r->next;
    if (r->dispatched == 0 && r->deadline_ns != 0) {
      if (r->deadline_ns <= now_ns) {
        q->slot->stats.expired++;
        unqueue(s, q, prev, r, QL_EDEADLINE, out);
        r = next;
        continue;
      }
      if (min == 0 || r->deadline_ns < min)
        min = r->deadline_ns;
    }
    prev = r;
    r = next;
  }
  q->min_deadline = min;
}

static void expire_device(ql__sched *s, unsigned d, uint64_t now_ns,
                          list *out) {
  for (int c = 0; c < NCLASS; c++) {
    queue *q = s->dev[d].active[c];
    while (q != NULL) {
      queue *next = q->act_next; /* q may leave the list */
      expire_queue(s, q, now_ns, out);
      q = next;
    }
  }
}

/* ------------------------------------------------------------ lifecycle */

static int config_check(const ql__sched_config *cfg) {
  if (cfg == NULL || cfg->max_batch_rows == 0 || cfg->max_queue == 0 ||
      cfg->n_devices == 0 || cfg->n_devices > QL_SCHED_MAX_DEVICES ||
      cfg->max_queue_delay_us > QL_SCHED_MAX_DELAY_US ||
      cfg->decode_hold_us > QL_SCHED_MAX_DELAY_US ||
      cfg->prefill_chunk_us > QL_SCHED_MAX_CHUNK_US)
    return QL_EINVAL;
  return 0;
}

static void config_apply(ql__sched *s, const ql__sched_config *cfg) {
  s->cfg = *cfg;
  s->cfg.default_ns_per_row =
      clamp_rate(cfg->default_ns_per_row ? cfg->default_ns_per_row
                                         : QL_SCHED_DEFAULT_NS_PER_ROW);
  s->delay_ns = cfg->max_queue_delay_us * 1000u;
  s->hold_ns = cfg->decode_hold_us * 1000u;
}

int ql__sched_create(const ql__sched_config *cfg, ql__sched **out) {
  int rc = config_check(cfg);
  ql__sched *s = NULL;
  *out = NULL;
  if (rc != 0)
    return rc;
  rc = QL_ENOMEM;
  if ((s = calloc(1, sizeof *s)) == NULL)
    goto fail;
  config_apply(s, cfg);
  if (map_alloc(&s->sessions, MAP_MIN_CAP) != 0)
    goto fail;
  for (unsigned d = 0; d < cfg->n_devices; d++)
    if (map_alloc(&s->dev[d].slots, MAP_MIN_CAP) != 0)
      goto fail;
  *out = s;
  return 0;
fail:
  ql__sched_free(s);
  return rc;
}

void ql__sched_free(ql__sched *s) {
  if (s == NULL)
    return;
  for (unsigned d = 0; d < QL_SCHED_MAX_DEVICES; d++) {
    map *m = &s->dev[d].slots;
    for (size_t i = 0; i < m->cap; i++)
      if (m->used[i])
        free((slot *)(uintptr_t)m->val[i]);
    map_free(m);
  }
  map_free(&s->sessions);
  free(s);
}

int ql__sched_configure(ql__sched *s, const ql__sched_config *cfg) {
  int rc = config_check(cfg);
  if (rc != 0)
    return rc;
  if (cfg->n_devices != s->cfg.n_devices)
    return QL_EINVAL;
  config_apply(s, cfg);
  return 0;
}

/* --------------------------------------------------------------- submit */

int ql__sched_submit(ql__sched *s, ql__sched_req *r, uint64_t now_ns) {
  if (r == NULL || r->weight == NULL || r->rows == 0 ||
      (r->cls != QL_SCHED_DECODE && r->cls != QL_SCHED_PREFILL))
    return QL_EINVAL;
  unsigned nd = s->cfg.n_devices;
  uint64_t all = nd == 64 ? UINT64_MAX : ((uint64_t)1 << nd) - 1, cand;
  if (r->device >= 0) {
    if ((unsigned)r->device >= nd)
      return QL_EINVAL;
    cand = (uint64_t)1 << r->device;
  } else if ((cand = r->holders & all) == 0) {
    return QL_ENOTFOUND;
  }
  if (r->deadline_ns != 0 && r->deadline_ns <= now_ns)
    return QL_EDEADLINE;

  size_t si = map_find(&s->sessions, r->session);
  if (s->cfg.session_quota != 0 && si != MAP_NONE &&
      s->sessions.val[si] >= s->cfg.session_quota)
    return QL_EEXHAUSTED;

  /* The device with room and the earliest estimated completion. */
  int cls = class_index(r->cls), best = -1;
  uint64_t best_est = 0;
  for (unsigned d = 0; d < nd; d++) {
    if (!(cand >> d & 1))
      continue;
    slot *sl = slot_find(s, d, r->weight);
    const queue *q = sl ? &sl->q[cls] : NULL;
    if (q != NULL && q->n >= s->cfg.max_queue)
      continue;
    uint64_t rate = q ? q->ns_per_row : s->cfg.default_ns_per_row;
    unsigned lanes = s->cfg.lanes[d] > 0 ? s->cfg.lanes[d] : 1;
    uint64_t est =
        sat_add(sat_add(s->dev[d].queued_cost, s->dev[d].running_cost) /
                    lanes,
                (uint64_t)r->rows * rate);
    if (best < 0 || est < best_est) {
      best = (int)d;
      best_est = est;
    }
  }
  if (best < 0)
    return QL_EEXHAUSTED;

  /* Allocate before changing anything, so a failure changes nothing
   * visible (an empty slot is invisible but for ql__sched_stats_get). */
  if (si == MAP_NONE && map_reserve(&s->sessions) != 0)
    return QL_ENOMEM;
  slot *sl = slot_get(s, (unsigned)best, r->weight);
  if (sl == NULL)
    return QL_ENOMEM;
  if (si == MAP_NONE)
    map_insert(&s->sessions, r->session, 1);
  else
    s->sessions.val[si]++;

  device *dv = &s->dev[best];
  queue *q = &sl->q[cls];
  r->on_device = (unsigned)best;
  r->status = 0;
  r->enqueue_ns = now_ns;
  r->next = NULL;
  r->seq = ++s->seq;
  r->charge = q->ns_per_row;
  r->dispatched = 0;
  r->done = 0;
  if (q->tail != NULL)
    q->tail->next = r;
  else
    q->head = r;
  q->tail = r;
  if (q->n++ == 0)
    activate(dv, q);
  q->rows += r->rows;
  dv->queued_cost += (uint64_t)r->rows * r->charge;
  if (cls == DEC) {
    dv->decode_ns = now_ns;
    /* The first row back after a completion that set a hold starts its
     * wait; one later than a whole hold after it finds clients that do
     * not decode in a loop on this weight: no hold then. So does a row
     * that finds the queue emptied (its rows removed) past the hold. */
    if (q->hold_rows != 0 && q->hold_from == 0) {
      if (now_ns <= sat_add(q->hold_set, s->hold_ns))
        q->hold_from = now_ns;
      else
        q->hold_rows = 0;
    } else if (q->hold_rows != 0 && q->n == 1 &&
               now_ns > sat_add(q->hold_from, s->hold_ns)) {
      q->hold_rows = 0;
      q->hold_from = 0;
    }
  }
  if (r->deadline_ns != 0 &&
      (q->min_deadline == 0 || r->deadline_ns < q->min_deadline))
    q->min_deadline = r->deadline_ns;
  return 0;
}

/* ----------------------------------------------------------------- next */

/*
 * When q's work may start under max_queue_delay_us: at once if a full
 * batch waits, nothing is held, its head has started (the rest of a
 * started request gains nothing from waiting) or a waiting request's
 * deadline falls within the hold (holding it would turn a short wait into
 * DEADLINE_EXCEEDED); else once its oldest request has waited
 * max_queue_delay_us.
 */
static uint64_t delay_due(const ql__sched *s, const queue *q) {
  if (s->delay_ns == 0 || q->rows >= batch_cap(s, q->cls) ||
      q->head->dispatched != 0)
    return 0;
  uint64_t release = sat_add(q->head->enqueue_ns, s->delay_ns);
  if (q->min_deadline != 0 && q->min_deadline <= release)
    return 0;
  return release;
}

/* rows, but no more than a decode launch takes (max_batch_rows may have
 * been lowered since a hold was set). */
static uint32_t decode_rows(const ql__sched *s, uint64_t rows) {
  uint32_t most = batch_cap(s, DEC);
  return rows < most ? (uint32_t)rows : most;
}

/*
 * The end of q's decode hold (from hold_from), or 0 when none applies:
 * none is set or no row has come back yet, its rows are all there (up to
 * a launch), its head has started, or the launch of the r rows waiting
 * plus that of the e rows to come would take no longer than one of r + e
 * (the wait would be a pure loss). Else it lasts what one launch saves,
 * up to decode_hold_us, and never past a waiting request's deadline.
 */
static uint64_t hold_due(const ql__sched *s, const queue *q) {
  uint32_t want = decode_rows(s, q->hold_rows);
  if (want == 0 || q->hold_from == 0 || q->rows >= want ||
      q->head->dispatched != 0 || s->hold_ns == 0)
    return 0;
  uint32_t r = (uint32_t)q->rows, e = want - r;
  uint64_t two = sat_add(launch_ns(q, r), launch_ns(q, e));
  uint64_t one = launch_ns(q, r + e);
  if (two <= one)
    return 0;
  uint64_t hold = two - one < s->hold_ns ? two - one : s->hold_ns;
  uint64_t release = sat_add(q->hold_from, hold);
  if (q->min_deadline != 0 && q->min_deadline <= release)
    return 0;
  return release;
}

/* The tenants, and the requests looked at, of fill()'s first pass. */
#define FAIR_TENANTS 16
#define FAIR_SCAN 256

/*
 * Puts take rows of r (which follows prev in q; NULL: the head) into b,
 * and takes r out of q once all its rows are dispatched. 1 when r stays
 * queued, 0 when it left.
 */
static int take_rows(ql__sched *s, queue *q, ql__sched_req *prev,
                     ql__sched_req *r, uint32_t take, uint64_t now_ns,
                     ql__sched_batch *b, uint32_t *room) {
  device *dv = &s->dev[q->slot->device];
  ql__sched_stats *st = &q->slot->stats;
  if (r->dispatched == 0) {
    assert(r->deadline_ns == 0 || r->deadline_ns > now_ns);
    uint64_t waited = now_ns > r->enqueue_ns ? now_ns - r->enqueue_ns : 0;
    st->queue_ns += waited;
    st->queue_hist[ql__sched_hist_bucket(waited)]++;
  }
  b->slice[b->n++] = (ql__sched_slice){r, r->dispatched, take};
  b->rows += take;
  r->dispatched += take;
  *room -= take;
  q->rows -= take;
  dv->queued_cost -= (uint64_t)take * r->charge;
  if (r->dispatched != r->rows)
    return 1;
  if (prev != NULL)
    prev->next = r->next;
  else
    q->head = r->next;
  if (q->tail == r)
    q->tail = prev;
  r->next = NULL;
  q->n--;
  return 0;
}

/* Moves up to a batch of rows from q into b: the oldest request of each
 * tenant first, then oldest first. */
static void fill(ql__sched *s, queue *q, uint64_t now_ns, ql__sched_batch *b) {
  device *dv = &s->dev[q->slot->device];
  uint32_t room =
      q->cls == PRE ? prefill_rows(s, q, now_ns) : batch_cap(s, q->cls);
  /* A hold that ran its time out without its rows makes the next ones
   * skip: the clients it waited for went elsewhere. One that ended
   * otherwise (a deadline, a new curve) says nothing either way. */
  if (q->hold_rows != 0) {
    uint64_t release = hold_due(s, q);
    if (release != 0 && now_ns >= release) {
      if (q->hold_misses < QL_SCHED_HOLD_MAX_MISSES)
        q->hold_misses++;
      q->hold_skip = 1u << q->hold_misses;
    } else if (q->rows >= decode_rows(s, q->hold_rows)) {
      q->hold_misses = 0;
    }
    q->hold_rows = 0;
    q->hold_from = 0;
  }
  /* Several tenants waiting: the oldest request of each (whole, the
   * head's rows as they fit) goes first, so that one user's many requests
   * do not make another's wait for several launches. One tenant: the head
   * only, as below. */
  uint64_t seen[FAIR_TENANTS];
  unsigned nseen = 0, scanned = 0;
  for (ql__sched_req *prev = NULL, *r = q->head;
       r != NULL && room > 0 && b->n < b->cap && nseen < FAIR_TENANTS &&
       scanned < FAIR_SCAN;
       scanned++) {
    ql__sched_req *next = r->next;
    unsigned i = 0;
    while (i < nseen && seen[i] != r->tenant)
      i++;
    uint32_t left = r->rows - r->dispatched;
    if (i < nseen || (r != q->head && left > room)) {
      prev = r;
      r = next;
      continue;
    }
    seen[nseen++] = r->tenant;
    if (take_rows(s, q, prev, r, left < room ? left : room, now_ns, b,
                  &room))
      prev = r; /* still queued (the head, cut) */
    r = next;
  }
  while (q->head != NULL && room > 0 && b->n < b->cap) {
    ql__sched_req *r = q->head;
    uint32_t left = r->rows - r->dispatched;
    (void)take_rows(s, q, NULL, r, left < room ? left : room, now_ns, b,
                    &room);
  }
  if (q->n == 0)
    deactivate(dv, q);
  b->weight = q->slot->weight;
  b->cls = index_class(q->cls);
  b->queue = q;
  b->cost = (uint64_t)b->rows * q->ns_per_row;
  dv->running_cost += b->cost;
  dv->running[q->cls]++;
  q->running++;
}

int ql__sched_next(ql__sched *s, unsigned device, uint64_t now_ns,
                   ql__sched_batch *b) {
  b->n = 0;
  b->rows = 0;
  b->weight = NULL;
  b->cls = 0;
  b->device = device;
  b->retry_ns = 0;
  b->expired = NULL;
  b->queue = NULL;
  b->cost = 0;
  if (device >= s->cfg.n_devices || b->slice == NULL || b->cap == 0)
    return QL_EINVAL;

  list expired;
  list_init(&expired);
  expire_device(s, device, now_ns, &expired);
  b->expired = expired.head;

  /* Decode first; oldest head first within a class; held queues only
   * tell when to come back. A decode queue held for its rows to come back
   * keeps prefill off the device meanwhile: decode goes first, and the
   * hold lasts less than the launch it saves. */
  queue *best = NULL;
  uint64_t retry = 0;
  int decode_held = 0;
  const struct device *dv = &s->dev[device];
  unsigned lanes = s->cfg.lanes[device];
  for (int c = 0; c < (b->decode_only ? PRE : NCLASS) && best == NULL; c++) {
    /* A device of several lanes keeps one free for decode while decode
     * work is about: prefill waits for a running prefill to end rather
     * than take it. */
    if (c == PRE && ((lanes > 1 && s->cfg.prefill_chunk_us != 0 &&
                     dv->running[PRE] + 1 >= lanes &&
                     decode_active(dv, now_ns)) ||
                    (decode_held &&
                     dv->running[DEC] + dv->running[PRE] + 1 >= lanes)))
      break;
    for (queue *q = dv->active[c]; q != NULL; q = q->act_next) {
      /* The later of the two holds. A stopped prefill gives way to decode
       * work as yield_ns said: the decode hold does not apply then (the
       * rows gathered while it ran). */
      uint64_t hold = b->decode_only ? 0 : hold_due(s, q);
      uint64_t due = delay_due(s, q);
      if (hold > due)
        due = hold;
      if (due > now_ns) {
        if (retry == 0 || due < retry)
          retry = due;
        if (hold > now_ns)
          decode_held = 1;
      } else if (best == NULL || q->head->seq < best->head->seq) {
        best = q;
      }
    }
  }
  if (best == NULL) {
    b->retry_ns = retry;
    return 0;
  }
  fill(s, best, now_ns, b);
  return 0;
}

uint64_t ql__sched_yield_ns(const ql__sched *s, unsigned device,
                            uint64_t now_ns) {
  if (device >= s->cfg.n_devices || !s->cfg.stops[device] ||
      s->cfg.prefill_chunk_us == 0)
    return 0;
  /* The due decode queue that next() would take: oldest head first. The
   * decode hold does not count here: while a launch runs, the rows it
   * waits for gather anyway. */
  const queue *best = NULL;
  for (const queue *q = s->dev[device].active[DEC]; q != NULL;
       q = q->act_next)
    if (delay_due(s, q) <= now_ns &&
        (best == NULL || q->head->seq < best->head->seq))
      best = q;
  if (best == NULL)
    return 0;
  /* Half the decode launch: with the piece running when asked and the
   * hand-over, its wait stays below its own time. */
  uint32_t cap = batch_cap(s, DEC);
  uint64_t est =
      launch_ns(best, best->rows < cap ? (uint32_t)best->rows : cap) / 2;
  uint64_t budget = s->cfg.prefill_chunk_us * 1000u;
  return est < 1 ? 1 : est < budget ? est : budget;
}

uint64_t ql__sched_decode_due_ns(const ql__sched *s, unsigned device,
                                 uint64_t now_ns) {
  if (device >= s->cfg.n_devices || !s->cfg.stops[device] ||
      s->cfg.prefill_chunk_us == 0)
    return 0;
  uint64_t first = 0;
  for (const queue *q = s->dev[device].active[DEC]; q != NULL;
       q = q->act_next) {
    uint64_t due = delay_due(s, q);
    if (due > now_ns && (first == 0 || due < first))
      first = due;
  }
  return first;
}

int ql__sched_decode_active(const ql__sched *s, unsigned device,
                            uint64_t now_ns) {
  return device < s->cfg.n_devices && decode_active(&s->dev[device], now_ns);
}

/* ------------------------------------------------------------- complete */

void ql__sched_complete(ql__sched *s, ql__sched_batch *b, uint64_t kernel_ns,
                        ql__sched_req **finished) {
  list done;
  list_init(&done);
  queue *q = b->queue;
  if (q != NULL) {
    device *dv = &s->dev[q->slot->device];
    ql__sched_stats *st = &q->slot->stats;
    assert(q->running > 0 && dv->running_cost >= b->cost);
    dv->running_cost -= b->cost;
    assert(dv->running[q->cls] > 0);
    dv->running[q->cls]--;
    q->running--;
    st->batches++;
    if (q->cls == PRE)
      st->prefill_batches++;
    else
      st->decode_batches++;
    st->rows += b->rows;
    if (kernel_ns != 0) {
      st->kernel_ns += kernel_ns;
      st->kernel_hist[ql__sched_hist_bucket(kernel_ns)]++;
      uint64_t meas = clamp_rate(kernel_ns / b->rows);
      q->ns_per_row =
          q->measured ? clamp_rate((3 * q->ns_per_row + meas) / 4) : meas;
      q->measured = 1;
      curve_learn(q, b->rows, kernel_ns);
    }
    uint64_t back = 0; /* rows of the requests answered now */
    for (uint32_t i = 0; i < b->n; i++) {
      ql__sched_req *r = b->slice[i].req;
      r->done += b->slice[i].rows;
      assert(r->done <= r->dispatched);
      if (is_finished(r)) {
        session_release(s, r->session);
        if (r->status == 0) {
          st->requests++;
          /* A session with a request still in the scheduler (its reply
           * can leave before this runs, and its next request come) is not
           * waited for. */
          if (map_find(&s->sessions, r->session) == MAP_NONE)
            back += r->rows;
        }
        list_push(&done, r);
      }
    }
    /* Their clients' next rows may be worth waiting for (decode_hold_us):
     * the rows waiting now and those answered. Another batch of the queue
     * completing while a hold waits adds its rows to it. */
    if (q->cls == DEC && s->hold_ns != 0 && back != 0 && b->end_ns != 0) {
      if (q->hold_rows != 0 && q->rows < decode_rows(s, q->hold_rows) &&
          (q->hold_from == 0 ||
           b->end_ns < sat_add(q->hold_from, s->hold_ns))) {
        /* A hold still waiting (another lane's batch set it): it waits
         * for these rows too. */
        q->hold_rows = decode_rows(s, (uint64_t)q->hold_rows + back);
        if (q->hold_from == 0)
          q->hold_set = b->end_ns;
      } else if (q->hold_skip > 0) {
        q->hold_skip--;
        q->hold_rows = 0;
        q->hold_from = 0;
      } else {
        q->hold_rows = decode_rows(s, q->rows + back);
        q->hold_set = b->end_ns;
        q->hold_from = q->rows != 0 ? b->end_ns : 0;
      }
    }
    b->end_ns = 0; /* a batch used again says its own */
    b->queue = NULL;
  }
  *finished = done.head;
}

/* --------------------------------------------------------------- remove */

void ql__sched_expire(ql__sched *s, uint64_t now_ns, ql__sched_req **out) {
  list l;
  list_init(&l);
  for (unsigned d = 0; d < s->cfg.n_devices; d++)
    expire_device(s, d, now_ns, &l);
  *out = l.head;
}

/* Removes the waiting requests of session, or all when all is set. */
static void remove_where(ql__sched *s, int all, uint64_t session, int code,
                         ql__sched_req **out) {
  list l;
  list_init(&l);
  /* A cut request is known to be finished by its non-zero status. */
  assert(code < 0);
  if (code >= 0)
    code = QL_EINTERNAL;
  for (unsigned d = 0; d < s->cfg.n_devices; d++) {
    for (int c = 0; c < NCLASS; c++) {
      queue *q = s->dev[d].active[c];
      while (q != NULL) {
        queue *qnext = q->act_next; /* q may leave the list */
        ql__sched_req *prev = NULL, *r = q->head;
        while (r != NULL) {
          ql__sched_req *next = r->next;
          if (all || r->session == session)
            unqueue(s, q, prev, r, code, &l);
          else
            prev = r;
          r = next;
        }
        q = qnext;
      }
    }
  }
  *out = l.head;
}

void ql__sched_remove_session(ql__sched *s, uint64_t session, int code,
                              ql__sched_req **out) {
  remove_where(s, 0, session, code, out);
}

void ql__sched_remove_all(ql__sched *s, int code, ql__sched_req **out) {
  remove_where(s, 1, 0, code, out);
}

/* ---------------------------------------------------------------- other */

void ql__sched_forget(ql__sched *s, const void *weight) {
  for (unsigned d = 0; d < s->cfg.n_devices; d++) {
    map *m = &s->dev[d].slots;
    size_t i = map_find(m, (uint64_t)(uintptr_t)weight);
    if (i == MAP_NONE)
      continue;
    slot *sl = (slot *)(uintptr_t)m->val[i];
    for (int c = 0; c < NCLASS; c++)
      assert(sl->q[c].n == 0 && sl->q[c].running == 0);
    map_delete(m, i);
    free(sl);
  }
}

int ql__sched_set_cost(ql__sched *s, const void *weight, unsigned device,
                       ql__sched_class cls, uint64_t ns_per_row) {
  if (weight == NULL || device >= s->cfg.n_devices ||
      (cls != QL_SCHED_DECODE && cls != QL_SCHED_PREFILL))
    return QL_EINVAL;
  slot *sl = slot_get(s, device, weight);
  if (sl == NULL)
    return QL_ENOMEM;
  queue *q = &sl->q[class_index(cls)];
  q->ns_per_row = clamp_rate(ns_per_row);
  q->measured = 1;
  return 0;
}

int ql__sched_set_curve(ql__sched *s, const void *weight, unsigned device,
                        const uint32_t *rows, const uint64_t *ns, size_t n) {
  if (weight == NULL || device >= s->cfg.n_devices || (n > 0 && (rows == NULL ||
      ns == NULL)))
    return QL_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (rows[i] == 0 || ns[i] == 0)
      return QL_EINVAL;
  slot *sl = slot_get(s, device, weight);
  if (sl == NULL)
    return QL_ENOMEM;
  for (int c = 0; c < NCLASS; c++) {
    queue *q = &sl->q[c];
    memset(q->curve, 0, sizeof q->curve);
    for (size_t i = 0; i < n; i++) {
      unsigned b = curve_point(rows[i]);
      q->curve[b].rows = rows[i];
      q->curve[b].ns = ns[i] > QL_SCHED_MAX_LAUNCH_NS ? QL_SCHED_MAX_LAUNCH_NS
                                                      : ns[i];
    }
  }
  return 0;
}

uint64_t ql__sched_launch_ns(const ql__sched *s, const void *weight,
                             unsigned device, ql__sched_class cls,
                             uint32_t rows) {
  const slot *sl =
      device < s->cfg.n_devices ? slot_find(s, device, weight) : NULL;
  if (sl == NULL || rows == 0 ||
      (cls != QL_SCHED_DECODE && cls != QL_SCHED_PREFILL))
    return 0;
  return launch_ns(&sl->q[class_index(cls)], rows);
}

int ql__sched_stats_get(const ql__sched *s, const void *weight, unsigned device,
                        ql__sched_stats *out) {
  const slot *sl =
      device < s->cfg.n_devices ? slot_find(s, device, weight) : NULL;
  if (sl == NULL)
    return QL_ENOTFOUND;
  *out = sl->stats;
  return 0;
}

size_t ql__sched_waiting(const ql__sched *s, const void *weight,
                         unsigned device, ql__sched_class cls) {
  const slot *sl =
      device < s->cfg.n_devices ? slot_find(s, device, weight) : NULL;
  if (sl == NULL || (cls != QL_SCHED_DECODE && cls != QL_SCHED_PREFILL))
    return 0;
  return sl->q[class_index(cls)].n;
}

size_t ql__sched_session_count(const ql__sched *s, uint64_t session) {
  size_t i = map_find(&s->sessions, session);
  return i == MAP_NONE ? 0 : (size_t)s->sessions.val[i];
}

uint64_t ql__sched_device_load(const ql__sched *s, unsigned device) {
  if (device >= s->cfg.n_devices)
    return 0;
  return s->dev[device].queued_cost + s->dev[device].running_cost;
}
