"""Where the kit's bundled files are: the checkout it ships in (the demo models under models/world,
the sample clips under examples/videos), found from any working directory."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def in_checkout(path: str) -> str:
    """`path` as given when it is absolute or exists from the working directory; else the same
    relative path inside the checkout when it is there (`sparrow demo` and `sparrow bench` find the
    shipped models from any folder); else as given, for the caller's error to name."""
    p = Path(path)
    if p.is_absolute() or p.exists() or not (REPO / p).exists():
        return path
    return str(REPO / p)
