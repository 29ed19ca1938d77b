/* upload.c - see upload.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "heap.h"
#include "state/upload.h"

/* Uploads in progress at once: each costs a lookup on every chunk. */
#define MAX_UPLOADS 1024

struct ql__uploads {
  ql__upload *head;
  size_t count;
  size_t bytes;     /* sum of costs */
  size_t max_bytes;
  unsigned share_pct; /* of max_bytes and MAX_UPLOADS, per uid */
};

/* What an upload counts against the budget: its data and its record. */
static size_t cost_of(const ql__upload *up) {
  return up->total + sizeof *up;
}

int ql__uploads_create(size_t max_bytes, ql__uploads **out) {
  ql__uploads *u = calloc(1, sizeof *u);
  if (u == NULL)
    return QL_ENOMEM;
  u->max_bytes = max_bytes;
  u->share_pct = 100;
  *out = u;
  return 0;
}

static void upload_free(ql__upload *up) {
  if (up == NULL)
    return;
  free(up->data);
  free(up);
}

/* Unlinks *pp from u and frees it; returns the bytes its data held. */
static size_t unlink_free(ql__uploads *u, ql__upload **pp) {
  ql__upload *up = *pp;
  size_t bytes = up->total;
  *pp = up->next;
  u->count--;
  u->bytes -= cost_of(up);
  upload_free(up);
  return bytes;
}

/* Removes every upload but those committing for which keep() is 0;
 * returns how many, and gives the heap back once for all of them. */
static size_t remove_unless(ql__uploads *u,
                            int (*keep)(const ql__upload *, const void *),
                            const void *arg) {
  size_t n = 0, bytes = 0;
  ql__upload **pp = &u->head;
  while (*pp) {
    if (!(*pp)->committing && !keep(*pp, arg)) {
      bytes += unlink_free(u, pp);
      n++;
    } else {
      pp = &(*pp)->next;
    }
  }
  ql__heap_release(bytes);
  return n;
}

void ql__uploads_free(ql__uploads *u) {
  if (u == NULL)
    return;
  while (u->head) {
    ql__upload *next = u->head->next;
    upload_free(u->head);
    u->head = next;
  }
  free(u);
}

int ql__uploads_begin(ql__uploads *u, const ql__upload *tmpl,
                      ql__upload **out) {
  *out = NULL;
  if (tmpl->total == 0)
    return QL_EINVAL;
  if (u->count >= MAX_UPLOADS || tmpl->total > SIZE_MAX - sizeof *tmpl ||
      u->bytes > u->max_bytes || /* the budget shrank on SIGHUP */
      cost_of(tmpl) > u->max_bytes - u->bytes)
    return QL_EEXHAUSTED;
  /* One user's share, so that a slow upload of one cannot hold the whole
   * budget against the others. */
  if (tmpl->owner != 0 && u->share_pct < 100) {
    size_t b, n;
    ql__uploads_of_uid(u, tmpl->uid, &b, &n);
    size_t share_b = u->max_bytes / 100 * u->share_pct +
                     u->max_bytes % 100 * u->share_pct / 100;
    size_t share_n = MAX_UPLOADS * u->share_pct / 100;
    if (n + 1 > (share_n > 0 ? share_n : 1) || b > share_b ||
        cost_of(tmpl) > share_b - b)
      return QL_EPERM;
  }
  ql__upload *up = malloc(sizeof *up);
  if (up == NULL)
    return QL_ENOMEM;
  *up = *tmpl;
  /* Allocated up front: the budget check above is then the real bound. */
  up->data = malloc(up->total);
  if (up->data == NULL) {
    free(up);
    return QL_ENOMEM;
  }
  /* Random ids: a client cannot guess another's upload and append to or
   * abort it (there is no session to check yet). */
  do {
    if (getrandom(&up->id, sizeof up->id, 0) != sizeof up->id) {
      free(up->data);
      free(up);
      return QL_EINTERNAL;
    }
  } while (up->id == 0 || ql__uploads_get(u, up->id) != NULL);
  up->received = 0;
  up->committing = 0;
  up->next = u->head;
  u->head = up;
  u->count++;
  u->bytes += cost_of(up);
  *out = up;
  return 0;
}

void ql__uploads_set_share(ql__uploads *u, unsigned pct) {
  u->share_pct = pct < 1 ? 1 : pct > 100 ? 100 : pct;
}

void ql__uploads_of_uid(const ql__uploads *u, uid_t uid, size_t *bytes,
                        size_t *count) {
  *bytes = *count = 0;
  for (const ql__upload *up = u->head; up != NULL; up = up->next)
    if (up->owner != 0 && up->uid == uid) {
      *bytes += cost_of(up);
      (*count)++;
    }
}

void ql__uploads_set_max(ql__uploads *u, size_t max_bytes) {
  u->max_bytes = max_bytes;
}

ql__upload *ql__uploads_get(ql__uploads *u, uint64_t id) {
  for (ql__upload *up = u->head; up; up = up->next)
    if (up->id == id)
      return up;
  return NULL;
}

ql__upload *ql__uploads_get_owned(ql__uploads *u, uint64_t id,
                                  uint64_t owner) {
  ql__upload *up = ql__uploads_get(u, id);
  return up != NULL && up->owner == owner ? up : NULL;
}

size_t ql__uploads_count_owned(const ql__uploads *u, uint64_t owner) {
  size_t n = 0;
  for (const ql__upload *up = u->head; up; up = up->next)
    n += up->owner == owner;
  return n;
}

static int other_owner(const ql__upload *up, const void *owner) {
  return up->owner != *(const uint64_t *)owner;
}

size_t ql__uploads_drop_owner(ql__uploads *u, uint64_t owner) {
  return remove_unless(u, other_owner, &owner);
}

int ql__upload_append(ql__upload *up, uint64_t offset, const void *data,
                      size_t len, uint64_t now_ns) {
  if (up->committing)
    return QL_EINVAL;
  if (offset != up->received)
    return QL_ESEQUENCE;
  if (len > up->total - up->received)
    return QL_ESHAPE;
  memcpy(up->data + up->received, data, len);
  up->received += len;
  up->last_ns = now_ns;
  return 0;
}

void ql__uploads_remove(ql__uploads *u, ql__upload *up) {
  for (ql__upload **pp = &u->head; *pp; pp = &(*pp)->next) {
    if (*pp == up) {
      ql__heap_release(unlink_free(u, pp));
      return;
    }
  }
}

/* The idle deadline of ql__uploads_expire: {now_ns, idle_ns}. */
static int still_active(const ql__upload *up, const void *arg) {
  const uint64_t *t = arg;
  return t[0] - up->last_ns <= t[1];
}

size_t ql__uploads_expire(ql__uploads *u, uint64_t now_ns, uint64_t idle_ns) {
  const uint64_t t[2] = {now_ns, idle_ns};
  return remove_unless(u, still_active, t);
}

size_t ql__uploads_count(const ql__uploads *u) { return u->count; }
