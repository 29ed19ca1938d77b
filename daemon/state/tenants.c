/* tenants.c - see tenants.h. */
#include <stdlib.h>

#include "log.h"
#include "state/tenants.h"
#include "wire/clock.h"

ql__tenant *ql__tenant_get(ql__tenants *t, uid_t uid) {
  for (ql__tenant *tn = t->head; tn != NULL; tn = tn->next)
    if (tn->uid == uid)
      return tn;
  ql__tenant *tn = calloc(1, sizeof *tn);
  if (tn == NULL)
    return NULL;
  tn->uid = uid;
  tn->calib_tokens = QL_TENANT_CALIB_BURST;
  tn->next = t->head;
  t->head = tn;
  return tn;
}

void ql__tenant_session_open(ql__tenants *t, ql__tenant *tn) {
  if (tn->sessions++ == 0)
    t->active++;
}

void ql__tenant_session_end(ql__tenants *t, ql__tenant *tn) {
  if (tn->sessions > 0 && --tn->sessions == 0)
    t->active--;
  ql__tenant_release(t, tn);
}

void ql__tenant_release(ql__tenants *t, ql__tenant *tn) {
  /* A bucket not yet full is kept: a new session would refill it. */
  if (tn->sessions != 0 || tn->queued_jobs != 0 || tn->queued_bytes != 0 ||
      tn->pinned_bytes != 0 || tn->calib_tokens < QL_TENANT_CALIB_BURST)
    return;
  for (ql__tenant **pp = &t->head; *pp != NULL; pp = &(*pp)->next)
    if (*pp == tn) {
      *pp = tn->next;
      free(tn);
      return;
    }
}

size_t ql__tenant_share(size_t budget, unsigned pct) {
  size_t s = budget / 100 * pct + budget % 100 * pct / 100;
  return s > 0 ? s : 1;
}

void ql__tenants_clear(ql__tenants *t) {
  while (t->head != NULL) {
    ql__tenant *next = t->head->next;
    free(t->head);
    t->head = next;
  }
  t->active = 0;
}

void ql__tenant_refused(ql__tenants *t, uid_t uid, const char *what) {
  ql__tenant *tn = ql__tenant_get(t, uid);
  uint64_t now = ql__now_ns();
  if (tn == NULL)
    return;
  tn->refused++;
  if (tn->logged_ns == 0 || now - tn->logged_ns >= 1000000000u) {
    tn->logged_ns = now;
    ql__notice("uid %u reached its share of %s (uid_share); %llu request%s "
               "refused so far", (unsigned)uid, what,
               (unsigned long long)tn->refused, tn->refused == 1 ? "" : "s");
  }
  ql__tenant_release(t, tn);
}

int ql__tenant_calib_take(ql__tenants *t, uid_t uid, uint64_t now_ns) {
  ql__tenant *tn = ql__tenant_get(t, uid);
  if (tn == NULL)
    return 0;
  if (tn->calib_tokens < QL_TENANT_CALIB_BURST) {
    uint64_t n = (now_ns - tn->calib_ns) / QL_TENANT_CALIB_REFILL_NS;
    if (n > 0) {
      tn->calib_tokens = n >= QL_TENANT_CALIB_BURST - tn->calib_tokens
                             ? QL_TENANT_CALIB_BURST
                             : tn->calib_tokens + (uint32_t)n;
      tn->calib_ns += n * QL_TENANT_CALIB_REFILL_NS;
    }
  }
  if (tn->calib_tokens == 0)
    return 0;
  if (tn->calib_tokens-- == QL_TENANT_CALIB_BURST)
    tn->calib_ns = now_ns; /* the refill clock starts at the first */
  return 1;
}
