"""`python -m vllm_sparrow.gpu_check`: run the check's parts, write one JSON report, print a line
per part; exit 1 when a part fails (a wrong result or an error), 0 otherwise.

Runs from a checkout without installing (the device machine has no package registry): the
kernels folder is then made importable under its installed name, vllm_sparrow_kernels.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path

PARTS = ("kernels", "graphs", "memory", "costs", "modes", "positions")


def kernels_from_checkout() -> None:
    """Make `vllm_sparrow_kernels` importable from the checkout's kernels/ when it is not installed."""
    if importlib.util.find_spec("vllm_sparrow_kernels") is not None:
        return
    folder = Path(__file__).resolve().parents[2] / "kernels"
    spec = importlib.util.spec_from_file_location("vllm_sparrow_kernels", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_sparrow_kernels"] = module
    spec.loader.exec_module(module)


def environment(device) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": str(device), "vllm_importable": importlib.util.find_spec("vllm") is not None}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m vllm_sparrow.gpu_check", description=__doc__)
    p.add_argument("--shapes", choices=("7b", "tiny"), default="7b", help="sizes (shapes.py)")
    p.add_argument("--device", default=None, help="cuda (default when available), cpu, or meta (memory at any "
                                                  "shapes without allocating it: the memory part only)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--out", default="gpu-check.json", help="the JSON report")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    kernels_from_checkout()
    import torch

    from . import costs, graphs, kernels, memory, modes, positions, shapes

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    s = {"7b": shapes.SEVEN_B, "tiny": shapes.TINY}[args.shapes]
    modules = {"kernels": kernels, "graphs": graphs, "memory": memory, "costs": costs, "modes": modes,
               "positions": positions}
    report = {"shapes": s.name, "environment": environment(device), "parts": {}}
    t_all = time.perf_counter()
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            result = modules[name].run(s, device)
        except Exception as e:  # a part's failure is reported; the other parts still run
            result = {"passed": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.perf_counter() - t0, 1)
        report["parts"][name] = result
        print(f"[gpu-check] {name}: {'passed' if result['passed'] else 'FAILED'} in {result['seconds']} s"
              + (f" ({result['error']})" if "error" in result else ""), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["seconds"] = round(time.perf_counter() - t_all, 1)
    report["passed"] = all(p["passed"] for p in report["parts"].values())
    Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"[gpu-check] {'passed' if report['passed'] else 'FAILED'} in {report['seconds']} s; report: {args.out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
