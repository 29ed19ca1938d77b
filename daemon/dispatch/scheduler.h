/*
 * scheduler.h - the policy that turns waiting Linear requests into kernel
 * launches (DESIGN §6): one queue per (weight, device, class), coalescing,
 * decode before prefill, prefill in chunks sized by time while decode
 * work is about, oldest-first fairness,
 * backpressure, deadlines and per-(weight, device) counters.
 *
 * The scheduler is policy only. It starts no thread, reads no clock (every
 * call that needs the time takes now_ns, on any monotonic clock the caller
 * likes, in nanoseconds) and knows nothing of libuv, messages or kernels,
 * so the same calls give the same answers in a unit test and in qlineard.
 * It is not thread-safe: the daemon calls it from the loop thread only.
 * Costs: a submit looks at each candidate device once, a next at each
 * queue of the device with work waiting (and at the requests of a queue
 * only when one of its deadlines may be due), a removal at every waiting
 * request.
 *
 * How the daemon uses it:
 *
 *   submit   the caller embeds a ql__sched_req in its job, fills the "in"
 *            fields (the class: DECODE or PREFILL; its kernel path is
 *            the caller's, in the weight key)
 *            and calls ql__sched_submit(). Nothing is allocated per
 *            request; the request links into its queue through itself.
 *   next     when a worker of device d is free it calls ql__sched_next(),
 *            which returns a batch: one weight, one class, and a list of
 *            slices (request, first row, row count) to run as one launch.
 *            Batch row i is row i of the slices laid end to end, so the
 *            caller gathers x rows in slice order and scatters y the same
 *            way. Requests whose deadline passed come back on the side.
 *   complete when the launch is done, ql__sched_complete() records it and
 *            returns the requests whose rows are now all computed.
 *   remove   at the end of a session, or at shutdown, the waiting requests
 *            come back to be answered with an error.
 *
 * Every request handed back to the caller (by complete, next's expired
 * list, expire or remove) comes back exactly once, with req->status saying
 * how to answer it, and the scheduler never touches it again: it is then
 * the caller's to free. Lists handed back are linked through req->next, in
 * a deterministic order; read next before freeing an element.
 *
 * Cost model (for choosing a device): each queue keeps an estimate of its
 * kernel time per row, ns_per_row, seeded by the config's default or by
 * ql__sched_set_cost() and then moved a quarter of the way towards each
 * measured launch (kernel_ns / rows). A device's estimated completion for a
 * new request is the estimated time of everything queued or running on it
 * plus the request's own rows at its queue's rate. This ignores the fixed
 * part of a launch and overlap between a device's workers; it only has to
 * rank devices, not predict latencies.
 *
 * On a device whose launches can stop and go on (cfg.stops: the CPU),
 * prefill is never cut into row chunks: it runs whole, and the caller
 * stops it at a piece boundary when decode work arrives
 * (ql__sched_yield_ns), runs the decode batches (ql__sched_batch.
 * decode_only) and then goes on with it. The rows stay dispatched
 * meanwhile: for the scheduler the launch is still running.
 *
 * Launch-time model (for sizing prefill chunks): each queue also keeps a
 * curve of launch time against rows, one point per power of two of rows,
 * seeded by ql__sched_set_curve() (the daemon's crossover calibration
 * times both paths at M = 1, 2, 4 ... 512) and moved by every measured
 * launch. A launch costs a fixed part (a read of the weight) plus a part
 * per row, so on a GPU 512 rows may cost little more than 32: the chunk is
 * the most rows that fit the time budget, not a fixed row count.
 */
#ifndef QL_SCHEDULER_H
#define QL_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "ql_defs.h"

/* Devices one scheduler serves (device masks are 64-bit). */
#define QL_SCHED_MAX_DEVICES 64
/* Histogram buckets: 0 holds [0, 1024) ns, bucket b > 0 holds
 * [2^(b+9), 2^(b+10)) ns, and the last one everything above. */
#define QL_SCHED_HIST_BUCKETS 32
/* Estimated kernel time per row before anything is known. */
#define QL_SCHED_DEFAULT_NS_PER_ROW 100000u
/* Estimates and measurements are clamped to this (about 16.8 ms a row), so
 * the sums of estimates cannot wrap in practice. */
#define QL_SCHED_MAX_NS_PER_ROW ((uint64_t)1 << 24)
/* The longest max_queue_delay_us and decode_hold_us accepted: one second. */
#define QL_SCHED_MAX_DELAY_US 1000000u
/* A decode hold that runs out makes the queue skip 2^misses holds, misses
 * counting those in a row up to this (64 skipped). */
#define QL_SCHED_HOLD_MAX_MISSES 6
/* The largest prefill_chunk_us accepted: ten seconds. */
#define QL_SCHED_MAX_CHUNK_US 10000000u
/* Points of a queue's launch-time curve: rows 1, 2, 4 ... 2^13 and more. */
#define QL_SCHED_CURVE_POINTS 14
/* Launch times are clamped to this (about 18 minutes). */
#define QL_SCHED_MAX_LAUNCH_NS ((uint64_t)1 << 40)
/* Decode work submitted within this long counts as still about: prefill
 * launches stay short in the gaps of a stream of decode requests. */
#define QL_SCHED_DECODE_WINDOW_NS ((uint64_t)50000000u)

typedef struct ql__sched ql__sched;
struct ql__sched_queue; /* private */

typedef struct ql__sched_config {
  uint32_t max_batch_rows; /* rows in one launch, >= 1 */
  /* A queue with fewer than a full batch of rows waits until its oldest
   * request has waited this long, so that later requests can join the
   * launch (never past a waiting request's deadline); 0 (the default)
   * never holds work back. */
  uint64_t max_queue_delay_us;
  /* After a decode launch completes, its clients usually send their next
   * rows at once: the queue's next launch may wait for as many rows as
   * were queued then plus those the launch answered, while the queue's
   * launch times (its curve) say that one launch of them all saves more
   * than the wait costs (the launch of r rows plus that of the e others
   * against one of r + e), and at most this long. A hold that runs out
   * (the rows did not come back: the clients went on to another weight,
   * or fewer of them remain) makes the queue's next holds skip, doubling,
   * up to 64 completions. 0 = never hold. */
  uint64_t decode_hold_us;
  /* The most rows of one ACT_QUANT (prefill) launch, always; 0 =
   * max_batch_rows. */
  uint32_t prefill_chunk_rows;
  /* While decode work is about (waiting, running, or submitted within
   * QL_SCHED_DECODE_WINDOW_NS) on a device of one lane, a prefill launch
   * takes the most rows whose estimated launch time (the queue's curve)
   * fits this budget, at least one, so that decode work waits at most
   * about this long; a device of several lanes keeps one lane free for
   * decode instead. Otherwise prefill runs whole (up to the row caps).
   * 0 = prefill is never cut by time, and takes any free lane. */
  uint64_t prefill_chunk_us;
  size_t max_queue; /* waiting requests per queue, >= 1 */
  /* Requests of one session in the scheduler at once (submitted and not
   * yet handed back); 0 = no quota. */
  size_t session_quota;
  unsigned n_devices; /* 1 .. QL_SCHED_MAX_DEVICES */
  /* Batches device d runs at once (its worker's lanes); 0 counts as 1.
   * Its backlog of queued and running work is divided by this when
   * estimating a new request's completion. */
  unsigned lanes[QL_SCHED_MAX_DEVICES];
  /* Non-zero when device d's prefill launches can stop at a piece
   * boundary and go on later (ql_backend.linear_parts): there prefill
   * runs whole, and the caller stops a running one for decode work when
   * ql__sched_yield_ns() says, instead of the scheduler cutting it into
   * row chunks that each read the whole weight again. */
  unsigned char stops[QL_SCHED_MAX_DEVICES];
  /* Estimated kernel time per row of a queue that has no measurement;
   * 0 = QL_SCHED_DEFAULT_NS_PER_ROW. */
  uint64_t default_ns_per_row;
} ql__sched_config;

/*
 * A Linear request as the scheduler sees it. The caller embeds it in its
 * own job (no allocation per request) and keeps it alive, unmoved, from a
 * successful submit until it is handed back; it is submitted again only
 * after that. A request's M must fit in rows (the message cap makes it far
 * smaller).
 */
typedef struct ql__sched_req ql__sched_req;

/* The two classes of work the scheduler keeps apart (DESIGN §6): decode,
 * few rows and latency first, and prefill, many rows. A queue is one
 * (weight, device, class); which kernel path a request takes is the
 * caller's concern, carried in its weight key. (0 is no class.) */
typedef enum ql__sched_class {
  QL_SCHED_DECODE = 1,
  QL_SCHED_PREFILL = 2,
} ql__sched_class;
struct ql__sched_req {
  /* In: set by the caller before ql__sched_submit(), unchanged after. */
  const void *weight;   /* opaque key: only the same key coalesces */
  int device;           /* run on this device, or -1: the best of holders */
  uint64_t holders;     /* with device -1: bit d set if device d holds the
                           weight; ignored otherwise */
  ql__sched_class cls;  /* decode or prefill (the caller's kernel path
                           is its own, in weight) */
  uint32_t rows;        /* M, >= 1 */
  uint64_t session;     /* for the quota and ql__sched_remove_session() */
  uint64_t tenant;      /* who asked (the daemon: its uid + 1; 0: nobody
                           in particular): a launch takes the oldest
                           request of each tenant waiting before more of
                           any one's (fill() in scheduler.c) */
  uint64_t deadline_ns; /* answer DEADLINE_EXCEEDED rather than start the
                           request at or after this time; 0 = none */

  /* Out: set by the scheduler, read-only to the caller. */
  unsigned on_device;  /* the device whose queue it joined */
  int status;          /* when handed back: 0 when every row was
                          computed, else the QL_E* code to answer */
  uint64_t enqueue_ns; /* now_ns of the submit */
  ql__sched_req *next; /* the next request in a list handed back */

  /* Private. */
  uint64_t seq;        /* submit order, for FIFO and oldest-first */
  uint64_t charge;     /* estimated ns per row when queued */
  uint32_t dispatched; /* rows handed out in batches */
  uint32_t done;       /* rows completed */
};

/* Rows [offset, offset + rows) of req, in one launch. */
typedef struct ql__sched_slice {
  ql__sched_req *req;
  uint32_t offset;
  uint32_t rows;
} ql__sched_slice;

/*
 * One launch. The caller provides the slice array and keeps the batch
 * until ql__sched_complete(); a batch may be reused after that.
 */
typedef struct ql__sched_batch {
  /* In: set by the caller before ql__sched_next(). */
  ql__sched_slice *slice; /* room for cap slices (cap >= max_batch_rows
                             never limits a batch) */
  uint32_t cap;
  int decode_only; /* take decode (QL_SCHED_DECODE) work only: the
                      caller has a stopped prefill launch to go on with */
  /* Set before ql__sched_complete() (which zeroes it): when the launch
   * ended, on the clock of now_ns; a decode hold (decode_hold_us) counts
   * from it. 0 = not known: no hold follows the launch. */
  uint64_t end_ns;

  /* Out: set by ql__sched_next(). */
  uint32_t n;         /* slices; 0 = nothing to run now */
  uint32_t rows;      /* their rows, <= max_batch_rows */
  const void *weight; /* every slice's weight, class and device */
  ql__sched_class cls;
  unsigned device;
  /* With n == 0: the time at which a queue held by max_queue_delay_us
   * or decode_hold_us becomes due, so call again then (or when a request
   * arrives); 0 when the device has nothing waiting. */
  uint64_t retry_ns;
  /* Requests that reached their deadline before any of their rows ran:
   * handed back with status QL_EDEADLINE, whatever n is. */
  ql__sched_req *expired;

  /* Private. */
  struct ql__sched_queue *queue; /* NULL once completed */
  uint64_t cost;                 /* estimated ns, counted as running */
} ql__sched_batch;

/* Counters of one (weight, device), kept until ql__sched_forget(). */
typedef struct ql__sched_stats {
  uint64_t requests;   /* requests whose rows were all computed */
  uint64_t rows;       /* rows computed */
  uint64_t batches;    /* launches */
  uint64_t decode_batches;  /* launches of decode work */
  uint64_t prefill_batches; /* launches of prefill work */
  uint64_t expired;    /* requests handed back with QL_EDEADLINE */
  uint64_t queue_ns;   /* sum of waits from submit to the first launch */
  uint64_t kernel_ns;  /* sum of measured launch times */
  uint64_t queue_hist[QL_SCHED_HIST_BUCKETS];  /* one entry per request */
  uint64_t kernel_hist[QL_SCHED_HIST_BUCKETS]; /* one per measured launch */
} ql__sched_stats;

/*
 * Makes a scheduler for cfg (copied). Returns 0 and sets *out, the
 * caller's until ql__sched_free(); QL_EINVAL for a config out of range;
 * QL_ENOMEM. On failure *out is NULL.
 */
int ql__sched_create(const ql__sched_config *cfg, ql__sched **out);

/*
 * Frees s and its counters. Requests still inside are not touched (they
 * are the caller's memory); call ql__sched_remove_all() first to get them
 * back. Safe on NULL.
 */
void ql__sched_free(ql__sched *s);

/*
 * Applies a new config (SIGHUP). n_devices cannot change (QL_EINVAL);
 * queued requests stay even where a queue is now over its bound.
 */
int ql__sched_configure(ql__sched *s, const ql__sched_config *cfg);

/*
 * Queues req at now_ns. Returns 0, after which the scheduler holds req
 * until it hands it back; or, with nothing changed and req still wholly
 * the caller's:
 *   QL_EINVAL     a field out of range (no weight, no rows, a class other
 *                 than DECODE/PREFILL, no such device)
 *   QL_ENOTFOUND  device -1 and no device in holders
 *   QL_EDEADLINE  deadline_ns is already due (<= now_ns)
 *   QL_EEXHAUSTED the session's quota is used up, or the queue of
 *                 (weight, device, class) is full; with device -1, full on
 *                 every holder
 *   QL_ENOMEM
 * With device -1 the request joins, among the holders whose queue has
 * room, the one with the earliest estimated completion (lowest index on a
 * tie).
 */
int ql__sched_submit(ql__sched *s, ql__sched_req *req, uint64_t now_ns);

/*
 * Chooses the next launch for a free worker of device at now_ns and fills
 * b (see ql__sched_batch). First, requests of this device whose deadline
 * is due and none of whose rows has started are moved to b->expired. Then,
 * among the queues that are due (see max_queue_delay_us and
 * decode_hold_us), WEIGHT_ONLY queues go before ACT_QUANT ones (none of
 * these while a WEIGHT_ONLY queue waits for its decode hold) and, within
 * a class, the queue whose oldest request is oldest goes first. Its
 * requests are taken in FIFO order up to max_batch_rows (for ACT_QUANT
 * also prefill_chunk_rows and, while decode work is about,
 * prefill_chunk_us) and b->cap slices; a request that does not fit is
 * split, its remaining rows staying at the head of its queue. On a
 * device of several lanes, while decode work is about, no ACT_QUANT batch
 * starts that would leave no lane free.
 * Returns 0, or QL_EINVAL (no such device, no slice room) with b->n 0.
 */
int ql__sched_next(ql__sched *s, unsigned device, uint64_t now_ns,
                   ql__sched_batch *b);

/*
 * On a device whose prefill launches stop (cfg.stops), how long the
 * running prefill launch may go on, from the start of its current call,
 * before it stops for the decode work due on device at now_ns (the queue
 * next() would take): half the estimated time of that decode launch (its
 * queue's curve), at most prefill_chunk_us. With the piece running when
 * it is asked and the hand-over, a decode request then waits behind
 * prefill less than its own launch takes (its latency stays within about
 * twice its time alone), and prefill goes on between decode launches
 * without reading the weight again for them. 0 when no decode work is
 * due there, on a device that does not stop, or when prefill_chunk_us is
 * 0 (prefill is never stopped).
 */
uint64_t ql__sched_yield_ns(const ql__sched *s, unsigned device,
                            uint64_t now_ns);

/*
 * When decode work waiting on device (as ql__sched_yield_ns() counts it)
 * that max_queue_delay_us holds back becomes due: the earliest such time
 * after now_ns, or 0 for none. With every lane busy nothing else asks the
 * scheduler again before a launch ends: the caller sets a timer for it.
 */
uint64_t ql__sched_decode_due_ns(const ql__sched *s, unsigned device,
                                 uint64_t now_ns);

/* Whether decode work is about on device at now_ns: waiting, running, or
 * submitted within QL_SCHED_DECODE_WINDOW_NS (a stream of decode requests
 * leaves gaps between them). */
int ql__sched_decode_active(const ql__sched *s, unsigned device,
                            uint64_t now_ns);

/*
 * Records that b's launch ran, taking kernel_ns (measured by the caller;
 * 0 = not measured: no kernel time is recorded and the cost estimate
 * stays), and sets *finished to the requests whose rows are now all done,
 * or whose remaining rows were removed while these ran; they are handed
 * back. b->slice stays readable. Completing a batch twice, or one with
 * n == 0, does nothing.
 */
void ql__sched_complete(ql__sched *s, ql__sched_batch *b, uint64_t kernel_ns,
                        ql__sched_req **finished);

/*
 * Moves the waiting requests of every device whose deadline is due and
 * none of whose rows has started to *out, with status QL_EDEADLINE: for a
 * timer, so they are answered even while every worker is busy.
 */
void ql__sched_expire(ql__sched *s, uint64_t now_ns, ql__sched_req **out);

/*
 * Takes the waiting requests of session (or all, for shutdown) out of the
 * queues, with status code (a QL_E* code, < 0). Those with no rows running
 * are set in *out. One with rows running (a prefill between chunks) loses
 * its remaining rows and comes back from the ql__sched_complete() that
 * finishes its last running rows, with the same status. Requests whose
 * rows are all dispatched are not waiting and are not affected.
 */
void ql__sched_remove_session(ql__sched *s, uint64_t session, int code,
                              ql__sched_req **out);
void ql__sched_remove_all(ql__sched *s, int code, ql__sched_req **out);

/*
 * Forgets weight: its queues and counters on every device. The weight must
 * have no request in the scheduler (the daemon's queued jobs hold a
 * reference to their weight, so this holds when its last one goes).
 */
void ql__sched_forget(ql__sched *s, const void *weight);

/*
 * Sets the estimated kernel time per row of (weight, device, class), e.g.
 * from the crossover calibration (clamped to 1 .. QL_SCHED_MAX_NS_PER_ROW).
 * Returns 0, QL_EINVAL or QL_ENOMEM.
 */
int ql__sched_set_cost(ql__sched *s, const void *weight, unsigned device,
                       ql__sched_class cls, uint64_t ns_per_row);

/*
 * Sets the launch-time curve of weight's queues on device (both classes:
 * the time is the kernel's, whatever the class): n points of rows[i] rows
 * taking ns[i] ns, replacing the curve (a point per power of two of rows:
 * of several in one, the last counts; times clamped to
 * QL_SCHED_MAX_LAUNCH_NS). Launches measured later move it. Returns 0,
 * QL_EINVAL (a zero row count or time, no such device) or QL_ENOMEM.
 */
int ql__sched_set_curve(ql__sched *s, const void *weight, unsigned device,
                        const uint32_t *rows, const uint64_t *ns, size_t n);

/* The estimated time in ns of a launch of rows rows from the queue of
 * (weight, device, class) (the curve, or rows x ns_per_row without one);
 * 0 when that queue has never been seen. */
uint64_t ql__sched_launch_ns(const ql__sched *s, const void *weight,
                             unsigned device, ql__sched_class cls,
                             uint32_t rows);

/* Copies the counters of (weight, device) to *out; QL_ENOTFOUND when it
 * has never had a request or a cost (or was forgotten). */
int ql__sched_stats_get(const ql__sched *s, const void *weight, unsigned device,
                        ql__sched_stats *out);

/* Requests waiting in the queue of (weight, device, class), counting one
 * whose rows have partly started. */
size_t ql__sched_waiting(const ql__sched *s, const void *weight,
                         unsigned device, ql__sched_class cls);

/* The session's requests in the scheduler (what its quota counts). */
size_t ql__sched_session_count(const ql__sched *s, uint64_t session);

/* Estimated ns of the work queued on device and running on it. */
uint64_t ql__sched_device_load(const ql__sched *s, unsigned device);

/* The histogram bucket of a time, and the lowest time of a bucket. */
unsigned ql__sched_hist_bucket(uint64_t ns);
uint64_t ql__sched_hist_lower_ns(unsigned bucket);

#endif /* QL_SCHEDULER_H */
