"""A command's report on the terminal, vLLM's own output in a file.

vLLM writes hundreds of lines per engine (Python logs, C++ warnings, progress bars, and on an
interrupt its engine process's errors), which bury a command's one summary line. Inside
`logs_to(path)` the process's stdout and stderr (file descriptors 1 and 2, so the engine
processes started inside inherit them) go to `path`; the caller writes its report to the stream
it is handed, which is the terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def logs_to(path: Path | None):
    """Yields the terminal's stdout; everything else written meanwhile goes to `path`
    (appended). None: nothing is redirected."""
    if path is None:
        yield sys.stdout
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log, os.fdopen(os.dup(saved[0]), "w", buffering=1) as report:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield report
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
