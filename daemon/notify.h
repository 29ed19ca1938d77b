/*
 * notify.h - the daemon's side of systemd's service notification protocol
 * (sd_notify(3)): READY=1, STOPPING=1, STATUS=, WATCHDOG=1 and
 * EXTEND_TIMEOUT_USEC= for a unit with Type=notify (DESIGN §10).
 *
 * Built on libsystemd when configure finds it (HAVE_SYSTEMD); without it
 * every function compiles to a no-op and ql__notify_watchdog_usec() returns
 * 0, so callers never carry an #ifdef. Outside systemd ($NOTIFY_SOCKET
 * unset, as under deploy/run and the tests) the calls do nothing either.
 *
 * Every function may be called from any thread; none blocks for long (one
 * datagram to a local socket), none fails: a notification that cannot be
 * sent is logged once and otherwise ignored, because a daemon that is
 * serving must not stop because its supervisor is unreachable.
 */
#ifndef QL_NOTIFY_H
#define QL_NOTIFY_H

#include <stdint.h>

/*
 * READY=1, with STATUS=status when status is not NULL. Send it once, after
 * the stored weights are resident and the required devices are present:
 * systemd holds back units ordered after qlineard.service until then, and
 * arms the watchdog only from this moment.
 */
void ql__notify_ready(const char *status);

/* STOPPING=1: shutdown (the bounded drain) has begun. */
void ql__notify_stopping(void);

/* STATUS=<printf-formatted text>, one line shown by systemctl status.
 * Newlines are replaced by spaces; the text is truncated at 255 bytes. */
void ql__notify_status(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/*
 * EXTEND_TIMEOUT_USEC=usec: asks for usec more microseconds before the
 * start (or stop) timeout fires. For a long start that is making progress
 * (loading a large store), sent after each step; a start that stops making
 * progress still times out.
 */
void ql__notify_extend_timeout(uint64_t usec);

/*
 * The watchdog interval systemd expects pings within (WatchdogSec=), in
 * microseconds, or 0 when the watchdog is off for this process (no
 * WatchdogSec=, not under systemd, or built without libsystemd). Ping at
 * half this interval.
 */
uint64_t ql__notify_watchdog_usec(void);

/* WATCHDOG=1: "still making progress". The caller decides whether that is
 * true (see server.c); a ping sent unconditionally from a timer would only
 * prove that the loop thread runs. */
void ql__notify_watchdog(void);

#endif /* QL_NOTIFY_H */
