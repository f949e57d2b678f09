"""Large clips for the servers' decode-bound tests, and the measure they are judged by: frames of a
moving white square made one at a time (a 4K clip never sits in memory whole), and a process's
peak resident memory."""

from pathlib import Path

import numpy as np


def frames(n, width, height):
    """n frames of a moving white square, one at a time."""
    frame = np.zeros((height, width, 3), np.uint8)
    for t in range(n):
        frame[:] = (7 * t) % 200
        frame[100:400, 100 + 20 * t : 400 + 20 * t] = 255
        yield frame


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the process's peak resident memory so far."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))) / 1024
