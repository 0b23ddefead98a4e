"""A Python model of criu_gpushare/gpu/xxh3.cu: the same algorithm, split the same way.

The kernel cannot run on the CPU machines, so this model executes its structure step by step (the
tiles, the warp that owns each 1024-byte block, the 32 threads that each load 32 bytes of it, the
shuffle tree that sums their partial lane sums, the separate chain warp that adds a block's sums to
the accumulators and scrambles, the tail and the merge) and test_xxh3_model.py compares the result
with the `xxhash` package. Names follow the kernel's, so a change there has an obvious twin here.

Only for small inputs: it is pure Python.
"""
import struct

M64 = (1 << 64) - 1

# The XXH3 default secret (192 bytes), as published in the XXH3 specification.
SECRET = bytes([
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
])

P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2, P64_3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P64_4, P64_5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5
PMX1, PMX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25

# The kernel's shape (xxh3.cu: XXH_COMPUTE_WARPS, XXH_BLOCKS_PER_WARP).
COMPUTE_WARPS = 8
BLOCKS_PER_WARP = 8
TILE_BLOCKS = COMPUTE_WARPS * BLOCKS_PER_WARP
BLOCK_LEN = 1024
STRIPE_LEN = 64


def r32(b, off):
    return struct.unpack_from("<I", b, off)[0]


def r64(b, off):
    return struct.unpack_from("<Q", b, off)[0]


def key64(i):
    """The i-th 64-bit word of the secret (aligned: the kernel keeps them in a constant array)."""
    return r64(SECRET, 8 * i)


def mul128_fold64(a, b):
    p = a * b
    return (p & M64) ^ (p >> 64)


def swap32(x):
    return int.from_bytes(x.to_bytes(4, "little"), "big")


def swap64(x):
    return int.from_bytes(x.to_bytes(8, "little"), "big")


def rotl32(x, r):
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def avalanche_xxh64(h):
    h ^= h >> 33
    h = h * P64_2 & M64
    h ^= h >> 29
    h = h * P64_3 & M64
    return h ^ (h >> 32)


def avalanche(h):
    h ^= h >> 37
    h = h * PMX1 & M64
    return h ^ (h >> 32)


# -- lengths 0..240: one thread, as in the kernel's xxh3_short ---------------------------------

def len_0to16(b):
    n = len(b)
    if n > 8:
        bitflipl = r64(SECRET, 32) ^ r64(SECRET, 40)
        bitfliph = r64(SECRET, 48) ^ r64(SECRET, 56)
        lo_in, hi_in = r64(b, 0), r64(b, n - 8)
        m = (lo_in ^ hi_in ^ bitflipl) * P64_1
        m_lo, m_hi = m & M64, m >> 64
        m_lo = (m_lo + ((n - 1) << 54)) & M64
        hi_in ^= bitfliph
        m_hi = (m_hi + hi_in + (hi_in & 0xFFFFFFFF) * (P32_2 - 1)) & M64
        m_lo ^= swap64(m_hi)
        h = m_lo * P64_2
        h_lo, h_hi = h & M64, h >> 64
        h_hi = (h_hi + m_hi * P64_2) & M64
        return avalanche(h_lo), avalanche(h_hi)
    if n >= 4:
        x = r32(b, 0) + (r32(b, n - 4) << 32)
        keyed = x ^ (r64(SECRET, 16) ^ r64(SECRET, 24))
        m = keyed * ((P64_1 + (n << 2)) & M64)
        m_lo, m_hi = m & M64, m >> 64
        m_hi = (m_hi + (m_lo << 1)) & M64
        m_lo ^= m_hi >> 3
        m_lo ^= m_lo >> 35
        m_lo = m_lo * PMX2 & M64
        m_lo ^= m_lo >> 28
        return m_lo, avalanche(m_hi)
    if n > 0:
        combl = (b[0] << 16) | (b[n >> 1] << 24) | b[n - 1] | (n << 8)
        combh = rotl32(swap32(combl), 13)
        keyl = combl ^ (r32(SECRET, 0) ^ r32(SECRET, 4))
        keyh = combh ^ (r32(SECRET, 8) ^ r32(SECRET, 12))
        return avalanche_xxh64(keyl), avalanche_xxh64(keyh)
    return (avalanche_xxh64(r64(SECRET, 64) ^ r64(SECRET, 72)),
            avalanche_xxh64(r64(SECRET, 80) ^ r64(SECRET, 88)))


def mix16(b, off, soff):
    return mul128_fold64(r64(b, off) ^ r64(SECRET, soff), r64(b, off + 8) ^ r64(SECRET, soff + 8))


def mix32(acc, b, o1, o2, soff):
    lo, hi = acc
    lo = (lo + mix16(b, o1, soff)) & M64
    lo ^= (r64(b, o2) + r64(b, o2 + 8)) & M64
    hi = (hi + mix16(b, o2, soff + 16)) & M64
    hi ^= (r64(b, o1) + r64(b, o1 + 8)) & M64
    return lo, hi


def finish_mid(acc, n):
    lo, hi = acc
    h_lo = (lo + hi) & M64
    h_hi = (lo * P64_1 + hi * P64_4 + n * P64_2) & M64
    return avalanche(h_lo), (-avalanche(h_hi)) & M64


def len_17to128(b):
    n = len(b)
    acc = (n * P64_1 & M64, 0)
    if n > 32:
        if n > 64:
            if n > 96:
                acc = mix32(acc, b, 48, n - 64, 96)
            acc = mix32(acc, b, 32, n - 48, 64)
        acc = mix32(acc, b, 16, n - 32, 32)
    acc = mix32(acc, b, 0, n - 16, 0)
    return finish_mid(acc, n)


def len_129to240(b):
    n = len(b)
    acc = (n * P64_1 & M64, 0)
    for i in range(4):
        acc = mix32(acc, b, 32 * i, 32 * i + 16, 32 * i)
    acc = (avalanche(acc[0]), avalanche(acc[1]))
    for i in range(4, n // 32):
        acc = mix32(acc, b, 32 * i, 32 * i + 16, 3 + 32 * (i - 4))
    acc = mix32(acc, b, n - 16, n - 32, 136 - 17 - 16)
    return finish_mid(acc, n)


# -- longer inputs: the kernel's split -----------------------------------------------------------

ACC_INIT = (P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1)


def thread_partials(b, block_off, t):
    """Compute thread t (0..31) of a warp on one 1024-byte block: it loads words 4t..4t+3
    (stripe t/2, lanes i0..i0+3 with i0 = 4*(t%2)) and sums what they add to lanes i0..i0+3."""
    s, i0 = t >> 1, (t & 1) * 4
    part = [0, 0, 0, 0]
    for q in range(4):
        i = i0 + q
        d = r64(b, block_off + 32 * t + 8 * q)
        dk = d ^ key64(s + i)
        part[q] = (part[q] + (dk & 0xFFFFFFFF) * (dk >> 32)) & M64
        part[(i ^ 1) - i0] = (part[(i ^ 1) - i0] + d) & M64
    return part


def warp_block_sums(b, block_off):
    """The warp's shuffle tree: xor-butterfly over masks 2, 4, 8, 16 (threads of equal parity);
    then thread 0 holds lanes 0..3 and thread 1 lanes 4..7 of the block's sums."""
    regs = [thread_partials(b, block_off, t) for t in range(32)]
    for mask in (2, 4, 8, 16):
        regs = [[(regs[t][q] + regs[t ^ mask][q]) & M64 for q in range(4)] for t in range(32)]
    return regs[0] + regs[1]


def scramble(a, i):
    a ^= a >> 47
    a ^= key64(16 + i)
    return a * P32_1 & M64


def accumulate_tail(b, acc, start, n):
    """The chain warp's tail: thread i adds to lane i what the last, partial block and the last
    stripe bring (only additions: no scramble after them)."""
    nb_stripes = (n - 1 - start) // STRIPE_LEN
    out = []
    for i in range(8):
        a = acc[i]
        for s in range(nb_stripes):
            p = start + STRIPE_LEN * s
            dk = r64(b, p + 8 * i) ^ key64(s + i)
            a = (a + (dk & 0xFFFFFFFF) * (dk >> 32) + r64(b, p + 8 * (i ^ 1))) & M64
        p = n - STRIPE_LEN
        dk = r64(b, p + 8 * i) ^ r64(SECRET, 192 - 64 - 7 + 8 * i)  # unaligned secret read
        a = (a + (dk & 0xFFFFFFFF) * (dk >> 32) + r64(b, p + 8 * (i ^ 1))) & M64
        out.append(a)
    return out


def merge(acc, soff, start):
    r = start
    for j in range(4):
        r = (r + mul128_fold64(acc[2 * j] ^ r64(SECRET, soff + 16 * j),
                               acc[2 * j + 1] ^ r64(SECRET, soff + 16 * j + 8))) & M64
    return avalanche(r)


def long_input(b):
    n = len(b)
    nb_blocks = (n - 1) // BLOCK_LEN
    acc = list(ACC_INIT)
    for tile in range(0, nb_blocks, TILE_BLOCKS):
        # compute warps: warp w sums blocks tile + w*BLOCKS_PER_WARP + k into shared slots
        slots = [None] * TILE_BLOCKS
        for w in range(COMPUTE_WARPS):
            for k in range(BLOCKS_PER_WARP):
                slot = w * BLOCKS_PER_WARP + k
                if tile + slot < nb_blocks:
                    slots[slot] = warp_block_sums(b, (tile + slot) * BLOCK_LEN)
        # chain warp, thread i: add and scramble block after block, in order
        for slot in range(min(TILE_BLOCKS, nb_blocks - tile)):
            acc = [scramble((acc[i] + slots[slot][i]) & M64, i) for i in range(8)]
    acc = accumulate_tail(b, acc, nb_blocks * BLOCK_LEN, n)
    lo = merge(acc, 11, n * P64_1 & M64)
    hi = merge(acc, 192 - 64 - 11, ~(n * P64_2) & M64)
    return lo, hi


def xxh3_128(data):
    """(low64, high64) of XXH3-128 with the default secret and seed 0."""
    b = bytes(data)
    n = len(b)
    if n <= 16:
        return len_0to16(b)
    if n <= 128:
        return len_17to128(b)
    if n <= 240:
        return len_129to240(b)
    return long_input(b)


def hexdigest(data):
    lo, hi = xxh3_128(data)
    return f"{hi:016x}{lo:016x}"
