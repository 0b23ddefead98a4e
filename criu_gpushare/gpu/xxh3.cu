// XXH3-128 (default secret, seed 0) of GPU memory, chunk by chunk: the chunk store's content
// address (store/FORMAT.md section 3), computed where the bytes are, so that the copy engine
// moves over PCIe only the chunks the store lacks (FORMAT.md section 13).
//
// Written from the XXH3 specification. tests/gpu_layer/xxh3_model.py is a Python model of this
// file, split the same way, checked against the `xxhash` package on CPU machines;
// tests/gpu/test_fingerprint.py checks this kernel itself on a GPU.
//
// One launch hashes the chunks of one allocation: chunk c is the bytes [c*chunk_size,
// min((c+1)*chunk_size, size)) at `base`, hashed by CUDA block c, result in out[2c] (low 64 bits)
// and out[2c+1] (high 64 bits). Every length is handled, 0 included (size 0: one block, out[0..1]
// = the hash of no bytes). `base` and `chunk_size` must be multiples of 16 (the 16-byte loads of
// the long path; the caller checks and otherwise hashes on the CPU).
//
// The long path (more than 240 bytes). XXH3 runs 8 64-bit accumulators over 1024-byte blocks:
// each block adds, per 8-byte word w at lane i of stripe s, `w` to lane i^1 and
// lo32(w ^ key[s+i]) * hi32(w ^ key[s+i]) to lane i, then scrambles the accumulators. What a
// block adds does not depend on the accumulators, so it is computed in parallel; only the "add,
// then scramble" steps run in order, and each lane's chain is independent of the others.
//   - 8 compute warps. A tile is 64 consecutive blocks; warp w takes blocks 8w..8w+7 of it. For
//     one block, thread t loads bytes 32t..32t+31 (stripe t/2, lanes 4(t%2)..4(t%2)+3) and sums
//     what its 4 words add to those 4 lanes; a shuffle butterfly over the threads of equal parity
//     leaves the block's 8 lane sums in threads 0 and 1, which store them in shared memory.
//   - 1 chain warp, threads 0..7 one lane each: while the compute warps fill one tile buffer, it
//     adds the previous tile's sums block after block and scrambles (double buffering).
//   - The last 1..1024 bytes are not a full block to XXH3 (no scramble, the last stripe at
//     len-64 with its own secret offset): the chain threads add them, then thread 0 merges.
// Addition modulo 2^64 is associative and commutative, so this order gives XXH3's exact result.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

#define XXH_COMPUTE_WARPS 8
#define XXH_BLOCKS_PER_WARP 8
#define XXH_TILE_BLOCKS (XXH_COMPUTE_WARPS * XXH_BLOCKS_PER_WARP)
#define XXH_THREADS ((XXH_COMPUTE_WARPS + 1) * 32)
#define XXH_BLOCK_LEN 1024
#define XXH_STRIPE_LEN 64
#define XXH_SECRET_LEN 192

#define P32_1 0x9E3779B1ULL
#define P32_2 0x85EBCA77ULL
#define P32_3 0xC2B2AE3DULL
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define PMX1 0x165667919E3779F9ULL
#define PMX2 0x9FB21C651E98DF25ULL

// The default secret of the XXH3 specification (192 bytes), as 24 little-endian 64-bit words
// (bytes b8 fe 6c 39 23 a4 4b be ... 40 7e), and a zero word so that secret64 may read one past.
__constant__ u64 xxh_secret64[XXH_SECRET_LEN / 8 + 1] = {
    0xbe4ba423396cfeb8ULL, 0x1cad21f72c81017cULL, 0xdb979083e96dd4deULL, 0x1f67b3b7a4a44072ULL,
    0x78e5c0cc4ee679cbULL, 0x2172ffcc7dd05a82ULL, 0x8e2443f7744608b8ULL, 0x4c263a81e69035e0ULL,
    0xcb00c391bb52283cULL, 0xa32e531b8b65d088ULL, 0x4ef90da297486471ULL, 0xd8acdea946ef1938ULL,
    0x3f349ce33f76faa8ULL, 0x1d4f0bc7c7bbdcf9ULL, 0x3159b4cd4be0518aULL, 0x647378d9c97e9fc8ULL,
    0xc3ebd33483acc5eaULL, 0xeb6313faffa081c5ULL, 0x49daf0b751dd0d17ULL, 0x9e68d429265516d3ULL,
    0xfca1477d58be162bULL, 0xce31d07ad1b8f88fULL, 0x280416958f3acb45ULL, 0x7e404bbbcafbd7afULL,
    0,
};

// -- small helpers (byte-wise loads: any alignment) -------------------------------------------

__device__ __forceinline__ u64 load64(const u8 *p)
{
    u64 v = 0;
#pragma unroll
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}

__device__ __forceinline__ u32 load32(const u8 *p)
{
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// The 8 (4) secret bytes at byte offset `off`: two aligned words and a funnel shift, not 8 loads.
__device__ __forceinline__ u64 secret64(int off)
{
    const u64 w0 = xxh_secret64[off >> 3], w1 = xxh_secret64[(off >> 3) + 1];
    const int sh = (off & 7) * 8;
    return sh ? (w0 >> sh) | (w1 << (64 - sh)) : w0;
}

__device__ __forceinline__ u32 secret32(int off) { return (u32)secret64(off); }

__device__ __forceinline__ u64 fold64(u64 a, u64 b) { return (a * b) ^ __umul64hi(a, b); }

__device__ __forceinline__ u64 avalanche_xxh64(u64 h)
{
    h ^= h >> 33;
    h *= P64_2;
    h ^= h >> 29;
    h *= P64_3;
    return h ^ (h >> 32);
}

__device__ __forceinline__ u64 avalanche(u64 h)
{
    h ^= h >> 37;
    h *= PMX1;
    return h ^ (h >> 32);
}

__device__ __forceinline__ u64 swap64(u64 x)
{
    return ((u64)__byte_perm((u32)x, 0, 0x0123) << 32) | __byte_perm((u32)(x >> 32), 0, 0x0123);
}
__device__ __forceinline__ u32 swap32(u32 x) { return __byte_perm(x, 0, 0x0123); }
__device__ __forceinline__ u32 rotl32(u32 x, int r) { return (x << r) | (x >> (32 - r)); }

// -- 0..240 bytes: one thread ------------------------------------------------------------------

__device__ __noinline__ void len_0to16(const u8 *p, u64 n, u64 *lo, u64 *hi)
{
    if (n > 8) {
        u64 flipl = secret64(32) ^ secret64(40), fliph = secret64(48) ^ secret64(56);
        u64 in_lo = load64(p), in_hi = load64(p + n - 8);
        u64 x = in_lo ^ in_hi ^ flipl;
        u64 m_lo = x * P64_1, m_hi = __umul64hi(x, P64_1);
        m_lo += (n - 1) << 54;
        in_hi ^= fliph;
        m_hi += in_hi + (u64)(u32)in_hi * (P32_2 - 1);
        m_lo ^= swap64(m_hi);
        u64 h_lo = m_lo * P64_2, h_hi = __umul64hi(m_lo, P64_2) + m_hi * P64_2;
        *lo = avalanche(h_lo);
        *hi = avalanche(h_hi);
    } else if (n >= 4) {
        u64 x = (u64)load32(p) + ((u64)load32(p + n - 4) << 32);
        u64 keyed = x ^ (secret64(16) ^ secret64(24));
        u64 mul = P64_1 + (n << 2);
        u64 m_lo = keyed * mul, m_hi = __umul64hi(keyed, mul);
        m_hi += m_lo << 1;
        m_lo ^= m_hi >> 3;
        m_lo ^= m_lo >> 35;
        m_lo *= PMX2;
        m_lo ^= m_lo >> 28;
        *lo = m_lo;
        *hi = avalanche(m_hi);
    } else if (n > 0) {
        u32 combl = ((u32)p[0] << 16) | ((u32)p[n >> 1] << 24) | (u32)p[n - 1] | ((u32)n << 8);
        u32 combh = rotl32(swap32(combl), 13);
        *lo = avalanche_xxh64((u64)(combl ^ (secret32(0) ^ secret32(4))));
        *hi = avalanche_xxh64((u64)(combh ^ (secret32(8) ^ secret32(12))));
    } else {
        *lo = avalanche_xxh64(secret64(64) ^ secret64(72));
        *hi = avalanche_xxh64(secret64(80) ^ secret64(88));
    }
}

__device__ __forceinline__ u64 mix16(const u8 *p, int soff)
{
    return fold64(load64(p) ^ secret64(soff), load64(p + 8) ^ secret64(soff + 8));
}

__device__ __forceinline__ void mix32(u64 *acc_lo, u64 *acc_hi, const u8 *p1, const u8 *p2, int soff)
{
    *acc_lo += mix16(p1, soff);
    *acc_lo ^= load64(p2) + load64(p2 + 8);
    *acc_hi += mix16(p2, soff + 16);
    *acc_hi ^= load64(p1) + load64(p1 + 8);
}

__device__ __forceinline__ void finish_mid(u64 acc_lo, u64 acc_hi, u64 n, u64 *lo, u64 *hi)
{
    *lo = avalanche(acc_lo + acc_hi);
    *hi = 0 - avalanche(acc_lo * P64_1 + acc_hi * P64_4 + n * P64_2);
}

__device__ __noinline__ void len_17to240(const u8 *p, u64 n, u64 *lo, u64 *hi)
{
    u64 acc_lo = n * P64_1, acc_hi = 0;
    if (n <= 128) {
        if (n > 32) {
            if (n > 64) {
                if (n > 96)
                    mix32(&acc_lo, &acc_hi, p + 48, p + n - 64, 96);
                mix32(&acc_lo, &acc_hi, p + 32, p + n - 48, 64);
            }
            mix32(&acc_lo, &acc_hi, p + 16, p + n - 32, 32);
        }
        mix32(&acc_lo, &acc_hi, p, p + n - 16, 0);
    } else {
        for (int i = 0; i < 4; i++)
            mix32(&acc_lo, &acc_hi, p + 32 * i, p + 32 * i + 16, 32 * i);
        acc_lo = avalanche(acc_lo);
        acc_hi = avalanche(acc_hi);
        int rounds = (int)(n / 32);
        for (int i = 4; i < rounds; i++)
            mix32(&acc_lo, &acc_hi, p + 32 * i, p + 32 * i + 16, 3 + 32 * (i - 4));
        mix32(&acc_lo, &acc_hi, p + n - 16, p + n - 32, 136 - 17 - 16);
    }
    finish_mid(acc_lo, acc_hi, n, lo, hi);
}

// -- more than 240 bytes: the whole CUDA block --------------------------------------------------

__device__ __forceinline__ u64 merge_accs(const u64 *acc, int soff, u64 start)
{
    u64 r = start;
#pragma unroll
    for (int j = 0; j < 4; j++)
        r += fold64(acc[2 * j] ^ secret64(soff + 16 * j), acc[2 * j + 1] ^ secret64(soff + 16 * j + 8));
    return avalanche(r);
}

__device__ __forceinline__ u64 lane_product(u64 w, u64 key)
{
    u64 dk = w ^ key;
    return (u64)(u32)dk * (dk >> 32);
}

__device__ void long_input(const u8 *p, u64 n, u64 *out)
{
    __shared__ u64 sums[2][XXH_TILE_BLOCKS][8];
    __shared__ u64 accs[8];
    const u32 warp = threadIdx.x >> 5, t = threadIdx.x & 31;
    const u64 nb_blocks = (n - 1) / XXH_BLOCK_LEN;
    const u64 nb_tiles = (nb_blocks + XXH_TILE_BLOCKS - 1) / XXH_TILE_BLOCKS;

    // A compute thread always meets the same 4 secret words: stripe t/2, lanes i0..i0+3.
    const u32 s = t >> 1, i0 = (t & 1) * 4;
    u64 key[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        key[q] = secret64(8 * (s + i0 + q));

    // A chain thread (warp XXH_COMPUTE_WARPS, t < 8) owns lane t.
    const u32 lane = t & 7;
    u64 acc = lane == 0 ? P32_3 : lane == 1 ? P64_1 : lane == 2 ? P64_2 : lane == 3 ? P64_3
            : lane == 4 ? P64_4 : lane == 5 ? P32_2 : lane == 6 ? P64_5 : P32_1;
    const u64 scramble_key = secret64(XXH_SECRET_LEN - XXH_STRIPE_LEN + 8 * lane);

    for (u64 tile = 0; tile <= nb_tiles; tile++) {
        const int buf = (int)(tile & 1);
        if (warp < XXH_COMPUTE_WARPS) {
            if (tile < nb_tiles) {
                const u64 first = tile * XXH_TILE_BLOCKS + warp * XXH_BLOCKS_PER_WARP;
                ulonglong2 v[XXH_BLOCKS_PER_WARP][2];
#pragma unroll
                for (int k = 0; k < XXH_BLOCKS_PER_WARP; k++) {
                    if (first + k < nb_blocks) {  // the same for the whole warp
                        const ulonglong2 *src = (const ulonglong2 *)(p + (first + k) * XXH_BLOCK_LEN + 32 * t);
                        v[k][0] = __ldcs(src);
                        v[k][1] = __ldcs(src + 1);
                    }
                }
#pragma unroll
                for (int k = 0; k < XXH_BLOCKS_PER_WARP; k++) {
                    if (first + k >= nb_blocks)
                        break;
                    const u64 w[4] = {v[k][0].x, v[k][0].y, v[k][1].x, v[k][1].y};
                    // lane i0+q gets the product of word q and the word of lane (i0+q)^1
                    u64 part[4];
                    part[0] = lane_product(w[0], key[0]) + w[1];
                    part[1] = lane_product(w[1], key[1]) + w[0];
                    part[2] = lane_product(w[2], key[2]) + w[3];
                    part[3] = lane_product(w[3], key[3]) + w[2];
#pragma unroll
                    for (int mask = 2; mask < 32; mask <<= 1) {
#pragma unroll
                        for (int q = 0; q < 4; q++)
                            part[q] += __shfl_xor_sync(0xffffffffu, part[q], mask);
                    }
                    if (t < 2) {
                        u64 *dst = sums[buf][warp * XXH_BLOCKS_PER_WARP + k];
#pragma unroll
                        for (int q = 0; q < 4; q++)
                            dst[i0 + q] = part[q];
                    }
                }
            }
        } else if (tile > 0 && t < 8) {
            const u64 done = (tile - 1) * XXH_TILE_BLOCKS;
            const u64 left = nb_blocks - done;
            const int count = left < XXH_TILE_BLOCKS ? (int)left : XXH_TILE_BLOCKS;
            for (int j = 0; j < count; j++) {
                acc += sums[buf ^ 1][j][t];
                acc ^= acc >> 47;
                acc ^= scramble_key;
                acc *= P32_1;
            }
        }
        __syncthreads();
    }

    if (warp == XXH_COMPUTE_WARPS) {
        if (t < 8) {
            const u64 start = nb_blocks * XXH_BLOCK_LEN;
            const u64 nb_stripes = (n - 1 - start) / XXH_STRIPE_LEN;
            for (u64 st = 0; st < nb_stripes; st++) {
                const u64 *stripe = (const u64 *)(p + start + st * XXH_STRIPE_LEN);  // 8-aligned
                acc += lane_product(stripe[t], secret64(8 * ((int)st + t))) + stripe[t ^ 1];
            }
            const u8 *last = p + n - XXH_STRIPE_LEN;  // any alignment
            acc += lane_product(load64(last + 8 * t), secret64(XXH_SECRET_LEN - XXH_STRIPE_LEN - 7 + 8 * t))
                   + load64(last + 8 * (t ^ 1));
            accs[t] = acc;
        }
        __syncwarp();
        if (t == 0) {
            out[0] = merge_accs(accs, 11, n * P64_1);
            out[1] = merge_accs(accs, XXH_SECRET_LEN - XXH_STRIPE_LEN - 11, ~(n * P64_2));
        }
    }
}

// Launch with grid = max(1, ceil(size / chunk_size)) blocks of XXH_THREADS (288) threads.
extern "C" __global__ void __launch_bounds__(XXH_THREADS, 2)
xxh3_128_chunks(const u8 *__restrict__ base, u64 size, u64 chunk_size, u64 *__restrict__ out)
{
    const u64 c = blockIdx.x;
    const u64 off = c * chunk_size;
    if (c > 0 && off >= size)
        return;
    const u64 n = size - off < chunk_size ? size - off : chunk_size;
    const u8 *p = base + off;
    if (n > 240) {
        long_input(p, n, out + 2 * c);
        return;
    }
    if (threadIdx.x == 0) {
        u64 lo, hi;
        if (n <= 16)
            len_0to16(p, n, &lo, &hi);
        else
            len_17to240(p, n, &lo, &hi);
        out[2 * c] = lo;
        out[2 * c + 1] = hi;
    }
}
