"""Shared fixtures: tiny targets built offline, trained drafts, video clips, engine settings.

Engines run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and are shared per test module. On
CUDA every test engine takes GPU_SHARE of the GPU's memory (ENGINE_DEFAULTS, vllm_server, and any
in-process vllm.LLM); on CPU nothing changes.
"""

import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _one_openmp_thread_per_engine() -> None:
    """Under pytest-xdist (the Makefile's JOBS) each worker is a lane whose engines run one OpenMP
    thread each, unbound (set before torch or vLLM load; the servers, commands and Ray replicas
    a lane starts inherit it). By default every engine binds an OpenMP thread to each core, and
    Intel OpenMP's waiting threads spin on the cores the other lane needs. Six engine, server
    and training files in two lanes took 277 s with vLLM's default binding, 221 s with each lane bound to a core of its
    own (which also crowds a lane's Ray replicas or server beside its engine onto one core), 230 s
    with KMP_BLOCKTIME=0, 217 s like this."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_one_openmp_thread_per_engine()

import pytest
from kinds import BUDGET_S, GROUPS, HELP, KIND_ORDER, KINDS, UNIT_ORDER

from support.shared_servers import KIND as SERVED_KIND
from support.shared_servers import UNIT_SERVERS, v1_server, v2_server

from sparrow_world.tiny_targets import build_tiny_target, make_prompt
from vllm_sparrow.releases import V2, release


def pytest_configure(config):
    for kind, text in HELP.items():
        config.addinivalue_line("markers", f"{kind}: {text}")


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (the Makefile's JOBS) a worker takes one unit at a time: a test file, or
    a group of files that share a worker (tests/kinds.py GROUPS), in the order collection put them
    (--no-loadscope-reorder). A scheduler of our own, because pytest-xdist's xdist_group marks
    work by rewriting node ids, which pytest 9 no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(Path(nodeid.split("::", 1)[0]).stem)

        def _reschedule(self, node) -> None:
            """A worker gets its next unit when it holds only its unit's last test (which it keeps
            until it knows the test after it), not two tests before as pytest-xdist does: units
            here are a few tests of a minute or more, and the default queued one behind a running
            test while the other lane ran dry (the V2 session: 777 lane-seconds in 478 s)."""
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    """Every test gets its file's kind (tests/kinds.py); a file without one, or a kind listed for a
    file that is gone, stops the run. The units are put in kinds.py's order: the Makefile's
    workers take them so (--no-loadscope-reorder; pytest_xdist_make_scheduler)."""
    here = Path(__file__).parent
    unlisted = sorted({item.path.stem for item in items if item.path.stem not in KINDS})
    stale = sorted(name for name in [*KINDS, *_GROUP_OF] if not (here / f"{name}.py").exists())
    if unlisted or stale:
        raise pytest.UsageError(f"tests/kinds.py: list {unlisted} with their kind; drop {stale}")
    row = release(_vllm_version())
    skip_v2 = None if row is not None and row.runner == V2 else pytest.mark.skip(
        reason="the V2 runner's glue: `make test-v2-runner` runs it in its side environment")
    for item in items:
        item.add_marker(getattr(pytest.mark, KINDS[item.path.stem]))
        if KINDS[item.path.stem] == "v2_runner" and skip_v2 is not None:
            item.add_marker(skip_v2)
    items.sort(key=lambda item: _unit_rank(item.path.stem))  # stable: a file's tests keep their order


_GROUP_OF = {name: group for group, names in GROUPS.items() for name in names}


def _unit(stem: str) -> str:
    return _GROUP_OF.get(stem, stem)


def _unit_rank(stem: str) -> tuple[int, int]:
    unit = _unit(stem)
    if unit in UNIT_ORDER:
        return (0, UNIT_ORDER.index(unit))
    return (1, KIND_ORDER.index(KINDS[stem]))


def pytest_runtest_teardown(item, nextitem):
    """The servers a unit shares (support/shared_servers.py) stop after its last test."""
    if nextitem is None or _unit(nextitem.path.stem) != _unit(item.path.stem):
        UNIT_SERVERS.close()


def pytest_sessionfinish(session):
    UNIT_SERVERS.close()  # -x stops a run inside a unit: no server outlives it


_KIND_SECONDS: dict[str, float] = {}  # kind -> seconds of its tests' set-up, call and teardown this run
_KIND_TESTS: dict[str, int] = {}  # kind -> tests run (not skipped)


def pytest_runtest_logreport(report):
    kind = KINDS.get(Path(report.location[0]).stem)
    if kind is None:
        return
    _KIND_SECONDS[kind] = _KIND_SECONDS.get(kind, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome == "failed"):
        _KIND_TESTS[kind] = _KIND_TESTS.get(kind, 0) + 1


_STARTED = time.monotonic()


def pytest_terminal_summary(terminalreporter, config):
    """Each kind's time this run against its budget (tests/kinds.py BUDGET_S): the seconds of its
    tests, summed over the lanes (pytest-xdist workers) that ran them."""
    ran = [k for k in BUDGET_S if _KIND_TESTS.get(k)]
    if not ran:
        return
    tr = terminalreporter
    tr.section("time per kind (tests/kinds.py BUDGET_S)")
    lanes = getattr(config.option, "numprocesses", None) or 1
    tr.write_line(f"{sum(_KIND_SECONDS[k] for k in ran):.0f} s of tests in {lanes} lane(s), "
                  f"{time.monotonic() - _STARTED:.0f} s since conftest loaded")
    for kind in ran:
        took, budget = _KIND_SECONDS[kind], BUDGET_S[kind]
        note = f"  OVER BUDGET by {took - budget:.0f} s: see --durations" if took > budget else ""
        tr.write_line(f"{kind:10s} {_KIND_TESTS[kind]:4d} tests {took:7.0f} s of {budget:5d} s{note}")


def _vllm_version() -> str:
    """The version of the vLLM this run imports (its metadata, first on the path: the side
    environment's under `make test-v2-runner`), without importing it."""
    from importlib.metadata import version

    return version("vllm").split("+")[0]


# Prompts the quick drafts are distilled on (so text requests accept drafts).
TRAINED_TEXTS = ["describe the red square moving left", "what happens after the blue circle appears"]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("sparrow")


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory):
    """A folder every worker of this run shares: under pytest-xdist each worker's base temp folder
    is a sub-folder of the run's own (.../pytest-N/popen-gw0), without it the run's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(folder: Path, build) -> Path:
    """`build(folder)` run by the first worker that asks, under a lock; the others wait for it and
    reuse the folder (builds here are deterministic: the same arguments give the same bytes)."""
    from filelock import FileLock

    done = folder.with_name(folder.name + ".built")
    with FileLock(str(folder.with_name(folder.name + ".lock"))):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker killed half way left it
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def target_dirs(run_dir):
    cache = {}

    def get(kind: str):
        if kind not in cache:
            cache[kind] = built_once(run_dir / f"target-{kind}", lambda out: build_tiny_target(kind, out))
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def trained_drafts(run_dir, target_dirs):
    """A draft distilled on the target's own continuations of TRAINED_TEXTS (chat-templated)."""
    from transformers import AutoTokenizer

    from support.quick_draft import make_trained_draft

    cache = {}

    def get(kind: str):
        if kind not in cache:
            target = target_dirs(kind)
            tok = AutoTokenizer.from_pretrained(str(target))
            prompts = [tok(make_prompt(kind, target, t, None), add_special_tokens=False)["input_ids"]
                       for t in TRAINED_TEXTS]
            cache[kind] = built_once(run_dir / f"draft-{kind}", lambda out: make_trained_draft(
                target, out, prompts=prompts, steps=150, max_new_tokens=64))
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def clips(workdir):
    """Decoded synthetic clips by frame count: (frames THWC uint8, metadata)."""
    from vllm_sparrow.video import decode_video
    from sparrow_world.synthetic_clip import write_synthetic_clip

    cache = {}

    def get(num_frames: int, size: int = 112):
        key = (num_frames, size)
        if key not in cache:
            path = write_synthetic_clip(workdir / f"clip-{num_frames}-{size}.mp4", num_frames,
                                        width=size, height=size, seed=num_frames)
            cache[key] = decode_video(path, num_frames=num_frames)
        return cache[key]

    return get


def on_cuda() -> bool:
    """Engines run on CUDA here: torch sees a GPU. Counted through NVML, as vLLM detects its
    platform, not with torch.cuda.is_available(), whose cuInit in this process would break CUDA in
    any process forked from it later."""
    import torch

    return torch.cuda.device_count() > 0


# The share of GPU memory each test engine takes on CUDA. vLLM reserves gpu_memory_utilization x
# the GPU's total memory per engine (0.92 by default) and refuses to start when less than that is
# free, but tests keep several engines alive at once: a module's shared engine beside a test's own
# (batch captioning), the `vllm serve` subprocess beside the in-process reference engine, an engine
# or two of earlier modules not yet collected. The tiny targets need far less than 0.15 (the
# weights are megabytes; the KV cache fills whatever is left), and 0.15 leaves room for six.
GPU_SHARE = 0.15


def gpu_share() -> dict:
    """Engine kwargs that make an engine take GPU_SHARE on CUDA; {} on CPU (nothing changes there:
    the CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE)."""
    return {"gpu_memory_utilization": GPU_SHARE} if on_cuda() else {}


def gpu_share_args() -> list[str]:
    """The same for a `vllm serve` command line."""
    return ["--gpu-memory-utilization", str(GPU_SHARE)] if on_cuda() else []


# gpu_share() is part of the defaults (and not only of make_llm) because tests hand
# ENGINE_DEFAULTS to subprocesses too (`sparrow caption --engine-args`).
ENGINE_DEFAULTS = dict(enforce_eager=True, dtype="float32", max_model_len=8192,
                       max_num_batched_tokens=8192, max_num_seqs=16,
                       limit_mm_per_prompt={"image": 1, "video": 1}, **gpu_share())


@pytest.fixture(scope="session", autouse=True)
def every_engine_takes_the_gpu_share():
    """On CUDA, an in-process vllm.LLM opened without make_llm (the benchmark's engines in
    quick_bench, batch captioning without an engine handed in) gets GPU_SHARE too, unless its
    caller chose a gpu_memory_utilization: vLLM's default of 0.92 fails while another engine lives."""
    if not on_cuda():
        yield
        return
    import functools

    from vllm import LLM

    original = LLM.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("gpu_memory_utilization", GPU_SHARE)
        original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LLM, "__init__", __init__)
        yield


def make_llm(target, **overrides):
    from vllm import LLM

    return LLM(model=str(target), **{**ENGINE_DEFAULTS, **overrides})


@contextlib.contextmanager
def vllm_server(target, args: list[str], log: Path, env: dict | None = None, timeout: float = 300,
                command: list[str] | None = None):
    """`vllm serve TARGET ARGS` on 127.0.0.1 at a free port, with this GPU share on CUDA; yields
    (base url, process) once /health answers, and stops the server's process group (API server
    and engine process) afterwards. command: run this instead of `vllm serve TARGET` (a script
    that execs it), with ARGS, the port and the GPU share after it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = command or [str(Path(sys.executable).with_name("vllm")), "serve", str(target)]
    cmd = [*head, *args, "--host", "127.0.0.1", "--port", str(port), *gpu_share_args()]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log, timeout)
        yield url, proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # by PID: the server and its engine process
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"vllm serve not healthy after {timeout}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def plain_server(workdir, target_dirs):
    """The tiny target served without speculation, shared by the files of its unit."""
    return v1_server(workdir, target_dirs(SERVED_KIND), None)


@pytest.fixture(scope="module")
def sparrow_server(workdir, target_dirs, trained_drafts):
    """The tiny target served with Sparrow and its trained draft, shared by the files of its unit."""
    return v1_server(workdir, target_dirs(SERVED_KIND), trained_drafts(SERVED_KIND))


@pytest.fixture(scope="module")
def v2_plain_server(workdir, target_dirs):
    return v2_server(workdir, target_dirs(SERVED_KIND), None)


@pytest.fixture(scope="module")
def v2_sparrow_server(workdir, target_dirs, trained_drafts):
    return v2_server(workdir, target_dirs(SERVED_KIND), trained_drafts(SERVED_KIND))


def close_llm(llm):
    """Shut the engine down now. Leaving it to garbage collection is not enough: a stale engine
    collected while a newer one runs tears down the process-wide distributed groups."""
    llm.llm_engine.engine_core.shutdown()  # idempotent (its finalizer is detached)
    gc.collect()


DEMO_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "world")


@pytest.fixture(scope="session")
def small_clips(workdir):
    """Six 4-frame 112x112 clips, v0.mp4 .. v5.mp4 (seed i), written once for the capture and
    training tests, whose datasets name them (support/clip_data.py: dataset)."""
    from sparrow_world.synthetic_clip import write_synthetic_clip

    root = workdir / "small-clips"
    root.mkdir()
    for i in range(6):
        write_synthetic_clip(root / f"v{i}.mp4", 4, width=112, height=112, seed=i)
    return root


@pytest.fixture(scope="session")
def small_dataset(workdir, small_clips):
    """The first four small clips, one "describe clip i" each: the training tests' dataset."""
    from support.clip_data import dataset

    return dataset(workdir / "small-capture-data", small_clips,
                   [{"video": f"v{i}.mp4", "prompt": f"describe clip {i}"} for i in range(4)])


@pytest.fixture(scope="session")
def small_capture(small_dataset, target_dirs):
    """small_dataset captured from the tiny Qwen2.5-VL target (training tests)."""
    from vllm_sparrow.training.capture import CaptureConfig, capture

    out = small_dataset.parent / "cap"
    capture(CaptureConfig(target=str(target_dirs("qwen2_5_vl")), data=str(small_dataset), out=str(out),
                          num_frames=4, max_new_tokens=12), progress=False)
    return out


@pytest.fixture(scope="session")
def quick_bench(workdir):
    """`sparrow bench --quick` on the shipped demo models, every method plus an untrained Sparrow
    draft as an ablation: run once, read by the benchmark and the demo-model tests."""
    from sparrow_world.bench.config import BenchConfig, quick
    from sparrow_world.bench.run import run_bench
    from vllm_sparrow.checkpoint import init_draft

    untrained = init_draft(os.path.join(DEMO_MODELS, "target"), workdir / "untrained-world-draft",
                           window_tokens=128)
    cfg = quick(BenchConfig(world="easy", target=os.path.join(DEMO_MODELS, "target"),
                            sparrow=os.path.join(DEMO_MODELS, "sparrow"),
                            eagle=os.path.join(DEMO_MODELS, "eagle"), eagle3=os.path.join(DEMO_MODELS, "eagle3"),
                            out=str(workdir / "bench-quick"), num_speculative_tokens=3,  # the build's replay depth
                            ablations={"untrained": str(untrained)}))
    records = run_bench(cfg)
    return cfg, {(r["method"], r["visual_tokens"], r["batch"]): r for r in records}
