"""What the `--ray` tests share: running a `sparrow` command as a user does, and finding the
processes it left.

A process belongs to the command's job when it was under the command while the command ran
(Tree notes its process tree every 0.2 s: the raylet's agents, which Ray starts without the
command's environment, are found this way), or when its starting environment (/proc/PID/environ)
carries the command's SPARROW_PARENT_PID (lifetime.record_command: everything the command starts
inherits it, a replica started since the last look included).
"""

import json
import os
import subprocess
import sys
import threading
import time

import psutil


def sparrow(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """`sparrow ARGS` started in a session of its own, with one vLLM process per engine
    (VLLM_ENABLE_V1_MULTIPROCESSING=0, as the suite's); the test hooks only as `env` gives them.
    Its .tree notes the processes under it."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("SPARROW_KILL_AT_WRITE", "SPARROW_HOLD_REPLICA", "SPARROW_PARENT_PID")}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_sparrow.cli", *args],
                            env={**base, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    proc.tree = Tree(proc.pid)
    return proc


class Tree:
    """The processes seen under `pid` while it runs (pid -> start time), noted by a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.seen = pid, {}
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while True:
            try:
                for p in psutil.Process(self.pid).children(recursive=True):
                    self.seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                return
            time.sleep(0.2)

    def running(self) -> list[int]:
        alive = []
        for pid, started in list(self.seen.items()):
            try:
                p = psutil.Process(pid)
                if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                continue
        return alive


def two_replicas() -> list[str]:
    """The options of the tests' clusters: 2 replicas on this machine's local cluster, one CPU each;
    on CUDA half a GPU each (their engines take conftest's GPU_SHARE of its memory), so that a
    one-GPU machine holds both (by default each would ask for a whole GPU)."""
    from conftest import on_cuda

    return ["--ray", "local", "--replicas", "2", *(["--replica-gpus", "0.5"] if on_cuda() else [])]


def job_processes(command_pid: int, tree: Tree | None = None) -> list[int]:
    """Running processes of the command `command_pid`'s job (zombies hold nothing)."""
    mark = f"SPARROW_PARENT_PID={command_pid}".encode()
    found = set(tree.running() if tree else ())
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != command_pid:
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\0") and psutil.Process(int(entry)).status() != psutil.STATUS_ZOMBIE:
                        found.add(int(entry))
            except (OSError, psutil.Error):
                continue
    return sorted(found)


def wait_gone(command_pid: int, seconds: float, tree: Tree | None = None) -> list[int]:
    """The job's processes still running after up to `seconds` (none, when all went)."""
    deadline = time.monotonic() + seconds
    while (left := job_processes(command_pid, tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line parses
