"""A pool of engine replicas fed by a Ray Dataset, its results streamed back to the driver.

run_replicas() is Ray Data's offline-inference pattern, as `ray.data.llm` builds it: the items
become a Dataset (one block per batch, so batches spread over the pool and a replica's death costs
one batch), `map_batches` hands batches to a fixed pool of actors of the given class (each loads
its engine once, in its constructor), and the driver iterates over the results while Ray Data's
streaming executor keeps the pool busy and bounds what waits in memory (back-pressure).

Fault tolerance is Ray Data's default for actor pools: a replica whose process dies is restarted
(its constructor runs again) and the batches it held are run again, so a batch may come back
twice: the callers write each id once. Dispatch waits until every replica has started, so the
first batches spread over all of them and a replica that cannot start fails the job at once with
its own error, not after the others have run.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Iterator

from .. import envs
from .options import RayOptions

START_WAIT_S = 1800  # replicas load their models first; a cluster adding nodes for them takes minutes too
HOLD_S = 600  # SPARROW_HOLD_REPLICA: how long the held replica waits to be killed


class ReplicaFailed(RuntimeError):
    """A replica raised (not died: a dead one is restarted); the message is its error's last line."""


def replica_resources(ray, opts: RayOptions, engine_args: dict[str, Any]) -> dict[str, float]:
    """The Ray resources one replica asks for: its CPUs, and its GPUs (by default one per rank of
    the engine's tensor x pipeline parallelism, on a cluster that has GPUs at all)."""
    gpus = opts.replica_gpus
    if gpus is None:
        world = int(engine_args.get("tensor_parallel_size", 1)) * int(engine_args.get("pipeline_parallel_size", 1))
        gpus = float(world) if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
    return {"num_cpus": opts.replica_cpus, "num_gpus": gpus}


def run_replicas(ray, rows: list[dict], replica: type, init: dict[str, Any], opts: RayOptions,
                 resources: dict[str, float], batch_size: int, ordered: bool) -> Iterator[dict]:
    """The rows `replica(**init)` returns for `rows`, batch by batch, as each batch finishes
    (in the input's order when `ordered`). replica: a class whose __call__ takes a batch (a dict
    of numpy columns) and returns a dict of columns."""
    ds = ray.data.from_items(rows, override_num_blocks=max(1, math.ceil(len(rows) / batch_size)))
    ds = ds.map_batches(replica, fn_constructor_kwargs=init, batch_size=batch_size, batch_format="numpy",
                        concurrency=opts.replicas, **resources)
    ctx = ds.context
    ctx.enable_progress_bars = False  # the command draws its own
    ctx.wait_for_min_actors_s = START_WAIT_S
    ctx.execution_options.preserve_order = ordered
    try:
        yield from ds.iter_rows()
    except ray.exceptions.RayError as e:
        raise ReplicaFailed(_last_line(e)) from e
    except Exception as e:  # noqa: BLE001 - Ray Data wraps the replica's own exception (UserCodeException)
        if type(e).__module__.startswith("ray."):
            raise ReplicaFailed(_last_line(e)) from e
        raise


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def hold_if_asked(items: list) -> None:
    """Test hook (SPARROW_HOLD_REPLICA=PATH): the first replica to get here creates PATH, writes
    its pid and then its batch's items (ids or sample indices, JSON) into it as two lines, and
    waits with its batch, so that a test can kill -9 a replica known to hold those items; every
    other replica, and every later batch, goes on at once."""
    path = envs.SPARROW_HOLD_REPLICA
    if path is None:
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:  # another replica (or this one's earlier life) was held already
        return
    os.write(fd, f"{os.getpid()}\n{json.dumps(items)}\n".encode())
    os.close(fd)
    time.sleep(HOLD_S)
