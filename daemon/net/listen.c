/* listen.c - see listen.h. */
#include "net/listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ql_defs.h"

#define ECHO_MAX 40    /* bytes of a bad value repeated in a message */
#define FDNAME_MAX 255 /* systemd's longest FileDescriptorName= */

/* s, at most n bytes of it and at most ECHO_MAX, made printable: it comes
 * from outside and ends up in the journal. */
static const char *echo(const char *s, size_t n, char *buf, size_t len) {
  size_t i, o = 0;
  for (i = 0; i < n && s[i] != '\0' && o + 4 < len && i < ECHO_MAX; i++) {
    unsigned char c = (unsigned char)s[i];
    buf[o++] = c < 0x20 || c >= 0x7f ? '?' : (char)c;
  }
  if (i < n && s[i] != '\0' && o + 4 <= len) {
    memcpy(buf + o, "...", 3);
    o += 3;
  }
  buf[o] = '\0';
  return buf;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int ascii_caseeq(const char *a, const char *b) {
  for (; *a != '\0' && *b != '\0'; a++, b++) {
    char x = *a >= 'A' && *a <= 'Z' ? (char)(*a + 32) : *a;
    if (x != *b)
      return 0;
  }
  return *a == '\0' && *b == '\0';
}

/*
 * A decimal number of at most digits digits, without sign, blanks or
 * leading zeros (strtoul takes all three, and saturates): its value, or
 * -1. The n bytes at s are all of it.
 */
static long long plain_decimal(const char *s, size_t n, size_t digits) {
  long long v = 0;
  if (n == 0 || n > digits || (s[0] == '0' && n > 1))
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (!is_digit(s[i]))
      return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

/* ------------------------------------------------------------- address */

int ql__listen_parse_loopback(const char *s, struct sockaddr_storage *sa,
                              socklen_t *salen, char *why, size_t whylen) {
  char e[ECHO_MAX + 8], host[QL_LISTEN_ADDR_MAX + 1];
  const char *colon, *h;
  size_t hn, n;
  char dummy[1];
  struct sockaddr_storage out;

  if (why == NULL || whylen == 0) {
    why = dummy;
    whylen = sizeof dummy;
  }
  why[0] = '\0';
  if (s == NULL || s[0] == '\0') {
    snprintf(why, whylen, "empty address (expected HOST:PORT, e.g. "
             "127.0.0.1:9464)");
    return QL_EINVAL;
  }
  n = strlen(s);
  if (n > QL_LISTEN_ADDR_MAX) {
    snprintf(why, whylen, "'%s' is longer than %d bytes",
             echo(s, n, e, sizeof e), QL_LISTEN_ADDR_MAX);
    return QL_EINVAL;
  }
  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (close == NULL || close[1] != ':') {
      snprintf(why, whylen, "'%s' is not [IPV6]:PORT", echo(s, n, e,
                                                            sizeof e));
      return QL_EINVAL;
    }
    h = s + 1;
    hn = (size_t)(close - h);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (colon == NULL) {
      snprintf(why, whylen, "'%s' has no port (expected HOST:PORT, e.g. "
               "127.0.0.1:9464)", echo(s, n, e, sizeof e));
      return QL_EINVAL;
    }
    h = s;
    hn = (size_t)(colon - s);
    if (memchr(h, ':', hn) != NULL) {
      snprintf(why, whylen, "'%s': an IPv6 address goes in brackets, as "
               "in [::1]:9464", echo(s, n, e, sizeof e));
      return QL_EINVAL;
    }
  }
  long long port = plain_decimal(colon + 1, strlen(colon + 1), 5);
  if (port < 1 || port > 65535) {
    snprintf(why, whylen, "'%s': the port is not a number from 1 to 65535",
             echo(s, n, e, sizeof e));
    return QL_EINVAL;
  }
  memcpy(host, h, hn);
  host[hn] = '\0';

  memset(&out, 0, sizeof out);
  int loopback;
  socklen_t len;
  if (s[0] == '[') {
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&out;
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1) {
      snprintf(why, whylen, "'%s' is not an IPv6 address",
               echo(host, hn, e, sizeof e));
      return QL_EINVAL;
    }
    loopback = IN6_IS_ADDR_LOOPBACK(&a6->sin6_addr);
    len = sizeof *a6;
  } else {
    struct sockaddr_in *a4 = (struct sockaddr_in *)&out;
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    /* localhost is loopback by definition (RFC 6761): not looked up, so
     * that no name service decides where the listener goes. */
    if (ascii_caseeq(host, "localhost")) {
      a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (inet_pton(AF_INET, host, &a4->sin_addr) != 1) {
      snprintf(why, whylen, "'%s' is not an IPv4 address, [::1] or "
               "localhost (names are not looked up)",
               echo(host, hn, e, sizeof e));
      return QL_EINVAL;
    }
    loopback = (ntohl(a4->sin_addr.s_addr) >> 24) == 127;
    len = sizeof *a4;
  }
  if (!loopback) {
    snprintf(why, whylen, "'%s' is not a loopback address (127.0.0.0/8, "
             "[::1] or localhost): the metrics listener is for this host "
             "only", echo(s, n, e, sizeof e));
    return QL_EINVAL;
  }
  if (sa != NULL)
    *sa = out;
  if (salen != NULL)
    *salen = len;
  return 0;
}

/* ------------------------------------------------------ socket handover */

int ql__listen_fds_find(const char *listen_pid, const char *listen_fds,
                        const char *listen_fdnames, pid_t self,
                        const char *want, int *fd, int *n_fds, char *why,
                        size_t whylen) {
  char e[ECHO_MAX + 8], dummy[1];
  int found = -1;

  if (why == NULL || whylen == 0) {
    why = dummy;
    whylen = sizeof dummy;
  }
  why[0] = '\0';
  if (n_fds != NULL)
    *n_fds = 0;
  if (listen_pid == NULL || listen_fds == NULL)
    return 0;
  long long pid = plain_decimal(listen_pid, strlen(listen_pid), 10);
  if (pid <= 0) {
    snprintf(why, whylen, "LISTEN_PID '%s' is not a process id",
             echo(listen_pid, strlen(listen_pid), e, sizeof e));
    return QL_EINVAL;
  }
  if (pid != (long long)self)
    return 0; /* a parent's, inherited: not ours */
  long long n = plain_decimal(listen_fds, strlen(listen_fds), 5);
  if (n < 0 || n > QL_LISTEN_FDS_MAX) {
    snprintf(why, whylen, "LISTEN_FDS '%s' is not a number from 0 to %d",
             echo(listen_fds, strlen(listen_fds), e, sizeof e),
             QL_LISTEN_FDS_MAX);
    return QL_EINVAL;
  }
  if (n_fds != NULL)
    *n_fds = (int)n;
  if (n == 0 || listen_fdnames == NULL)
    return 0; /* no names: none is want */
  /* Names separated by ':', one per descriptor, in their order. */
  const char *p = listen_fdnames;
  long long i = 0;
  for (;; i++) {
    size_t len = strcspn(p, ":");
    if (i >= n) {
      snprintf(why, whylen, "LISTEN_FDNAMES names more descriptors than "
               "LISTEN_FDS (%lld)", n);
      return QL_EINVAL;
    }
    if (len == 0 || len > FDNAME_MAX) {
      snprintf(why, whylen, "LISTEN_FDNAMES: name %lld is empty or longer "
               "than %d bytes", i + 1, FDNAME_MAX);
      return QL_EINVAL;
    }
    for (size_t k = 0; k < len; k++)
      if ((unsigned char)p[k] < 0x20 || (unsigned char)p[k] >= 0x7f) {
        snprintf(why, whylen, "LISTEN_FDNAMES: name %lld ('%s') holds a "
                 "character that is not printable ASCII", i + 1,
                 echo(p, len, e, sizeof e));
        return QL_EINVAL;
      }
    if (want != NULL && strlen(want) == len && memcmp(p, want, len) == 0) {
      if (found >= 0) {
        snprintf(why, whylen, "LISTEN_FDNAMES names '%s' twice (descriptors "
                 "%d and %lld): one socket of that name is served",
                 want, QL_LISTEN_FDS_START + found,
                 QL_LISTEN_FDS_START + i);
        return QL_EINVAL;
      }
      found = (int)i;
    }
    if (p[len] == '\0')
      break;
    p += len + 1;
  }
  if (i + 1 != n) {
    snprintf(why, whylen, "LISTEN_FDNAMES names %lld descriptor%s, "
             "LISTEN_FDS says %lld", i + 1, i == 0 ? "" : "s", n);
    return QL_EINVAL;
  }
  if (found < 0)
    return 0;
  if (fd != NULL)
    *fd = QL_LISTEN_FDS_START + found;
  return 1;
}

int ql__listen_take(const char *want, int *fd, char *why, size_t whylen) {
  int n = 0, got = -1;
  int rc = ql__listen_fds_find(getenv("LISTEN_PID"), getenv("LISTEN_FDS"),
                               getenv("LISTEN_FDNAMES"), getpid(), want, &got,
                               &n, why, whylen);
  /* As sd_listen_fds() does: what is handed over stays this process's. */
  for (int i = 0; i < n; i++)
    (void)fcntl(QL_LISTEN_FDS_START + i, F_SETFD, FD_CLOEXEC);
  if (n > 0 || rc != 0) {
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
  }
  if (rc <= 0)
    return rc;
  int domain = 0, type = 0, listening = 0;
  socklen_t l1 = sizeof domain, l2 = sizeof type, l3 = sizeof listening;
  if (getsockopt(got, SOL_SOCKET, SO_DOMAIN, &domain, &l1) != 0 ||
      getsockopt(got, SOL_SOCKET, SO_TYPE, &type, &l2) != 0 ||
      getsockopt(got, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l3) != 0) {
    snprintf(why, whylen, "descriptor %d, named '%s' by LISTEN_FDNAMES, is "
             "not a socket: %s", got, want, strerror(errno));
    return QL_EINVAL;
  }
  if ((domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM ||
      !listening) {
    snprintf(why, whylen, "descriptor %d, named '%s' by LISTEN_FDNAMES, is "
             "not a listening TCP socket (ListenStream=HOST:PORT in the "
             "socket unit)", got, want);
    return QL_EINVAL;
  }
  int fl = fcntl(got, F_GETFL);
  if (fl < 0 || fcntl(got, F_SETFL, fl | O_NONBLOCK) != 0) {
    snprintf(why, whylen, "descriptor %d: %s", got, strerror(errno));
    return QL_EINVAL;
  }
  *fd = got;
  return 1;
}
