"""The knobs `sparrow caption` and `sparrow capture` take to run on a Ray cluster (knobs.py).

A config of its own, beside each command's job config (the jobs know nothing of Ray): the command
parses both, and runs the Ray form of its job (caption.py, capture.py) when `--ray` is given, the
one-process job otherwise. No Ray import here: the CLI's --help stays fast and works without the
extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..knobs import knob


class ClusterRefused(Exception):
    """A cluster job refused before it started (the message says what to change); the CLI prints it."""


class BadRayOptions(ClusterRefused, ValueError):
    pass


@dataclass(kw_only=True)
class RayOptions:
    """The cluster a command runs its job on, and the replicas it asks for there."""

    ray: str | None = knob(None, "run on a Ray cluster: its address (as ray.init takes it, e.g. HEAD:6379 or "
                                 "'auto'), or 'local' to start one on this machine for this command; needs "
                                 "pip install 'vllm-sparrow[ray]'")
    replicas: int = knob(1, "engine replicas on the Ray cluster (--ray): each a vLLM engine of its own, fed "
                            "batches by a Ray Dataset")
    replica_gpus: float | None = knob(None, "GPUs each replica asks Ray for (--ray; default: the engine's "
                                            "tensor x pipeline parallel size where the cluster has GPUs, else 0)")
    replica_cpus: float = knob(1.0, "CPUs each replica asks Ray for (--ray; fractions allowed)")

    def check_ray_options(self) -> None:
        """Refuse cluster knobs without a cluster, and a pool that cannot exist."""
        if self.ray is None and (self.replicas != 1 or self.replica_gpus is not None or self.replica_cpus != 1.0):
            raise BadRayOptions("--replicas, --replica-gpus and --replica-cpus need --ray (local, or a cluster's "
                             "address)")
        if self.replicas < 1:
            raise BadRayOptions(f"--replicas {self.replicas}: give 1 or more")
        if self.replica_cpus < 0 or (self.replica_gpus or 0) < 0:
            raise BadRayOptions("--replica-cpus and --replica-gpus cannot be negative")

    def check_cluster_job(self) -> None:
        """A Ray form's check: the knobs as above, and a cluster to run on."""
        self.check_ray_options()
        if self.ray is None:
            raise BadRayOptions("a job on Ray needs --ray (local, or a cluster's address)")
