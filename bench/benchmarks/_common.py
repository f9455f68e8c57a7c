"""Helpers shared by benchmark modules."""
from __future__ import annotations

from ..runner import BenchFailure

MiB = 1 << 20


def need(env, key: str):
    """A prepared input (env.data[key]); raises the preparation error if it failed."""
    v = env.data.get(key)
    if v is None:
        raise BenchFailure(f"input {key!r} was not prepared")
    if isinstance(v, BaseException):
        raise BenchFailure(f"input {key!r} could not be prepared: {v}")
    return v


def untar_tree(ctx, tree, dest_dir, what="copy the Linux tree into the FS (untimed): tar -xf"):
    """Untimed copy of the cached tree into the FS (from the uncompressed tar), then syncfs."""
    ctx.untimed(["tar", "-xf", str(tree.tar), "-C", str(dest_dir)], what, logical_bytes=tree.bytes)
    ctx.sync()
