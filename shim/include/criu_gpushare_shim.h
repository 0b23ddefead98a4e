/* criu_gpushare_shim.h: the contract of libcriu_gpushare.so, the LD_PRELOAD shim.
 *
 * The shim runs inside each workload process. It owns structure, not bytes: it tracks what the
 * driver cannot restore, gates GPU work, and answers the tool on a control socket. It never links
 * libcuda; it finds the real driver at run time.
 *
 * Exported for tools (resolve with dlsym on the loaded shim):
 *   criu_gpushare_shim_version()   "MAJOR.MINOR.PATCH", the package version it was built with
 *   criu_gpushare_shim_protocol()  the control-protocol version (an integer, see protocol.md)
 */
#ifndef CRIU_GPUSHARE_SHIM_H
#define CRIU_GPUSHARE_SHIM_H

#define CRIU_GPUSHARE_SHIM_VERSION "0.1.0"
#define CRIU_GPUSHARE_PROTOCOL 1

#define GS_EXPORT __attribute__((visibility("default")))

GS_EXPORT const char *criu_gpushare_shim_version(void);
GS_EXPORT int criu_gpushare_shim_protocol(void);

#endif
