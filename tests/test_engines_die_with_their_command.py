"""Every process a `sparrow` command starts dies with it, kill -9 included (vllm_sparrow/lifetime.py):
a real `sparrow caption` with a multiprocess vLLM engine (an EngineCore process, and a worker
process under it) killed with SIGKILL takes the engine core and the worker with it, even with both
stopped (so it is the kernel's signal, not vLLM's own shutdown, that ends them); and, fast,
without vLLM: children started by spawn and by fork, and theirs, die with a killed command; a
child whose command died before it armed itself dies at once; outside a sparrow command nothing
is armed; a child started from a short-lived thread is left alone (the parent-death signal
fires when the thread that started it ends, not its process)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import ENGINE_DEFAULTS

from sparrow_world.synthetic_clip import write_synthetic_clip

GONE_WITHIN_S = 30


def _gone(pid: int) -> bool:
    """Dead, or a zombie: an orphan's zombie waits for init to reap it, and holds no memory."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_all_gone(pids, timeout_s: float) -> list[int]:
    """The pids still running after timeout_s (empty: all gone)."""
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _kill_all(pids) -> None:
    """So that a failing test leaves nothing behind."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _start(code: str, **env) -> subprocess.Popen:
    """A python child in its own session (the test kills it, never its group by accident)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _read_pids(proc: subprocess.Popen, roles: set[str]) -> dict[str, int]:
    """Lines "READY <role> <pid>" the child and its descendants print once armed."""
    pids = {}
    while set(pids) != roles:
        line = proc.stdout.readline()
        assert line, f"the child ended early: {proc.stderr.read()[-3000:]}"
        if line.startswith("READY "):
            _, role, pid = line.split()
            pids[role] = int(pid)
    return pids


# The "command": record_command() as the CLI does; a spawned child that arms itself as the plugin
# does in vLLM's spawned engine core and forks a grandchild (as an engine core starts workers); a
# forked child that runs no plugin (a forked engine core inherits plugins_loaded).
FAMILY = """
import os, subprocess, sys, time
from vllm_sparrow.lifetime import record_command
record_command()
print("READY command", os.getpid(), flush=True)
spawned = '''
import os, time
from vllm_sparrow.lifetime import die_with_parent
die_with_parent()
print("READY spawned", os.getpid(), flush=True)
if os.fork() == 0:
    print("READY grandchild", os.getpid(), flush=True)
    time.sleep(600)
    os._exit(0)
time.sleep(600)
'''
subprocess.Popen([sys.executable, "-c", spawned])
if os.fork() == 0:
    print("READY forked", os.getpid(), flush=True)
    time.sleep(600)
    os._exit(0)
time.sleep(600)
"""


def test_a_killed_commands_spawned_and_forked_children_and_theirs_die_with_it():
    proc = _start(FAMILY)
    pids = {}
    try:
        pids = _read_pids(proc, {"command", "spawned", "grandchild", "forked"})
        os.kill(pids["command"], signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        survivors = _wait_all_gone([pids[r] for r in ("spawned", "grandchild", "forked")], 10)
        assert not survivors, {r: p for r, p in pids.items() if p in survivors}
    finally:
        _kill_all(pids.values())
        proc.kill()
        proc.wait()


# The command starts a child and exits before the child reaches die_with_parent(): no parent-death
# signal can come any more, so the child must see its command gone and die at once.
LATE = """
import os, subprocess, sys
from vllm_sparrow.lifetime import record_command
record_command()
late = '''
import os, sys, time
while os.path.exists(f"/proc/{sys.argv[2]}"):  # until the command has died and been reaped
    time.sleep(0.02)
from vllm_sparrow.lifetime import die_with_parent
die_with_parent()
open(sys.argv[1], "w").write("outlived its command")
'''
child = subprocess.Popen([sys.executable, "-c", late, sys.argv[1], str(os.getpid())])
print("READY late", child.pid, flush=True)
os._exit(0)
"""


def test_a_child_whose_command_died_before_it_armed_dies_at_once(tmp_path):
    marker = tmp_path / "survived"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LATE), str(marker)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    pids = {}
    try:
        pids = _read_pids(proc, {"late"})
        proc.wait(timeout=10)  # reaped: the command is gone, not a zombie
        assert not _wait_all_gone([pids["late"]], 20)
        assert not marker.exists()
    finally:
        _kill_all(pids.values())


PDEATHSIG = """
import ctypes, os
from vllm_sparrow.lifetime import die_with_parent
die_with_parent()
sig = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print("PDEATHSIG", sig.value)
"""


@pytest.mark.parametrize("command, expected", [(None, 0), ("self", 0), ("alive", signal.SIGKILL)])
def test_only_processes_below_a_sparrow_command_are_armed(command, expected):
    """No variable (plain vLLM, an in-process engine): nothing; the command itself: nothing; a
    process below a live command: SIGKILL on its parent's death."""
    env = {k: v for k, v in os.environ.items() if k != "SPARROW_PARENT_PID"}
    code = textwrap.dedent(PDEATHSIG)
    if command == "self":
        code = "import os; os.environ['SPARROW_PARENT_PID'] = str(os.getpid())\n" + code
    elif command == "alive":
        env["SPARROW_PARENT_PID"] = str(os.getpid())
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"PDEATHSIG {expected}" in done.stdout


THREAD = """
import os, threading, time
from vllm_sparrow.lifetime import record_command
record_command()
child = []
def start():
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    child.append(pid)
t = threading.Thread(target=start)
t.start()
t.join()
time.sleep(1)  # the thread that forked is gone: an armed child would be dead by now
pid, status = os.waitpid(child[0], os.WNOHANG)
print("CHILD", "alive" if pid == 0 else "dead", flush=True)
os.kill(child[0], 9)
"""


def test_a_child_started_from_a_short_lived_thread_is_left_alone_and_says_so():
    """prctl(2): the signal fires when the *thread* that forked the child ends, so arming a child
    of a worker thread would kill it while its parent lives on."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(THREAD)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CHILD alive" in done.stdout
    assert "started from a thread other than its parent's main thread" in done.stdout + done.stderr


# --- a real `sparrow caption` with a multiprocess engine --------------------------------------

ITEMS = 400  # far more than can finish before the kill


@pytest.fixture(scope="module")
def many_items(workdir):
    """One short clip listed ITEMS times under different ids: a job that keeps the engine busy."""
    root = workdir / "lifetime-items"
    clip = write_synthetic_clip(root / "clip.mp4", 8, seed=5)
    src = root / "items.jsonl"
    src.write_text("\n".join(json.dumps({"video": str(clip), "id": f"c{i}"}) for i in range(ITEMS)))
    return src


def _caption_cli(items, out, target, log) -> subprocess.Popen:
    # Multiprocessing on (conftest turns it off for in-process engines): an EngineCore process; the
    # `mp` executor puts the model in a worker process under it, as tensor parallelism would.
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env.pop("SPARROW_KILL_AT_WRITE", None)
    env.pop("SPARROW_PARENT_PID", None)
    engine = {**ENGINE_DEFAULTS, "max_model_len": 2048, "distributed_executor_backend": "mp"}
    return subprocess.Popen([sys.executable, "-m", "vllm_sparrow.cli", "caption", "--target", str(target),
                             "--inputs", str(items), "--out", str(out), "--frames", "8", "--max-tokens", "12",
                             "--chunk", "1", "--engine-args", json.dumps(engine)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for_progress(cli: subprocess.Popen, out, log, timeout_s: float) -> None:
    """Until the job has written a caption row (the engine core and its worker run by then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert cli.poll() is None, f"sparrow caption ended early ({cli.returncode}): {log.read_text()[-3000:]}"
        if out.exists() and b'"caption"' in out.read_bytes():
            return
        time.sleep(0.2)
    raise AssertionError(f"no caption row within {timeout_s} s")


def test_a_kill_9_of_sparrow_caption_takes_the_engine_core_and_its_worker(many_items, tmp_path, target_dirs):
    out, log = tmp_path / "captions.jsonl", tmp_path / "caption.log"
    with log.open("w") as log_file:  # a file, not a pipe: nobody reads vLLM's logs until the end
        cli = _caption_cli(many_items, out, target_dirs("qwen2_5_vl"), log_file)
    recorded = []
    try:
        _wait_for_progress(cli, out, log, timeout_s=300)
        family = _descendants(cli.pid)
        recorded = [p.pid for p in family]
        engine_cores = [p for p in family if p.ppid() == cli.pid and "EngineCore" in " ".join(p.cmdline())]
        assert len(engine_cores) == 1, [(p.pid, p.cmdline()) for p in family]
        workers = [p for p in family if p.ppid() == engine_cores[0].pid]
        assert workers, [(p.pid, p.ppid(), p.cmdline()) for p in family]  # a grandchild of the command
        for p in engine_cores + workers:  # stopped, only the kernel's SIGKILL can end them: not
            p.suspend()  # vLLM's own shutdown paths (a worker's pipe to the engine core), which need them to run
        os.kill(cli.pid, signal.SIGKILL)
        assert cli.wait(timeout=10) == -signal.SIGKILL
        t0 = time.monotonic()
        survivors = _wait_all_gone(recorded, GONE_WITHIN_S)
        assert not survivors, [(p.pid, p.cmdline()) for p in family if p.pid in survivors]
        print(f"{len(recorded)} descendants gone {time.monotonic() - t0:.2f} s after the kill")
    finally:
        _kill_all(recorded + [p.pid for p in _descendants(cli.pid)])
        if cli.poll() is None:
            cli.kill()
            cli.wait()
