/* ql_errno.h - the one mapping of a failed system call's errno into the
 * QL_E* space (DESIGN §7: library errors are mapped where they enter our
 * code), for both ends: the daemon and libqlinear. Not installed. */
#ifndef QL_ERRNO_H
#define QL_ERRNO_H

/*
 * The QL_E* code of errno value e: memory (ENOMEM) is QL_ENOMEM; room that
 * runs out and can come back (a full file system, a quota, a file-size
 * limit, the descriptor tables) is QL_EEXHAUSTED, "try again later"; a
 * timeout or a call that would block is QL_ETIMEDOUT; a peer that is not
 * there or went away is QL_ECONNECT; a refusal is QL_EPERM; a bad path or
 * argument QL_EINVAL; a missing file QL_ENOTFOUND; anything else QL_EIO.
 * A caller that knows better for one value (a missing socket is "is the
 * daemon running?") says so before it calls this.
 */
int ql__errno_from_sys(int e);

#endif
