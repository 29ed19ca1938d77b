/*
 * tenants.h - what each user (uid) of the daemon holds of the budgets all
 * users share, so that one cannot take another's share (docs/security.md,
 * "Several users").
 *
 * A tenant is a uid with open sessions or with something still counted
 * against it. The rule: while sessions of two or more uids are open, no
 * uid's queued requests may take more than uid_share percent of
 * max_queued_bytes or of max_queue (its queued requests on all weights
 * together, so that every queue keeps room for the others). Budgets that a
 * client can hold for long are shared always: uploads in progress (see
 * upload.h) and page-locked region memory (max_pinned_bytes, session.c).
 * Loop thread only.
 */
#ifndef QL_TENANTS_H
#define QL_TENANTS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Crossover measurements one uid's loads may start: this many at once,
 * then one a minute (calibrate.h). */
#define QL_TENANT_CALIB_BURST 8
#define QL_TENANT_CALIB_REFILL_NS ((uint64_t)60000000000u)

typedef struct ql__tenant {
  uid_t uid;
  unsigned sessions;   /* open sessions of this uid */
  size_t queued_bytes; /* inline x and y bytes of its queued requests */
  size_t queued_jobs;  /* its queued requests (fused parts each count) */
  uint64_t pinned_bytes; /* its regions page-locked for devices (counted
                            until each is unregistered, after its last
                            job, which may be after its session ended) */
  uint64_t refused;    /* requests refused for its share (stats) */
  /* Crossover measurements its loads may still start (a token bucket of
   * QL_TENANT_CALIB_BURST, one more every QL_TENANT_CALIB_REFILL_NS), and
   * when it was last refilled. */
  uint32_t calib_tokens;
  uint64_t calib_ns;
  uint64_t logged_ns;  /* when a refusal was last logged (1 a second) */
  struct ql__tenant *next;
} ql__tenant;

typedef struct ql__tenants {
  ql__tenant *head;
  unsigned active; /* tenants with open sessions */
} ql__tenants;

/* The tenant of uid, made if there is none; NULL when out of memory. */
ql__tenant *ql__tenant_get(ql__tenants *t, uid_t uid);

/* A session of the tenant opened / ended. */
void ql__tenant_session_open(ql__tenants *t, ql__tenant *tn);
void ql__tenant_session_end(ql__tenants *t, ql__tenant *tn);

/* Frees tn when nothing is counted against it any more (no session, no
 * queued request). */
void ql__tenant_release(ql__tenants *t, ql__tenant *tn);

/* Counts a refusal of uid's request for its share of what (a budget's
 * name) and logs it, at most once a second per uid, naming the uid. */
void ql__tenant_refused(ql__tenants *t, uid_t uid, const char *what);

/* 1 when a load of uid may start one more crossover measurement now (a
 * token is taken), else 0. */
int ql__tenant_calib_take(ql__tenants *t, uid_t uid, uint64_t now_ns);

/* pct percent of budget, at least 1. */
size_t ql__tenant_share(size_t budget, unsigned pct);

/* Frees every tenant (at exit). Safe on a zeroed table. */
void ql__tenants_clear(ql__tenants *t);

#endif /* QL_TENANTS_H */
