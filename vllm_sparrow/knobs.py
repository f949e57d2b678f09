"""Knobs: config dataclass fields with their help, and the command-line options derived from them.

A config field is the single source of its knob: its default, its help (`knob(help=...)`), and
optionally its flag and parser. `add_options` turns the fields into argparse options and
`from_args` builds the config back, so a command never restates a default.

    bool, default False   --name             (store_true)
    bool, default True    --no-name          (store_false; or the flag given)
    int / float / str     --name VALUE       (X | None: the same, default None)
    tuple[int, ...]       --name 1,2,3       (comma separated)
    dict                  --name '{"a": 1}'  (JSON)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from typing import Any, Callable

_MISSING = dataclasses.MISSING


def knob(default: Any = _MISSING, help: str = "", *, flag: str | None = None,  # noqa: A002
         parse: Callable[[str], Any] | None = None, choices: tuple | None = None, cli: bool = True,
         default_factory: Callable[[], Any] | Any = _MISSING) -> Any:
    """A dataclass field with its command-line help (and flag / parser / choices when needed)."""
    meta = {"help": help, "flag": flag, "parse": parse, "choices": choices, "cli": cli}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def optional_window(text: str) -> int | None:
    """window_tokens on the command line: a number, or none/null/all for every text token."""
    return None if text.lower() in ("none", "null", "all") else int(text)


def add_options(parser: argparse.ArgumentParser, cls: type, *, only: tuple[str, ...] | None = None,
                skip: tuple[str, ...] = ()) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or (only is not None and f.name not in only) or not f.metadata.get("cli", True):
            continue
        required = f.default is _MISSING and f.default_factory is _MISSING
        default = None if required else (f.default if f.default is not _MISSING else f.default_factory())
        base = _base_type(hints[f.name])
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        text = f.metadata.get("help", "")
        kw: dict[str, Any] = {"dest": f.name, "default": default}
        if base is bool:
            if default:
                flag = f.metadata.get("flag") or "--no-" + f.name.replace("_", "-")
            parser.add_argument(flag, action="store_false" if default else "store_true", help=text, **kw)
            continue
        if f.metadata.get("parse") is not None:
            kw["type"] = f.metadata["parse"]
        elif base is tuple:
            item = typing.get_args(hints[f.name])[0]
            kw["type"] = lambda s, item=item: tuple(item(x) for x in s.split(",") if x)
        elif base is dict:
            kw["type"] = json.loads
        elif base in (int, float, str):
            kw["type"] = base
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        if not (required or default is None or default == {}):
            text = f"{text} (default: {shown})".strip()
        parser.add_argument(flag, required=required, help=text, **kw)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any):
    """cls(...) from the parsed options that belong to it (and `overrides`)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**{**values, **overrides})


def _base_type(hint: Any) -> Any:
    """int | None -> int; tuple[int, ...] -> tuple; dict[str, Any] -> dict."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    return origin if origin is not None else hint
