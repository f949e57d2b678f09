"""vLLM general-plugin entry point (group `vllm.general_plugins`, name `sparrow`).

Runs in every vLLM process before configs are built. Idempotent, imports no CUDA, and refuses
an unsupported vLLM version with a message that says what to install.
"""

from __future__ import annotations


def register() -> None:
    from .patches import apply_patches

    apply_patches()
