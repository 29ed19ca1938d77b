/*
 * devices.h - the devices one daemon serves (DESIGN §1, §9): every device
 * of every backend built into the kernel library, each with its own worker
 * (one thread for the CPU, batches_in_flight for an accelerator), budget
 * and state.
 *
 * Devices are numbered in the registry's backend order (accelerators
 * first, the CPU last); that number is the scheduler's device and the
 * index of a weight's layouts. A device whose ops report a failure for
 * good (QL_EDEVICE) goes out of service: its queued requests are answered
 * QL_EDEVICE, new ones go to the other devices that hold their weight, and
 * the rest of the daemon keeps serving. Loop thread only.
 */
#ifndef QL_DEVICES_H
#define QL_DEVICES_H

#include <stddef.h>
#include <stdint.h>

#include "registry.h"
#include "state/device.h"
#include "state/weights.h"
#include "state/worker.h"

struct ql__server;
struct ql__config;

/*
 * Configures every backend but the CPU's (configured earlier, before the
 * store's repacks) with bc, finds their devices and starts a worker for
 * each, with batches_in_flight threads for an accelerator. A
 * backend without devices (no driver, no GPU) says so once in the log and
 * adds none; the CPU is always there. 0, or an error with nothing left
 * running.
 */
int ql__devices_open(struct ql__server *s, const ql_backend_config *bc);

/*
 * Sets every accelerator's weight budget from cfg: its device_budget_bytes
 * item (by name or alias), else accel_budget_percent of its memory, and
 * hands it to the weight store. Weights already resident stay, whatever
 * the new budget. An item that names no device here is logged and
 * ignored (one config may serve several hosts). 0, or QL_EINVAL with err
 * set and no budget changed when two items name the same device.
 */
int ql__devices_set_budgets(struct ql__server *s, const struct ql__config *cfg,
                            char *err, size_t errlen);

/* Lets queued work finish and stops every worker (blocks). */
void ql__devices_close(struct ql__server *s);

/* Frees the workers (closed or never started). Safe to call twice. */
void ql__devices_free(struct ql__server *s);

/*
 * Registers host memory [p, p + len), mapped by the daemon, with every
 * backend of the served devices that offers host_register (registry.h),
 * so that their ops reach it by DMA, with no staging copy. The backends
 * that accepted it are written to out[] (at most max); their count is
 * returned. A refusal is logged at debug level and costs only speed.
 */
unsigned ql__devices_host_register(struct ql__server *s, void *p, size_t len,
                                   const ql_backend **out, unsigned max);

/* 1 when a backend of the served devices offers host_register: a region
 * would be page-locked if the bounds allow it. */
int ql__devices_host_register_wanted(const struct ql__server *s);

/* Undoes ql__devices_host_register() for the n backends it gave; called
 * before the memory is unmapped, once no job uses it. */
void ql__devices_host_unregister(void *p, const ql_backend *const *bs,
                                 unsigned n);

/* The device called name (its name or its alias), or NULL. */
ql__device *ql__device_find(struct ql__server *s, const char *name);

/*
 * Where a load goes when it names no device (DESIGN §8): every
 * accelerator in service, or the CPU when there is none. Fills *pl;
 * 0, or QL_EDEVICE when every device is out of service.
 */
int ql__devices_placement(const struct ql__server *s, ql__placement *pl);

/*
 * The devices a load names (DESIGN §8), n names or aliases, as a mask.
 * 0, or with err set: QL_ENOTFOUND (no such device), QL_EINVAL (one
 * device named twice, under either spelling), QL_EDEVICE (out of
 * service).
 */
int ql__devices_resolve(struct ql__server *s, char *const *names, size_t n,
                        uint64_t *mask, char *err, size_t errlen);

/* The placement on exactly the devices of mask (non-zero): 0, or
 * QL_EDEVICE with err set when one of them is out of service now. */
int ql__devices_placement_mask(const struct ql__server *s, uint64_t mask,
                               ql__placement *pl, char *err, size_t errlen);

/* Takes d out of service after rc (QL_EDEVICE), once: logged at error
 * level with the reason. Its queued work is answered by the dispatcher (batch.c). */
void ql__device_fail(struct ql__server *s, ql__device *d, int rc);

/* Bit d set for each device d out of service. */
uint64_t ql__devices_failed(const struct ql__server *s);

/* "cpu, cuda:0" into buf: the devices of mask, by alias. */
void ql__devices_list(const struct ql__server *s, uint64_t mask, char *buf,
                      size_t len);

#endif /* QL_DEVICES_H */
