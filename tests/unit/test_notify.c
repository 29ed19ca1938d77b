/*
 * test_notify.c - daemon/notify.c against a fake systemd: a datagram
 * socket named by $NOTIFY_SOCKET, as the service manager provides it.
 * Built with libsystemd, each call must send exactly the expected
 * assignments; built without, nothing may arrive and the watchdog is off.
 * Either way, no call may fail or block when systemd is absent or gone.
 * (check runs each test in its own process, so setenv stays local.)
 */
#include "config.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "notify.h"
#include "testutil.h"

static char dir[64];
static char path[96];
static int sock = -1;

/* Binds the fake manager's socket and points $NOTIFY_SOCKET at it. */
static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/ql-notify-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/notify", dir);
  sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(sock, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  ck_assert_int_eq(bind(sock, (struct sockaddr *)&sa, sizeof sa), 0);
  ck_assert_int_eq(setenv("NOTIFY_SOCKET", path, 1), 0);
}

static void teardown(void) {
  if (sock >= 0)
    close(sock);
  sock = -1;
  unlink(path);
  rmdir(dir);
}

/* The next datagram, or "" when none is waiting. */
static const char *next(void) {
  static char buf[1024];
  ssize_t n = recv(sock, buf, sizeof buf - 1, MSG_DONTWAIT);
  if (n < 0) {
    ck_assert_msg(errno == EAGAIN || errno == EWOULDBLOCK, "recv: %s",
                  strerror(errno));
    n = 0;
  }
  buf[n] = '\0';
  return buf;
}

#ifdef HAVE_SYSTEMD
#define EXPECT(s) ck_assert_str_eq(next(), (s))
#else
#define EXPECT(s) ck_assert_str_eq(next(), "")
#endif

START_TEST(test_messages) {
  ql__notify_ready(NULL);
  EXPECT("READY=1");
  ql__notify_ready("3 weights resident; devices cpu");
  EXPECT("READY=1\nSTATUS=3 weights resident; devices cpu");
  ql__notify_stopping();
  EXPECT("STOPPING=1");
  ql__notify_status("draining %d request%s", 2, "s");
  EXPECT("STATUS=draining 2 requests");
  ql__notify_extend_timeout(20000000);
  EXPECT("EXTEND_TIMEOUT_USEC=20000000");
  ql__notify_watchdog();
  EXPECT("WATCHDOG=1");
  ck_assert_str_eq(next(), "");
}
END_TEST

/* A status cannot inject assignments: newlines become spaces, and a long
 * one is cut rather than split. */
START_TEST(test_status_one_line) {
  ql__notify_status("a\nWATCHDOG=1\r\nb");
  EXPECT("STATUS=a WATCHDOG=1  b");
  ql__notify_ready("x\nSTOPPING=1");
  EXPECT("READY=1\nSTATUS=x STOPPING=1");
  char longtext[1000];
  memset(longtext, 'z', sizeof longtext - 1);
  longtext[sizeof longtext - 1] = '\0';
  ql__notify_status("%s", longtext);
  const char *m = next();
#ifdef HAVE_SYSTEMD
  ck_assert_int_eq(strncmp(m, "STATUS=zzz", 10), 0);
  ck_assert_uint_eq(strlen(m), strlen("STATUS=") + 255);
#else
  ck_assert_str_eq(m, "");
#endif
}
END_TEST

START_TEST(test_watchdog_usec) {
  char pid[32];
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 0);

  setenv("WATCHDOG_USEC", "30000000", 1);
  setenv("WATCHDOG_PID", pid, 1);
#ifdef HAVE_SYSTEMD
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 30000000);
  /* Asking does not consume it. */
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 30000000);
#else
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 0);
#endif
  /* Meant for another process (we are a child of the one systemd
   * started): off. */
  snprintf(pid, sizeof pid, "%ld", (long)getppid());
  setenv("WATCHDOG_PID", pid, 1);
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 0);
  /* Nonsense: off. */
  setenv("WATCHDOG_PID", "", 1);
  setenv("WATCHDOG_USEC", "soon", 1);
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 0);
  setenv("WATCHDOG_USEC", "0", 1);
  ck_assert_uint_eq(ql__notify_watchdog_usec(), 0);
}
END_TEST

/* Not under systemd, or the manager's socket is gone: every call returns
 * quietly (one warning in the log at most). */
START_TEST(test_no_manager) {
  unsetenv("NOTIFY_SOCKET");
  ql__notify_ready("ready");
  ql__notify_watchdog();
  ql__notify_stopping();
  ck_assert_str_eq(next(), "");
  setenv("NOTIFY_SOCKET", "/nonexistent/qlinear/notify", 1);
  for (int i = 0; i < 3; i++) {
    ql__notify_watchdog();
    ql__notify_status("tick %d", i);
  }
  ql__notify_stopping();
  ck_assert_str_eq(next(), "");
}
END_TEST

static Suite *notify_suite(void) {
  Suite *s = suite_create("notify");
  TCase *tc = tcase_create("protocol");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_messages);
  tcase_add_test(tc, test_status_one_line);
  tcase_add_test(tc, test_watchdog_usec);
  tcase_add_test(tc, test_no_manager);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run_suite(notify_suite(), CK_NORMAL); }
