"""Device memory made as the shims make theirs, for the benches that import or map it as the tool
does (mapping_bench.py, overlap_bench.py, save_stages_bench.py): one cuMemCreate allocation,
exportable as a POSIX fd, mapped read-write in this process.

Needs the package on sys.path (each bench puts the repository there) and a current context.
"""
from criu_gpushare.gpu import driver as drv, memory


def allocation(size, device=0):
    """size bytes on GPU `device`, mapped read-write here -> (handle, device pointer). The caller
    unmaps and releases them (cuMemUnmap, cuMemAddressFree, cuMemRelease) or lets its exit do it."""
    cu = drv.driver()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = memory.fd_handle_type()
    handle = drv.check(cu.cuMemCreate(size, prop, 0), f"allocate {size} bytes on GPU {device}")
    ptr = drv.check(cu.cuMemAddressReserve(size, 0, 0, 0), f"reserve {size} bytes")
    drv.check(cu.cuMemMap(ptr, size, 0, handle, 0), "map")
    memory.set_read_write(ptr, size, device)
    return handle, ptr


def export(handle, what="export"):
    """A new fd of the allocation `handle`, as a shim hands it to the tool (the caller closes it);
    `what` names the step in the error."""
    return drv.check(drv.driver().cuMemExportToShareableHandle(handle, memory.fd_handle_type(), 0), what)
