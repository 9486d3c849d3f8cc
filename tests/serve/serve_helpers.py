"""Shared helpers for the serving tests: tiny model dirs and a real uvicorn server on loopback."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def save_model(path: Path, preset: str = "micro", seed: int = 0, broken: bool = False) -> Path:
    """A random embedded model saved as a Hugging Face dir; `broken` fills its weights with NaN."""
    from posttrain.model.arch import random_model

    model, tok = random_model(preset, seed)
    if broken:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Run `app` under uvicorn on 127.0.0.1, ephemeral port; yields the base URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
