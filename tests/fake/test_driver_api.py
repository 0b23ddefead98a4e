"""cuda-python (cuda.bindings.driver) against the fake driver, one test per area of the fake (tests/fakecuda/README.md).

Each test runs a short program in a subprocess with the fake on LD_LIBRARY_PATH; the program
asserts and prints PASS at the end.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

PRELUDE = textwrap.dedent("""
    import ctypes, os, sys, threading, time
    from cuda.bindings import driver as cu
    R = cu.CUresult
    def ok(r):
        assert r[0] == R.CUDA_SUCCESS, r
        return r[1] if len(r) == 2 else (r[1:] if len(r) > 2 else None)
    def err(r):
        return r[0] if isinstance(r, tuple) else r
    def ctx(dev=0):
        ok(cu.cuInit(0)); d = ok(cu.cuDeviceGet(dev)); c = ok(cu.cuDevicePrimaryCtxRetain(d))
        ok(cu.cuCtxSetCurrent(c)); return c
    FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    def prop(dev=0):
        p = cu.CUmemAllocationProp(); p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = dev
        p.requestedHandleTypes = FD; return p
    def access(dev=0):
        a = cu.CUmemAccessDesc(); a.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        a.location.id = dev; a.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE; return [a]
    def u32(ptr, index=0):
        out = ctypes.c_uint32(); ok(cu.cuMemcpyDtoH(ctypes.addressof(out), int(ptr) + 4 * index, 4))
        return out.value
    def launch(mod, name, args, types, stream):
        f = ok(cu.cuModuleGetFunction(mod, name))
        ok(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, (args, types), 0))
    U64, U32 = ctypes.c_uint64, ctypes.c_uint32
    MB = 1 << 20
""")


def run(fake_env, body: str, timeout: float = 60, **env) -> str:
    """Run PRELUDE + body with the fake driver; fail with its output unless it prints PASS."""
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint('PASS')\n"],
                          env=dict(fake_env, **env), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr
    return proc.stdout


def test_cuda_bindings_resolve_entry_points_through_get_proc_address(fake_env):
    run(fake_env, """
        ok(cu.cuInit(0))
        assert ok(cu.cuDriverGetVersion()) == 13000
        status = cu.CUdriverProcAddressQueryResult
        PTDS = cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        DEFAULT = cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        r = cu.cuGetProcAddress(b"cuMemcpyHtoD", 13000, DEFAULT)
        assert r[0] == R.CUDA_SUCCESS and r[2] == status.CU_GET_PROC_ADDRESS_SUCCESS, r
        plain = int(r[1])
        per_thread = int(cu.cuGetProcAddress(b"cuMemcpyHtoD", 13000, PTDS)[1])
        assert plain and per_thread and plain != per_thread
        lib = ctypes.CDLL("libcuda.so.1")
        assert plain == ctypes.cast(lib.cuMemcpyHtoD_v2, ctypes.c_void_p).value
        assert per_thread == ctypes.cast(lib.cuMemcpyHtoD_v2_ptds, ctypes.c_void_p).value
        # Version selection: the newest variant not newer than the version asked for.
        old = int(cu.cuGetProcAddress(b"cuCtxGetDevice", 12000, DEFAULT)[1])
        new = int(cu.cuGetProcAddress(b"cuCtxGetDevice", 13000, DEFAULT)[1])
        assert old == ctypes.cast(lib.cuCtxGetDevice, ctypes.c_void_p).value
        assert new == ctypes.cast(lib.cuCtxGetDevice_v2, ctypes.c_void_p).value
        # Failures, through ctypes: cuda-python drops the status on errors.
        gpa = lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                        ctypes.POINTER(ctypes.c_int)]
        fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
        assert gpa(b"cuNoSuchFunction", ctypes.byref(fn), 13000, 0, ctypes.byref(st)) == int(R.CUDA_ERROR_NOT_FOUND)
        assert st.value == int(status.CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND) and not fn.value
        assert gpa(b"cuCheckpointProcessLock", ctypes.byref(fn), 12000, 0, ctypes.byref(st)) == \
            int(R.CUDA_ERROR_NOT_FOUND)
        assert st.value == int(status.CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
    """)


def test_per_thread_default_stream_mode_of_cuda_bindings(fake_env):
    run(fake_env, """
        ctx()
        p = ok(cu.cuMemAlloc(4096))
        ok(cu.cuMemsetD32(p, 7, 1024))
        ok(cu.cuMemsetD32Async(p, 9, 512, 0))
        ok(cu.cuStreamSynchronize(0))
        assert u32(p, 0) == 9 and u32(p, 600) == 7
    """, CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM="1")


def test_devices_count_names_uuids_memory_and_attributes(fake_env):
    script = """
        ok(cu.cuInit(0))
        n = ok(cu.cuDeviceGetCount())
        uuids = [bytes(ok(cu.cuDeviceGetUuid(ok(cu.cuDeviceGet(i)))).bytes).hex() for i in range(n)]
        assert len(set(uuids)) == n
        assert ok(cu.cuDeviceTotalMem(ok(cu.cuDeviceGet(0)))) == 64 * MB
        assert ok(cu.cuDeviceGetName(64, 0)).rstrip(b"\\0 ").startswith(b"Fake")
        assert ok(cu.cuDeviceGetPCIBusId(32, 1)).rstrip(b"\\0 ")
        A = cu.CUdevice_attribute
        assert ok(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0)) == 1
        assert ok(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0)) == 0
        assert err(cu.cuDeviceGet(n)) == R.CUDA_ERROR_INVALID_DEVICE
        print(n, *uuids)
    """
    a = run(fake_env, script, FAKECUDA_DEVICES="3", FAKECUDA_MEM_MB="64").split()
    b = run(fake_env, script, FAKECUDA_DEVICES="3", FAKECUDA_MEM_MB="64").split()
    c = run(fake_env, script, FAKECUDA_DEVICES="3", FAKECUDA_MEM_MB="64", FAKECUDA_UUID_SEED="other").split()
    assert a[0] == "3"
    assert a == b, "UUIDs must be deterministic"
    assert a[1:4] != c[1:4], "FAKECUDA_UUID_SEED must change the UUIDs"


def test_calls_before_cuinit_and_without_a_context(fake_env):
    run(fake_env, """
        assert err(cu.cuDeviceGetCount()) == R.CUDA_ERROR_NOT_INITIALIZED
        ok(cu.cuInit(0))
        assert err(cu.cuMemAlloc(4096)) == R.CUDA_ERROR_INVALID_CONTEXT
    """)


def test_primary_contexts_push_pop_and_current(fake_env):
    run(fake_env, """
        ok(cu.cuInit(0))
        c0 = ok(cu.cuDevicePrimaryCtxRetain(0)); c1 = ok(cu.cuDevicePrimaryCtxRetain(1))
        flags, active = ok(cu.cuDevicePrimaryCtxGetState(0))
        assert active == 1
        ok(cu.cuCtxSetCurrent(c0))
        assert int(ok(cu.cuCtxGetCurrent())) == int(c0) and int(ok(cu.cuCtxGetDevice())) == 0
        ok(cu.cuCtxPushCurrent(c1))
        assert int(ok(cu.cuCtxGetDevice())) == 1
        assert int(ok(cu.cuCtxPopCurrent())) == int(c1)
        assert int(ok(cu.cuCtxGetDevice())) == 0
        ok(cu.cuCtxSynchronize())
        ok(cu.cuDevicePrimaryCtxRelease(1))
    """)


def test_cumemalloc_info_address_range_and_out_of_memory(fake_env):
    run(fake_env, """
        ctx()
        free0, total = ok(cu.cuMemGetInfo())
        assert total == 64 * MB
        p = ok(cu.cuMemAlloc(3 * MB))
        free1, _ = ok(cu.cuMemGetInfo())
        assert free0 - free1 == 4 * MB  # rounded to the 2 MiB granularity
        base, size = ok(cu.cuMemGetAddressRange(int(p) + 100))
        assert int(base) == int(p) and size == 3 * MB
        assert err(cu.cuMemAlloc(128 * MB)) == R.CUDA_ERROR_OUT_OF_MEMORY
        assert err(cu.cuMemFree(int(p) + 4096)) == R.CUDA_ERROR_INVALID_VALUE
        ok(cu.cuMemFree(p))
        assert ok(cu.cuMemGetInfo())[0] == free0
    """, FAKECUDA_MEM_MB="64")


def test_pointer_attributes(fake_env):
    run(fake_env, """
        c = ctx(1)
        p = ok(cu.cuMemAlloc(MB))
        A = cu.CUpointer_attribute
        assert ok(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p)) == \\
            cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        assert ok(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p)) == 1
        assert int(ok(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, int(p) + 8))) == int(p)
        assert ok(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_RANGE_SIZE, p)) == MB
        assert ok(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p))
        assert int(ok(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_CONTEXT, p))) == int(c)
        values = ok(cu.cuPointerGetAttributes(2, [A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                  A.CU_POINTER_ATTRIBUTE_MAPPED], p))
        assert values[0] == 1 and values[1]
        host = ctypes.create_string_buffer(64)
        assert err(cu.cuPointerGetAttribute(A.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                            ctypes.addressof(host))) == R.CUDA_ERROR_INVALID_VALUE
    """)


def test_vmm_create_reserve_map_access_and_properties(fake_env):
    run(fake_env, """
        ctx()
        G = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        g = ok(cu.cuMemGetAllocationGranularity(prop(), G))
        assert g == 2 * MB
        assert err(cu.cuMemCreate(g + 1, prop(), 0)) == R.CUDA_ERROR_INVALID_VALUE
        h = ok(cu.cuMemCreate(2 * g, prop(1), 0))
        va = ok(cu.cuMemAddressReserve(4 * g, 0, 0, 0))
        ok(cu.cuMemMap(va, 2 * g, 0, h, 0))
        assert err(cu.cuMemMap(va, 2 * g, 0, h, 0)) == R.CUDA_ERROR_ALREADY_MAPPED
        # Mapped but without access: copies are refused until cuMemSetAccess.
        assert err(cu.cuMemsetD32(va, 1, 16)) == R.CUDA_ERROR_INVALID_VALUE
        ok(cu.cuMemSetAccess(va, 2 * g, access(1), 1))
        loc = cu.CUmemLocation(); loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE; loc.id = 1
        assert ok(cu.cuMemGetAccess(loc, va)) == 3  # PROT_READWRITE
        loc.id = 0
        assert ok(cu.cuMemGetAccess(loc, va)) == 0
        ok(cu.cuMemsetD32(va, 0xabc, 2 * g // 4))
        assert u32(va, 12345) == 0xabc
        p = ok(cu.cuMemGetAllocationPropertiesFromHandle(h))
        assert p.location.id == 1 and int(p.requestedHandleTypes) == int(FD)
        h2 = ok(cu.cuMemRetainAllocationHandle(int(va) + 4096))
        assert int(h2) == int(h)
        ok(cu.cuMemRelease(h2))
        ok(cu.cuMemRelease(h))  # the mapping keeps the memory
        assert u32(va, 1) == 0xabc
        ok(cu.cuMemUnmap(va, 2 * g))
        ok(cu.cuMemAddressFree(va, 4 * g))
    """)


def test_vmm_export_import_shares_memory_between_processes(workers):
    exporter, importer = workers(), workers()
    exporter.ok("vmm v 0x200000 1")
    exporter.ok("set32 v 0x31")
    fd = exporter.ok("export v")[0]
    importer.ok(f"import v {exporter.pid} {fd}")
    assert importer.ok("get32 v 9") == ["0x31"]
    importer.ok("set32 v 0x32")
    assert exporter.ok("get32 v 9") == ["0x32"]


def test_legacy_ipc_between_processes(workers):
    exporter, importer = workers(), workers()
    exporter.ok("alloc a 0x100000")
    exporter.ok("set32 a 0x41")
    handle = exporter.ok("ipc_get a")[0]
    assert exporter.do(f"ipc_open b {handle}") == ["err", "CUDA_ERROR_INVALID_CONTEXT"]
    va = importer.ok(f"ipc_open a {handle}")[0]
    assert importer.ok(f"ipc_open again {handle}") == [va], "a second open gives the same mapping"
    assert importer.ok("get32 a 77") == ["0x41"]
    importer.ok("set32 a 0x42")
    assert exporter.ok("get32 a 77") == ["0x42"]
    importer.ok("ipc_close again")
    importer.ok("ipc_close a")


def test_page_locked_host_memory(fake_env):
    run(fake_env, """
        ctx()
        h = ok(cu.cuMemHostAlloc(MB, 0))
        assert int(ok(cu.cuMemHostGetDevicePointer(h, 0))) == int(h)
        h2 = ok(cu.cuMemAllocHost(4096))
        buf = ctypes.create_string_buffer(8192)
        ok(cu.cuMemHostRegister(ctypes.addressof(buf), 8192, 0))
        assert err(cu.cuMemHostRegister(ctypes.addressof(buf), 8192, 0)) == \\
            R.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        assert int(ok(cu.cuMemHostGetDevicePointer(ctypes.addressof(buf), 0))) == ctypes.addressof(buf)
        d = ok(cu.cuMemAlloc(MB))
        ctypes.memset(int(h), 0x5a, MB)
        s = ok(cu.cuStreamCreate(0))
        ok(cu.cuMemcpyHtoDAsync(d, h, MB, s))
        ok(cu.cuMemcpyDtoHAsync(ctypes.addressof(buf), d, 8192, s))
        ok(cu.cuStreamSynchronize(s))
        assert buf.raw == b"\\x5a" * 8192
        ok(cu.cuMemHostUnregister(ctypes.addressof(buf)))
        assert err(cu.cuMemHostUnregister(ctypes.addressof(buf))) == R.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        ok(cu.cuMemFreeHost(h)); ok(cu.cuMemFreeHost(h2))
    """)


def test_copies_and_memsets_sync_async_and_2d(fake_env):
    run(fake_env, """
        ctx()
        a = ok(cu.cuMemAlloc(MB)); b = ok(cu.cuMemAlloc(MB))
        ok(cu.cuMemsetD8(a, 0x11, MB))
        ok(cu.cuMemsetD16(a, 0x2222, 8))
        ok(cu.cuMemcpyDtoD(b, a, MB))
        assert u32(b, 0) == 0x22222222 and u32(b, 4) == 0x11111111
        s = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        ok(cu.cuMemsetD32Async(a, 0xdeadbeef, MB // 4, s))
        ok(cu.cuMemcpyDtoDAsync(b, a, MB, s))
        ok(cu.cuMemsetD8Async(b, 0, 4, s))
        ok(cu.cuStreamSynchronize(s))
        assert u32(b, 0) == 0 and u32(b, 1) == 0xdeadbeef
        ok(cu.cuMemsetD2D32(a, 64, 7, 4, 3))  # 3 rows of 4 words, 64-byte pitch
        assert [u32(a, i) for i in (0, 3, 4, 16, 35, 36)] == [7, 7, 0xdeadbeef, 7, 7, 0xdeadbeef]
        src = ctypes.create_string_buffer(b"abcdefgh", 8)
        ok(cu.cuMemcpyHtoD(a, src, 8))
        ok(cu.cuMemcpy(b, a, 8))  # unified addressing
        c1 = ok(cu.cuDevicePrimaryCtxRetain(1))
        ok(cu.cuMemcpyPeer(b, c1, a, ok(cu.cuCtxGetCurrent()), 8))
        dst = ctypes.create_string_buffer(8)
        ok(cu.cuMemcpyDtoH(dst, b, 8))
        assert dst.raw == b"abcdefgh"
        assert err(cu.cuMemcpyDtoH(dst, int(b) + 64 * MB, 8)) == R.CUDA_ERROR_INVALID_VALUE  # nothing mapped there
    """)


def test_streams_events_and_fake_kernels_run_in_order(fake_env):
    run(fake_env, """
        ctx()
        mod = ok(cu.cuModuleLoadData(b"fakecuda"))
        assert err(cu.cuModuleLoadData(b"not a module")) == R.CUDA_ERROR_INVALID_IMAGE
        n = 1 << 16
        a = ok(cu.cuMemAlloc(4 * n)); b = ok(cu.cuMemAlloc(4 * n))
        s1 = ok(cu.cuStreamCreate(0)); s2 = ok(cu.cuStreamCreate(0))
        start = ok(cu.cuEventCreate(0)); done = ok(cu.cuEventCreate(0))
        ok(cu.cuEventRecord(start, s1))
        launch(mod, b"sleep_us", (400000,), (U64,), s1)
        launch(mod, b"fill32", (int(a), 5, n), (U64, U32, U64), s1)
        launch(mod, b"add32", (int(a), 3, n), (U64, U32, U64), s1)
        ok(cu.cuEventRecord(done, s1))
        assert err(cu.cuEventQuery(done)) == R.CUDA_ERROR_NOT_READY
        assert err(cu.cuStreamQuery(s1)) == R.CUDA_ERROR_NOT_READY
        ok(cu.cuStreamWaitEvent(s2, done, 0))  # s2 waits for s1's work
        launch(mod, b"copy8", (int(b), int(a), 4 * n), (U64, U64, U64), s2)
        ok(cu.cuStreamSynchronize(s2))
        assert err(cu.cuEventQuery(done)) == R.CUDA_SUCCESS
        assert u32(b, n - 1) == 8
        assert ok(cu.cuEventElapsedTime(start, done)) >= 350.0
        calls = []
        CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        cb = CB(lambda data: calls.append(data))
        ok(cu.cuLaunchHostFunc(s1, ctypes.cast(cb, ctypes.c_void_p).value, 0))
        ok(cu.cuStreamSynchronize(s1))
        assert len(calls) == 1
        # An illegal pointer is caught at launch.
        f = ok(cu.cuModuleGetFunction(mod, b"fill32"))
        assert err(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s1, ((4096, 1, 16), (U64, U32, U64)), 0)) == \\
            R.CUDA_ERROR_ILLEGAL_ADDRESS
        ok(cu.cuStreamDestroy(s1)); ok(cu.cuStreamDestroy(s2))
        ok(cu.cuEventDestroy(start)); ok(cu.cuEventDestroy(done))
    """)


def test_legacy_default_stream_orders_after_other_streams(fake_env):
    run(fake_env, """
        ctx()
        mod = ok(cu.cuModuleLoadData(b"fakecuda"))
        a = ok(cu.cuMemAlloc(4096))
        s = ok(cu.cuStreamCreate(0))
        launch(mod, b"sleep_us", (100000,), (U64,), s)
        launch(mod, b"fill32", (int(a), 1, 1024), (U64, U32, U64), s)
        launch(mod, b"add32", (int(a), 1, 1024), (U64, U32, U64), 0)  # NULL stream: after s's work
        ok(cu.cuCtxSynchronize())
        assert u32(a, 10) == 2
    """)


def test_peer_access(fake_env):
    run(fake_env, """
        ok(cu.cuInit(0))
        assert ok(cu.cuDeviceCanAccessPeer(0, 1)) == 1 and ok(cu.cuDeviceCanAccessPeer(0, 0)) == 0
        c0 = ctx(0); c1 = ok(cu.cuDevicePrimaryCtxRetain(1))
        ok(cu.cuCtxEnablePeerAccess(c1, 0))
        assert err(cu.cuCtxEnablePeerAccess(c1, 0)) == R.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        ok(cu.cuCtxDisablePeerAccess(c1))
        assert err(cu.cuCtxDisablePeerAccess(c1)) == R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
        assert err(cu.cuCtxEnablePeerAccess(c0, 0)) == R.CUDA_ERROR_INVALID_DEVICE
    """)


def test_multicast_objects(fake_env):
    run(fake_env, """
        ctx()
        mp = cu.CUmulticastObjectProp(); mp.numDevices = 2; mp.size = 2 * MB; mp.handleTypes = FD
        assert ok(cu.cuMulticastGetGranularity(mp, cu.CUmulticastGranularity_flags.CU_MULTICAST_GRANULARITY_MINIMUM)) == 2 * MB
        mc = ok(cu.cuMulticastCreate(mp))
        ok(cu.cuMulticastAddDevice(mc, 0)); ok(cu.cuMulticastAddDevice(mc, 1))
        mem = ok(cu.cuMemCreate(2 * MB, prop(0), 0))
        ok(cu.cuMulticastBindMem(mc, 0, mem, 0, 2 * MB, 0))
        va = ok(cu.cuMemAddressReserve(2 * MB, 0, 0, 0)); ok(cu.cuMemMap(va, 2 * MB, 0, mem, 0))
        ok(cu.cuMemSetAccess(va, 2 * MB, access(0), 1))
        ok(cu.cuMulticastBindAddr(mc, 0, va, 2 * MB, 0))
        ok(cu.cuMulticastUnbind(mc, 0, 0, 2 * MB))
        fd = ok(cu.cuMemExportToShareableHandle(mc, FD, 0))
        assert fd >= 0
        ok(cu.cuMemRelease(mc))
    """)


def test_error_names_and_strings(fake_env):
    run(fake_env, """
        assert ok(cu.cuGetErrorName(R.CUDA_ERROR_ILLEGAL_STATE)) == b"CUDA_ERROR_ILLEGAL_STATE"
        assert ok(cu.cuGetErrorString(R.CUDA_ERROR_OUT_OF_MEMORY))
    """)


def test_fault_injection_fails_the_nth_call_only(fake_env):
    run(fake_env, """
        ctx()
        ok(cu.cuMemCreate(2 * MB, prop(), 0))
        assert err(cu.cuMemCreate(2 * MB, prop(), 0)) == R.CUDA_ERROR_OUT_OF_MEMORY
        ok(cu.cuMemCreate(2 * MB, prop(), 0))
        assert err(cu.cuMemAlloc(4096)) == R.CUDA_ERROR_UNKNOWN  # code defaults to UNKNOWN
    """, FAKECUDA_FAIL="cuMemCreate=2:2,cuMemAlloc=1")


def test_threads_allocate_copy_and_free_concurrently(fake_env):
    run(fake_env, """
        c = ctx()
        errors = []
        def work(seed):
            try:
                ok(cu.cuCtxSetCurrent(c))
                s = ok(cu.cuStreamCreate(0))
                for i in range(20):
                    p = ok(cu.cuMemAlloc(64 * 1024))
                    ok(cu.cuMemsetD32Async(p, seed * 1000 + i, 16 * 1024, s))
                    ok(cu.cuStreamSynchronize(s))
                    assert u32(p, 999) == seed * 1000 + i
                    ok(cu.cuMemFree(p))
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        [t.start() for t in threads]; [t.join() for t in threads]
        assert not errors, errors
    """)


def test_a_child_forked_after_cuinit_cannot_use_cuda(fake_env):
    run(fake_env, """
        ctx()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if err(cu.cuMemAlloc(4096)) == R.CUDA_ERROR_NOT_INITIALIZED else 1)
        assert os.waitpid(pid, 0)[1] == 0
        ok(cu.cuMemAlloc(4096))  # the parent is unaffected
    """)


def test_usage_files_show_each_process_device_memory(workers, fake_env):
    from fakecuda.usage import read_usage
    a, b = workers(), workers(device=1)
    a.ok("alloc x 0x400000")
    b.ok("vmm y 0x200000 1")
    usage = read_usage(fake_env["FAKECUDA_STATE"])
    assert usage[a.pid] == {0: 4 << 20, 1: 0}
    assert usage[b.pid] == {0: 0, 1: 2 << 20}
    a.ok("exit")
    a.proc.wait(10)
    assert a.pid not in read_usage(fake_env["FAKECUDA_STATE"])


def test_2d_3d_copies_and_stream_memory_operations(fake_env):
    run(fake_env, """
        ctx()
        a = ok(cu.cuMemAlloc(MB)); flag = ok(cu.cuMemAlloc(4096))
        ok(cu.cuMemsetD8(a, 0, MB)); ok(cu.cuMemsetD8(flag, 0, 4096))
        host = (ctypes.c_uint8 * 64)(*range(64))  # 4 rows of 16 bytes
        p = cu.CUDA_MEMCPY2D()
        p.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_HOST; p.srcHost = ctypes.addressof(host); p.srcPitch = 16
        p.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE; p.dstDevice = a; p.dstPitch = 256
        p.WidthInBytes = 8; p.Height = 4
        ok(cu.cuMemcpy2D(p))
        out = (ctypes.c_uint8 * 1024)()
        ok(cu.cuMemcpyDtoH(out, a, 1024))
        assert list(out[0:9]) == [0, 1, 2, 3, 4, 5, 6, 7, 0] and list(out[768:776]) == list(range(48, 56))
        # A stream waits on a value another stream writes.
        waiter = ok(cu.cuStreamCreate(0)); writer = ok(cu.cuStreamCreate(0))
        ok(cu.cuStreamWaitValue32(waiter, flag, 7, cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ))
        ok(cu.cuMemsetD32Async(a, 0x99, 4, waiter))
        time.sleep(0.1)
        assert err(cu.cuStreamQuery(waiter)) == R.CUDA_ERROR_NOT_READY
        ok(cu.cuStreamWriteValue32(writer, flag, 7, 0))
        ok(cu.cuStreamSynchronize(waiter))
        assert u32(a, 0) == 0x99
        r = cu.cuGraphLaunch(None, 0)
        assert err(r) == R.CUDA_ERROR_INVALID_HANDLE
    """)
