/*
 * fuzz_request.c - libFuzzer target for the request decoder.
 *
 * Runs exactly what ql__handle_message() runs on bytes from the socket:
 * ql__request_decode() with the daemon's budget (the message size plus
 * 1 MiB), then ql__request_check_strings() and ql__request_validate(),
 * then ql__request_free(). Any input
 * must end in an error code or a valid request, never in a crash, a leak or
 * a sanitizer report. The contracts of both calls are checked too: a broken
 * one traps, so the fuzzer keeps the input as a crash.
 *
 * An input that decodes is decoded twice more with budgets it cannot fit
 * (half, and one byte less than, what the decoded request holds), so the
 * unpacker's allocation-failure paths run on every shape of message the
 * fuzzer finds: they must fail with QL_EPROTO and leak nothing.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over the
 * seed corpus in tests/fuzz/corpus/request/ by 'make check'.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Same budget as ql__handle_message(). */
#define BUDGET_SLACK ((size_t)1 << 20)

static void check_err(const char *err, size_t errlen) {
  if (memchr(err, '\0', errlen) == NULL)
    __builtin_trap();
}

/* Decodes with a budget below what the message needs: must fail cleanly. */
static void decode_short(const uint8_t *data, size_t size, size_t budget) {
  char err[256] = "";
  ql__request *req = (ql__request *)&req; /* decode must reset it */
  int rc = ql__request_decode(data, size, budget, &req, err, sizeof err);
  check_err(err, sizeof err);
  if (rc != QL_EPROTO || req != NULL)
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256] = "";
  ql__request *req = (ql__request *)&req; /* decode must reset it */

  int rc = ql__request_decode(data, size, size + BUDGET_SLACK, &req, err,
                              sizeof err);
  check_err(err, sizeof err);
  if (rc != 0) {
    /* Failure: one of the documented codes, and nothing handed back. */
    if ((rc != QL_EPROTO && rc != QL_ENOMEM) || req != NULL)
      __builtin_trap();
    return 0;
  }
  if (req == NULL || req->msg == NULL || req->used == 0 ||
      req->used > req->limit)
    __builtin_trap();

  rc = ql__request_check_strings(data, size, err, sizeof err);
  check_err(err, sizeof err);
  if (rc != 0 && rc != QL_ENAME && rc != QL_EPROTO)
    __builtin_trap();
  rc = ql__request_validate(req->msg, err, sizeof err);
  check_err(err, sizeof err);
  /* 0 or a code from the one error list. */
  if (rc > 0 || rc <= QL_ERRNO_MIN_)
    __builtin_trap();

  /* The decode peaked at no less than what it still holds. */
  size_t held = req->used;
  ql__request_free(req);
  decode_short(data, size, held / 2);
  decode_short(data, size, held - 1);
  return 0;
}
