"""Which weights a model folder holds, cheaply: captures, drafts and start-up checks compare it."""

from __future__ import annotations

from pathlib import Path


def weights_fingerprint(model: str | Path) -> str | None:
    """sha256 (first 16 hex digits) of a local model folder's weight files, in name order; None
    for a hub id or a folder without weight files. Files up to 4 MiB are hashed whole; larger
    ones by size and 16 evenly spaced 64 KiB reads, so a 15 GB target costs 1 MiB of reading per
    file at capture start, while retraining, which changes every tensor, still changes it."""
    import hashlib

    folder = Path(model)
    files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")) if folder.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        with open(f, "rb") as fh:
            if size <= 4 << 20:
                digest.update(fh.read())
                continue
            digest.update(str(size).encode())
            for k in range(16):
                fh.seek((size - (64 << 10)) * k // 15)
                digest.update(fh.read(64 << 10))
    return digest.hexdigest()[:16]
