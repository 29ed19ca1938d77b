/*
 * fuzz_session.c - libFuzzer target for the session socket's message
 * decoder (DESIGN §7).
 *
 * Runs what the daemon runs on a packet from session.sock (session_ops.c):
 * ql__session_request_decode() with the daemon's budget (the packet's size
 * plus 16 KiB), then ql__session_request_validate(), then
 * ql__session_request_free(). Any input must end in an error code or a
 * valid request, never in a crash, a leak or a sanitizer report; a broken
 * contract traps. An input that decodes is decoded again with budgets it
 * cannot fit, so the unpacker's allocation-failure paths run too.
 *
 * The first 24 bytes of every input are also read as (offset, length,
 * size) of a region slice: ql__slice_valid() must agree with exact 128-bit
 * arithmetic, whatever the values.
 *
 * Built under libFuzzer by 'make fuzz' and, with replay_main.c, run over the
 * seed corpus in tests/fuzz/corpus/session/ by 'make check'.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Same budget as session_ops.c. */
#define BUDGET_SLACK 16384

static void check_err(const char *err, size_t errlen) {
  if (memchr(err, '\0', errlen) == NULL)
    __builtin_trap();
}

static void decode_short(const uint8_t *data, size_t size, size_t budget) {
  char err[256] = "";
  ql__session_request *req = (ql__session_request *)&req;
  int rc = ql__session_request_decode(data, size, budget, &req, err,
                                      sizeof err);
  check_err(err, sizeof err);
  if (rc != QL_EPROTO || req != NULL)
    __builtin_trap();
}

static void check_slice(const uint8_t *data, size_t size) {
  uint64_t v[3];
  if (size < sizeof v)
    return;
  memcpy(v, data, sizeof v);
  unsigned __int128 end = (unsigned __int128)v[0] + v[1];
  int want = end <= v[2];
  if (ql__slice_valid(v[0], v[1], v[2]) != want)
    __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256] = "";
  ql__session_request *req = (ql__session_request *)&req;

  check_slice(data, size);
  int rc = ql__session_request_decode(data, size, size + BUDGET_SLACK, &req,
                                      err, sizeof err);
  check_err(err, sizeof err);
  if (rc != 0) {
    if ((rc != QL_EPROTO && rc != QL_ENOMEM) || req != NULL)
      __builtin_trap();
    /* Only packets the socket can carry decode. */
    return 0;
  }
  if (size > QL_SESSION_MSG_MAX || req == NULL || req->msg == NULL ||
      req->used == 0 || req->used > req->limit)
    __builtin_trap();
  rc = ql__session_request_validate(req->msg, err, sizeof err);
  check_err(err, sizeof err);
  if (rc > 0 || rc <= QL_ERRNO_MIN_)
    __builtin_trap();
  /* A valid request has a body the daemon knows. */
  if (rc == 0 &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_OPEN &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_RING &&
      req->msg->body_case != QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT)
    __builtin_trap();
  /* A valid MapWeight names a weight by a valid name. */
  if (rc == 0 &&
      req->msg->body_case == QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT &&
      (req->msg->map_weight->name == NULL ||
       !ql__name_valid(req->msg->map_weight->name)))
    __builtin_trap();
  /* A valid import carries a whole handle and names a device. */
  if (rc == 0 &&
      req->msg->body_case == QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC &&
      (req->msg->import_ze_ipc->ipc_handle.len != QL_ZE_IPC_HANDLE_BYTES ||
       req->msg->import_ze_ipc->device == NULL ||
       req->msg->import_ze_ipc->device[0] == '\0'))
    __builtin_trap();
  size_t held = req->used;
  ql__session_request_free(req);
  decode_short(data, size, held / 2);
  decode_short(data, size, held - 1);
  return 0;
}
