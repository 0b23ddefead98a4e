"""The test kernels, for either driver: the fake driver's built-in ones (image b"fakecuda"), or
the same kernels as PTX for a real GPU, with the same names and parameters:
  sleep_us(uint64 us)                      spin for us microseconds (%globaltimer)
  fill32(CUdeviceptr p, uint32 v, uint64 n) p[i] = v for i < n
  add32(CUdeviceptr p, uint32 v, uint64 n)  p[i] += v for i < n
fill32 and add32 use a grid-stride loop, so any launch shape covers all n elements.
"""
from __future__ import annotations

FAKE_IMAGE = b"fakecuda"

_ELEMENTWISE = """
.visible .entry {name}(.param .u64 p, .param .u32 v, .param .u64 n)
{{
    .reg .pred %done;
    .reg .b32 %r<6>;
    .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [p];
    ld.param.u32 %r1, [v];
    ld.param.u64 %rd2, [n];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mov.u32 %r5, %nctaid.x;
    mul.wide.u32 %rd3, %r2, %r3;
    cvt.u64.u32 %rd4, %r4;
    add.u64 %rd3, %rd3, %rd4;
    mul.wide.u32 %rd5, %r5, %r3;
{name}_loop:
    setp.ge.u64 %done, %rd3, %rd2;
    @%done bra {name}_end;
    shl.b64 %rd6, %rd3, 2;
    add.u64 %rd7, %rd1, %rd6;
    {body}
    add.u64 %rd3, %rd3, %rd5;
    bra {name}_loop;
{name}_end:
    ret;
}}
"""

PTX = ("""
.version 7.0
.target sm_70
.address_size 64

.visible .entry sleep_us(.param .u64 us)
{
    .reg .pred %wait;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [us];
    mul.lo.u64 %rd1, %rd1, 1000;
    mov.u64 %rd2, %globaltimer;
sleep_us_loop:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %wait, %rd4, %rd1;
    @%wait bra sleep_us_loop;
    ret;
}
""" + _ELEMENTWISE.format(name="fill32", body="st.global.u32 [%rd7], %r1;")
    + _ELEMENTWISE.format(name="add32", body="ld.global.u32 %r2, [%rd7];\n    add.u32 %r2, %r2, %r1;\n"
                                             "    st.global.u32 [%rd7], %r2;")).encode() + b"\0"


def load_module(cu):
    """Loads the kernels with cuda-python's driver module `cu`: the PTX (a real driver), else the
    fake driver's (which refuses any other image)."""
    err, mod = cu.cuModuleLoadData(PTX)
    if err == cu.CUresult.CUDA_SUCCESS:
        return mod
    err, mod = cu.cuModuleLoadData(FAKE_IMAGE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot load the test kernels: {cu.cuGetErrorName(err)[1].decode()}")
    return mod
