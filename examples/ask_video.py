"""Ask a question about a local video through the OpenAI client (server: examples/serve_sparrow.sh).

    python examples/ask_video.py clip.mp4 "What happens in this video?" [--url http://127.0.0.1:8000]
"""

import argparse
import base64
from pathlib import Path

import openai


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("video")
    p.add_argument("question")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--max-tokens", type=int, default=256)
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    data = "data:video/mp4;base64," + base64.b64encode(Path(a.video).read_bytes()).decode()
    stream = client.chat.completions.create(
        model=model, max_tokens=a.max_tokens, temperature=0.0, stream=True,
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data}},
                                               {"type": "text", "text": a.question}]}])
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
