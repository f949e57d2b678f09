"""A `local` Ray cluster dies with the command that started it, kill -9 included.

ray.init() starts a local cluster's processes as the command's children. Ray ties its GCS server
and raylet to the command (a parent-death signal) and the workers end with their raylet, but the
raylet's agents (the dashboard agent, the runtime-env agent) only notice its death by polling, and
then try to tell the dead GCS about it with a 60 s timeout: after a kill -9 of the command they
ran on for a minute (measured, Ray 2.60). Those agents do not carry the command's
SPARROW_PARENT_PID (the raylet starts them with an environment of its own: measured), and once
the raylet is dead they are init's children. So a command that starts a local cluster first
starts this watchdog, a small process that waits on a pipe whose only write end the command
holds, and meanwhile notes every process under the command (its process tree, every POLL_S):

- the command's way out (normal, an exception, Ctrl-C) shuts the cluster down with Ray's own
  ray.shutdown() and then writes "done": the watchdog exits;
- the command's death (kill -9, SIGTERM) closes the pipe without "done": the watchdog kills every
  process it saw under the command that still runs (the same process: pid and start time), and
  every process whose environment carries the command's SPARROW_PARENT_PID (lifetime.py:
  everything the command started, and what those started, inherits it, also one started since
  the last look), then exits.

The watchdog ignores the signals a terminal or a job scheduler sends the whole process group
(SIGINT, SIGTERM, SIGHUP): it must outlive its command by the moment the sweep takes, no more.
Linux only (/proc); elsewhere the local cluster is left to Ray's own fate sharing.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

DONE = b"done"
SWEEP_ROUNDS = 50  # a process may start another while the sweep runs: sweep until none is left
POLL_S = 0.5  # how often the watchdog notes the processes under the command


class Watchdog:
    """The command's side: start() before ray.init(), release() after ray.shutdown()."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    @classmethod
    def start(cls) -> Watchdog | None:
        if not sys.platform.startswith("linux"):
            return None
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid())], stdin=subprocess.PIPE)
        return cls(proc)

    def release(self) -> None:
        """The cluster is down: the watchdog goes without sweeping."""
        try:
            self.proc.stdin.write(DONE)
            self.proc.stdin.close()
        except OSError:  # it is gone already
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def sweep(command: int, seen: dict[int, float] | None = None) -> int:
    """Kill every process marked as started under `command`, and every one of `seen` (pid ->
    start time) that still runs (this one and the command aside); returns how many were killed."""
    mark = f"SPARROW_PARENT_PID={command}".encode()
    killed = 0
    for _ in range(SWEEP_ROUNDS):
        found = set(_marked(mark)) | set(_still_running(seen or {}))
        left = [pid for pid in found if pid not in (os.getpid(), command)]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:  # gone meanwhile, or not ours
                pass
        time.sleep(0.1)
    return killed


def _under(command: int, seen: dict[int, float]) -> None:
    """Note the processes now under `command` (pid -> start time: a pid used again later is not them)."""
    import psutil  # vLLM's dependency (the environment has vLLM)

    try:
        for p in psutil.Process(command).children(recursive=True):
            if p.pid != os.getpid():
                seen.setdefault(p.pid, p.create_time())
    except psutil.Error:  # the command is gone: the pipe says so next
        pass


def _still_running(seen: dict[int, float]) -> list[int]:
    import psutil

    alive = []
    for pid, started in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


def _marked(mark: bytes) -> list[int]:
    """Running processes whose environment holds `mark` (a zombie's environment reads empty)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone, or another user's
            continue
    return found


def main(argv: list[str]) -> int:
    command = int(argv[0])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    said, seen, fd = b"", {}, sys.stdin.fileno()
    while True:  # until the pipe closes: the command is done, or dead
        _under(command, seen)
        if select.select([fd], [], [], POLL_S)[0]:
            chunk = os.read(fd, 64)
            if not chunk:
                break
            said += chunk
    if said != DONE:
        killed = sweep(command, seen)
        print(f"sparrow: the command (pid {command}) died; its local Ray cluster's {killed} processes left were "
              "killed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
