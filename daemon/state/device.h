/*
 * device.h - one device the daemon serves, as the server's table of them
 * holds it (ql__server.dev[]); what is done with the table is
 * devices.h's. Apart so that the server's struct can hold the table
 * without including the functions that take the server.
 */
#ifndef QL_DEVICE_H
#define QL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "registry.h"
#include "state/worker.h"

typedef struct ql__device {
  unsigned index;         /* in ql__server.dev[] */
  const ql_backend *b;    /* its backend */
  int ordinal;            /* the backend's number for it */
  int host;               /* the CPU: layouts live in host memory */
  char name[64];          /* "cpu", "cuda:<uuid>" */
  char alias[32];         /* "cpu", "cuda:0" */
  size_t memory;          /* the device's memory (0 for the host) */
  size_t budget;          /* layout bytes outside host memory; 0: none
                             (ql__devices_set_budgets) */
  ql__worker *worker;     /* runs its batches */
  unsigned lanes;         /* the worker's threads: batches at once (1 for
                             the host, batches_in_flight otherwise) */
  unsigned busy;          /* batches on the worker, <= lanes (batch.c) */
  int failed;             /* out of service: its requests fail QL_EDEVICE */
  uint64_t wd_completed;  /* the watchdog's last look at the worker */
  int wd_misses;
} ql__device;

#endif /* QL_DEVICE_H */
