/*
 * region.c - libqlinear: memory shared with the daemon: mapped mode's
 * ql_map_weight, the shared-memory regions, and Level Zero imports.
 */
#include "internal.h"

/* ------------------------------------------------------------ mapped mode */

QL_EXPORT int ql_map_weight(ql_client *c, const char *name, const char *device,
                            ql_weight_map *out) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__MapWeightRequest mr = QLINEAR__V1__MAP_WEIGHT_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  const Qlinear__V1__MapWeightResponse *mw;
  int fd = -1, rv;

  ql__err_clear();
  if (out != NULL) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
  }
  if (c == NULL || name == NULL || out == NULL)
    return ql__err_set(QL_EINVAL, "client, name or output is NULL");
  mr.name = (char *)name;
  mr.device = (char *)(device != NULL ? device : "");
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_MAP_WEIGHT;
  req.map_weight = &mr;
  if ((rv = ql__session_call(c, &req,
                             QLINEAR__V1__SESSION_RESPONSE__BODY_MAP_WEIGHT, &r,
                             &fd)) != 0)
    return rv;
  mw = r->map_weight;
  /* What the caller maps and reads at: an answer that does not add up is
   * refused here rather than mapped. */
  if (fd < 0 || mw->size == 0 || mw->layout == NULL || mw->device == NULL ||
      strlen(mw->layout) >= sizeof out->layout ||
      strlen(mw->device) >= sizeof out->device ||
      mw->digest.len != QL_DIGEST_BYTES || mw->n == 0 || mw->k == 0 ||
      mw->groups == 0 || mw->ldq == 0 || mw->q_offset >= mw->size ||
      mw->scale_offset >= mw->size ||
      (mw->has_zero && mw->zero_offset >= mw->size) ||
      (mw->has_bias && mw->bias_offset >= mw->size)) {
    rv = ql__err_set(QL_EPROTO, "the daemon's layout of '%s' does not add up%s",
                     name, fd < 0 ? " (no descriptor)" : "");
    goto done;
  }
  out->fd = fd;
  fd = -1;
  out->size = mw->size;
  ql__copy_str(out->layout, sizeof out->layout, mw->layout);
  ql__copy_str(out->device, sizeof out->device, mw->device);
  out->format = (ql_format)mw->format;
  out->scale_dtype = (ql_dtype)mw->scale_dtype;
  out->n = mw->n;
  out->k = mw->k;
  out->groups = mw->groups;
  out->group_size = mw->group_size;
  out->ldq = mw->ldq;
  out->q_offset = mw->q_offset;
  out->scale_offset = mw->scale_offset;
  out->zero_offset = mw->has_zero ? mw->zero_offset : UINT64_MAX;
  out->bias_offset = mw->has_bias ? mw->bias_offset : UINT64_MAX;
  out->sms = mw->sms;
  out->writable = mw->writable ? 1 : 0;
  memcpy(out->digest, mw->digest.data, QL_DIGEST_BYTES);
  rv = 0;
done:
  if (fd >= 0)
    close(fd);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}

/* ------------------------------------------------------------ regions */

/* Tells the daemon to forget region id; best effort when cleaning up. */
static int destroy_remote(ql_client *c, uint64_t id) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__DestroyRegionRequest dr =
      QLINEAR__V1__DESTROY_REGION_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  dr.region_id = id;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_DESTROY_REGION;
  req.destroy_region = &dr;
  int rv = ql__session_call(
      c, &req, QLINEAR__V1__SESSION_RESPONSE__BODY_DESTROY_REGION, &r, NULL);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Allocates every page of a fresh mapping, as this process's memory: one
 * madvise where the kernel has it, else a write to each page (zero, as
 * the pages are: the region's bytes do not change). */
static int populate(uint8_t *base, size_t size) {
  if (madvise(base, size, MADV_POPULATE_WRITE) == 0)
    return 0;
  if (errno != EINVAL && errno != ENOSYS)
    return ql__err_set(ql__errno_from_sys(errno),
                       "populating the region: %s", strerror(errno));
  long page = sysconf(_SC_PAGESIZE);
  for (size_t off = 0; off < size; off += (size_t)page)
    ((volatile uint8_t *)base)[off] = 0;
  return 0;
}

QL_EXPORT int ql_region_create(ql_client *c, size_t size, ql_region **out) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__CreateRegionRequest cr =
      QLINEAR__V1__CREATE_REGION_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  region_node *node = NULL;
  void *base = MAP_FAILED;
  uint64_t id = 0;
  int fd = -1, rv;

  ql__err_clear();
  if (out != NULL)
    *out = NULL;
  if (c == NULL || out == NULL)
    return ql__err_set(QL_EINVAL, "client or output is NULL");
  if (size == 0)
    return ql__err_set(QL_EINVAL, "a region of 0 bytes");
  cr.size = size;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_CREATE_REGION;
  req.create_region = &cr;
  if ((rv = ql__session_call(c, &req,
                             QLINEAR__V1__SESSION_RESPONSE__BODY_CREATE_REGION,
                             &r, &fd)) != 0)
    return rv;
  id = r->create_region->region_id;
  if (id == 0 || r->create_region->size != size || fd < 0) {
    rv = ql__err_set(QL_EPROTO, "the daemon sent region %llu of %llu bytes%s",
                     (unsigned long long)id,
                     (unsigned long long)r->create_region->size,
                     fd < 0 ? " without a descriptor" : "");
    goto fail;
  }
  /* Mapping a file that could shrink would expose us to SIGBUS: accept
   * only what the daemon promises, a memfd of this size sealed against
   * shrinking and growing. */
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != size || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
          (F_SEAL_SHRINK | F_SEAL_GROW)) {
    rv = ql__err_set(QL_EPROTO,
                     "the region's descriptor is not a sealed memfd of "
                     "%zu bytes",
                     size);
    goto fail;
  }
  base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    rv = ql__err_set(ql__errno_from_sys(errno), "mapping the region: %s",
                     strerror(errno));
    goto fail;
  }
  /* The pages are ours to populate: the daemon refuses requests on pages
   * nobody wrote rather than fault them into its own memory. */
  if ((rv = populate(base, size)) != 0)
    goto fail;
  if ((node = calloc(1, sizeof *node)) == NULL) {
    rv = ql__err_set(QL_ENOMEM, "allocating the region");
    goto fail;
  }
  close(fd);
  qlinear__v1__session_response__free_unpacked(r, NULL);
  node->pub.id = id;
  node->pub.size = size;
  node->pub.data = base;
  pthread_mutex_lock(&c->lock);
  node->next = c->regions;
  if (c->regions != NULL)
    c->regions->prev = node;
  c->regions = node;
  pthread_mutex_unlock(&c->lock);
  *out = &node->pub;
  return 0;

fail:
  if (base != MAP_FAILED)
    munmap(base, size);
  if (fd >= 0)
    close(fd);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  if (id != 0) {
    char saved[ERRBUF_SIZE];
    memcpy(saved, ql__errbuf, sizeof saved);
    destroy_remote(c, id);
    memcpy(ql__errbuf, saved, sizeof saved);
  }
  return rv;
}

QL_EXPORT int ql_region_destroy(ql_client *c, ql_region *r) {
  ql__err_clear();
  if (r == NULL)
    return 0;
  if (c == NULL)
    return ql__err_set(QL_EINVAL, "client is NULL");
  region_node *node = (region_node *)r, *p;
  pthread_mutex_lock(&c->lock);
  for (p = c->regions; p != NULL && p != node; p = p->next)
    ;
  if (p != NULL) {
    if (node->prev != NULL)
      node->prev->next = node->next;
    else
      c->regions = node->next;
    if (node->next != NULL)
      node->next->prev = node->prev;
  }
  pthread_mutex_unlock(&c->lock);
  if (p == NULL)
    return ql__err_set(QL_EINVAL, "not a region of this client");
  int rv = destroy_remote(c, node->pub.id);
  munmap(node->pub.data, node->pub.size);
  free(node);
  return rv;
}

/* ------------------------------------------------------ Level Zero IPC */

QL_EXPORT int ql_ze_import(ql_client *c, int fd,
                           const unsigned char handle[QL_ZE_IPC_HANDLE_BYTES],
                           const char *device, uint64_t *import_id,
                           uint64_t *size) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__ImportZeIpcRequest ir = QLINEAR__V1__IMPORT_ZE_IPC_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  int rv;

  ql__err_clear();
  if (import_id != NULL)
    *import_id = 0;
  if (c == NULL || handle == NULL || device == NULL || import_id == NULL ||
      fd < 0)
    return ql__err_set(QL_EINVAL,
                       "client, handle, device or output is NULL, or "
                       "the descriptor is negative");
  if (device[0] == '\0' || strlen(device) >= QL_DEVICE_NAME_MAX)
    return ql__err_set(QL_EINVAL, "device name empty or too long");
  ir.ipc_handle.data = (uint8_t *)handle; /* pack only reads it */
  ir.ipc_handle.len = QL_ZE_IPC_HANDLE_BYTES;
  ir.device = (char *)device;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_IMPORT_ZE_IPC;
  req.import_ze_ipc = &ir;
  if ((rv = ql__session_call_fd(
           c, &req, QLINEAR__V1__SESSION_RESPONSE__BODY_IMPORT_ZE_IPC, &r, NULL,
           fd)) != 0)
    return rv;
  if (r->import_ze_ipc->import_id == 0) {
    qlinear__v1__session_response__free_unpacked(r, NULL);
    return ql__err_set(QL_EPROTO, "the daemon sent import id 0");
  }
  *import_id = r->import_ze_ipc->import_id;
  if (size != NULL)
    *size = r->import_ze_ipc->size;
  qlinear__v1__session_response__free_unpacked(r, NULL);
  return 0;
}

QL_EXPORT int ql_ze_release(ql_client *c, uint64_t import_id) {
  Qlinear__V1__SessionRequest req = QLINEAR__V1__SESSION_REQUEST__INIT;
  Qlinear__V1__ReleaseImportRequest rr =
      QLINEAR__V1__RELEASE_IMPORT_REQUEST__INIT;
  Qlinear__V1__SessionResponse *r = NULL;
  int rv;

  ql__err_clear();
  if (c == NULL || import_id == 0)
    return ql__err_set(QL_EINVAL, "client is NULL or import id 0");
  rr.import_id = import_id;
  req.body_case = QLINEAR__V1__SESSION_REQUEST__BODY_RELEASE_IMPORT;
  req.release_import = &rr;
  rv = ql__session_call(
      c, &req, QLINEAR__V1__SESSION_RESPONSE__BODY_RELEASE_IMPORT, &r, NULL);
  if (r != NULL)
    qlinear__v1__session_response__free_unpacked(r, NULL);
  return rv;
}
