/* criu_gpushare_shim.h: the contract of libcriu_gpushare.so, the LD_PRELOAD shim.
 *
 * The shim runs inside each workload process. It owns structure, not bytes: it tracks what the
 * driver cannot restore, gates GPU work, and answers the tool on a control socket. It never links
 * libcuda; it finds the real driver (libcuda.so.1) at run time.
 *
 * How programs reach it (all three covered, for every name in hooks.def and each _v2/_ptds/_ptsz
 * variant listed there):
 *   - direct linking: every interposed function is exported under the driver's name, gated ones
 *     included (so programs linked against libcuda are held by the gates too);
 *   - dlsym(handle, "cu...") on any real library handle returns the wrapper when the driver's
 *     function is one the shim wraps; dlsym(RTLD_DEFAULT/RTLD_NEXT, ...) goes to glibc untouched
 *     (RTLD_DEFAULT finds the exported wrappers anyway; RTLD_NEXT lookups of driver functions are
 *     not wrapped);
 *   - cuGetProcAddress and cuGetProcAddress_v2 return the wrapper of whatever the driver returned
 *     (matched by pointer, so unversioned names and the per-thread-stream flag work).
 * The shim's own driver calls never go through its wrappers; a wrapper re-entered on one thread
 * passes straight through.
 *
 * What it tracks (status command, protocol.md): the devices it sees (ordinal and UUID), cuMem
 * allocations (POSIX-fd export capability is added to every cuMemCreate) and the GPU each lives
 * on, mappings with merged access, POSIX-fd exports (kept dups), imports linked to their exporter
 * (pid, allocation id), cuMemAlloc >= CRIU_GPUSHARE_MALLOC_MIN backed by exportable cuMem memory,
 * and so are stream-ordered allocations of that size from device pools without export handle
 * types, size limit or usage flags
 * (freed blocks kept per pool, up to its release threshold, for reuse at the same size),
 * CUDA IPC of that memory served through the shim, page-locked host memory (cuMemHostAlloc/
 * cuMemAllocHost are mmap + register, so they can be re-registered), peer access, multicast objects
 * and binds. Imports it cannot restore (CUDA IPC of memory not allocated through a shim, imports
 * no shim claims as exporter, memory pools imported from another process) are listed so a
 * checkpoint refuses them.
 *
 * Legacy CUDA IPC: memory the shim backs gets a handle served by the shim (an fd export); other
 * memory the driver can share (a small cuMemAlloc) gets a lazy handle, for which the exporter's
 * shim takes the driver's handle only when someone opens it, so a handle not yet opened survives
 * the exporter's checkpoints. An opened one is a driver IPC import, which a checkpoint refuses.
 *
 * Suspend/resume re-creates released memory at the same VAs; a devices map ("0:1,1:0") puts it on
 * other GPUs of this process, with everything recorded for the old ordinal following.
 *
 * Gates (quiesce/resume): launch gate = cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 * cuGraphLaunch; memory gate = copies, memsets, stream memory operations, cuLaunchHostFunc (each
 * with its _ptds/_ptsz twin). Not gated: copies to or from CUDA arrays, batched copies, managed
 * prefetch. The drain synchronizes every active primary context and every context the program
 * made with cuCtxCreate (green contexts are not covered). A host function that calls a gated
 * function while the gates close makes the drain time out (busy), never deadlock.
 *
 * Environment:
 *   CRIU_GPUSHARE_MALLOC_MIN  bytes (default 2097152): cuMemAlloc and stream-ordered allocations
 *                             of at least this much are backed by exportable cuMem memory; 0 turns
 *                             the backing off.
 *   CRIU_GPUSHARE_POOLS       0: stream-ordered allocations stay the driver's pools' (which reuse
 *                             freed memory for any size; a checkpoint then moves them through the
 *                             driver's slower path); default 1.
 *
 * Exported for tools (resolve with dlsym on the loaded shim):
 *   criu_gpushare_shim_version()   "MAJOR.MINOR.PATCH", the package version it was built with
 *   criu_gpushare_shim_protocol()  the control-protocol version (an integer, see protocol.md)
 * Also exported: dlsym, and the driver functions listed in hooks.def.
 *
 * Control socket: abstract "\0criu-gpushare.<pid>", SOCK_SEQPACKET, JSON, protocol version
 * CRIU_GPUSHARE_PROTOCOL (another version is answered with error "version"); see shim/protocol.md.
 * It serves only root and the process's own euid, and sends fds to and believes answers from only
 * peer shims of those users whose pid matches their name; a stranger's socket or connections cost
 * the program nothing measurable.
 *
 * Sources: shim/README.md has the module map and its layers.
 */
#ifndef CRIU_GPUSHARE_SHIM_H
#define CRIU_GPUSHARE_SHIM_H

#define CRIU_GPUSHARE_SHIM_VERSION "0.1.0"
#define CRIU_GPUSHARE_PROTOCOL 2

#define GS_EXPORT __attribute__((visibility("default")))

GS_EXPORT const char *criu_gpushare_shim_version(void);
GS_EXPORT int criu_gpushare_shim_protocol(void);

#endif
