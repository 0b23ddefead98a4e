/* resolve.c: finding the real driver, and making every way a program reaches the driver land on
 * the shim's wrappers.
 *
 * Three ways in, all covered:
 *   - direct linking: the wrappers are exported under the driver's own names, and the preloaded
 *     shim comes before libcuda in the global scope;
 *   - dlsym(handle, "cu...") on a libcuda handle: dlsym is interposed and returns the wrapper;
 *   - cuGetProcAddress (v1 and _v2): the wrapper replaces the pointer the driver returns.
 * A lookup may name a function without its version (cuGetProcAddress("cuMemAlloc") returns
 * cuMemAlloc_v2, or the _ptsz twin with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), so the
 * wrapper is found by the pointer returned, compared with libcuda's own symbol of each hook.
 *
 * The shim's own calls go to libcuda directly (REAL, CU), never through a wrapper.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "resolve.h"

/* cuda.h maps cuGetProcAddress to _v2; the v1 entry point is a separate symbol. */
#undef cuGetProcAddress
GS_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags);

__thread int gs_depth __attribute__((tls_model("initial-exec")));

struct gs_hook {
    const char *name;
    void *wrapper;
};

static const struct gs_hook hooks[GS_HOOK_COUNT] = {
#define X(name) [GS_HOOK_##name] = {#name, (void *)&name},
    GS_HOOKS(X)
#undef X
};

static void *real_slots[GS_HOOK_COUNT];

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_p;
static pthread_once_t real_dlsym_once = PTHREAD_ONCE_INIT;

/* glibc's dlsym, found without calling dlsym (which is ours). */
static void find_real_dlsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && !real_dlsym_p; i++)
        real_dlsym_p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

static dlsym_fn real_dlsym(void)
{
    pthread_once(&real_dlsym_once, find_real_dlsym);
    return real_dlsym_p;
}

/* libcuda's handle. With load == 0 it is only found if the program already loaded it: a lookup
 * in some other library must not pull the driver into a process that does not use it. */
static void *libcuda(int load)
{
    static void *handle;
    void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
    if (h)
        return h;
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h && load)
        h = dlopen("libcuda.so.1", RTLD_LAZY);
    if (h)
        __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
    return h;
}

void *gs_real(const char *name)
{
    void *lib = libcuda(1);
    dlsym_fn sym = real_dlsym();
    return lib && sym ? sym(lib, name) : NULL;
}

void *gs_real_hook(int id)
{
    void *p = __atomic_load_n(&real_slots[id], __ATOMIC_RELAXED);
    if (!p) {
        p = gs_real(hooks[id].name);
        __atomic_store_n(&real_slots[id], p, __ATOMIC_RELAXED);
    }
    return p;
}

static int is_wrapper(void *p)
{
    for (int i = 0; i < GS_HOOK_COUNT; i++)
        if (hooks[i].wrapper == p)
            return 1;
    return 0;
}

void *gs_wrapper_for(const char *name, void *real, int exact_name)
{
    if (!real || !name || is_wrapper(real) || !libcuda(0))
        return real;
    size_t len = strlen(name);
    for (int i = 0; i < GS_HOOK_COUNT; i++)
        if (strncmp(hooks[i].name, name, len) == 0 && gs_real_hook(i) == real)
            return hooks[i].wrapper;
    if (exact_name)
        for (int i = 0; i < GS_HOOK_COUNT; i++)
            if (strcmp(hooks[i].name, name) == 0 && gs_real_hook(i))
                return hooks[i].wrapper;
    return real;
}

/* dlsym on a real handle returns the wrapper. The pseudo-handles (RTLD_DEFAULT, RTLD_NEXT) depend
 * on who calls, so they go straight to glibc as a tail call that keeps the caller's return
 * address; RTLD_DEFAULT finds the exported wrappers anyway, and RTLD_NEXT lookups of driver
 * functions are left alone (documented in the header). */
GS_EXPORT void *dlsym(void *handle, const char *name)
{
    dlsym_fn sym = real_dlsym();
    if (handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return sym(handle, name);
    void *p = sym(handle, name);
    if (p && name[0] == 'c' && name[1] == 'u')
        p = gs_wrapper_for(name, p, 1);
    return p;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                     cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    __typeof__(&cuGetProcAddress_v2) real = REAL(cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = gs_wrapper_for(symbol, *pfn, 0);
    return r;
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    __typeof__(&cuGetProcAddress) real = REAL(cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = gs_wrapper_for(symbol, *pfn, 0);
    return r;
}

const char *gs_cu_name(CUresult r)
{
    const char *name = NULL;
    CU(CUresult(*)(CUresult, const char **), cuGetErrorName, r, &name);
    return name ? name : "CUDA error";
}

static void (*server_starter)(void);

void gs_set_server_starter(void (*start)(void))
{
    __atomic_store_n(&server_starter, start, __ATOMIC_RELEASE);
}

void gs_want_server(void)
{
    void (*start)(void) = __atomic_load_n(&server_starter, __ATOMIC_ACQUIRE);
    if (start)
        start();
}

/* The control server starts with the driver: a process that never initializes CUDA gets no
 * socket and no threads. */
CUresult CUDAAPI cuInit(unsigned int flags)
{
    __typeof__(&cuInit) real = REAL(cuInit);
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = real(flags);
    if (r == CUDA_SUCCESS && !gs_depth)
        gs_want_server();
    return r;
}
