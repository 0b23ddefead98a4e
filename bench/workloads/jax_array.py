"""One JAX process holding an array of random words on the GPU (XLA's allocator, preallocating a
fraction of the GPU as XLA does by default), its runtime threads running as in any JAX program.

    python3 jax_array.py --gib 2 [--ctl DIR]

XLA_PYTHON_CLIENT_MEM_FRACTION (set it before starting: the default, 0.75, takes most of the GPU)
decides how much XLA preallocates; --gib of it holds the data. Commands (wlcommon.py): `check` ->
{"sha": digest of the array computed by a jitted XLA program on the GPU}; `step` -> runs a jitted
update-and-reduce on a second array (XLA launches, its threads busy) and answers its result.
"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlcommon  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ctl")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp

    words = wlcommon.gib_to_bytes(args.gib) // 4
    key = jax.random.PRNGKey(os.getpid())
    data = jax.random.bits(key, (words,), dtype=jnp.uint32)
    state = {"x": jnp.arange(1 << 20, dtype=jnp.uint32), "steps": 0}

    @jax.jit
    def digest(a):  # wrapping uint32 sums: exact, the same on every run
        w = jnp.arange(a.shape[0], dtype=jnp.uint32) * 2 + 1
        return jnp.stack([a.sum(dtype=jnp.uint32), (a * w).sum(dtype=jnp.uint32),
                          a[::4097].sum(dtype=jnp.uint32)])

    @jax.jit
    def step(x):
        y = x * jnp.uint32(1664525) + jnp.uint32(1013904223)
        return y, y.sum(dtype=jnp.uint32)

    def check(_args):
        parts = [int(v) for v in digest(data).block_until_ready().tolist()]
        return {"sha": hashlib.sha256(repr(parts).encode()).hexdigest(), "parts": parts}

    def run_step(_args):
        state["x"], total = step(state["x"])
        state["steps"] += 1
        return {"steps": state["steps"], "sum": int(total.block_until_ready())}

    data.block_until_ready()
    wlcommon.serve(wlcommon.channel_from_args(args.ctl),
                   {"pids": [os.getpid()], "bytes": words * 4, "backend": jax.default_backend()},
                   {"check": check, "step": run_step})


if __name__ == "__main__":
    main()
