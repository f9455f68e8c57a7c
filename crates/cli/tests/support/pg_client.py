"""A client of the Python module for the mount tests (crates/cli/tests/patchgroups.rs).

    pg_client.py MODULE_DIR rules DIR   the rules' errors through the module; prints "ok"
    pg_client.py MODULE_DIR hold DIR    an atomic group with DIR/py-in written; prints "engaged",
                                        then sleeps until killed
"""
import errno
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
import amaranth_pg  # noqa: E402

mode, mnt = sys.argv[2], sys.argv[3]
pg = amaranth_pg.Patchgroups(mnt)


def expect(err, fn, *args):
    try:
        fn(*args)
    except OSError as e:
        if e.errno != err:
            raise SystemExit(f"{fn.__name__}{args}: {errno.errorcode[e.errno]}, want {err}")
        return
    if err:
        raise SystemExit(f"{fn.__name__}{args}: succeeded, want {errno.errorcode[err]}")


def write(name):
    with open(os.path.join(mnt, name), "w") as f:
        f.write("data\n")


if mode == "rules":
    p, q = pg.create(), pg.create()
    expect(errno.EINVAL, pg.engage, p)
    pg.release(p)
    pg.engage(p)
    write("py-p")
    expect(errno.EBUSY, pg.add_depend, q, p)
    pg.disengage(p)
    pg.add_depend(q, p)
    expect(errno.EINVAL, pg.engage, p)
    expect(errno.EINVAL, pg.add_depend, p, q)
    pg.release(q)
    pg.engage(q)
    write("py-q")
    pg.disengage(q)
    pg.sync(q)
    expect(errno.ENOENT, pg.sync, 123456789)
    g = pg.linear()
    write("py-l")
    pg.disengage(g)
    pg.sync()
    print("ok")
elif mode == "hold":
    a = pg.create(amaranth_pg.ATOMIC)
    pg.release(a)
    pg.engage(a)
    write("py-in")
    print("engaged", flush=True)
    time.sleep(600)
