/* Strided copies (cuMemcpy2D/3D and their peer and async forms), stream memory operations
 * (cuStreamWriteValue*, cuStreamWaitValue*, cuStreamBatchMemOp), cooperative launches and
 * cuGraphLaunch (the fake has no graphs), each with its _ptds/_ptsz twin. */
#include "fake.h"

#include <string.h>
#include <unistd.h>

/* Where one side of a 2D/3D copy starts; arrays are not modelled. */
static CUresult fk_side(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t z,
                        size_t pitch, size_t height, uintptr_t *out, int *device_side)
{
    uintptr_t base;
    switch (type) {
    case CU_MEMORYTYPE_HOST: base = (uintptr_t)host; *device_side = 0; break;
    case CU_MEMORYTYPE_DEVICE: base = (uintptr_t)dev; *device_side = 1; break;
    case CU_MEMORYTYPE_UNIFIED: base = (uintptr_t)dev; *device_side = 0; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!base) return CUDA_ERROR_INVALID_VALUE;
    *out = base + z * pitch * height + y * pitch + x;
    return CUDA_SUCCESS;
}

static CUresult fk_copy3d_generic(CUmemorytype st, const void *sh, CUdeviceptr sd, size_t sx, size_t sy, size_t sz,
                                  size_t spitch, size_t sheight, CUmemorytype dt, void *dh, CUdeviceptr dd,
                                  size_t dx, size_t dy, size_t dz, size_t dpitch, size_t dheight, size_t width,
                                  size_t height, size_t depth, CUstream hs, int pt, int sync)
{
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if (width == 0 || height == 0 || depth == 0) return CUDA_SUCCESS;
    if (height > 1 && (spitch < width || dpitch < width)) return CUDA_ERROR_INVALID_VALUE;
    if (depth > 1 && (sheight < height || dheight < height)) return CUDA_ERROR_INVALID_VALUE;
    struct fk_copy3d c = {0};
    int src_dev, dst_dev;
    if ((r = fk_side(st, sh, sd, sx, sy, sz, spitch, sheight, &c.src, &src_dev)) ||
        (r = fk_side(dt, dh, dd, dx, dy, dz, dpitch, dheight, &c.dst, &dst_dev)))
        return r;
    c.width = width;
    c.height = height;
    c.depth = depth;
    c.spitch = spitch;
    c.dpitch = dpitch;
    c.sslice = spitch * sheight;
    c.dslice = dpitch * dheight;
    size_t sspan = (depth - 1) * c.sslice + (height - 1) * spitch + width;
    size_t dspan = (depth - 1) * c.dslice + (height - 1) * dpitch + width;
    if ((r = fk_check_range(c.src, sspan, src_dev, 0)) || (r = fk_check_range(c.dst, dspan, dst_dev, 1))) return r;
    return fk_submit_copy3d(&c, hs, pt, sync);
}

static CUresult fk_copy2d(const CUDA_MEMCPY2D *p, CUstream hs, int pt, int sync)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return fk_copy3d_generic(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, 0, p->srcPitch, 0,
                             p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes, p->dstY, 0, p->dstPitch, 0,
                             p->WidthInBytes, p->Height, 1, hs, pt, sync);
}

static CUresult fk_copy3d(const CUDA_MEMCPY3D *p, CUstream hs, int pt, int sync)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return fk_copy3d_generic(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, p->srcZ,
                             p->srcPitch, p->srcHeight, p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes,
                             p->dstY, p->dstZ, p->dstPitch, p->dstHeight, p->WidthInBytes, p->Height, p->Depth, hs,
                             pt, sync);
}

static CUresult fk_copy3d_peer(const CUDA_MEMCPY3D_PEER *p, CUstream hs, int pt, int sync)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    return fk_copy3d_generic(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcXInBytes, p->srcY, p->srcZ,
                             p->srcPitch, p->srcHeight, p->dstMemoryType, p->dstHost, p->dstDevice, p->dstXInBytes,
                             p->dstY, p->dstZ, p->dstPitch, p->dstHeight, p->WidthInBytes, p->Height, p->Depth, hs,
                             pt, sync);
}

#define C2D_BODY(pt) fk_copy2d(p, NULL, pt, 1)
#define C3D_BODY(pt) fk_copy3d(p, NULL, pt, 1)
#define C3DP_BODY(pt) fk_copy3d_peer(p, NULL, pt, 1)
#define C2DA_BODY(pt) fk_copy2d(p, hs, pt, 0)
#define C3DA_BODY(pt) fk_copy3d(p, hs, pt, 0)
#define C3DPA_BODY(pt) fk_copy3d_peer(p, hs, pt, 0)
FK_PAIR(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D *p), C2D_BODY)
FK_PAIR(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D *p), C2D_BODY)
FK_PAIR(cuMemcpy3D_v2, cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D *p), C3D_BODY)
FK_PAIR(cuMemcpy3DPeer, cuMemcpy3DPeer_ptds, (const CUDA_MEMCPY3D_PEER *p), C3DP_BODY)
FK_PAIR(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D *p, CUstream hs), C2DA_BODY)
FK_PAIR(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D *p, CUstream hs), C3DA_BODY)
FK_PAIR(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz, (const CUDA_MEMCPY3D_PEER *p, CUstream hs), C3DPA_BODY)

/* ---- stream memory operations --------------------------------------------------------------- */

static int fk_wait_done(const struct fk_memop *m)
{
    unsigned long long v = m->bits == 32 ? __atomic_load_n((uint32_t *)m->addr, __ATOMIC_ACQUIRE)
                                         : __atomic_load_n((uint64_t *)m->addr, __ATOMIC_ACQUIRE);
    switch (m->flags & 0x3) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return m->bits == 32 ? (int32_t)((uint32_t)v - (uint32_t)m->value) >= 0 : (int64_t)(v - m->value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == m->value;
    case CU_STREAM_WAIT_VALUE_AND: return (v & m->value) != 0;
    default: /* NOR */
        return m->bits == 32 ? (uint32_t)~(v | m->value) != 0 : ~(v | m->value) != 0;
    }
}

void fk_run_memop(const struct fk_memop *m)
{
    if (m->write) {
        if (m->bits == 32) __atomic_store_n((uint32_t *)m->addr, (uint32_t)m->value, __ATOMIC_RELEASE);
        else __atomic_store_n((uint64_t *)m->addr, (uint64_t)m->value, __ATOMIC_RELEASE);
        return;
    }
    while (!fk_wait_done(m)) usleep(50);
}

static CUresult fk_memop(CUstream hs, CUdeviceptr addr, unsigned long long value, unsigned flags, int write, int bits,
                         int pt)
{
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if ((uintptr_t)addr % (unsigned)(bits / 8)) return CUDA_ERROR_INVALID_VALUE;
    if ((r = fk_check_range((uintptr_t)addr, (size_t)bits / 8, 1, write))) return r;
    struct fk_memop m = {write, bits, (uintptr_t)addr, value, flags};
    return fk_submit_memop(&m, hs, pt);
}

#define W32_BODY(pt) fk_memop(hs, addr, value, flags, 1, 32, pt)
#define W64_BODY(pt) fk_memop(hs, addr, value, flags, 1, 64, pt)
#define WT32_BODY(pt) fk_memop(hs, addr, value, flags, 0, 32, pt)
#define WT64_BODY(pt) fk_memop(hs, addr, value, flags, 0, 64, pt)
FK_PAIR(cuStreamWriteValue32_v2, cuStreamWriteValue32_v2_ptsz,
        (CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags), W32_BODY)
FK_PAIR(cuStreamWriteValue64_v2, cuStreamWriteValue64_v2_ptsz,
        (CUstream hs, CUdeviceptr addr, cuuint64_t value, unsigned int flags), W64_BODY)
FK_PAIR(cuStreamWaitValue32_v2, cuStreamWaitValue32_v2_ptsz,
        (CUstream hs, CUdeviceptr addr, cuuint32_t value, unsigned int flags), WT32_BODY)
FK_PAIR(cuStreamWaitValue64_v2, cuStreamWaitValue64_v2_ptsz,
        (CUstream hs, CUdeviceptr addr, cuuint64_t value, unsigned int flags), WT64_BODY)

static CUresult fk_batch(CUstream hs, unsigned count, CUstreamBatchMemOpParams *ops, unsigned flags, int pt)
{
    if (flags != 0 || (count && !ops)) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++) {
        CUresult r = CUDA_SUCCESS;
        switch (ops[i].operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
            r = fk_memop(hs, ops[i].waitValue.address, ops[i].waitValue.value, ops[i].waitValue.flags, 0, 32, pt);
            break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            r = fk_memop(hs, ops[i].waitValue.address, ops[i].waitValue.value64, ops[i].waitValue.flags, 0, 64, pt);
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
            r = fk_memop(hs, ops[i].writeValue.address, ops[i].writeValue.value, 0, 1, 32, pt);
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            r = fk_memop(hs, ops[i].writeValue.address, ops[i].writeValue.value64, 0, 1, 64, pt);
            break;
        case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        case CU_STREAM_MEM_OP_BARRIER:
            break; /* host memory is coherent */
        default:
            r = CUDA_ERROR_INVALID_VALUE;
        }
        if (r) return r;
    }
    return CUDA_SUCCESS;
}
#define BATCH_BODY(pt) fk_batch(hs, count, ops, flags, pt)
FK_PAIR(cuStreamBatchMemOp_v2, cuStreamBatchMemOp_v2_ptsz,
        (CUstream hs, unsigned int count, CUstreamBatchMemOpParams *ops, unsigned int flags), BATCH_BODY)

/* ---- cooperative launches and graphs -------------------------------------------------------- */

#define COOP_BODY(pt) \
    ((void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, fk_launch_function(f, hs, params, pt))
FK_PAIR(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz,
        (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
         unsigned int bz, unsigned int shm, CUstream hs, void **params),
        COOP_BODY)

/* The fake cannot instantiate graphs, so no graph exec handle is ever valid. */
#define GRAPH_BODY(pt) ((void)pt, (void)exec, (void)hs, CUDA_ERROR_INVALID_HANDLE)
FK_PAIR(cuGraphLaunch, cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream hs), GRAPH_BODY)
