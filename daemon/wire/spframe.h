/*
 * spframe.h - the SP-over-IPC framing of the request sockets, as a parser
 * of untrusted bytes with no I/O, no allocation and no libuv, so that it
 * can be fuzzed on its own (tests/fuzz/fuzz_spframe.c).
 *
 * The wire format is nanomsg's (rfc/sp-tcp-mapping-01.txt, which the ipc
 * transport follows; nng speaks the same):
 *
 *   - each direction starts with an 8-byte protocol header: 0x00 'S' 'P'
 *     0x00, the sender's protocol id (16 bits, big-endian: REQ 48, REP 49)
 *     and two reserved bytes, zero;
 *   - then messages, each a type byte (1: a normal message; the ipc
 *     transport defines no other that a peer may send us), the payload's
 *     length (64 bits, big-endian) and the payload;
 *   - for REQ/REP the payload starts with the backtrace: 32-bit big-endian
 *     words, the last one (the request id) with its top bit set, one
 *     word more per device the request passed through. The REP side sends
 *     the same words back in front of its reply.
 *
 * The daemon takes no devices in front of it: a backtrace longer than
 * QL__SP_MAX_ROUTE bytes is refused like any other malformed input.
 */
#ifndef QL_SPFRAME_H
#define QL_SPFRAME_H

#include <stddef.h>
#include <stdint.h>

#define QL__SP_PROTO_REQ 48        /* NN_REQ: what a client announces */
#define QL__SP_PROTO_REP 49        /* NN_REP: what the daemon announces */
#define QL__SP_HELLO_BYTES 8       /* the protocol header */
#define QL__SP_FRAME_BYTES 9       /* type byte and length */
#define QL__SP_MSG_NORMAL 1        /* the only type byte accepted */
#define QL__SP_MAX_ROUTE 8         /* backtrace bytes: two hops at most */

/* The parser's state for one connection. Set it with ql__sp_parser_init. */
typedef struct ql__sp_parser {
  uint64_t max_payload; /* a longer frame is refused */
  uint16_t proto;       /* the protocol the peer must announce */
  int greeted;          /* its protocol header has been read */
} ql__sp_parser;

/* One message, pointing into the caller's buffer. */
typedef struct ql__sp_msg {
  const uint8_t *route; /* the backtrace, 4..QL__SP_MAX_ROUTE bytes */
  size_t route_len;
  const uint8_t *body;  /* the rest of the payload (may be empty) */
  size_t body_len;
} ql__sp_msg;

enum {
  QL__SP_MORE = 0, /* more bytes are needed */
  QL__SP_MSG = 1,  /* *m is a message */
};

void ql__sp_parser_init(ql__sp_parser *p, uint16_t peer_proto,
                        uint64_t max_payload);

/*
 * Parses what the peer sent next, buf[0..len). Returns
 *   QL__SP_MSG: *m is the message, which lies in the first *used bytes;
 *   QL__SP_MORE: *used bytes (the protocol header, or none) are done with,
 *     and nothing more can be parsed before the next *need bytes after
 *     them are all there (*need > 0 and at most QL__SP_FRAME_BYTES +
 *     max_payload);
 *   QL_EPROTO: the stream is malformed and the connection must be closed;
 *     *why says how, in a static string.
 * Bytes are refused as soon as they are seen: a bad header or type byte
 * fails on its first byte, a too long frame once its length is complete.
 * The caller drops the *used bytes before the next call.
 */
int ql__sp_parse(ql__sp_parser *p, const uint8_t *buf, size_t len,
                 ql__sp_msg *m, size_t *used, size_t *need,
                 const char **why);

/* The 8-byte protocol header announcing proto. */
void ql__sp_hello(uint8_t out[QL__SP_HELLO_BYTES], uint16_t proto);

/* Writes the frame header of a payload of len bytes. */
void ql__sp_frame_header(uint8_t out[QL__SP_FRAME_BYTES], uint64_t len);

#endif /* QL_SPFRAME_H */
