"""README's `pip install` into an existing vLLM 0.32 environment: the package's wheel asks for
nothing that would replace the environment's torch or vLLM (only safetensors and PyAV), and once
installed vLLM's plugin loader finds it by its entry point and registers the sparrow method.

Installed here with `pip install --no-deps --target` beside this environment's vLLM, so the test
reads the wheel pip builds from the checkout, not the editable install the suite runs on."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_needs_only_safetensors_and_pyav_and_vllm_loads_it(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            str(ROOT), "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("vllm_sparrow-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        entry = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    needs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    core = [n for n in needs if "extra ==" not in n]
    assert sorted(core) == ["av>=14", "safetensors"], needs  # never torch, vllm or triton
    assert "sparrow = vllm_sparrow.plugin:register" in entry and "[vllm.general_plugins]" in entry

    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    probe = ("import importlib.metadata as m, vllm_sparrow, vllm.plugins as p; "
             "eps = [e for e in m.entry_points(group='vllm.general_plugins') if e.name == 'sparrow']; "
             "print(vllm_sparrow.__file__); print([e.dist._path for e in eps]); p.load_general_plugins(); "
             "from vllm.config import SpeculativeConfig; print('sparrow' in str(SpeculativeConfig.__annotations__['method']))")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = ran.stdout.strip().splitlines()
    assert lines[0].startswith(str(site)), lines  # the installed copy, not the checkout
    assert str(site) in lines[1] and lines[-1] == "True", lines
