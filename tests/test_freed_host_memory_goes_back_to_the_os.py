"""The serving worker hands the C allocator's free pages back to the OS when requests end, at most
once per interval (host_memory.py): memory freed between live blocks, which the allocator would
otherwise keep resident, leaves the process's RSS; live blocks are untouched."""

import pytest

from vllm_sparrow import envs
from vllm_sparrow.host_memory import DEFAULT_INTERVAL_S, HostMemoryReturner
from vllm_sparrow.serving_draft import host_memory_interval


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_releases_at_most_once_per_interval():
    clock = _Clock()
    returner = HostMemoryReturner(5.0, clock)
    assert returner.stats.allocator in ("glibc", "tcmalloc")  # glibc here unless tcmalloc is preloaded
    assert not returner.maybe_release()  # just started
    clock.now = 4.9
    assert not returner.maybe_release()
    clock.now = 5.0
    assert returner.maybe_release()
    assert not returner.maybe_release()  # the interval starts again
    clock.now = 10.5
    assert returner.maybe_release()
    assert returner.stats.releases == 2 and returner.stats.seconds > 0


def test_off_never_releases():
    returner = HostMemoryReturner(None, _Clock())
    assert returner.stats.allocator == "none" and not returner.maybe_release()


def test_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("SPARROW_HOST_MEMORY_RELEASE", raising=False)
    assert host_memory_interval() == DEFAULT_INTERVAL_S
    monkeypatch.setenv("SPARROW_HOST_MEMORY_RELEASE", "off")
    assert host_memory_interval() is None
    monkeypatch.setenv("SPARROW_HOST_MEMORY_RELEASE", "0.5")
    assert host_memory_interval() == 0.5
    monkeypatch.setenv("SPARROW_HOST_MEMORY_RELEASE", "-1")
    with pytest.raises(ValueError, match="SPARROW_HOST_MEMORY_RELEASE"):
        envs.SPARROW_HOST_MEMORY_RELEASE


def test_pages_freed_between_live_blocks_leave_the_resident_set():
    """256 MiB in 64 KiB blocks (below glibc's mmap threshold: heap blocks, as the drafter's step
    temporaries are), every 16th kept alive: after the free, glibc keeps the pages between the live
    blocks resident; a release gives them back, and the live blocks keep their contents."""
    clock = _Clock()
    returner = HostMemoryReturner(1.0, clock)
    if returner.stats.allocator != "glibc":
        pytest.skip("the heap layout below is glibc's; this process runs another allocator")
    blocks = [bytearray(64 * 1024) for _ in range(4096)]
    for i in range(0, len(blocks), 16):
        blocks[i][:4] = i.to_bytes(4, "little")
    kept = blocks[::16]
    del blocks
    before = _rss_mib()
    clock.now = 1.0
    assert returner.maybe_release()
    after = _rss_mib()
    assert before - after > 128, f"resident memory went from {before:.0f} to {after:.0f} MiB"
    assert all(b[:4] == (16 * j).to_bytes(4, "little") for j, b in enumerate(kept))
