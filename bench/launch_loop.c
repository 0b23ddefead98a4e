/* launch_loop.c: a launch-bound loop in C, for bench/shim_bench.py ("launch-c").
 *
 *   launch_loop KERNEL_IMAGE_FILE LAUNCHES
 *
 * Reaches the driver the way the CUDA runtime (and so PyTorch) does: cuGetProcAddress_v2 on a
 * dlopen'ed libcuda, so the shim's wrappers apply when it is preloaded. Launches an empty kernel
 * LAUNCHES times on one stream and prints launches per second (the queue stays full: the rate is
 * what the CPU side of a launch costs, which is all the shim can add to).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define GET(name, ver) get(#name, ver)
typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_t gpa;

static void *get(const char *name, int ver)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, ver, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "no %s\n", name);
        exit(1);
    }
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib || !(gpa = (gpa_t)dlsym(lib, "cuGetProcAddress_v2")))
        return fprintf(stderr, "no driver\n"), 1;
    CUresult (*init)(unsigned) = GET(cuInit, 2000);
    CUresult (*devget)(CUdevice *, int) = GET(cuDeviceGet, 2000);
    CUresult (*retain)(CUcontext *, CUdevice) = GET(cuDevicePrimaryCtxRetain, 7000);
    CUresult (*setcur)(CUcontext) = GET(cuCtxSetCurrent, 4000);
    CUresult (*load)(CUmodule *, const void *) = GET(cuModuleLoadData, 2000);
    CUresult (*getfn)(CUfunction *, CUmodule, const char *) = GET(cuModuleGetFunction, 2000);
    CUresult (*mkstream)(CUstream *, unsigned) = GET(cuStreamCreate, 2000);
    CUresult (*sync)(CUstream) = GET(cuStreamSynchronize, 2000);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **) = GET(cuLaunchKernel, 4000);
    FILE *f = fopen(argv[1], "rb");
    static char image[1 << 16];
    size_t n = f ? fread(image, 1, sizeof image - 1, f) : 0;
    if (!n)
        return fprintf(stderr, "cannot read %s\n", argv[1]), 1;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream s;
    if (init(0) || devget(&dev, 0) || retain(&ctx, dev) || setcur(ctx) || load(&mod, image) ||
        getfn(&fn, mod, "sleep_us") || mkstream(&s, 0))
        return fprintf(stderr, "setup failed\n"), 1;
    unsigned long long us = 0;
    void *params[] = {&us};
    long launches = atol(argv[2]);
    for (int i = 0; i < 2000; i++) /* warm up */
        launch(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
    sync(s);
    double t0 = now();
    for (long i = 0; i < launches; i++)
        if (launch(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) != CUDA_SUCCESS)
            return fprintf(stderr, "launch failed\n"), 1;
    sync(s);
    printf("{\"rate\": %.1f}\n", launches / (now() - t0));
    return 0;
}
