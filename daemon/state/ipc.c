/* ipc.c - see ipc.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state/ipc.h"
#include "log.h"

struct ql__ipc_table {
  ql__ipc_mem *list;
  size_t n;
  uint64_t clock; /* bumped at every use */
};

/* Explicit imports' ids, over every session (loop thread only). */
static uint64_t next_import_id;

/* The kind of memory of m, for logs. */
static const char *kind(const ql__ipc_mem *m) {
  return m->id != 0 ? "Level Zero IPC" : "CUDA IPC";
}

void ql__ipc_ref(ql__ipc_mem *m) { m->refs++; }

void ql__ipc_unref(ql__ipc_mem *m) {
  if (m == NULL || --m->refs > 0)
    return;
  int rc = m->dev->b->ipc_close(m->dev->ordinal, m->base);
  if (rc != 0)
    ql__warn("session %llu: closing a %s allocation on %s: %s",
             (unsigned long long)m->session, kind(m), m->dev->alias,
             ql_strerror(rc));
  else
    ql__info("session %llu: closed a %s allocation of %llu bytes on %s",
             (unsigned long long)m->session, kind(m),
             (unsigned long long)m->size, m->dev->alias);
  if (m->fd >= 0)
    close(m->fd);
  free(m);
}

/* Unlinks m from t and drops the table's reference. */
static void drop(ql__ipc_table *t, ql__ipc_mem *m) {
  for (ql__ipc_mem **pp = &t->list; *pp; pp = &(*pp)->next) {
    if (*pp == m) {
      *pp = m->next;
      t->n--;
      break;
    }
  }
  ql__ipc_unref(m);
}

/* Makes room for one more import: drops the least recently used one that
 * only the table holds, other than keep. 0, or QL_EEXHAUSTED when every
 * one is in use. */
static int make_room(ql__ipc_table *t, const ql__ipc_mem *keep) {
  ql__ipc_mem *lru = NULL;
  if (t->n < QL_SESSION_MAX_IPC)
    return 0;
  for (ql__ipc_mem *m = t->list; m; m = m->next)
    if (m->id == 0 && m->refs == 1 && m != keep &&
        (lru == NULL || m->last_use < lru->last_use))
      lru = m;
  if (lru == NULL)
    return QL_EEXHAUSTED;
  drop(t, lru);
  return 0;
}

int ql__ipc_get(ql__ipc_table **tp, const ql__device *d, uint64_t session,
                const uint8_t *handle, size_t len, const ql__ipc_mem *keep,
                ql__ipc_mem **out, char *err, size_t errlen) {
  ql__ipc_table *t = *tp;
  ql__ipc_mem *m;
  void *base = NULL;
  uint64_t size = 0;
  int rc;

  *out = NULL;
  /* A backend whose handles carry descriptors (ipc_open_fd) has no
   * ipc_open: handle bytes alone never reach it. */
  if (d->b->ipc_open == NULL) {
    snprintf(err, errlen, "device %s takes no CUDA IPC memory", d->alias);
    return QL_ENOTSUP;
  }
  if (len != d->b->ipc_handle_bytes || len > sizeof m->handle) {
    snprintf(err, errlen, "a memory handle of device %s has %zu bytes, got "
             "%zu", d->alias, d->b->ipc_handle_bytes, len);
    return QL_EINVAL;
  }
  if (t == NULL) {
    if ((t = calloc(1, sizeof *t)) == NULL) {
      snprintf(err, errlen, "out of memory");
      return QL_ENOMEM;
    }
    *tp = t;
  }
  for (m = t->list; m; m = m->next) {
    if (m->id == 0 && m->dev == d && m->handle_len == len &&
        memcmp(m->handle, handle, len) == 0) {
      m->last_use = ++t->clock;
      *out = m;
      return 0;
    }
  }
  if ((rc = make_room(t, keep)) != 0) {
    snprintf(err, errlen, "the session has %d IPC allocations open, each "
             "imported or in use by a request", QL_SESSION_MAX_IPC);
    return rc;
  }
  if ((m = calloc(1, sizeof *m)) == NULL) {
    snprintf(err, errlen, "out of memory");
    return QL_ENOMEM;
  }
  rc = d->b->ipc_open(d->ordinal, handle, len, &base, &size);
  if (rc != 0) {
    free(m);
    if (rc == QL_EINVAL)
      snprintf(err, errlen, "device %s cannot open the CUDA IPC memory "
               "handle (not a live allocation of a process of this machine "
               "that this device can map)", d->alias);
    else
      snprintf(err, errlen, "opening a CUDA IPC memory handle on %s: %s",
               d->alias, ql_strerror(rc));
    return rc;
  }
  memcpy(m->handle, handle, len);
  m->handle_len = len;
  m->fd = -1;
  m->dev = d;
  m->session = session;
  m->base = base;
  m->size = size;
  m->refs = 1;
  m->last_use = ++t->clock;
  m->next = t->list;
  t->list = m;
  t->n++;
  ql__info("session %llu: opened a CUDA IPC allocation of %llu bytes on %s",
           (unsigned long long)session, (unsigned long long)size, d->alias);
  *out = m;
  return 0;
}

/* The table *tp, made on first use. */
static int table(ql__ipc_table **tp, char *err, size_t errlen) {
  if (*tp == NULL && (*tp = calloc(1, sizeof **tp)) == NULL) {
    snprintf(err, errlen, "out of memory");
    return QL_ENOMEM;
  }
  return 0;
}

int ql__ipc_import(ql__ipc_table **tp, const ql__device *d, uint64_t session,
                   const uint8_t *handle, size_t len, int fd,
                   ql__ipc_mem **out, char *err, size_t errlen) {
  ql__ipc_mem *m = NULL;
  void *base = NULL;
  uint64_t size = 0;
  int rc;

  *out = NULL;
  if (d->b->ipc_open_fd == NULL) {
    snprintf(err, errlen, "device %s takes no Level Zero IPC memory",
             d->alias);
    rc = QL_ENOTSUP;
    goto fail;
  }
  if (len != d->b->ipc_handle_bytes || len > sizeof m->handle) {
    snprintf(err, errlen, "a memory handle of device %s has %zu bytes, got "
             "%zu", d->alias, d->b->ipc_handle_bytes, len);
    rc = QL_EINVAL;
    goto fail;
  }
  if ((rc = table(tp, err, errlen)) != 0)
    goto fail;
  if ((rc = make_room(*tp, NULL)) != 0) {
    snprintf(err, errlen, "the session has %d IPC allocations open, each "
             "imported or in use by a request", QL_SESSION_MAX_IPC);
    goto fail;
  }
  if ((m = calloc(1, sizeof *m)) == NULL) {
    snprintf(err, errlen, "out of memory");
    rc = QL_ENOMEM;
    goto fail;
  }
  rc = d->b->ipc_open_fd(d->ordinal, fd, handle, len, &base, &size);
  if (rc != 0) {
    if (rc == QL_EINVAL)
      snprintf(err, errlen, "device %s cannot open the Level Zero IPC "
               "handle with its descriptor (not an allocation of this "
               "driver that this device can map)", d->alias);
    else if (rc == QL_ENOTSUP)
      snprintf(err, errlen, "the driver of device %s has no memory IPC",
               d->alias);
    else
      snprintf(err, errlen, "opening a Level Zero IPC handle on %s: %s",
               d->alias, ql_strerror(rc));
    goto fail;
  }
  memcpy(m->handle, handle, len);
  m->handle_len = len;
  m->id = ++next_import_id;
  m->fd = fd;
  m->dev = d;
  m->session = session;
  m->base = base;
  m->size = size;
  m->refs = 1;
  m->last_use = ++(*tp)->clock;
  m->next = (*tp)->list;
  (*tp)->list = m;
  (*tp)->n++;
  ql__info("session %llu: imported a Level Zero IPC allocation of %llu "
           "bytes on %s (import %llu)", (unsigned long long)session,
           (unsigned long long)size, d->alias, (unsigned long long)m->id);
  *out = m;
  return 0;
fail:
  free(m);
  if (fd >= 0)
    close(fd);
  return rc;
}

ql__ipc_mem *ql__ipc_find(ql__ipc_table *t, uint64_t id) {
  if (t == NULL || id == 0)
    return NULL;
  for (ql__ipc_mem *m = t->list; m; m = m->next)
    if (m->id == id) {
      m->last_use = ++t->clock;
      return m;
    }
  return NULL;
}

int ql__ipc_release(ql__ipc_table *t, uint64_t id) {
  ql__ipc_mem *m = ql__ipc_find(t, id);
  if (m == NULL)
    return QL_ENOTFOUND;
  drop(t, m);
  return 0;
}

size_t ql__ipc_table_free(ql__ipc_table *t) {
  size_t n;
  if (t == NULL)
    return 0;
  n = t->n;
  while (t->list != NULL)
    drop(t, t->list);
  free(t);
  return n;
}
