/*
 * handlers.h - what the daemon does with each request body.
 *
 * ql__handle_message is the transport's callback: it decodes and validates
 * the message, answers synchronous bodies at once, and hands Linear
 * requests to a device worker and LoadCommit quantizations to the libuv
 * thread pool; their replies are sent when they complete. Every failure is
 * answered with a Status carrying a QL_E* code and a message; nothing a
 * client sends can change stored state unless the request succeeds.
 *
 * On the request socket every body but Hello needs the token of an open
 * session (session.h); a request acts for that session: its uploads, the
 * weights it holds, its regions. Another session's upload or region is not
 * found. The admin socket needs no token: its directory's group is the
 * check. Persistent loads, unloads of any weight and ReloadConfig are
 * admin-only; Linear is refused there.
 */
#ifndef QL_HANDLERS_H
#define QL_HANDLERS_H

#include <stddef.h>

#include "net/ring.h"
#include "qlineard.h"
#include "state/session.h"

/* Transport callbacks of the request socket and of admin.sock; arg is the
 * ql__server. Consume route. */
void ql__handle_message(void *arg, const void *body, size_t len, void *route);
void ql__handle_admin_message(void *arg, const void *body, size_t len,
                              void *route);

/* What sessions' rings call up (net/ring.h), with the ql__server as arg
 * and the ring's session as owner: a request taken from the ring is
 * handled as on the request socket, for that session, limited to what a
 * ring carries; a ring whose rules were broken ends its session. */
extern const ql__dring_ops ql__handlers_ring_ops;

/* Number of requests accepted and not yet answered (commits and linear
 * jobs), for the shutdown drain. */
size_t ql__handlers_in_flight(const ql__server *s);


#endif /* QL_HANDLERS_H */
