"""The interoperation test's witness, outside Redis: a file "cur max" updated under flock by
every holder (this module in Python, interop_worker.c in C, and as a script from the
command `redsem run` runs):  python3 witness.py FILE enter|leave"""

import fcntl
import os
import sys


def update(path, delta):
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 64, 0).decode().split()
        cur, mx = (int(text[0]), int(text[1])) if len(text) == 2 else (0, 0)
        cur += delta
        mx = max(mx, cur)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{cur} {mx}\n".encode(), 0)
    finally:
        os.close(fd)  # drops the lock


def read(path):
    with open(path) as f:
        text = f.read().split()
    return (int(text[0]), int(text[1])) if len(text) == 2 else (0, 0)


if __name__ == "__main__":
    update(sys.argv[1], +1 if sys.argv[2] == "enter" else -1)
