"""Every process a `sparrow` command starts dies with it, kill -9 included.

A `sparrow` command that opens a vLLM engine with multiprocessing has children: vLLM V1's
EngineCore process and, under it, its workers (tensor parallelism, or the `mp` executor). vLLM
stops them from its own shutdown code and from atexit hooks, neither of which runs when the
command is killed with SIGKILL; the engine core has no watch on its parent (only the workers watch
theirs, the engine core, through a pipe), so it lives on, orphaned, holding the model's memory,
on a GPU the GPU's, and the rerun cannot start.

The mechanism is Linux's parent-death signal: a process that calls prctl(PR_SET_PDEATHSIG,
SIGKILL) is killed by the kernel when its parent dies, however the parent died. It is set per
process, so every process arms it for itself:
  - the CLI records its pid in SPARROW_PARENT_PID before any engine starts (record_command());
    children inherit the variable, so a process that sees it knows a sparrow command is above it;
  - vLLM loads general plugins in every process it starts (the front end when it builds the
    config, EngineCore.__init__, WorkerWrapperBase.init_worker), so a *spawned* engine core or
    worker arms itself from plugin.register() (die_with_parent());
  - a *forked* child is not covered by that: it inherits vllm.plugins.plugins_loaded = True from
    its parent and never runs register() again (vLLM forks unless CUDA is initialised or the
    platform asks for spawn; the CPU platform does). So every process that takes part also
    registers an at-fork hook that arms each forked child right after os.fork().
Grandchildren arm against their own parent (a worker against the engine core), so a kill -9 of
the command takes the engine core, and its death takes the workers.

Known window: a spawned engine core runs register() only in EngineCore.__init__, after vLLM's
startup handshake with the front end. Killed before that, it holds no model yet and exits by
itself when the handshake times out (vllm.v1.engine.core.HANDSHAKE_TIMEOUT_MINS, 5 minutes).

Ctrl-C while an engine starts (interruptible_start()): vLLM 0.32's front end waits for its engine
core inside vllm.utils.network_utils.zmq_socket_ctx, which catches KeyboardInterrupt and drops it;
the front end then waits VLLM_ENGINE_READY_TIMEOUT_S (10 minutes) for a ready message from an
engine core that the same Ctrl-C (the terminal signals the whole process group) has killed. So a
command opens its engines inside interruptible_start(), where SIGINT raises an exception that no
`except KeyboardInterrupt` catches: vLLM's cleanup on the way (its finally blocks: the client's
finalizer stops the engine processes) still runs, and the block turns it back into
KeyboardInterrupt.

SPARROW_PARENT_PID is written and read only here, through envs.py. Nothing here may stop vLLM
from starting: on another OS, or on any failure, it logs one line and the process carries on
without the guard.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from . import LOGGER, envs

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_fork_hook_installed = False
# Written by the at-fork `before` hook in the parent, read by the child (its memory is a copy).
_forking_pid: int | None = None
_forked_from_main_thread = True


def _logger():
    """vLLM's logger where vLLM is loaded, else the standard one: never import vLLM from here (it
    takes seconds, and the fork hook runs in a child that may never use it)."""
    vllm_logger = sys.modules.get("vllm.logger")
    try:
        return vllm_logger.init_logger(LOGGER) if vllm_logger else logging.getLogger(LOGGER)
    except Exception:  # noqa: BLE001 - logging must not be what breaks vLLM
        return logging.getLogger(LOGGER)


def record_command() -> None:
    """Mark this process as the `sparrow` command that the processes it starts must die with.

    Called by the CLI before any engine starts: the variable reaches every descendant through the
    environment, and the fork hook covers children forked from this process itself."""
    envs.export("SPARROW_PARENT_PID", os.getpid())
    _install_fork_hook()


def command_pid() -> int | None:
    """The pid of the `sparrow` command above this process, or None when there is none (plain vLLM,
    an engine opened in-process by a test or a notebook)."""
    return envs.SPARROW_PARENT_PID  # None when unset or not a number: this guard never raises


def die_with_parent() -> None:
    """In a process started (directly or not) by a `sparrow` command: be killed when the parent
    that started it dies. Called from plugin.register() in every process vLLM starts; does
    nothing in the command itself or outside a sparrow command. Never raises."""
    try:
        command = command_pid()
        if command is None or command == os.getpid():
            return
        parent = _multiprocessing_parent() or os.getppid()
        _arm(command, parent, _started_by_main_thread(parent))
        _install_fork_hook()
    except Exception as e:  # noqa: BLE001 - the guard must never stop vLLM from starting
        _logger().warning("vllm-sparrow: could not tie process %d to its parent's life (%s: %s); it may "
                          "outlive a killed sparrow command.", os.getpid(), type(e).__name__, e)


def _install_fork_hook() -> None:
    """Arm every child forked from this process (and, the hook being inherited, from its
    descendants): a forked child does not run the plugin again, so it cannot arm itself there."""
    global _fork_hook_installed
    if _fork_hook_installed or not sys.platform.startswith("linux"):  # no signal to arm elsewhere
        return
    os.register_at_fork(before=_note_forking_thread, after_in_child=_arm_forked_child)
    _fork_hook_installed = True


def _note_forking_thread() -> None:
    """Runs in the parent, in the thread that forks: the child needs both facts, and after the
    fork it can learn neither (its parent may already be gone; its only thread is its main one)."""
    global _forking_pid, _forked_from_main_thread
    _forking_pid = os.getpid()
    _forked_from_main_thread = threading.current_thread() is threading.main_thread()


def _arm_forked_child() -> None:
    try:
        command = command_pid()
        if command is not None and _forking_pid is not None:
            _arm(command, _forking_pid, _forked_from_main_thread)
    except Exception as e:  # noqa: BLE001 - an exception here would only be printed, and the fork must go on
        _logger().warning("vllm-sparrow: could not tie forked process %d to its parent's life (%s: %s).",
                          os.getpid(), type(e).__name__, e)


def _arm(command: int, parent: int, from_main_thread: bool | None) -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL), then close the race: a parent that died before the call
    sent no signal, so if it (or the sparrow command) is already gone, die now as it would have."""
    if not sys.platform.startswith("linux"):
        _logger().info("vllm-sparrow: no parent-death signal on %s; process %d may outlive a killed sparrow "
                       "command.", sys.platform, os.getpid())
        return
    if from_main_thread is False:
        # The signal fires when the *thread* that forked this process exits, not when the process
        # does (prctl(2)): a child started from a short-lived thread would be killed while its
        # parent lives on. vLLM starts the engine core from the thread that builds LLM(...) (the
        # CLI's main thread) and workers from the engine core's main thread, so this is rare.
        _logger().warning("vllm-sparrow: process %d was started from a thread other than its parent's main "
                          "thread; it is not tied to its parent's life and may outlive a killed sparrow command.",
                          os.getpid())
        return
    _set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent or not _alive(command):
        os.kill(os.getpid(), signal.SIGKILL)


def _set_parent_death_signal(sig: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # the process's own libc: prctl is in it on Linux
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def _alive(pid: int) -> bool:
    """Whether the process runs. A killed process stays a zombie until its parent (the shell)
    reaps it, and os.kill(pid, 0) succeeds on a zombie, so /proc's state decides where it can."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's (a reused pid): not ours to judge
        return True
    return True


class _StartInterrupted(BaseException):
    """SIGINT inside interruptible_start(): not a KeyboardInterrupt, so no library code on the way
    out drops it; the block raises KeyboardInterrupt in its place."""


class interruptible_start:
    """`with interruptible_start(): llm = LLM(...)`: Ctrl-C while the engine starts raises
    KeyboardInterrupt out of the block within moments, the engine processes stopped by vLLM's own
    cleanup on the way, instead of being lost in vLLM's start-up wait (the docstring above). Any
    other exception after a SIGINT (the engine core, signalled too, died first: "Engine core
    initialization failed") leaves as KeyboardInterrupt too. Active only in the main thread while
    SIGINT has Python's default handler (not ignored, nobody else's handler); it changes nothing
    else, and restores the handler on the way out."""

    def __enter__(self):
        self.interrupted = False
        self._previous = None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame) -> None:
        self.interrupted = True
        if frame is not None and frame.f_code is interruptible_start.__exit__.__code__:
            raise KeyboardInterrupt  # leaving the block already: nothing left in it to drop it
        raise _StartInterrupted

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if exc_type is not None and self.interrupted and not issubclass(exc_type, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        return False


def _multiprocessing_parent() -> int | None:
    """The pid of the process that started this one, as multiprocessing recorded it before the
    start: unlike os.getppid(), still the starter's pid if the starter has died since."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else None


def _started_by_main_thread(parent: int) -> bool | None:
    """Whether the parent's main thread started this process (its task lists us among its
    children); False when another of its threads did; None when /proc cannot tell (the parent
    gone, or a kernel without /proc/<pid>/task/<tid>/children)."""
    me = str(os.getpid())

    def children(tid: str) -> list[str] | None:
        try:
            with open(f"/proc/{parent}/task/{tid}/children") as f:
                return f.read().split()
        except OSError:
            return None

    main = children(str(parent))
    if main is None:
        return None
    if me in main:
        return True
    try:
        tids = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return None
    return False if any(me in (children(t) or ()) for t in tids if t != str(parent)) else None
