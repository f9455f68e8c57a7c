"""Patchgroups on an Amaranth mount (docs/PATCHGROUPS.md), for Python.

A patchgroup collects every change this process makes while it is engaged.
``add_depend(after, before)`` makes every change of ``before`` reach the disk
before any change of ``after`` without waiting: ordering instead of fsync. An
atomic group (``ATOMIC``) survives a crash whole or not at all.

    import amaranth_pg
    with amaranth_pg.Patchgroups("/mnt/amaranth") as pg:
        data = pg.create()
        pg.release(data); pg.engage(data)
        ...write the new file...
        pg.disengage(data)
        swap = pg.create(); pg.add_depend(swap, data); pg.release(swap); pg.engage(swap)
        os.rename("new", "file")        # never reaches the disk before the data
        pg.disengage(swap)

Every method raises ``OSError`` with the errno the rules name (see the C header
``amaranth_pg.h``). Setting ``AMARANTH_PG_TRACE=FILE`` logs every call.
"""

import errno
import fcntl
import os
import struct

__all__ = ["ATOMIC", "Patchgroups", "ioctl_number"]

ATOMIC = 1
_ARGS = struct.Struct("=QQII")  # group, other, flags, zero: 24 bytes
_MAGIC = 0xA7


def ioctl_number(nr):
    """_IOWR(0xA7, nr, struct amaranth_pg_args) as Linux computes it."""
    read_write = 3
    return (read_write << 30) | (_ARGS.size << 16) | (_MAGIC << 8) | nr


_CREATE, _DEPEND, _RELEASE, _ENGAGE, _DISENGAGE, _SYNC, _ABANDON = (
    ioctl_number(n) for n in range(1, 8)
)


class Patchgroups:
    """The patchgroup calls on the mount holding ``path`` (default: $AMARANTH_PG_PATH or ".")."""

    def __init__(self, path=None):
        path = path or os.environ.get("AMARANTH_PG_PATH") or "."
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, cmd, name, group=0, other=0, flags=0):
        if group < 0 or other < 0 or flags < 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        buf = bytearray(_ARGS.pack(group, other, flags, 0))
        try:
            fcntl.ioctl(self.fd, cmd, buf, True)
        except OSError as e:
            _trace(name, group, other, "-1 " + errno.errorcode.get(e.errno, "?"))
            raise
        out = _ARGS.unpack(buf)[0]
        _trace(name, group, other, str(out if cmd == _CREATE else 0))
        return out

    def create(self, flags=0):
        """A new group of this process (flags: 0 or ATOMIC); returns its id."""
        return self._call(_CREATE, "create", flags=flags)

    def add_depend(self, after, before):
        """Every change of ``before`` reaches the disk before any change of ``after``."""
        self._call(_DEPEND, "add_depend", after, before)

    def release(self, group):
        """No more befores; the group may be engaged from now on."""
        self._call(_RELEASE, "release", group)

    def engage(self, group):
        """Every change this process makes from now on joins ``group``."""
        self._call(_ENGAGE, "engage", group)

    def disengage(self, group):
        """Stop adding changes to ``group`` (the last disengage of an atomic group commits it)."""
        self._call(_DISENGAGE, "disengage", group)

    def sync(self, group=0):
        """Returns once ``group`` and what it depends on are durable (0: everything)."""
        self._call(_SYNC, "sync", group)

    def abandon(self, group):
        """Drops this process's handle to ``group``; its dependencies stay."""
        self._call(_ABANDON, "abandon", group)

    def linear(self, prev=0):
        """Disengages and abandons ``prev`` (if any) and returns a new group that depends on it,
        released and engaged (Featherstitch's ``patchgroup_linear``)."""
        if prev:
            try:
                self.disengage(prev)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        g = self.create()
        try:
            if prev:
                self.add_depend(g, prev)
            self.release(g)
            self.engage(g)
        except OSError:
            self.abandon(g)
            raise
        if prev:
            self.abandon(prev)
        return g


def _trace(name, a, b, result):
    path = os.environ.get("AMARANTH_PG_TRACE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {name} {a} {b} -> {result}\n")
