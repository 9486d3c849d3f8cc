"""The OpenAI wire format: validated request models, response and chunk builders.

Invariant: a request that reaches the router has been validated here (bounds,
roles, types), and every error leaves the server as an OpenAI-shaped body
`{"error": {"message", "type", "param", "code"}}` with a 4xx status for the
client's mistakes and 5xx for ours.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator
from pydantic_core import PydanticCustomError

from posttrain.types import Completion, Image, Message

Tier = Literal["standard", "fast"]
TIER_ALIASES: dict[str, Tier] = {
    "standard": "standard",
    "default": "standard",
    "auto": "standard",
    "flex": "standard",
    "fast": "fast",
    "priority": "fast",
}
_LOOSE = ConfigDict(extra="ignore")


class TextPart(BaseModel):
    """A `{"type": "text", "text": ...}` content part."""

    model_config = _LOOSE
    type: Literal["text"]
    text: str


class ImageUrl(BaseModel):
    model_config = _LOOSE
    url: str
    detail: str | None = None
    """OpenAI's resolution hint; accepted and ignored (the image is passed as sent)."""


class ImagePart(BaseModel):
    """A `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}` content part.
    Validation checks its shape only; `serve.limits.check_chat` decodes the data URL into the
    typed `Image` under the server's bounds (`decode_image_url`) and sets `image`."""

    model_config = _LOOSE
    type: Literal["image_url"]
    image_url: ImageUrl
    _image: Image | None = PrivateAttr(None)

    def attach(self, image: Image) -> None:
        """Set the part's decoded image (`serve.limits.check_chat`)."""
        self._image = image

    @property
    def image(self) -> Image:
        if self._image is None:
            raise RuntimeError("ImagePart.image read before serve.limits.check_chat decoded it")
        return self._image


ContentPart = TextPart | ImagePart
PART_TYPES = ("text", "image_url")


def _part(i: int, p: Any) -> ContentPart:
    """Content part `i` of a message, or a PydanticCustomError naming what is wrong with it."""
    if not isinstance(p, dict):
        raise PydanticCustomError("invalid_content_part", f"part {i} is {type(p).__name__}, not an object")
    kind = p.get("type")
    if "type" not in p:
        raise PydanticCustomError("invalid_content_part", f"part {i} has no 'type' ('text' or 'image_url')")
    if kind not in PART_TYPES:
        raise PydanticCustomError(
            "invalid_content_part",
            f"part {i} has type {str(kind)[:40]!r}; this server accepts 'text' and 'image_url' parts",
        )
    if kind == "text":
        if not isinstance(p.get("text"), str):
            raise PydanticCustomError("invalid_content_part", f"part {i}: a 'text' part needs a string 'text'")
        return TextPart(type="text", text=p["text"])
    box = p.get("image_url")
    if not isinstance(box, dict) or not isinstance(box.get("url"), str):
        raise PydanticCustomError(
            "invalid_content_part",
            f'part {i}: an \'image_url\' part needs "image_url": {{"url": "data:image/png;base64,..."}}',
        )
    detail = box.get("detail")
    return ImagePart(
        type="image_url", image_url=ImageUrl(url=box["url"], detail=detail if isinstance(detail, str) else None)
    )


class ChatMessage(BaseModel):
    model_config = _LOOSE
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart]
    """A string, or a list of content parts (OpenAI's form): 'text' parts, whose texts are joined
    in order, and 'image_url' parts (data URLs only), which become the message's images."""

    @field_validator("content", mode="before")
    @classmethod
    def _parts(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise PydanticCustomError(
                "invalid_content", f"content must be a string or a list of content parts, not {type(v).__name__}"
            )
        return [_part(i, p) for i, p in enumerate(v)]

    def text(self) -> str:
        """The message's text: its content, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def images(self) -> tuple[Image, ...]:
        """The message's images, in part order (decoded by `serve.limits.check_chat`)."""
        return () if isinstance(self.content, str) else tuple(p.image for p in self.content if isinstance(p, ImagePart))

    def to_message(self) -> Message:
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=self.text(), images=self.images())


class StreamOptions(BaseModel):
    model_config = _LOOSE
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields shared by chat and completions requests."""

    model_config = _LOOSE
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=64)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    service_tier: str | None = None
    user: str | None = None
    return_token_ids: bool = False
    """posttrain extension (as vLLM): return each choice's token ids and the prompt's."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty")
        return v

    @field_validator("service_tier")
    @classmethod
    def _tier(cls, v: str | None) -> str | None:
        if v is not None and v not in TIER_ALIASES:
            raise ValueError(f"unknown service_tier {v!r}; allowed: {', '.join(TIER_ALIASES)}")
        return v

    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)

    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=1)
    echo: bool = Field(False)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and isinstance(v[0], list) and any(not p for p in v):
            raise ValueError("token-id prompts must not be empty")
        return v

    @field_validator("echo")
    @classmethod
    def _echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    def wanted_tokens(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request: strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)
    """A Hugging Face checkpoint directory readable by the server."""


@dataclass(frozen=True)
class Served:
    """Who served a request: version name, tier and weight version."""

    version: str
    tier: Tier
    weights: int


class ApiError(Exception):
    """An error to send as an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_label(base: str, served: Served) -> str:
    return f"{base}@{served.version}:{served.tier}"


def _envelope(obj: str, rid: str, model: str, served: Served) -> dict[str, Any]:
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "service_tier": served.tier,
        "system_fingerprint": f"{served.version}-w{served.weights}",
    }


def chat_logprobs(c: Completion, token_str: Any) -> dict[str, Any]:
    content = []
    for tid, lp in zip(c.token_ids, c.logprobs):
        tok = token_str(tid)
        content.append({"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []})
    return {"content": content}


def completion_logprobs(c: Completion, token_str: Any) -> dict[str, Any]:
    tokens = [token_str(t) for t in c.token_ids]
    offsets, pos = [], 0
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": list(c.logprobs),
        "top_logprobs": [{t: lp} for t, lp in zip(tokens, c.logprobs)],
        "text_offset": offsets,
    }


def chat_response(
    rid: str,
    model: str,
    served: Served,
    groups: Sequence[Completion],
    want_logprobs: bool,
    want_ids: bool,
    token_str: Any,
) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(groups):
        choice: dict[str, Any] = {
            "index": i,
            "message": {"role": "assistant", "content": c.text},
            "finish_reason": c.finish_reason,
            "logprobs": chat_logprobs(c, token_str) if want_logprobs else None,
        }
        if want_ids:
            choice["token_ids"], choice["prompt_token_ids"] = list(c.token_ids), list(c.prompt_ids)
        choices.append(choice)
    out = _envelope("chat.completion", rid, model, served)
    out["choices"] = choices
    out["usage"] = usage(len(groups[0].prompt_ids) if groups else 0, sum(len(c.token_ids) for c in groups))
    return out


def completions_response(
    rid: str,
    model: str,
    served: Served,
    comps: Sequence[Completion],
    want_logprobs: bool,
    want_ids: bool,
    token_str: Any,
) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(comps):
        choice: dict[str, Any] = {
            "index": i,
            "text": c.text,
            "finish_reason": c.finish_reason,
            "logprobs": completion_logprobs(c, token_str) if want_logprobs else None,
        }
        if want_ids:
            choice["token_ids"], choice["prompt_token_ids"] = list(c.token_ids), list(c.prompt_ids)
        choices.append(choice)
    out = _envelope("text_completion", rid, model, served)
    out["choices"] = choices
    prompts = {c.prompt_ids for c in comps}
    out["usage"] = usage(sum(len(p) for p in prompts), sum(len(c.token_ids) for c in comps))
    return out


def chunk(
    kind: Literal["chat", "text"],
    rid: str,
    model: str,
    served: Served,
    index: int,
    text: str | None,
    finish: str | None,
    first: bool = False,
) -> dict[str, Any]:
    out = _envelope("chat.completion.chunk" if kind == "chat" else "text_completion", rid, model, served)
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        out["choices"] = [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}]
    else:
        out["choices"] = [{"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}]
    return out


def usage_chunk(
    kind: Literal["chat", "text"], rid: str, model: str, served: Served, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    out = _envelope("chat.completion.chunk" if kind == "chat" else "text_completion", rid, model, served)
    out["choices"] = []
    out["usage"] = usage(prompt_tokens, completion_tokens)
    return out
