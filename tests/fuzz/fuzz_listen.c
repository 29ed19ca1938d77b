/*
 * fuzz_listen.c - libFuzzer target for the two parsers of daemon/net/listen.c:
 * the loopback listen address (metrics_listen, from a config file or the
 * command line) and systemd's socket handover (LISTEN_PID, LISTEN_FDS,
 * LISTEN_FDNAMES, from the environment).
 *
 * Input: up to four fields separated by NUL bytes: an address, then the
 * values of LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES (a missing field is
 * an unset variable); the process is 42, the name wanted "metrics".
 * Beyond "no crash, no out-of-bounds read", it checks what the daemon
 * relies on: an accepted address is a loopback one with a port, and is
 * accepted again the same; a refusal says why in printable text; a
 * descriptor found lies among those handed over; a malformed handover is
 * refused, never half taken.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over
 * the seed corpus in tests/fuzz/corpus/listen/ by 'make check'.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/listen.h"
#include "ql_defs.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

/* A reason: non-empty, NUL-terminated within its buffer, printable. */
static void check_why(const char *why, size_t len) {
  const char *end = memchr(why, '\0', len);
  CHECK(end != NULL && end > why);
  for (const char *p = why; p < end; p++)
    CHECK((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
}

static void fuzz_address(const char *s) {
  struct sockaddr_storage sa, again;
  socklen_t len = 0, len2 = 0;
  char why[256];
  memset(why, 'x', sizeof why);
  int rc = ql__listen_parse_loopback(s, &sa, &len, why, sizeof why);
  if (rc != 0) {
    CHECK(rc == QL_EINVAL);
    check_why(why, sizeof why);
    return;
  }
  CHECK(why[0] == '\0');
  CHECK(strlen(s) <= QL_LISTEN_ADDR_MAX);
  if (sa.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&sa;
    CHECK(len == sizeof *a);
    CHECK(ntohl(a->sin_addr.s_addr) >> 24 == 127);
    CHECK(a->sin_port != 0);
  } else {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&sa;
    CHECK(sa.ss_family == AF_INET6 && len == sizeof *a);
    CHECK(IN6_IS_ADDR_LOOPBACK(&a->sin6_addr));
    CHECK(a->sin6_port != 0);
  }
  CHECK(ql__listen_parse_loopback(s, &again, &len2, NULL, 0) == 0);
  CHECK(len2 == len && memcmp(&sa, &again, len) == 0);
}

static void fuzz_handover(const char *pid, const char *fds,
                          const char *names) {
  char why[256];
  int fd = -1, n = -1;
  memset(why, 'x', sizeof why);
  int rc = ql__listen_fds_find(pid, fds, names, 42, "metrics", &fd, &n, why,
                               sizeof why);
  CHECK(n >= 0 && n <= QL_LISTEN_FDS_MAX);
  if (rc < 0) {
    CHECK(rc == QL_EINVAL);
    check_why(why, sizeof why);
    return;
  }
  CHECK(rc == 0 || rc == 1);
  if (rc == 1) {
    CHECK(n >= 1);
    CHECK(fd >= QL_LISTEN_FDS_START && fd < QL_LISTEN_FDS_START + n);
  }
  if (pid == NULL || fds == NULL)
    CHECK(rc == 0 && n == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy with a NUL after it: the fields are C strings. */
  char *buf = malloc(size + 1);
  const char *field[4] = {NULL, NULL, NULL, NULL};
  if (buf == NULL)
    return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  size_t at = 0;
  for (int i = 0; i < 4 && at <= size; i++) {
    field[i] = buf + at;
    at += strlen(buf + at) + 1;
  }
  fuzz_address(field[0]);
  fuzz_handover(field[1], field[2], field[3]);
  free(buf);
  return 0;
}
