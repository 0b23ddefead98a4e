/* Initialisation, configuration, devices, contexts, peer access, the API gate and fault injection. */
#include "fake.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct fk_global fk = {
    .mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP,
    .gate_mu = PTHREAD_MUTEX_INITIALIZER,
    .gate_cv = PTHREAD_COND_INITIALIZER,
    .next_handle = 0x100000,
};

void fk_lock(void) { pthread_mutex_lock(&fk.mu); }
void fk_unlock(void) { pthread_mutex_unlock(&fk.mu); }

void fk_log(const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakecuda: %s\n", line);
}

double fk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- fault injection: FAKECUDA_FAIL="cuMemCreate=3,cuCheckpointProcessLock=1:2" ------------ */

#define FK_MAX_FAILS 32
static struct { char name[64]; long nth; CUresult code; long seen; } fk_fails[FK_MAX_FAILS];
static int fk_nfails = -1;
static pthread_mutex_t fk_fail_mu = PTHREAD_MUTEX_INITIALIZER;

static void fk_fail_parse(void)
{
    const char *spec = getenv("FAKECUDA_FAIL");
    fk_nfails = 0;
    if (!spec || !*spec) return;
    char *copy = strdup(spec), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && fk_nfails < FK_MAX_FAILS;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) { fk_log("FAKECUDA_FAIL: ignoring '%s' (want name=N[:CODE])", tok); continue; }
        *eq = 0;
        char *colon = strchr(eq + 1, ':');
        if (colon) *colon = 0;
        snprintf(fk_fails[fk_nfails].name, sizeof fk_fails[0].name, "%s", tok);
        fk_fails[fk_nfails].nth = atol(eq + 1);
        fk_fails[fk_nfails].code = colon ? (CUresult)atoi(colon + 1) : CUDA_ERROR_UNKNOWN;
        fk_fails[fk_nfails].seen = 0;
        fk_nfails++;
    }
    free(copy);
}

/* Names are matched without the _v2/_v3/_ptds/_ptsz suffixes, so "cuMemAlloc" covers cuMemAlloc_v2. */
static void fk_base_name(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s", name);
    static const char *suffixes[] = {"_ptds", "_ptsz", "_v2", "_v3", "_v4"};
    for (int again = 1; again;) {
        again = 0;
        size_t len = strlen(out);
        for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
            size_t sl = strlen(suffixes[i]);
            if (len > sl && strcmp(out + len - sl, suffixes[i]) == 0) {
                out[len - sl] = 0;
                again = 1;
                break;
            }
        }
    }
}

CUresult fk_fail_point(const char *name)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fk_fail_mu);
    if (fk_nfails < 0) fk_fail_parse();
    if (fk_nfails > 0) {
        char base[64];
        fk_base_name(name, base, sizeof base);
        for (int i = 0; i < fk_nfails; i++) {
            if (strcmp(fk_fails[i].name, base) != 0) continue;
            if (++fk_fails[i].seen == fk_fails[i].nth) {
                r = fk_fails[i].code;
                fk_log("FAKECUDA_FAIL: %s call %ld fails with %d", base, fk_fails[i].nth, (int)r);
            }
        }
    }
    pthread_mutex_unlock(&fk_fail_mu);
    return r;
}

/* ---- the API gate: while a checkpoint lock is held, the process's own calls wait ------------ */

static __thread int fk_in_api; /* nested public calls (one entry point calling another) */

CUresult fk_enter(const char *name, int gate)
{
    if (!fk.initialized || fk.forked) return CUDA_ERROR_NOT_INITIALIZED;
    static int trace = -1;
    if (trace < 0) trace = getenv("FAKECUDA_TRACE") != NULL;
    if (trace) fk_log("%d: %s", (int)getpid(), name);
    CUresult r = fk_fail_point(name);
    if (r != CUDA_SUCCESS || !gate) return r;
    pthread_mutex_lock(&fk.gate_mu);
    if (fk_in_api == 0)
        while (fk.cstate != FK_RUNNING || fk.locking) pthread_cond_wait(&fk.gate_cv, &fk.gate_mu);
    fk.inflight++;
    fk_in_api++;
    pthread_mutex_unlock(&fk.gate_mu);
    return CUDA_SUCCESS;
}

void fk_leave_cleanup(int *entered)
{
    if (!*entered) return;
    pthread_mutex_lock(&fk.gate_mu);
    fk_in_api--;
    if (fk.inflight > 0) fk.inflight--;
    pthread_cond_broadcast(&fk.gate_cv);
    pthread_mutex_unlock(&fk.gate_mu);
}

/* ---- init and devices -------------------------------------------------------------------- */

static unsigned long long fk_splitmix(unsigned long long *x)
{
    unsigned long long z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fk_configure(void)
{
    const char *s = getenv("FAKECUDA_DEVICES");
    fk.ndev = s ? atoi(s) : 2;
    if (fk.ndev < 0) fk.ndev = 0;
    if (fk.ndev > FK_MAX_DEVICES) fk.ndev = FK_MAX_DEVICES;
    s = getenv("FAKECUDA_MEM_MB");
    size_t mb = s ? strtoull(s, NULL, 10) : 4096;
    unsigned long long seed = 0;
    s = getenv("FAKECUDA_UUID_SEED");
    if (s)
        for (const char *c = s; *c; c++) seed = seed * 131 + (unsigned char)*c;
    for (int i = 0; i < fk.ndev; i++) {
        struct fk_device *d = &fk.dev[i];
        snprintf(d->name, sizeof d->name, "Fake CUDA Device %d", i);
        unsigned long long x = seed * 1000003ull + (unsigned long long)i + 1;
        unsigned long long a = fk_splitmix(&x), b = fk_splitmix(&x);
        memcpy(d->uuid.bytes, &a, 8);
        memcpy(d->uuid.bytes + 8, &b, 8);
        d->total = mb << 20;
        d->primary.magic = FK_CTX_MAGIC;
        d->primary.dev = i;
        d->primary.primary = 1;
        d->primary.id = (unsigned long long)i + 1;
        d->primary.stack = FK_DEFAULT_STACK;
    }
    s = getenv("FAKECUDA_STATE");
    if (s && *s)
        snprintf(fk.state_dir, sizeof fk.state_dir, "%s", s);
    else
        snprintf(fk.state_dir, sizeof fk.state_dir, "/tmp/fakecuda-%u", (unsigned)getuid());
    for (char *slash = fk.state_dir + 1; (slash = strchr(slash, '/')); slash++) {
        *slash = 0; /* mkdir -p */
        mkdir(fk.state_dir, 0777);
        *slash = '/';
    }
    mkdir(fk.state_dir, 0777);
    /* The restore threads' socket names derive from this path: make it the same in every process. */
    char *real = realpath(fk.state_dir, NULL);
    if (real) {
        snprintf(fk.state_dir, sizeof fk.state_dir, "%s", real);
        free(real);
    }
    char usage[600];
    snprintf(usage, sizeof usage, "%s/usage", fk.state_dir);
    mkdir(usage, 0777);
    /* Every allocation keeps an fd: make room for many of them. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max && rl.rlim_cur < 65536) {
        rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static CUresult fk_arena_init(void);

/* A child forked after cuInit cannot use CUDA, as with the real driver: its stream workers and
 * restore thread do not exist in it. */
static void fk_after_fork_in_child(void)
{
    if (fk.initialized) fk.forked = 1;
}

/* The usage file of an exiting process is removed (the reader also skips dead pids). */
__attribute__((destructor)) static void fk_at_exit(void)
{
    if (fk.initialized && !fk.forked && fk.init_pid == getpid() && fk.state_dir[0]) {
        char path[700];
        snprintf(path, sizeof path, "%s/usage/%d", fk.state_dir, (int)getpid());
        unlink(path);
    }
}

FK_EXPORT CUresult cuInit(unsigned int flags)
{
    CUresult r = fk_fail_point("cuInit");
    if (r != CUDA_SUCCESS) return r;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    if (fk.forked) {
        fk_unlock();
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (fk.initialized) {
        fk_unlock();
        return CUDA_SUCCESS;
    }
    fk_configure();
    r = fk_arena_init();
    if (r != CUDA_SUCCESS) {
        fk_unlock();
        return r;
    }
    pthread_atfork(NULL, NULL, fk_after_fork_in_child);
    fk.init_pid = getpid();
    fk.initialized = 1;
    fk_unlock();
    fk_checkpoint_start_restore_thread();
    fk_usage_write();
    return CUDA_SUCCESS;
}

static CUresult fk_arena_init(void)
{
    uintptr_t dummy;
    return fk_va_alloc(0, 0, 0, &dummy);
}

FK_EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

static CUresult fk_check_dev(CUdevice d) { return (d < 0 || d >= fk.ndev) ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS; }

FK_EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    FK_API("cuDeviceGet");
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= fk.ndev) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetCount(int *n)
{
    FK_API("cuDeviceGetCount");
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = fk.ndev;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    FK_API("cuDeviceGetName");
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", fk.dev[d].name);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d)
{
    FK_API("cuDeviceGetUuid_v2");
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *u = fk.dev[d].uuid;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }

int fk_dev_by_uuid(const CUuuid *u)
{
    for (int i = 0; i < fk.ndev; i++)
        if (memcmp(fk.dev[i].uuid.bytes, u->bytes, 16) == 0) return i;
    return -1;
}

FK_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    FK_API("cuDeviceTotalMem_v2");
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fk.dev[d].total;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetPCIBusId(char *pci, int len, CUdevice d)
{
    FK_API("cuDeviceGetPCIBusId");
    if (!pci || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(pci, (size_t)len, "00000000:%02X:00.0", 0x10 + d);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d)
{
    FK_API("cuDeviceGetAttribute");
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 4; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 0x10 + d; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
        *v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
        *v = 0;
        break;
    default:
        *v = 0;
        break;
    }
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer)
{
    FK_API("cuDeviceCanAccessPeer");
    if (!can) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d) || fk_check_dev(peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = d != peer;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetP2PAttribute(int *v, CUdevice_P2PAttribute attr, CUdevice src, CUdevice dst)
{
    FK_API("cuDeviceGetP2PAttribute");
    (void)attr;
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(src) || fk_check_dev(dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
    *v = 1;
    return CUDA_SUCCESS;
}

/* ---- contexts ------------------------------------------------------------------------------- */

#define FK_CTX_STACK 16
static __thread struct fk_ctx *fk_ctx_stack[FK_CTX_STACK];
static __thread int fk_ctx_depth;
static unsigned long long fk_next_ctx_id = 100;

struct fk_ctx *fk_current_ctx(void) { return fk_ctx_depth > 0 ? fk_ctx_stack[fk_ctx_depth - 1] : NULL; }

int fk_valid_ctx(struct fk_ctx *c) { return c && c->magic == FK_CTX_MAGIC; }

CUresult fk_require_ctx(struct fk_ctx **out)
{
    struct fk_ctx *c = fk_current_ctx();
    if (!fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (out) *out = c;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d)
{
    FK_API("cuDevicePrimaryCtxRetain");
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    fk.dev[d].primary.refcount++;
    fk_unlock();
    *pctx = (CUcontext)&fk.dev[d].primary;
    return CUDA_SUCCESS;
}

/* Releasing the last reference keeps the fake's allocations: tests never rely on the reset. */
FK_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    FK_API("cuDevicePrimaryCtxRelease_v2");
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    if (fk.dev[d].primary.refcount > 0) fk.dev[d].primary.refcount--;
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
    FK_API("cuDevicePrimaryCtxGetState");
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    *flags = fk.dev[d].primary.flags;
    *active = fk.dev[d].primary.refcount > 0;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int flags)
{
    FK_API("cuDevicePrimaryCtxSetFlags_v2");
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    fk.dev[d].primary.flags = flags;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    FK_API("cuDevicePrimaryCtxReset_v2");
    return fk_check_dev(d);
}

static struct fk_ctx *fk_ctx_create(CUdevice d, unsigned flags)
{
    struct fk_ctx *c = calloc(1, sizeof *c);
    c->magic = FK_CTX_MAGIC;
    c->dev = d;
    c->flags = flags;
    c->refcount = 1;
    c->stack = FK_DEFAULT_STACK;
    fk_lock();
    c->id = fk_next_ctx_id++;
    fk_unlock();
    return c;
}

static void fk_ctx_push(struct fk_ctx *c)
{
    if (fk_ctx_depth < FK_CTX_STACK) fk_ctx_stack[fk_ctx_depth++] = c;
}

FK_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice d)
{
    FK_API("cuCtxCreate_v4");
    (void)params;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (fk_check_dev(d)) return CUDA_ERROR_INVALID_DEVICE;
    struct fk_ctx *c = fk_ctx_create(d, flags);
    fk_ctx_push(c);
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d)
{
    return cuCtxCreate_v4(pctx, NULL, flags, d);
}

FK_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    FK_API("cuCtxDestroy_v2");
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    if (!fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    fk_stream_sync_ctx(c);
    for (int i = 0; i < fk_ctx_depth; i++)
        if (fk_ctx_stack[i] == c) fk_ctx_stack[i] = NULL;
    /* The struct is kept (magic cleared): streams may still point at it. */
    c->magic = 0;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FK_API("cuCtxSetCurrent");
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    if (c && !fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (fk_ctx_depth == 0) {
        if (c) fk_ctx_stack[fk_ctx_depth++] = c;
    } else if (c) {
        fk_ctx_stack[fk_ctx_depth - 1] = c;
    } else {
        fk_ctx_depth--;
    }
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FK_API("cuCtxGetCurrent");
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)fk_current_ctx();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    FK_API("cuCtxPushCurrent_v2");
    struct fk_ctx *c = (struct fk_ctx *)ctx;
    if (!fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (fk_ctx_depth >= FK_CTX_STACK) return CUDA_ERROR_OUT_OF_MEMORY;
    fk_ctx_push(c);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    FK_API("cuCtxPopCurrent_v2");
    if (fk_ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct fk_ctx *c = fk_ctx_stack[--fk_ctx_depth];
    if (pctx) *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    FK_API("cuCtxGetDevice");
    struct fk_ctx *c;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    *d = c->dev;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext ctx)
{
    FK_API("cuCtxGetDevice_v2");
    struct fk_ctx *c = ctx ? (struct fk_ctx *)ctx : fk_current_ctx();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    FK_API("cuCtxGetId");
    struct fk_ctx *c = ctx ? (struct fk_ctx *)ctx : fk_current_ctx();
    if (!id) return CUDA_ERROR_INVALID_VALUE;
    if (!fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *id = c->id;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    FK_API("cuCtxGetFlags");
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    *flags = c->flags;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    FK_API("cuCtxGetApiVersion");
    (void)ctx;
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSynchronize(void)
{
    FK_API("cuCtxSynchronize");
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    fk_stream_sync_ctx(c);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    FK_API("cuCtxSynchronize_v2");
    struct fk_ctx *c = ctx ? (struct fk_ctx *)ctx : fk_current_ctx();
    if (!fk_valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    fk_stream_sync_ctx(c);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    FK_API("cuCtxGetStreamPriorityRange");
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

/* Only the stack size is modelled (the current context's); other limits read 0 and take any value. */
FK_EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit limit)
{
    FK_API("cuCtxGetLimit");
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 0;
    if (limit != CU_LIMIT_STACK_SIZE) return CUDA_SUCCESS;
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    *v = c->stack;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t v)
{
    FK_API("cuCtxSetLimit");
    if (limit != CU_LIMIT_STACK_SIZE) return CUDA_SUCCESS;
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    c->stack = v;
    return CUDA_SUCCESS;
}

/* ---- peer access: a per-context bitmask; the fake's copies do not depend on it ------------- */

FK_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    FK_API("cuCtxEnablePeerAccess");
    struct fk_ctx *c, *p = (struct fk_ctx *)peer;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!fk_valid_ctx(p)) return CUDA_ERROR_INVALID_CONTEXT;
    if (p->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    if (c->peers & (1u << p->dev)) r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    else c->peers |= 1u << p->dev;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
    FK_API("cuCtxDisablePeerAccess");
    struct fk_ctx *c, *p = (struct fk_ctx *)peer;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    if (!fk_valid_ctx(p)) return CUDA_ERROR_INVALID_CONTEXT;
    fk_lock();
    if (!(c->peers & (1u << p->dev))) r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    else c->peers &= ~(1u << p->dev);
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice d)
{
    (void)params;
    (void)n;
    return cuCtxCreate_v4(pctx, NULL, flags, d);
}
