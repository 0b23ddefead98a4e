/* devices.c: the GPUs this process sees, by ordinal and UUID, and ordinal maps.
 *
 * The UUIDs are read from the driver when the server starts and again by the commands that run
 * after a driver restore (recreate, adopt, resume), never by `status`: the driver blocks every call
 * of a process it holds locked, and status must answer then too.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices.h"
#include "resolve.h"

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gs_devices cache;
static int known; /* atomic */

static void format_uuid(const CUuuid *u, char out[GS_UUID_LEN])
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, GS_UUID_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

void gs_devices_refresh(void)
{
    struct gs_devices d;
    memset(&d, 0, sizeof(d));
    int n = 0;
    if (CU(CUresult(*)(int *), cuDeviceGetCount, &n) != CUDA_SUCCESS)
        return;
    for (int i = 0; i < n && i < GS_MAX_DEV; i++) {
        CUdevice dev;
        CUuuid u;
        memset(&u, 0, sizeof(u));
        if (CU(CUresult(*)(CUdevice *, int), cuDeviceGet, &dev, i) != CUDA_SUCCESS)
            break;
        CUresult r = CU(CUresult(*)(CUuuid *, CUdevice), cuDeviceGetUuid_v2, &u, dev);
        if (r == CUDA_ERROR_NOT_FOUND) /* a driver without the _v2 entry point */
            r = CU(CUresult(*)(CUuuid *, CUdevice), cuDeviceGetUuid, &u, dev);
        if (r != CUDA_SUCCESS)
            break;
        format_uuid(&u, d.uuid[i]);
        d.n = i + 1;
    }
    pthread_mutex_lock(&dev_mu);
    cache = d;
    pthread_mutex_unlock(&dev_mu);
    __atomic_store_n(&known, 1, __ATOMIC_RELEASE);
}

int gs_devices_known(void) { return __atomic_load_n(&known, __ATOMIC_ACQUIRE); }

void gs_devices_get(struct gs_devices *out)
{
    pthread_mutex_lock(&dev_mu);
    *out = cache;
    pthread_mutex_unlock(&dev_mu);
}

/* ---- ordinal maps ----------------------------------------------------------------------------- */

void gs_devmap_identity(struct gs_devmap *m)
{
    for (int i = 0; i < GS_MAX_DEV; i++)
        m->to[i] = i;
}

static int ordinal(const char **p, int ndev, int *out)
{
    const char *s = *p;
    long v = 0;
    if (*s < '0' || *s > '9')
        return -1;
    while (*s >= '0' && *s <= '9' && v < GS_MAX_DEV)
        v = v * 10 + (*s++ - '0');
    if ((*s >= '0' && *s <= '9') || v >= ndev)
        return -2;
    *out = (int)v;
    *p = s;
    return 0;
}

int gs_devmap_parse(const char *spec, int ndev, struct gs_devmap *m, char *err, size_t errlen)
{
    unsigned char seen[GS_MAX_DEV] = {0};
    const char *p = spec;
    gs_devmap_identity(m);
    if (ndev > GS_MAX_DEV)
        ndev = GS_MAX_DEV;
    for (;;) {
        int from, to, r;
        if ((r = ordinal(&p, ndev, &from)) || *p++ != ':' || (r = ordinal(&p, ndev, &to))) {
            if (r == -2)
                snprintf(err, errlen, "\"devices\": an ordinal at byte %ld is not a device of this "
                         "process (it sees %d)", (long)(p - spec), ndev);
            else
                snprintf(err, errlen, "\"devices\" must be OLD:NEW pairs of device ordinals, "
                         "separated by commas (e.g. \"0:1,1:0\")");
            return -1;
        }
        if (seen[from]) {
            snprintf(err, errlen, "\"devices\" names device %d twice", from);
            return -1;
        }
        seen[from] = 1;
        m->to[from] = to;
        if (!*p)
            return 0;
        if (*p++ != ',') {
            snprintf(err, errlen, "\"devices\" must be OLD:NEW pairs of device ordinals, "
                     "separated by commas (e.g. \"0:1,1:0\")");
            return -1;
        }
    }
}

int gs_devmap_apply(const struct gs_devmap *m, int dev)
{
    return m && dev >= 0 && dev < GS_MAX_DEV ? m->to[dev] : dev;
}

/* ---- a context for the control threads --------------------------------------------------------- */

int gs_push_ctx(int dev)
{
    int n = 0;
    CU(CUresult(*)(int *), cuDeviceGetCount, &n);
    int pick = -1;
    for (int k = -1; k < n && pick < 0; k++) {
        int d = k < 0 ? dev : k;
        unsigned flags;
        int active = 0;
        if (d < 0 || d >= n)
            continue;
        if (CU(CUresult(*)(CUdevice, unsigned *, int *), cuDevicePrimaryCtxGetState, d, &flags,
               &active) == CUDA_SUCCESS && active)
            pick = d;
    }
    if (pick < 0)
        pick = dev >= 0 && dev < n ? dev : (n > 0 ? 0 : -1);
    if (pick < 0)
        return -1;
    CUcontext ctx;
    if (CU(CUresult(*)(CUcontext *, CUdevice), cuDevicePrimaryCtxRetain, &ctx, pick) != CUDA_SUCCESS)
        return -1;
    if (CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, ctx) != CUDA_SUCCESS) {
        CU(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease_v2, pick);
        return -1;
    }
    return pick;
}

void gs_pop_ctx(int pushed)
{
    if (pushed < 0)
        return;
    CUcontext old;
    CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
    CU(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease_v2, pushed);
}

CUresult gs_context_device(CUcontext ctx, int *dev)
{
    CUdevice d = 0;
    CUresult r = CU(CUresult(*)(CUdevice *, CUcontext), cuCtxGetDevice_v2, &d, ctx);
    if (r == CUDA_ERROR_NOT_FOUND) { /* older driver: push the context to ask it */
        CUcontext old;
        r = CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, ctx);
        if (r == CUDA_SUCCESS) {
            r = CU(CUresult(*)(CUdevice *), cuCtxGetDevice, &d);
            CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
        }
    }
    *dev = (int)d;
    return r;
}
