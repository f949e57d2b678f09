"""The Ray cluster a command runs on: a running one by its address, or `local`, started here.

Every replica gets the driver's plugin, vLLM and Hugging Face variables as the job's runtime_env
(envs.for_workers: a remote node's environment is its own otherwise); anything else a node needs
(the package itself, LD_PRELOAD on CPU nodes, the model files at the same path) is the node's.
A `local` cluster is this command's: its processes die with it (lifetime.py's mark, and the
watchdog for what Ray leaves after a kill -9), and ray.shutdown() stops it on every way out.
A running cluster outlives the command, as it should; Ray ends the command's replicas with it.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from .. import envs
from ..lifetime import command_pid, record_command
from .options import ClusterRefused
from .watchdog import Watchdog

INSTALL = "pip install 'vllm-sparrow[ray]'"
REAP_S = 15  # a local cluster's workers end this long after ray.shutdown() at the most, else are killed


class RayMissing(ClusterRefused):
    """--ray without Ray Data installed: the message says how to install it."""


class ClusterTooSmall(ClusterRefused):
    """The replicas asked for need more than a fixed-size (local) cluster has."""


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401 - the part the commands use (pandas, pyarrow)
    except ImportError as e:
        raise RayMissing(f"--ray needs Ray Data, which this environment lacks ({e}). Install it with: {INSTALL} "
                         "(from a clone: pip install '/path/to/vllm-sparrow[ray]'; ray[data] 2.60, which leaves "
                         "vLLM and torch as they are)") from None
    return ray


@contextlib.contextmanager
def open_cluster(address: str) -> Iterator[Any]:
    """Yields the `ray` module, connected to the cluster at `address` (or to a new local one)."""
    ray = import_ray()
    local = address == "local"
    watchdog, before = None, set()
    if local:
        if command_pid() != os.getpid():  # whoever starts a local cluster is what it dies with
            record_command()
        watchdog = Watchdog.start()
        before = {p.pid for p in _descendants()} | ({watchdog.proc.pid} if watchdog else set())
    try:
        runtime_env = {"env_vars": envs.for_workers()}
        if local:
            with envs.hooks_hidden():  # the cluster's processes start here and inherit this environment
                ray.init(address="local", include_dashboard=False, runtime_env=runtime_env)
        else:
            ray.init(address=address, runtime_env=runtime_env)
        yield ray
    finally:
        cluster = [p for p in _descendants() if p.pid not in before] if local else []
        try:
            ray.shutdown()
        finally:
            _reap(cluster)
            if watchdog is not None:
                watchdog.release()


def _descendants() -> list:
    import psutil  # vLLM's dependency (the environment has vLLM)

    return psutil.Process().children(recursive=True)


def _reap(procs: list) -> None:
    """ray.shutdown() stops a local cluster's GCS and raylet; its workers (the replicas) notice
    and exit seconds later, after the command would have returned: wait for them, then kill what
    is left, so the command ends with its cluster."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=REAP_S)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)


def check_fits(ray, address: str, replicas: int, resources: dict[str, float]) -> None:
    """A local cluster does not grow: refuse replicas it cannot hold (a running cluster may add
    nodes for them; there Ray Data waits, and says so in the log)."""
    if address != "local":
        return
    have = ray.cluster_resources()
    for name, key in (("CPUs", "num_cpus"), ("GPUs", "num_gpus")):
        need = replicas * resources[key]
        if need > have.get(name[:-1], 0) + 1e-9:
            raise ClusterTooSmall(
                f"{replicas} replicas of {resources[key]:g} {name} each need {need:g} {name}; this machine's local "
                f"cluster has {have.get(name[:-1], 0):g}. Give fewer --replicas, or a smaller --replica-"
                f"{name.lower()} (fractions are fine)")
