/*
 * reload.h - the live reconfiguration: SIGHUP (server.c) and the admin's
 * ReloadConfig request (handlers.c) both come here, so that the request
 * handlers need nothing of the server's own file.
 */
#ifndef QL_RELOAD_H
#define QL_RELOAD_H

#include <stddef.h>

#include "qlineard.h"

/* Reads the configuration again (SIGHUP, or ReloadConfig on the admin
 * socket) and applies what can change live; report says what changed and
 * what needs a restart. All or nothing: a bad file, or device budgets
 * that cannot apply, change nothing and give QL_EINVAL (QL_ENOMEM), report
 * saying why. */
int ql__server_reload(ql__server *s, char *report, size_t len);

#endif /* QL_RELOAD_H */
