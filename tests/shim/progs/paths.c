/* paths.c: a CUDA program that reaches the driver one way, chosen by argv[1]:
 *   direct     linked against libcuda (built with -DDIRECT)
 *   dlsym      dlsym on a dlopen'ed libcuda handle, versioned names
 *   gpa1       cuGetProcAddress (v1), unversioned names (as a CUDA 12.0 program asks)
 *   gpa2       cuGetProcAddress_v2, unversioned names
 *   gpa2-ptds  cuGetProcAddress_v2 with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * argv[2] is the kernel image (a file: the fake driver's "fakecuda" or PTX with add32).
 * It allocates 4 MiB with cuMemAlloc and prints "READY <ptr>", then for each line on stdin:
 *   launch   add32(+2) on the default stream, synchronize   -> "LAUNCHED"
 *   memset   cuMemsetD32 to 1                                -> "MEMSET"
 *   read     cuMemcpyDtoH of the first word                  -> "VALUE <v>"
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#undef cuGetProcAddress
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static const char *mode;
static void *lib;

__attribute__((unused)) static void *get(const char *unversioned, const char *versioned)
{
    void *p = NULL;
    if (!strcmp(mode, "dlsym")) {
        p = dlsym(lib, versioned);
    } else if (!strcmp(mode, "gpa1")) {
        gpa1_t gpa = (gpa1_t)dlsym(lib, "cuGetProcAddress");
        if (gpa(unversioned, &p, 12000, 0) != CUDA_SUCCESS)
            p = NULL;
    } else {
        gpa2_t gpa = (gpa2_t)dlsym(lib, "cuGetProcAddress_v2");
        cuuint64_t flags = strcmp(mode, "gpa2-ptds") ? 0 : CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        CUdriverProcAddressQueryResult st;
        if (gpa(unversioned, &p, 12000, flags, &st) != CUDA_SUCCESS)
            p = NULL;
    }
    if (!p) {
        fprintf(stderr, "%s: cannot resolve %s\n", mode, versioned);
        exit(2);
    }
    return p;
}

#ifdef DIRECT
#define FN(var, type, unversioned, versioned) __typeof__(type) var = versioned
#else
#define FN(var, type, unversioned, versioned) __typeof__(type) var = (__typeof__(type))get(#unversioned, #versioned)
#endif

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ != CUDA_SUCCESS) {                                                     \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                       \
            exit(3);                                                                  \
        }                                                                             \
    } while (0)

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(2);
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: paths MODE IMAGE\n");
        return 2;
    }
    mode = argv[1];
    const char *image = read_file(argv[2]);
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    FN(init, CUresult (*)(unsigned), cuInit, cuInit);
    FN(devget, CUresult (*)(CUdevice *, int), cuDeviceGet, cuDeviceGet);
    FN(retain, CUresult (*)(CUcontext *, CUdevice), cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain);
    FN(setcur, CUresult (*)(CUcontext), cuCtxSetCurrent, cuCtxSetCurrent);
    FN(alloc, CUresult (*)(CUdeviceptr *, size_t), cuMemAlloc, cuMemAlloc_v2);
    FN(load, CUresult (*)(CUmodule *, const void *), cuModuleLoadData, cuModuleLoadData);
    FN(getfn, CUresult (*)(CUfunction *, CUmodule, const char *), cuModuleGetFunction, cuModuleGetFunction);
    FN(sync, CUresult (*)(void), cuCtxSynchronize, cuCtxSynchronize);
    FN(dtoh, CUresult (*)(void *, CUdeviceptr, size_t), cuMemcpyDtoH, cuMemcpyDtoH_v2);
#ifdef DIRECT
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **) = cuLaunchKernel;
    CUresult (*memset32)(CUdeviceptr, unsigned, size_t) = cuMemsetD32_v2;
#else
    int ptds = !strcmp(mode, "gpa2-ptds");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **) = (void *)get("cuLaunchKernel", "cuLaunchKernel");
    CUresult (*memset32)(CUdeviceptr, unsigned, size_t) =
        (void *)get("cuMemsetD32", ptds ? "cuMemsetD32_v2_ptds" : "cuMemsetD32_v2");
#endif
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CUmodule mod;
    CUfunction add32;
    CHECK(init(0));
    CHECK(devget(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(setcur(ctx));
    CHECK(alloc(&p, 4 << 20));
    CHECK(load(&mod, image));
    CHECK(getfn(&add32, mod, "add32"));
    printf("READY %llu\n", (unsigned long long)p);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof(line), stdin)) {
        if (!strncmp(line, "launch", 6)) {
            uint32_t v = 2;
            uint64_t n = 1;
            void *args[] = {&p, &v, &n};
            CHECK(launch(add32, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
            CHECK(sync());
            printf("LAUNCHED\n");
        } else if (!strncmp(line, "memset", 6)) {
            CHECK(memset32(p, 1, 1));
            printf("MEMSET\n");
        } else if (!strncmp(line, "read", 4)) {
            uint32_t v = 0;
            CHECK(dtoh(&v, p, 4));
            printf("VALUE %u\n", v);
        }
        fflush(stdout);
    }
    return 0;
}
