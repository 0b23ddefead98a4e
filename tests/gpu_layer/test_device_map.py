"""Device maps: the tool's ordinal of a UUID, and a workload's devices map under --gpu-map."""
import pytest

from criu_gpushare.errors import DriverError
from criu_gpushare.gpu.devices import DeviceMap, workload_devices_map

A, B, C = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000", \
    "GPU-cccccccc-0000-0000-0000-000000000000"


def test_the_tool_finds_its_own_ordinal_of_a_uuid():
    m = DeviceMap([B, A])  # the tool sees them in another order than the workload
    assert m.ordinal(A) == 1 and m.ordinal(B) == 0
    assert m.ordinal(None, fallback=3) == 3
    with pytest.raises(DriverError, match="not visible"):
        m.ordinal(C)


def test_a_workload_devices_map_follows_the_gpu_map_in_its_own_ordinals():
    devices = {0: B, 1: A}  # the workload's own numbering
    assert workload_devices_map(devices, {A: B, B: A}) == "0:1,1:0"
    assert workload_devices_map(devices, {A: A}) == ""
    assert workload_devices_map(devices, None) == ""
    with pytest.raises(DriverError, match="not one the workload sees"):
        workload_devices_map(devices, {A: C})
