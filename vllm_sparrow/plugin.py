"""vLLM general-plugin entry point (group `vllm.general_plugins`, name `sparrow`).

Runs in every vLLM process before configs are built, sparrow or not, so it must never stop
vLLM from starting: on an unsupported vLLM version, or one that lacks an internal Sparrow reads
(patches.py checks them), it logs one line and registers nothing (vLLM then refuses
`method: "sparrow"` as an unknown method), and if a patch fails to apply it
undoes the ones applied, logs why, and leaves vLLM as it was. Idempotent; imports no CUDA.

In a process a `sparrow` command started (vLLM's engine core, its workers) it first ties the
process's life to its parent's (lifetime.py), so a kill -9 of the command leaves nothing running.
"""

from __future__ import annotations

import logging


def _logger():
    try:
        from vllm.logger import init_logger

        return init_logger("vllm_sparrow")
    except Exception:  # noqa: BLE001 - logging must not be what breaks vLLM
        return logging.getLogger("vllm_sparrow")


def register() -> None:
    from .lifetime import die_with_parent
    from .patches import UnsupportedVllmVersion, apply_patches, revert_patches

    die_with_parent()  # first: before this process loads a model it must not outlive its command (never raises)

    try:
        apply_patches()
    except UnsupportedVllmVersion as e:
        _logger().warning("%s The sparrow speculative method is not registered; vLLM runs without it.", e)
    except Exception as e:  # noqa: BLE001 - a broken patch must not take vLLM down with it
        revert_patches()
        _logger().error("vllm-sparrow could not patch this vLLM (%s: %s); its patches were undone and "
                        "the sparrow method is not registered.", type(e).__name__, e, exc_info=True)
