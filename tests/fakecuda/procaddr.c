/* cuGetProcAddress and cuGetProcAddress_v2: the entry-point table.
 *
 * Callers (cuda-bindings, cudart, NCCL, the shim) ask for unversioned names with the CUDA version
 * they were built for, e.g. ("cuMemAlloc", 3020) or ("cuCtxGetDevice", 13000). As the driver does,
 * the answer is the newest variant introduced at or before that version, and its _ptds/_ptsz twin
 * when CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM is asked. Names the fake lacks give
 * CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; names known only from a later
 * version give CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. */
#include "fake.h"

#include <string.h>

/* E(name, version, symbol): a plain entry; T(name, version, symbol, per-thread twin). */
#define FK_PROCS(E, T)                                                                  \
    E("cuGetErrorString", 6000, cuGetErrorString)                                       \
    E("cuGetErrorName", 6000, cuGetErrorName)                                           \
    E("cuInit", 2000, cuInit)                                                           \
    E("cuDriverGetVersion", 2020, cuDriverGetVersion)                                   \
    E("cuGetProcAddress", 11030, cuGetProcAddress)                                      \
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2)                                   \
    E("cuDeviceGet", 2000, cuDeviceGet)                                                 \
    E("cuDeviceGetCount", 2000, cuDeviceGetCount)                                       \
    E("cuDeviceGetName", 2000, cuDeviceGetName)                                         \
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid)                                         \
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2)                                     \
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2)                                    \
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute)                               \
    E("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId)                                 \
    E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer)                             \
    E("cuDeviceGetP2PAttribute", 8000, cuDeviceGetP2PAttribute)                         \
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain)                       \
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2)                 \
    E("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2)               \
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState)                   \
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2)                     \
    E("cuCtxCreate", 3020, cuCtxCreate_v2)                                              \
    E("cuCtxCreate", 11040, cuCtxCreate_v3)                                             \
    E("cuCtxCreate", 12050, cuCtxCreate_v4)                                             \
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2)                                            \
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2)                                    \
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2)                                      \
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent)                                         \
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent)                                         \
    E("cuCtxGetDevice", 2000, cuCtxGetDevice)                                           \
    E("cuCtxGetDevice", 13000, cuCtxGetDevice_v2)                                       \
    E("cuCtxGetFlags", 7000, cuCtxGetFlags)                                             \
    E("cuCtxGetId", 12000, cuCtxGetId)                                                  \
    E("cuCtxSynchronize", 2000, cuCtxSynchronize)                                       \
    E("cuCtxSynchronize", 13000, cuCtxSynchronize_v2)                                   \
    E("cuCtxSetLimit", 3010, cuCtxSetLimit)                                             \
    E("cuCtxGetLimit", 3010, cuCtxGetLimit)                                             \
    E("cuCtxGetApiVersion", 3020, cuCtxGetApiVersion)                                   \
    E("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange)                 \
    E("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess)                             \
    E("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess)                           \
    E("cuModuleLoadData", 2000, cuModuleLoadData)                                       \
    E("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx)                                   \
    E("cuModuleUnload", 2000, cuModuleUnload)                                           \
    E("cuModuleGetFunction", 2000, cuModuleGetFunction)                                 \
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2)                                            \
    T("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz)                  \
    T("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz) \
    T("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz)                     \
    T("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz)       \
    T("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz) \
    T("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz)          \
    E("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode)    \
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool)                    \
    E("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool)                                  \
    E("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool)                                  \
    E("cuMemPoolCreate", 11020, cuMemPoolCreate)                                        \
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy)                                      \
    E("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute)                            \
    E("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute)                            \
    E("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo)                                        \
    E("cuMemPoolSetAccess", 11020, cuMemPoolSetAccess)                                  \
    E("cuMemPoolExportToShareableHandle", 11020, cuMemPoolExportToShareableHandle)      \
    E("cuMemPoolImportFromShareableHandle", 11020, cuMemPoolImportFromShareableHandle)  \
    E("cuMemAlloc", 3020, cuMemAlloc_v2)                                                \
    E("cuMemFree", 3020, cuMemFree_v2)                                                  \
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2)                            \
    E("cuMemAllocHost", 3020, cuMemAllocHost_v2)                                        \
    E("cuMemFreeHost", 2000, cuMemFreeHost)                                             \
    E("cuMemHostAlloc", 2020, cuMemHostAlloc)                                           \
    E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2)                  \
    E("cuMemHostGetFlags", 2030, cuMemHostGetFlags)                                     \
    E("cuMemHostRegister", 6050, cuMemHostRegister_v2)                                  \
    E("cuMemHostUnregister", 4000, cuMemHostUnregister)                                 \
    E("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle)                                     \
    E("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2)                               \
    E("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle)                                 \
    E("cuIpcGetEventHandle", 4010, cuIpcGetEventHandle)                                 \
    E("cuIpcOpenEventHandle", 4010, cuIpcOpenEventHandle)                               \
    T("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds)                                        \
    T("cuMemcpyPeer", 4000, cuMemcpyPeer, cuMemcpyPeer_ptds)                            \
    T("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)                      \
    T("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)                      \
    T("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)                      \
    T("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz)                         \
    T("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz)             \
    T("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)       \
    T("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)       \
    T("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz)       \
    T("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds)                            \
    T("cuMemsetD16", 3020, cuMemsetD16_v2, cuMemsetD16_v2_ptds)                         \
    T("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds)                         \
    T("cuMemsetD2D8", 3020, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds)                      \
    T("cuMemsetD2D16", 3020, cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds)                   \
    T("cuMemsetD2D32", 3020, cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds)                   \
    T("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz)                   \
    T("cuMemsetD16Async", 3020, cuMemsetD16Async, cuMemsetD16Async_ptsz)                \
    T("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz)                \
    T("cuMemsetD2D8Async", 3020, cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz)             \
    T("cuMemsetD2D16Async", 3020, cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz)          \
    T("cuMemsetD2D32Async", 3020, cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz)          \
    T("cuMemcpy2D", 3020, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds)                            \
    T("cuMemcpy2DUnaligned", 3020, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds) \
    T("cuMemcpy3D", 3020, cuMemcpy3D_v2, cuMemcpy3D_v2_ptds)                            \
    T("cuMemcpy3DPeer", 4000, cuMemcpy3DPeer, cuMemcpy3DPeer_ptds)                      \
    T("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz)             \
    T("cuMemcpy3DAsync", 3020, cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz)             \
    T("cuMemcpy3DPeerAsync", 4000, cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz)       \
    T("cuStreamWriteValue32", 11070, cuStreamWriteValue32_v2, cuStreamWriteValue32_v2_ptsz) \
    T("cuStreamWriteValue64", 11070, cuStreamWriteValue64_v2, cuStreamWriteValue64_v2_ptsz) \
    T("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2, cuStreamWaitValue32_v2_ptsz) \
    T("cuStreamWaitValue64", 11070, cuStreamWaitValue64_v2, cuStreamWaitValue64_v2_ptsz) \
    T("cuStreamBatchMemOp", 11070, cuStreamBatchMemOp_v2, cuStreamBatchMemOp_v2_ptsz)   \
    T("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz) \
    T("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz)                        \
    E("cuStreamCreate", 2000, cuStreamCreate)                                           \
    E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority)                   \
    T("cuStreamGetPriority", 5050, cuStreamGetPriority, cuStreamGetPriority_ptsz)       \
    T("cuStreamGetFlags", 5050, cuStreamGetFlags, cuStreamGetFlags_ptsz)                \
    T("cuStreamGetId", 12000, cuStreamGetId, cuStreamGetId_ptsz)                        \
    T("cuStreamGetCtx", 9020, cuStreamGetCtx, cuStreamGetCtx_ptsz)                      \
    T("cuStreamGetCtx", 12050, cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz)               \
    T("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz)             \
    T("cuStreamAddCallback", 5000, cuStreamAddCallback, cuStreamAddCallback_ptsz)       \
    T("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz)                         \
    T("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz)       \
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2)                                      \
    E("cuEventCreate", 2000, cuEventCreate)                                             \
    T("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz)                         \
    T("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz) \
    E("cuEventQuery", 2000, cuEventQuery)                                               \
    E("cuEventSynchronize", 2000, cuEventSynchronize)                                   \
    E("cuEventDestroy", 4000, cuEventDestroy_v2)                                        \
    E("cuEventElapsedTime", 2000, cuEventElapsedTime)                                   \
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2)                               \
    T("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz)                      \
    T("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz)               \
    T("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz)               \
    E("cuPointerGetAttribute", 4000, cuPointerGetAttribute)                             \
    E("cuPointerSetAttribute", 6000, cuPointerSetAttribute)                             \
    E("cuPointerGetAttributes", 7000, cuPointerGetAttributes)                           \
    E("cuMemAddressReserve", 10020, cuMemAddressReserve)                                \
    E("cuMemAddressFree", 10020, cuMemAddressFree)                                      \
    E("cuMemCreate", 10020, cuMemCreate)                                                \
    E("cuMemRelease", 10020, cuMemRelease)                                              \
    E("cuMemMap", 10020, cuMemMap)                                                      \
    E("cuMemUnmap", 10020, cuMemUnmap)                                                  \
    E("cuMemSetAccess", 10020, cuMemSetAccess)                                          \
    E("cuMemGetAccess", 10020, cuMemGetAccess)                                          \
    E("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle)              \
    E("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle)          \
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity)            \
    E("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle) \
    E("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle)                \
    E("cuMulticastCreate", 12010, cuMulticastCreate)                                    \
    E("cuMulticastAddDevice", 12010, cuMulticastAddDevice)                              \
    E("cuMulticastBindMem", 12010, cuMulticastBindMem)                                  \
    E("cuMulticastBindAddr", 12010, cuMulticastBindAddr)                                \
    E("cuMulticastUnbind", 12010, cuMulticastUnbind)                                    \
    E("cuMulticastGetGranularity", 12010, cuMulticastGetGranularity)                    \
    E("cuCheckpointProcessGetRestoreThreadId", 12080, cuCheckpointProcessGetRestoreThreadId) \
    E("cuCheckpointProcessGetState", 12080, cuCheckpointProcessGetState)                \
    E("cuCheckpointProcessLock", 12080, cuCheckpointProcessLock)                        \
    E("cuCheckpointProcessCheckpoint", 12080, cuCheckpointProcessCheckpoint)            \
    E("cuCheckpointProcessRestore", 12080, cuCheckpointProcessRestore)                  \
    E("cuCheckpointProcessUnlock", 12080, cuCheckpointProcessUnlock)

/* Declare every symbol by its assembler name, so the table needs none of the prototypes. */
#define FK_DECL_E(name, version, sym) extern char fkp_##sym __asm__(#sym);
#define FK_DECL_T(name, version, sym, twin) FK_DECL_E(name, version, sym) FK_DECL_E(name, version, twin)
FK_PROCS(FK_DECL_E, FK_DECL_T)

struct fk_proc { const char *name; int version; void *fn; void *twin; };
#define FK_ROW_E(name, version, sym) {name, version, &fkp_##sym, NULL},
#define FK_ROW_T(name, version, sym, twin) {name, version, &fkp_##sym, &fkp_##twin},
static const struct fk_proc fk_procs[] = {FK_PROCS(FK_ROW_E, FK_ROW_T)};

static CUresult fk_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    const struct fk_proc *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof fk_procs / sizeof fk_procs[0]; i++) {
        const struct fk_proc *p = &fk_procs[i];
        if (strcmp(p->name, symbol) != 0) continue;
        known = 1;
        if (p->version <= version && (!best || p->version > best->version)) best = p;
    }
    *pfn = NULL;
    if (!best) {
        if (status) *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->twin ? best->twin : best->fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    CUresult r = fk_fail_point("cuGetProcAddress_v2");
    if (r != CUDA_SUCCESS) return r;
    return fk_lookup(symbol, pfn, cudaVersion, flags, status);
}

FK_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CUresult r = fk_fail_point("cuGetProcAddress");
    if (r != CUDA_SUCCESS) return r;
    return fk_lookup(symbol, pfn, cudaVersion, flags, NULL);
}
