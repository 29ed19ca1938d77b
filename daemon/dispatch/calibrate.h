/*
 * calibrate.h - the crossover of every weight shape on every device that
 * holds it (DESIGN §6): where AUTO requests on that device switch from the
 * weight-only to the activation-quantized path. Measured after READY
 * (kernels/crossover.h) on the device's own worker, one size at a time
 * between its batches (so a measurement times that device alone and holds
 * its requests back for one size at most), one (shape, device) at a time,
 * and cached in <state_dir>/crossover.json so that a restart does not
 * measure again. Until a (shape, device) is known its weights use
 * crossover_default_rows there; a non-zero crossover_rows in the config
 * fixes the crossover for every weight and device, and nothing is
 * measured.
 *
 * The cache is keyed by what the times depend on: the device (its name,
 * stable across restarts; the CPU's keys carry none, as they always did),
 * the kernels that run (their implementation names, which carry the CPU
 * level), the format, group size, scale dtype and shape. Loop thread only.
 */
#ifndef QL_CALIBRATE_H
#define QL_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "qlineard.h"
#include "dispatch/xover.h"

/* Reads the cache of the state directory, if there is one (a bad file is
 * logged and ignored: it is only a cache). 0 or QL_ENOMEM. */
int ql__calibrate_open(ql__server *s);

/* Frees the table. Call after the loop stopped. Safe when never opened. */
void ql__calibrate_close(ql__server *s);

/* The daemon is ready: measurements may start. */
void ql__calibrate_start(ql__server *s);

/* A weight became resident: gives it, on each device that holds it, its
 * shape's crossover there, or queues that (shape, device) for
 * measurement. */
void ql__calibrate_weight(ql__server *s, ql__weight *w);

/* The same for a weight a session of uid loaded: the measurements its load
 * starts are bounded per uid (tenants.h, QL_TENANT_CALIB_BURST); past
 * that the weight keeps the default crossover, and a later load of its
 * shape may measure it. */
void ql__calibrate_weight_by(ql__server *s, ql__weight *w, uid_t uid);

/* The crossover AUTO requests use: ql__weight_crossover_rows (weights.h),
 * which reads what ql__calibrate_weight gave the weight. */

/* 1 while a measurement is under way (the drain waits). */
int ql__calibrate_busy(const ql__server *s);

#endif /* QL_CALIBRATE_H */
