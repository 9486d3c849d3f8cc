"""Image content parts in chat requests (issue 40 item 4): data URLs only, bounded in bytes and
pixels before decoding, validated into the typed Image, and refused by the text-only engine with
one 400 (never dropped between client and model, never a 500). The bounds and parse errors are
checked on `serve.limits.validate` (the server's own parse step); the end-to-end ones through the
official openai client against a real uvicorn server on loopback."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import httpx
import openai
import pytest
from serve_helpers import running, save_model

from posttrain.configs.serve import LimitsConfig, ServeConfig
from posttrain.serve.limits import validate
from posttrain.serve.protocol import ApiError, ChatRequest
from posttrain.serve.server import build_server
from posttrain.types import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, Image


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int = 8, height: int = 6, extra: bytes = b"", seed: int = 0) -> bytes:
    """An RGB PNG of varied pixels; `extra` (whole chunks) goes between IHDR and IDAT."""
    rows = b"".join(
        b"\x00" + bytes((x * 31 + y * 17 + seed + c) % 256 for x in range(width) for c in range(3))
        for y in range(height)
    )
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + extra
        + _chunk(b"IDAT", zlib.compress(rows))
        + _chunk(b"IEND", b"")
    )


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(*parts: dict, **limits) -> ChatRequest:
    body = {"model": "posttrain", "messages": [{"role": "user", "content": list(parts)}]}
    return validate(json.dumps(body).encode(), ChatRequest, LimitsConfig(**limits))


def refused(*parts: dict, **limits) -> ApiError:
    with pytest.raises(ApiError) as info:
        chat(*parts, **limits)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


TEXT = {"type": "text", "text": "what does the chart show?"}
URL_PARAM = "messages.0.content.1.image_url.url"


def test_the_limits_match_the_typed_images_own_bounds():
    limits = LimitsConfig()
    assert limits.max_image_bytes == MAX_IMAGE_BYTES and limits.max_image_pixels == MAX_IMAGE_PIXELS
    for name, top in (("max_image_bytes", MAX_IMAGE_BYTES), ("max_image_pixels", MAX_IMAGE_PIXELS)):
        with pytest.raises(ValueError):
            LimitsConfig(**{name: top + 1})


def test_a_valid_png_becomes_the_messages_typed_image():
    data = png(8, 6)
    body = chat(TEXT, image_part(data_url(data)), {"type": "text", "text": " and why?"})
    message = body.messages[0].to_message()
    assert message.content == "what does the chart show? and why?"
    assert message.images == (Image.from_png(data),)


def test_metadata_chunks_are_dropped_and_the_pixels_kept():
    plain = png(5, 4)
    tagged = png(5, 4, extra=_chunk(b"tEXt", b"Comment\x00the answer is 42") + _chunk(b"pHYs", b"\x00" * 9))
    (image,) = chat(TEXT, image_part(data_url(tagged))).messages[0].to_message().images
    assert image == Image.from_png(plain) and b"answer" not in image.png


def test_a_chunk_that_changes_the_pixels_is_refused_not_dropped():
    err = refused(TEXT, image_part(data_url(png(4, 4, extra=_chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03")))))
    assert err.code == "invalid_image" and "tRNS" in err.message and err.param == URL_PARAM


def test_oversized_bytes_are_refused_before_decoding():
    data = png(40, 40)
    err = refused(TEXT, image_part(data_url(data)), max_image_bytes=len(data) - 1)
    assert err.code == "image_too_large" and "serve.limits.max_image_bytes" in err.message
    assert err.param == URL_PARAM
    # its size is judged from the base64 text alone: data that would not even decode gets the same answer
    junk = "data:image/png;base64," + base64.b64encode(data[:24]).decode() + "!" * 4000
    assert refused(TEXT, image_part(junk), max_image_bytes=2000).code == "image_too_large"


def test_oversized_pixels_are_refused_from_the_header_before_decoding():
    err = refused(TEXT, image_part(data_url(png(16, 16))), max_image_pixels=255)
    assert err.code == "image_too_large" and "16x16" in err.message and "serve.limits.max_image_pixels" in err.message
    # a header that claims 4097 x 4096 pixels, followed by data that is not even base64: refused by the header
    ihdr = struct.pack(">IIBBBBB", 4097, 4096, 8, 2, 0, 0, 0)
    head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
    bomb = "data:image/png;base64," + base64.b64encode(head[:24]).decode() + "%%%%"
    err = refused(TEXT, image_part(bomb))
    assert err.code == "image_too_large" and "4097x4096" in err.message


@pytest.mark.parametrize(
    "data, said",
    [
        (b"this is plain text, not an image at all", "not a PNG"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 40, "JPEG"),
        (b"GIF89a" + b"\x00" * 40, "GIF"),
    ],
)
def test_not_an_image_is_refused(data, said):
    err = refused(TEXT, image_part(data_url(data)))
    assert err.code == "invalid_image" and said in err.message and "PNG images only" in err.message


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda d: d[: len(d) // 2], "not a PNG"),
        (lambda d: d[:40] + bytes([d[40] ^ 0xFF]) + d[41:], "CRC"),
        (lambda d: d + b"trailing", "IEND"),
    ],
    ids=["truncated", "corrupt", "trailing"],
)
def test_a_truncated_or_corrupt_png_is_refused(damage, said):
    err = refused(TEXT, image_part(data_url(damage(png(8, 8)))))
    assert err.code == "invalid_image" and said in err.message and err.param == URL_PARAM


@pytest.mark.parametrize(
    "url, said",
    [
        ("https://example.com/chart.png", "remote image URLs are not fetched"),
        ("http://169.254.169.254/latest/meta-data", "remote image URLs are not fetched"),
        ("file:///etc/passwd", "'file' URLs are not accepted; only data URLs"),
        ("ftp://example.com/a.png", "'ftp' URLs are not accepted; only data URLs"),
        ("chart.png", "not a URL"),
        ("data:image/png,rawbytes", "not base64"),
        ("data:image/png;base64", "needs a ','"),
        ("data:image/png;base64,@@@@not-base64@@@@", "not valid base64"),
    ],
)
def test_remote_urls_other_schemes_and_bad_data_urls_are_refused(url, said):
    err = refused(TEXT, image_part(url))
    assert err.code in ("invalid_image_url", "invalid_image") and said in err.message and err.param == URL_PARAM


def test_another_media_type_is_refused_naming_the_rule():
    err = refused(TEXT, image_part(data_url(png(), media="image/jpeg")))
    assert err.code == "invalid_image" and "'image/jpeg' is not accepted" in err.message and "PNG" in err.message


def test_no_error_message_quotes_the_image_data():
    secret = base64.b64encode(b"SECRET-PAYLOAD" * 4).decode()
    for url in (f"data:image/png;base64,{secret}", f"data:image/gif;base64,{secret}", f"https://x/{secret}"):
        assert secret[:12] not in refused(TEXT, image_part(url)).message


def test_too_many_images_are_refused():
    err = refused(TEXT, image_part(data_url(png())), image_part(data_url(png())), max_images=1)
    assert err.code == "limit_exceeded" and "serve.limits.max_images" in err.message


@pytest.mark.parametrize(
    "part, said",
    [
        ({"type": "audio", "input_audio": {}}, "type 'audio'; this server accepts 'text' and 'image_url'"),
        ({"text": "no type"}, "has no 'type'"),
        ({"type": "text"}, "a 'text' part needs a string 'text'"),
        ({"type": "text", "text": 3}, "a 'text' part needs a string 'text'"),
        ({"type": "image_url"}, "an 'image_url' part needs"),
        ({"type": "image_url", "image_url": {}}, "an 'image_url' part needs"),
        ({"type": "image_url", "image_url": "data:image/png;base64,AAAA"}, "an 'image_url' part needs"),
        ("just a string", "part 1 is str, not an object"),
    ],
)
def test_malformed_parts_are_refused_naming_the_part(part, said):
    err = refused(TEXT, part)
    assert err.code == "invalid_content_part" and err.param == "messages.0.content", err.message
    assert said in err.message and "part 1" in err.message


def test_content_that_is_neither_a_string_nor_parts_is_refused():
    body = {"model": "posttrain", "messages": [{"role": "user", "content": {"type": "text", "text": "x"}}]}
    with pytest.raises(ApiError) as info:
        validate(json.dumps(body).encode(), ChatRequest, LimitsConfig())
    assert info.value.code == "invalid_content" and "a string or a list of content parts" in info.value.message


# -- through the server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_model(tmp_path_factory.mktemp("model") / "m", "micro", seed=2)
    app = build_server(
        ServeConfig(
            model=str(path), canary={"probe_domains": []}, limits={"max_image_pixels": 4096, "max_image_bytes": 65536}
        )
    )
    with running(app) as url:
        yield url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_a_text_only_parts_list_answers_exactly_as_the_string(server):
    _, client = server
    parts = [{"type": "text", "text": "rev "}, {"type": "text", "text": "abcd="}]
    outs = [
        client.chat.completions.create(
            model="posttrain", messages=[{"role": "user", "content": c}], max_tokens=8, temperature=0, logprobs=True
        )
        for c in ("rev abcd=", parts)
    ]
    assert outs[0].choices[0].message.content == outs[1].choices[0].message.content
    assert outs[0].usage.prompt_tokens == outs[1].usage.prompt_tokens
    assert [t.logprob for t in outs[0].choices[0].logprobs.content] == [
        t.logprob for t in outs[1].choices[0].logprobs.content
    ]


@pytest.mark.parametrize("model", ["posttrain", "posttrain:fast"])
def test_a_valid_image_reaches_the_text_only_engine_and_is_refused_with_one_400(server, model):
    url, client = server
    content = [TEXT, image_part(data_url(png(8, 6)))]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0
        )
    body = info.value.body
    assert info.value.status_code == 400 and body["code"] == "images_not_supported" and body["param"] == "messages"
    assert "1 image(s) ([image 8x6 sha256:" in body["message"] and "reads text only" in body["message"]
    assert httpx.get(url + "/health").status_code == 200


@pytest.mark.parametrize(
    "part, code, said",
    [
        (image_part(data_url(png(80, 80))), "image_too_large", "max_image_pixels"),  # 6,400 pixels; 4,096 allowed
        (
            image_part(data_url(png(8, 8, extra=_chunk(b"tEXt", b"k\x00" + b"v" * 70_000)))),
            "image_too_large",
            "max_image_bytes",  # 70 kB; 64 KiB allowed
        ),
        (image_part(data_url(b"not an image at all, just some bytes")), "invalid_image", "not a PNG"),
        (image_part("https://example.com/chart.png"), "invalid_image_url", "remote image URLs are not fetched"),
        ({"type": "video_url", "video_url": {"url": "x"}}, "invalid_content_part", "type 'video_url'"),
    ],
)
def test_the_servers_refusals_are_openai_shaped_400s(server, part, code, said):
    url, client = server
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="posttrain", messages=[{"role": "user", "content": [TEXT, part]}])
    assert info.value.status_code == 400 and info.value.body["code"] == code and said in info.value.body["message"]
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"].startswith("messages.0")
    counted = [line for line in httpx.get(url + "/metrics").text.splitlines() if f'code="{code}"' in line]
    assert counted and all(line.startswith("posttrain_refused_requests_total{") for line in counted)


def test_the_policy_server_refuses_images_too(monkeypatch):
    from posttrain.serve.policy import policy_app

    seen = []
    monkeypatch.setattr("posttrain.serve.policy.load_policy", lambda path: lambda ms: seen.append(ms) or "ok")
    with running(policy_app(ServeConfig(policy="m:f"))) as url:
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "posttrain", "messages": [{"role": "user", "content": [TEXT, image_part(data_url(png()))]}]},
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "images_not_supported"
        ok = httpx.post(
            url + "/v1/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": [TEXT]}]}
        )
        assert ok.status_code == 200 and seen == [[{"role": "user", "content": TEXT["text"]}]]
