"""Helpers of the bring-your-own tests: small task files written on the spot."""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TINY = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_tokens=6",
    "eval.tasks_per_domain=6",
    "eval.max_tokens=6",
    "run.threads=1",
    "run.progress=false",
    "run.checkpoint_every=0",
    "monitor.report=false",
]


def rows(n: int = 120, seed: int = 0) -> list[dict]:
    """Subtraction questions (the embedded model's `a-b=` form), with a difficulty and an id."""
    rng = random.Random(seed)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10)], n)
    return [{"id": f"r{i}", "q": f"{a}-{b}=", "a": str(a - b), "lvl": 1 + (b >= 5)} for i, (a, b) in enumerate(pairs)]


def write_jsonl(path: Path, data: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def train_cfg(tmp_path: Path, base: str, name: str, domains: str, *extra: str):
    from posttrain.configs import load_config

    return load_config(
        None,
        [
            *TINY,
            f"model.path={base}",
            f"run.out_dir={tmp_path}",
            f"run.name={name}",
            f"tasks.domains={domains}",
            *extra,
        ],
    )


Policy = Callable[[str, "str | None"], str]  # (request text, the nonce it asks for) -> reply


class FakeJudge:
    """A judge server whose reply is `policy(request, nonce)`; records every request."""

    def __init__(self) -> None:
        self.policy: Policy = lambda request, nonce: ""
        self.requests: list[str] = []
        self.status = 200
        """The HTTP status of every answer (a 5xx: a judge service that fails)."""
        self.hang = threading.Event()
        """Cleared: each answer waits until it is set (a judge that does not answer in time)."""
        self.hang.set()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = body["messages"][-1]["content"]
                judge.requests.append(request)
                judge.hang.wait()
                asked = re.findall(r'<verdict id="([0-9a-f]{16})">SCORE</verdict>', request)
                reply = judge.policy(request, asked[-1] if asked else None)
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
                self.send_response(judge.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a hung judge's test): nothing to answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hang.set()
        self.server.shutdown()
        self.server.server_close()
