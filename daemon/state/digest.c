#include <openssl/evp.h>

#include "state/digest.h"

int ql__qweight_digest(const ql_qweight *q, uint8_t out[QL_DIGEST_BYTES]) {
  int rc = QL_EINTERNAL;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == NULL)
    return QL_ENOMEM;
  uint64_t hdr[7] = {1 /* layout version */, (uint64_t)q->format,
                     q->group_size, (uint64_t)q->n, (uint64_t)q->k,
                     (uint64_t)q->scale_dtype, q->bias != NULL};
  unsigned int len = 0;
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
      EVP_DigestUpdate(ctx, "qlinear-weight", 14) != 1 ||
      EVP_DigestUpdate(ctx, hdr, sizeof hdr) != 1 ||
      EVP_DigestUpdate(ctx, q->qdata, q->qdata_bytes) != 1 ||
      EVP_DigestUpdate(ctx, q->scale, q->scale_bytes) != 1)
    goto done;
  if (q->zero != NULL && EVP_DigestUpdate(ctx, q->zero, q->scale_bytes) != 1)
    goto done;
  if (q->bias != NULL &&
      EVP_DigestUpdate(ctx, q->bias, (size_t)q->n * sizeof(float)) != 1)
    goto done;
  if (EVP_DigestFinal_ex(ctx, out, &len) != 1 || len != QL_DIGEST_BYTES)
    goto done;
  rc = 0;
done:
  EVP_MD_CTX_free(ctx);
  return rc;
}

int ql__source_digest(const ql_source_spec *spec, const void *data,
                      size_t len, uint8_t out[QL_DIGEST_BYTES]) {
  int rc = QL_EINTERNAL;
  uint8_t hdr[QL_SOURCE_HEADER_BYTES];
  unsigned int olen = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == NULL)
    return QL_ENOMEM;
  ql_source_header(spec, hdr);
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
      EVP_DigestUpdate(ctx, hdr, sizeof hdr) != 1 ||
      (len > 0 && EVP_DigestUpdate(ctx, data, len) != 1) ||
      EVP_DigestFinal_ex(ctx, out, &olen) != 1 || olen != QL_DIGEST_BYTES)
    goto done;
  rc = 0;
done:
  EVP_MD_CTX_free(ctx);
  return rc;
}
