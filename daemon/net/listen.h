/*
 * listen.h - the daemon's network listening sockets, of which there is one:
 * the metrics listener (metrics.h). Two parsers of text from outside the
 * daemon live here, with no state and no I/O, so that a fuzz target
 * (tests/fuzz/fuzz_listen.c) reaches every byte of them:
 *
 * - a loopback listen address, "HOST:PORT", from the configuration
 *   (metrics_listen): only 127.0.0.0/8, [::1] and localhost are accepted,
 *   since whatever listens there is readable by every local user and by
 *   nothing else;
 * - systemd's socket handover (sd_listen_fds(3)): LISTEN_PID, LISTEN_FDS
 *   and LISTEN_FDNAMES, read to find the descriptor of a socket unit's
 *   FileDescriptorName=.
 *
 * The daemon's own sockets (qlineard.sock, session.sock, admin.sock) are
 * bound by the daemon itself and are not handed over; should one ever be,
 * ql__listen_fds_find() is the parser to use for it as well.
 */
#ifndef QL_LISTEN_H
#define QL_LISTEN_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

/* The longest listen address text accepted ("[::1]:65535" is 11 bytes;
 * room for 127.255.255.255:65535 and localhost:65535 too). */
#define QL_LISTEN_ADDR_MAX 32

/* The first descriptor systemd hands over (SD_LISTEN_FDS_START), and the
 * most handed over descriptors this parser takes. */
#define QL_LISTEN_FDS_START 3
#define QL_LISTEN_FDS_MAX 1024

/*
 * Parses s, "HOST:PORT", into *sa (*salen bytes of it used): HOST is a
 * dotted IPv4 address in 127.0.0.0/8, "[::1]", or "localhost" (any case),
 * which is 127.0.0.1 here and never looked up (a resolver or /etc/hosts
 * could say otherwise, RFC 6761 does not); PORT is decimal, 1 to 65535,
 * without sign or leading zeros. sa and salen may be NULL (only checks).
 * 0, or QL_EINVAL with the reason in why (whylen bytes, NUL-terminated),
 * which repeats at most 40 bytes of s, made printable.
 */
int ql__listen_parse_loopback(const char *s, struct sockaddr_storage *sa,
                              socklen_t *salen, char *why, size_t whylen);

/*
 * systemd's socket handover, from the values of LISTEN_PID, LISTEN_FDS and
 * LISTEN_FDNAMES (each NULL when unset) for the process self: the
 * descriptor named want. Returns 1 with *fd set when it is there; 0 when
 * nothing is handed over to this process (LISTEN_PID or LISTEN_FDS unset,
 * or LISTEN_PID another process's: variables inherited from a parent),
 * or no descriptor is named want; QL_EINVAL with the reason in why when
 * the values are malformed: LISTEN_FDS or LISTEN_PID not a plain decimal
 * number, more than QL_LISTEN_FDS_MAX descriptors, LISTEN_FDNAMES not
 * naming as many descriptors as LISTEN_FDS says (when set), a name empty
 * or longer than 255 bytes or with a character outside printable ASCII,
 * or want named twice. *n_fds (may be NULL) gets LISTEN_FDS whenever the
 * handover is this process's (0 otherwise), so that the caller can mark
 * them all close-on-exec.
 */
int ql__listen_fds_find(const char *listen_pid, const char *listen_fds,
                        const char *listen_fdnames, pid_t self,
                        const char *want, int *fd, int *n_fds, char *why,
                        size_t whylen);

/*
 * The descriptor systemd handed this process under the name want, from
 * the environment: ql__listen_fds_find() on getpid(), then every handed
 * over descriptor is made close-on-exec and the three variables are
 * removed (nothing the daemon starts inherits them), and the one found
 * is checked to be a listening stream socket of AF_INET or AF_INET6
 * (SO_ACCEPTCONN, SO_TYPE, SO_DOMAIN) and made non-blocking. Returns 1
 * with *fd set (the caller owns it), 0 when there is none, or QL_EINVAL
 * with the reason in why (the descriptor, if one was found, is left open:
 * it is systemd's socket, and the daemon is about to exit).
 */
int ql__listen_take(const char *want, int *fd, char *why, size_t whylen);

#endif /* QL_LISTEN_H */
