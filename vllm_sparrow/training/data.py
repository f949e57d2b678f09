"""Training samples: JSONL in three shapes, media decoded with PyAV.

Accepted lines (paths relative to the JSONL file's folder unless absolute):
  flat:            {"video": "a.mp4", "prompt": "...", "response": "..."}  (response optional)
  LLaVA-Video-178K / ShareGPT4Video:
                   {"video": "a.mp4", "conversations": [{"from": "human", "value": "<image>\\n..."},
                                                        {"from": "gpt", "value": "..."}]}
  chat messages:   {"video_path": "a.mp4", "messages": [{"role": "user", "content": "..."},
                                                         {"role": "assistant", "content": "..."}]}
"image"/"image_path" instead of a video; neither means a text-only sample. A line may carry
"response_ids" (the response's token ids, as `sparrow respond` writes them beside "response"):
capture then uses them as they are, with no tokenizer round trip. Only the first
user/assistant turn is used. A bad line becomes a `BadSample` with a reason, never an exception,
so a capture run counts it and goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

MediaKind = Literal["video", "image"]
_MEDIA_MARKERS = re.compile(r"<(image|video)>\s*")


@dataclass(frozen=True)
class Sample:
    index: int  # line number (0-based) in the JSONL file: the sample's stable id
    prompt: str
    response: str | None  # None: the target writes it
    media_kind: MediaKind | None = None
    media_path: Path | None = None
    response_ids: tuple[int, ...] | None = None  # the target's own tokens (sparrow respond)


@dataclass(frozen=True)
class BadSample:
    index: int
    reason: str  # short category: "bad json", "missing file", "empty response", ...
    detail: str  # what to fix

    def message(self) -> str:
        return f"sample {self.index}: {self.reason}: {self.detail}"


def read_samples(jsonl: str | Path) -> Iterator[Sample | BadSample]:
    jsonl = Path(jsonl)
    with jsonl.open(encoding="utf-8") as f:
        for index, line in enumerate(f):
            if line.strip():
                yield parse_line(index, line, jsonl.parent)


def parse_line(index: int, line: str, root: Path) -> Sample | BadSample:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return BadSample(index, "bad json", f"{e}; each line must be one JSON object")
    if not isinstance(row, dict):
        return BadSample(index, "bad json", "each line must be a JSON object")
    kind, path = _media(row, root)
    if path is not None and not path.is_file():
        return BadSample(index, "missing file", f"{path} does not exist; fix the path")
    prompt, response = _turn(row)
    if not prompt:
        return BadSample(index, "empty prompt", "give 'prompt', 'conversations' or 'messages'")
    if response is not None and not response.strip():
        return BadSample(index, "empty response", "drop the key to let the target write it")
    ids = row.get("response_ids")
    if ids is not None and not (isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)):
        return BadSample(index, "bad response_ids", "give a non-empty list of token ids, or drop the key")
    return Sample(index, prompt, response, kind, path, None if ids is None else tuple(ids))


def _media(row: dict[str, Any], root: Path) -> tuple[MediaKind | None, Path | None]:
    for kind in ("video", "image"):
        for key in (kind, f"{kind}_path"):
            if isinstance(row.get(key), str) and row[key]:
                path = Path(row[key])
                return kind, path if path.is_absolute() else root / path
    return None, None


def _turn(row: dict[str, Any]) -> tuple[str, str | None]:
    """(prompt, response or None) from the flat, conversations or messages shape."""
    if "prompt" in row:
        response = row.get("response")
        return _clean(row["prompt"]), None if response is None else str(response)
    turns = row.get("conversations") or row.get("messages") or []
    user = next((t for t in turns if _role(t) == "user"), None)
    if user is None:
        return "", None
    after = turns[turns.index(user) + 1 :]
    reply = next((t for t in after if _role(t) == "assistant"), None)
    return _clean(_text(user)), None if reply is None else _text(reply)


def _role(turn: Any) -> str:
    role = str(turn.get("from") or turn.get("role") or "") if isinstance(turn, dict) else ""
    return {"human": "user", "gpt": "assistant"}.get(role, role)


def _text(turn: dict[str, Any]) -> str:
    content = turn.get("value", turn.get("content", ""))
    if isinstance(content, list):  # OpenAI-style parts: keep the text ones
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _clean(prompt: Any) -> str:
    # The chat template places the media itself; dataset markers would become literal text.
    return _MEDIA_MARKERS.sub("", str(prompt)).strip()


def load_media(sample: Sample, num_frames: int) -> Any:
    """Decoded media for the processor: video -> (frames THWC uint8, metadata), image -> PIL.

    Raises ValueError (VideoDecodeError for videos) with the file and what to do.
    """
    if sample.media_kind == "video":
        from ..video import decode_video

        return decode_video(sample.media_path, num_frames=num_frames)
    if sample.media_kind == "image":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(sample.media_path) as im:
                return im.convert("RGB")
        except (UnidentifiedImageError, OSError) as e:
            raise ValueError(f"{sample.media_path}: not a readable image ({e}); re-encode it") from e
    return None
