/* status.c: the `status` reply: this process, every tracked object, its state and its gates. */
#include <stdio.h>
#include <unistd.h>

#include "criu_gpushare_shim.h"
#include "devices.h"
#include "gates.h"
#include "status.h"
#include "track.h"

static const char *kind_name(int kind)
{
    switch (kind) {
    case GS_OBJ_ALLOC: return "allocation";
    case GS_OBJ_IMPORT: return "import";
    case GS_OBJ_MCAST: return "multicast";
    default: return "unknown";
    }
}

static void access_json(struct gs_buf *b, const struct gs_map *m)
{
    gs_buf_printf(b, "[");
    for (int i = 0; i < m->n_access; i++) {
        const CUmemAccessDesc *d = &m->access[i];
        const char *prot = d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "rw"
                           : d->flags == CU_MEM_ACCESS_FLAGS_PROT_READ  ? "r"
                                                                        : "none";
        gs_buf_printf(b, "%s{\"location_type\":%d,\"location\":%d,\"prot\":\"%s\"}", i ? "," : "",
                      (int)d->location.type, d->location.id, prot);
    }
    gs_buf_printf(b, "]");
}

/* "gpu": the UUID of device dev, or null when the process has no such device. */
static void gpu_json(struct gs_buf *b, const struct gs_devices *d, int dev)
{
    gs_buf_printf(b, ",\"gpu\":");
    if (dev >= 0 && dev < d->n)
        gs_buf_str(b, d->uuid[dev]);
    else
        gs_buf_printf(b, "null");
}

static void devices_json(struct gs_buf *b, const struct gs_devices *d)
{
    gs_buf_printf(b, "\"devices\":[");
    for (int i = 0; i < d->n; i++) {
        gs_buf_printf(b, "%s{\"ordinal\":%d,\"uuid\":", i ? "," : "", i);
        gs_buf_str(b, d->uuid[i]);
        gs_buf_printf(b, "}");
    }
    gs_buf_printf(b, "],");
}

static const char *origin_name(int origin)
{
    return origin == GS_ORIGIN_MALLOC ? "cuMemAlloc" : origin == GS_ORIGIN_ASYNC ? "cuMemAllocAsync"
                                                                               : "cuMemCreate";
}

static int kept_held(uint64_t id)
{
    gs_kept_lock();
    int held = gs_kept_held(id);
    gs_kept_unlock();
    return held;
}

static void objects_json(struct gs_buf *b, const struct gs_devices *d)
{
    gs_buf_printf(b, "\"allocations\":[");
    for (size_t i = 0; i < gs.allocs.n; i++) {
        const struct gs_alloc *a = &gs.allocs.v[i];
        int n_exp = 0;
        for (size_t j = 0; j < gs.exports.n; j++)
            n_exp += gs.exports.v[j].kind == GS_OBJ_ALLOC && gs.exports.v[j].obj_id == a->id;
        gs_buf_printf(b,
                      "%s{\"id\":%llu,\"origin\":\"%s\",\"device\":%d,\"size\":%zu,"
                      "\"va\":%llu,\"handle_types\":%llu,\"exports\":%d,\"ipc_handles\":%d,"
                      "\"app_released\":%s,\"dropped\":%s,\"kept\":%s,\"intact\":%s,\"fresh\":%s",
                      i ? "," : "", (unsigned long long)a->id,
                      origin_name(a->origin), a->dev, a->size,
                      (unsigned long long)a->va, a->handle_types, n_exp, a->ipc_handles,
                      a->app_released ? "true" : "false", a->dropped ? "true" : "false",
                      kept_held(a->id) ? "true" : "false", a->intact ? "true" : "false",
                      a->fresh ? "true" : "false");
        gpu_json(b, d, a->dev);
        gs_buf_printf(b, "}");
    }
    gs_buf_printf(b, "],\"mappings\":[");
    for (size_t i = 0; i < gs.maps.n; i++) {
        const struct gs_map *m = &gs.maps.v[i];
        gs_buf_printf(b,
                      "%s{\"va\":%llu,\"size\":%zu,\"offset\":%zu,\"object\":\"%s\",\"id\":%llu,"
                      "\"access\":",
                      i ? "," : "", (unsigned long long)m->va, m->size, m->offset, kind_name(m->kind),
                      (unsigned long long)m->obj_id);
        access_json(b, m);
        gs_buf_printf(b, ",\"access_overflow\":%s,\"dropped\":%s}",
                      m->access_overflow ? "true" : "false", m->dropped ? "true" : "false");
    }
    gs_buf_printf(b, "],\"exports\":[");
    for (size_t i = 0; i < gs.exports.n; i++) {
        const struct gs_export *e = &gs.exports.v[i];
        gs_buf_printf(b, "%s{\"object\":\"%s\",\"id\":%llu,\"voided\":%s}", i ? "," : "",
                      kind_name(e->kind), (unsigned long long)e->obj_id,
                      e->voided ? "true" : "false");
    }
    gs_buf_printf(b, "],\"imports\":[");
    for (size_t i = 0; i < gs.imports.n; i++) {
        const struct gs_import *im = &gs.imports.v[i];
        gs_buf_printf(b, "%s{\"id\":%llu,\"kind\":\"%s\",\"size\":%zu,\"va\":%llu,\"exporter\":",
                      i ? "," : "", (unsigned long long)im->id,
                      im->kind == GS_IMPORT_IPC ? "cuda-ipc" : "posix-fd", im->size,
                      (unsigned long long)im->va);
        if (im->exporter_pid)
            gs_buf_printf(b, "{\"pid\":%d,\"id\":%llu}", (int)im->exporter_pid,
                          (unsigned long long)im->exporter_id);
        else
            gs_buf_printf(b, "null");
        gs_buf_printf(b, ",\"app_released\":%s,\"dropped\":%s", im->app_released ? "true" : "false",
                      im->dropped ? "true" : "false");
        int dev = gs_import_device(im->id); /* where its memory lives */
        gs_buf_printf(b, ",\"device\":%d", dev);
        gpu_json(b, d, dev);
        gs_buf_printf(b, "}");
    }
    gs_buf_printf(b, "],\"host_buffers\":[");
    for (size_t i = 0; i < gs.hosts.n; i++) {
        const struct gs_host *h = &gs.hosts.v[i];
        gs_buf_printf(b,
                      "%s{\"ptr\":%llu,\"size\":%zu,\"register_flags\":%u,\"owned\":%s,"
                      "\"device_ptr\":%llu,\"dropped\":%s}",
                      i ? "," : "", (unsigned long long)(uintptr_t)h->p, h->size, h->flags,
                      h->owned ? "true" : "false", (unsigned long long)h->dptr,
                      h->dropped ? "true" : "false");
    }
    gs_buf_printf(b, "],\"lazy_ipc_handles\":[");
    for (size_t i = 0; i < gs.lazy_ipc.n; i++) {
        const struct gs_lazy_ipc *l = &gs.lazy_ipc.v[i];
        gs_buf_printf(b, "%s{\"va\":%llu,\"size\":%zu,\"opened\":%d}", i ? "," : "",
                      (unsigned long long)l->base, l->size, l->opened);
    }
    gs_buf_printf(b, "],\"peer_access\":[");
    int first = 1;
    for (int o = 0; o < GS_MAX_DEV; o++)
        for (int a = 0; a < GS_MAX_DEV; a++)
            if (gs.peer[o][a]) {
                gs_buf_printf(b, "%s{\"owner\":%d,\"accessor\":%d}", first ? "" : ",", o, a);
                first = 0;
            }
    gs_buf_printf(b, "],\"multicast\":[");
    for (size_t i = 0; i < gs.mcasts.n; i++) {
        const struct gs_mcast *mc = &gs.mcasts.v[i];
        gs_buf_printf(b, "%s{\"id\":%llu,\"size\":%zu,\"num_devices\":%u,\"creator\":",
                      i ? "," : "", (unsigned long long)mc->id, mc->prop.size, mc->prop.numDevices);
        if (mc->creator_pid)
            gs_buf_printf(b, "{\"pid\":%d,\"id\":%llu}", (int)mc->creator_pid,
                          (unsigned long long)mc->creator_id);
        else
            gs_buf_printf(b, "null");
        gs_buf_printf(b, ",\"devices\":[");
        for (int d = 0; d < mc->n_devs; d++)
            gs_buf_printf(b, "%s%d", d ? "," : "", mc->devs[d]);
        gs_buf_printf(b, "],\"app_released\":%s}", mc->app_released ? "true" : "false");
    }
    gs_buf_printf(b, "],\"multicast_binds\":[");
    for (size_t i = 0; i < gs.mcbinds.n; i++) {
        const struct gs_mcbind *mb = &gs.mcbinds.v[i];
        gs_buf_printf(b,
                      "%s{\"multicast\":%llu,\"device\":%d,\"mc_offset\":%zu,\"size\":%zu,"
                      "\"allocation\":%llu,\"mem_offset\":%zu,\"mem_ptr\":%llu}",
                      i ? "," : "", (unsigned long long)mb->mc_id, mb->dev, mb->mc_offset, mb->size,
                      (unsigned long long)mb->mem_alloc_id, mb->mem_offset,
                      (unsigned long long)mb->mem_ptr);
    }
    /* What a checkpoint would have to refuse, in words the user can act on. */
    char msgs[GS_UNTRACKED_MAX][GS_UNTRACKED_LEN];
    int n = gs_untracked_list(msgs);
    gs_buf_printf(b, "],\"untracked\":[");
    for (int i = 0; i < n; i++) {
        gs_buf_printf(b, "%s", i ? "," : "");
        gs_buf_str(b, msgs[i]);
    }
    gs_buf_printf(b, "],\"notes\":[");
    int k = 0;
    if (gs.n_foreign_ipc_exports) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%d CUDA IPC handle(s) of memory not allocated through the "
                 "shim were given out: their importers cannot be checkpointed",
                 gs.n_foreign_ipc_exports);
        gs_buf_str(b, msg);
        k++;
    }
    if (gs.n_untracked_exports) {
        char msg[400];
        snprintf(msg, sizeof(msg), "%d export(s) of handles that are not this process's "
                 "allocations (last: %s): their importers cannot be checkpointed",
                 gs.n_untracked_exports, gs.last_untracked);
        gs_buf_printf(b, "%s", k ? "," : "");
        gs_buf_str(b, msg);
    }
    gs_buf_printf(b, "]");
}

/* "released" when anything is dropped, else "quiesced" or "running". Lock held. */
static const char *state_name(void)
{
    if (gs_anything_dropped())
        return "released";
    return gs_quiesced(0) ? "quiesced" : "running";
}

static void gates_json(struct gs_buf *b)
{
    static const char *const names[] = {"launch", "memory"};
    gs_buf_printf(b, "\"gates\":{");
    for (int g = GS_GATE_LAUNCH; g <= GS_GATE_MEMORY; g++) {
        int closed;
        long inflight;
        gs_gate_state(g, &closed, &inflight);
        gs_buf_printf(b, "%s\"%s\":{\"closed\":%s,\"inflight\":%ld}", g ? "," : "", names[g],
                      closed ? "true" : "false", inflight);
    }
    gs_buf_printf(b, "}");
}

int gs_status_json(struct gs_buf *b)
{
    struct gs_devices d; /* the driver's last answer: status makes no driver call (devices.h) */
    gs_devices_get(&d);
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS))
        return -1;
    gs_buf_printf(b, "\"pid\":%d,\"version\":\"%s\",\"protocol\":%d,", (int)getpid(),
                  CRIU_GPUSHARE_SHIM_VERSION, CRIU_GPUSHARE_PROTOCOL);
    devices_json(b, &d);
    objects_json(b, &d);
    gs_buf_printf(b, ",\"state\":\"%s\"", state_name());
    gs_unlock();
    gs_buf_printf(b, ",");
    gates_json(b);
    return 0;
}
