/* Built against cuda.h and linked with -lcuda: the fake must export the versioned names that
 * cuda.h's macros produce, with and without CUDA_API_PER_THREAD_DEFAULT_STREAM. */
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                    \
    do {                                                               \
        CUresult r_ = (call);                                          \
        if (r_ != CUDA_SUCCESS) {                                      \
            fprintf(stderr, "%s: %d\n", #call, (int)r_);               \
            return 1;                                                  \
        }                                                              \
    } while (0)

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CUstream s;
    char in[64], out[64];
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&p, sizeof in));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    memset(in, 0x3c, sizeof in);
    CHECK(cuMemcpyHtoDAsync(p, in, sizeof in, s));
    CHECK(cuMemsetD8Async(p, 0x7e, 8, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpyDtoH(out, p, sizeof out));
    if (out[0] != 0x7e || out[8] != 0x3c) return 2;
    CHECK(cuMemFree(p));
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    puts("PASS");
    return 0;
}
