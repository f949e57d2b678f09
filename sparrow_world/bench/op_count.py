"""Counting what a draft step costs without a clock: aten ops and host reads per engine step.

One trivial op costs ~9 us of host time here (more with CUDA launches), so the op count of a
step approximates its fixed cost, and it must not grow with the batch. A host read (`.item()`,
`bool(tensor)`, `nonzero`, ...) stalls the host until the device catches up and cannot be
captured in a CUDA graph. `.tolist()`/`.cpu()` of a CPU tensor dispatch nothing, so on CPU they
are caught by running the step on the meta device instead (tests/test_draft_step_cost_*).
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

# aten ops whose result size or value the host must read from the device
HOST_READS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::is_nonzero",
    "aten::equal", "aten::allclose", "aten::repeat_interleave",
})


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.host_reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func._schema.name
        if name in HOST_READS:
            self.host_reads.append(name)
        return func(*args, **(kwargs or {}))


def _install(worker) -> None:
    drafter = worker.model_runner.drafter
    if getattr(drafter, "_op_records", None) is not None:
        drafter._op_records.clear()
        return
    drafter._op_records = []
    inner = drafter.propose

    def counted(*args, **kwargs):
        cm = kwargs["common_attn_metadata"]
        qsl = cm.query_start_loc_cpu[: cm.num_reqs + 1]
        with OpCounter() as counter:
            out = inner(*args, **kwargs)
        drafter._op_records.append({
            "batch": int(cm.num_reqs), "max_query": int((qsl[1:] - qsl[:-1]).max()),
            "ops": counter.ops, "host_reads": list(counter.host_reads)})
        return out

    drafter.propose = counted


def _records(worker) -> list[dict[str, Any]]:
    return list(worker.model_runner.drafter._op_records)


def count_draft_ops(llm) -> None:
    """From now on record aten ops and host reads of every propose() call (clears old records)."""
    llm.collective_rpc(_install)


def draft_op_records(llm) -> list[dict[str, Any]]:
    """One record per engine step: batch size, longest query, ops, host-read op names."""
    return llm.collective_rpc(_records)[0]
