/* lookup.c: where each lookup of a driver function lands. For every argument "NAME:SYMBOL:VERSION"
 * it prints one line "SYMBOL DLSYM GPA1 GPA2" where each column is "shim", "driver" or "absent":
 *   DLSYM  dlsym(libcuda handle, SYMBOL)
 *   GPA1   cuGetProcAddress(NAME, VERSION, flags), GPA2 the same through cuGetProcAddress_v2;
 *          flags ask for the per-thread default stream when SYMBOL ends in _ptds or _ptsz.
 * The shim is recognised by the file name dladdr reports, passed as argv[1]. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#undef cuGetProcAddress
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static const char *where(void *p, const char *shim)
{
    Dl_info info;
    if (!p)
        return "absent";
    if (dladdr(p, &info) && info.dli_fname && !strcmp(info.dli_fname, shim))
        return "shim";
    return "driver";
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib || argc < 2)
        return 2;
    gpa1_t gpa1 = (gpa1_t)dlsym(lib, "cuGetProcAddress");
    gpa2_t gpa2 = (gpa2_t)dlsym(lib, "cuGetProcAddress_v2");
    for (int i = 2; i < argc; i++) {
        char name[128], symbol[128];
        int version;
        if (sscanf(argv[i], "%127[^:]:%127[^:]:%d", name, symbol, &version) != 3)
            return 2;
        cuuint64_t flags = ends_with(symbol, "_ptds") || ends_with(symbol, "_ptsz")
                               ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                               : 0;
        void *a = dlsym(lib, symbol), *b = NULL, *c = NULL;
        CUdriverProcAddressQueryResult st;
        if (gpa1(name, &b, version, flags) != CUDA_SUCCESS)
            b = NULL;
        if (gpa2(name, &c, version, flags, &st) != CUDA_SUCCESS)
            c = NULL;
        printf("%s %s %s %s\n", symbol, where(a, argv[1]), where(b, argv[1]), where(c, argv[1]));
    }
    return 0;
}
