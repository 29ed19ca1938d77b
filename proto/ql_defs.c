/* ql_defs.c - descriptions of the error codes listed in ql_defs.h, and
 * the one errno mapping of ql_errno.h. */
#include <errno.h>

#include "ql_defs.h"
#include "ql_errno.h"

#ifndef QL_EXPORT
#define QL_EXPORT __attribute__((visibility("default")))
#endif

QL_EXPORT const char *ql_strerror(int err) {
  switch (err) {
  case QL_OK:
    return "success";
#define XX(name, val, msg)                                                     \
  case QL_E##name:                                                             \
    return msg;
    QL_ERRNO_MAP(XX)
#undef XX
  default:
    return "unknown error";
  }
}

QL_EXPORT const char *ql_err_name(int err) {
  switch (err) {
  case QL_OK:
    return "QL_OK";
#define XX(name, val, msg)                                                     \
  case QL_E##name:                                                             \
    return "QL_E" #name;
    QL_ERRNO_MAP(XX)
#undef XX
  default:
    return "QL_EUNKNOWN";
  }
}

int ql__errno_from_sys(int e) {
  switch (e) {
  case ENOMEM:
  case ENOBUFS:
    return QL_ENOMEM;
  case ENOSPC:
  case EDQUOT:
  case EFBIG:
  case EMFILE:
  case ENFILE:
    return QL_EEXHAUSTED;
  case ETIMEDOUT:
  case EAGAIN:
    return QL_ETIMEDOUT;
  case ECONNREFUSED:
  case ECONNRESET:
  case ECONNABORTED:
  case ENOTCONN:
  case EPIPE:
  case EHOSTUNREACH:
  case ENETUNREACH:
  case EADDRNOTAVAIL:
    return QL_ECONNECT;
  case EACCES:
  case EPERM:
  case EROFS:
  case EADDRINUSE:
    return QL_EPERM;
  case EINVAL:
  case ENAMETOOLONG:
  case EPROTONOSUPPORT:
  case ENODEV:
    return QL_EINVAL;
  case ENOENT:
  case ENOTDIR:
    return QL_ENOTFOUND;
  case EMSGSIZE:
    return QL_ETOOBIG;
  default:
    return QL_EIO;
  }
}
