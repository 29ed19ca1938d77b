/* notify.c - see notify.h. */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "notify.h"

#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>

/* STATUS= text is one line: the protocol separates assignments by '\n'. */
#define STATUS_MAX 256

static atomic_int warned;

/*
 * Sends one notification. sd_notify() returns 0 when $NOTIFY_SOCKET is
 * unset (not under systemd): nothing to do. A failure is logged once only,
 * since a watchdog tick would otherwise repeat it every few seconds.
 */
static void notify(const char *state) {
  int rc = sd_notify(0, state);
  if (rc < 0 && atomic_exchange(&warned, 1) == 0)
    ql__warn("cannot notify systemd (%.*s): %s",
             (int)strcspn(state, "\n"), state, strerror(-rc));
}

/* Writes prefix "STATUS=" text into buf, text flattened to one line. */
static void format_status(char *buf, size_t len, const char *prefix,
                          const char *text) {
  int n = snprintf(buf, len, "%sSTATUS=", prefix);
  if (n < 0 || (size_t)n >= len)
    return;
  char *p = buf + n;
  snprintf(p, len - n, "%s", text);
  for (; *p != '\0'; p++)
    if (*p == '\n' || *p == '\r')
      *p = ' ';
}

void ql__notify_ready(const char *status) {
  if (status == NULL) {
    notify("READY=1");
    return;
  }
  char buf[STATUS_MAX + 16];
  format_status(buf, sizeof buf, "READY=1\n", status);
  notify(buf);
}

void ql__notify_stopping(void) { notify("STOPPING=1"); }

void ql__notify_status(const char *fmt, ...) {
  char text[STATUS_MAX], buf[STATUS_MAX + 16];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  format_status(buf, sizeof buf, "", text);
  notify(buf);
}

void ql__notify_extend_timeout(uint64_t usec) {
  char buf[48];
  snprintf(buf, sizeof buf, "EXTEND_TIMEOUT_USEC=%" PRIu64, usec);
  notify(buf);
}

uint64_t ql__notify_watchdog_usec(void) {
  /* Keeps $WATCHDOG_USEC/$WATCHDOG_PID: it may be asked again, and the
   * PID check already ignores them in any child process. */
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0)
    return 0;
  return usec;
}

void ql__notify_watchdog(void) { notify("WATCHDOG=1"); }

#else /* !HAVE_SYSTEMD: built without libsystemd, nothing to tell. */

void ql__notify_ready(const char *status) { (void)status; }

void ql__notify_stopping(void) {}

void ql__notify_status(const char *fmt, ...) { (void)fmt; }

void ql__notify_extend_timeout(uint64_t usec) { (void)usec; }

uint64_t ql__notify_watchdog_usec(void) { return 0; }

void ql__notify_watchdog(void) {}

#endif /* HAVE_SYSTEMD */
