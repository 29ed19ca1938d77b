/* ql_defs.c - descriptions of the error codes listed in ql_defs.h. */
#include "ql_defs.h"

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
