/*
 * golden_load.h - a check the daemon tests share: TorchAO's own weights
 * (tests/data/golden, made by TorchAO 0.18) and the float weights they came
 * from are one weight when loaded on a given device.
 */
#ifndef QL_TEST_GOLDEN_LOAD_H
#define QL_TEST_GOLDEN_LOAD_H

#include "qlinear/qlinear.h"

/*
 * For TorchAO's bf16 and f16 cases of q8c, f8r and q4g (group 128), loads
 * the float weight through c with ql_load_float() (default scale dtype) on
 * devices (a ql_load_desc.devices list; NULL: the daemon's default), then
 * TorchAO's packed tensors with ql_load_packed() under the same name on
 * the same devices: that second load must be shared, with the first's
 * digest, and the weight must hold scales in the dtype TorchAO stores
 * them in. The golden directory is $QL_TEST_DATA/golden. Unloads what it
 * loaded; returns the number of cases checked (a test failure aborts).
 */
int td_torchao_identity(ql_client *c, const char *devices);

#endif
