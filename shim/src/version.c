/* version.c: what the shim says it is, for `criu-gpushare doctor` and the tool's handshake. */
#include "criu_gpushare_shim.h"

const char *criu_gpushare_shim_version(void) { return CRIU_GPUSHARE_SHIM_VERSION; }

int criu_gpushare_shim_protocol(void) { return CRIU_GPUSHARE_PROTOCOL; }
