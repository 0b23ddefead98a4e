/* devices.h: the GPUs this process sees: ordinal <-> UUID, ordinal maps (old:new) for memory
 * re-created on other GPUs, and the primary context a control thread works in. Layer 2 (calls the
 * driver through resolve). */
#ifndef GS_DEVICES_H
#define GS_DEVICES_H

#include <cuda.h>
#include <stddef.h>

#define GS_MAX_DEV 64  /* devices the shim knows by ordinal */
#define GS_UUID_LEN 41 /* "GPU-" + 36 + NUL, as nvidia-smi prints it */

struct gs_devices {
    int n; /* 0 until the driver answered */
    char uuid[GS_MAX_DEV][GS_UUID_LEN];
};
/* Asks the driver again (cuDeviceGetCount, cuDeviceGetUuid_v2). Never from `status`: a process
 * locked by a driver checkpoint blocks driver calls, so status reads the last answer. */
void gs_devices_refresh(void);
int gs_devices_known(void);
void gs_devices_get(struct gs_devices *out);

/* A map of this process's ordinals, old -> new; identity for ordinals it does not name. */
struct gs_devmap {
    int to[GS_MAX_DEV];
};
void gs_devmap_identity(struct gs_devmap *m);
/* Parses "OLD:NEW[,OLD:NEW...]" (decimal ordinals below ndev, each OLD once). 0, or -1 with the
 * reason in err. */
int gs_devmap_parse(const char *spec, int ndev, struct gs_devmap *m, char *err, size_t errlen);
/* Where dev goes (dev itself when the map does not name it, or it is no ordinal). */
int gs_devmap_apply(const struct gs_devmap *m, int dev);

/* Pushes the primary context of dev if it is active, else of the first active device (a control
 * thread must not create a context on a GPU the program never used). Returns the device pushed,
 * or -1 when none could be (the call is then made without a context); pop with gs_pop_ctx. */
int gs_push_ctx(int dev);
/* The device of context ctx (cuCtxGetDevice_v2, or pushing it on an older driver). */
CUresult gs_context_device(CUcontext ctx, int *dev);
void gs_pop_ctx(int pushed);

#endif
