"""vLLM general-plugin entry point (group `vllm.general_plugins`, name `sparrow`).

Runs in every vLLM process before configs are built, sparrow or not, so it must never stop
vLLM from starting. It picks the glue for the installed release by its runner (releases.py):
  V1 runner               applies the patch table (patches.py), which adds the method; a release
                          lacking an internal Sparrow reads gets nothing, and a patch that fails to
                          apply is undone with the others
  V2 runner               registers the method through vLLM's registry (v2_runner/method.py);
                          patches nothing and sets no environment variable (its releases refuse
                          any VLLM_USE_V2_MODEL_RUNNER but 1, for every engine)
On any other release, or when its glue cannot be set up, it logs one line and registers nothing:
vLLM then refuses `method: "sparrow"` as an unknown method. Idempotent; imports no CUDA.

In a process a `sparrow` command started (vLLM's engine core, its workers) it first ties the
process's life to its parent's (lifetime.py), so a kill -9 of the command leaves nothing running.
"""

from __future__ import annotations

import logging

from . import LOGGER


def _logger():
    try:
        from vllm.logger import init_logger

        return init_logger(LOGGER)
    except Exception:  # noqa: BLE001 - logging must not be what breaks vLLM
        return logging.getLogger(LOGGER)


def register() -> None:
    from .lifetime import die_with_parent
    from .patches import UnsupportedVllmVersion, apply_patches, check_vllm_version, revert_patches
    from .releases import V2, release

    die_with_parent()  # first: before this process loads a model it must not outlive its command (never raises)

    try:
        version = check_vllm_version()
        if release(version).runner == V2:
            _register_on_v2_runner(version)
            return
        apply_patches()
    except UnsupportedVllmVersion as e:
        _logger().warning("%s The sparrow speculative method is not registered; vLLM runs without it.", e)
    except Exception as e:  # noqa: BLE001 - a broken patch must not take vLLM down with it
        revert_patches()
        _logger().error("vllm-sparrow could not set itself up in this vLLM (%s: %s); nothing of it is left "
                        "applied and the sparrow method is not registered.", type(e).__name__, e, exc_info=True)


def _register_on_v2_runner(version: str) -> None:
    from .v2_runner.method import register

    register(version)
