"""Images in chat requests: an `image_url` content part's data URL to the typed `Image`.

Invariant: only `data:image/png;base64,...` URLs are read (the server fetches nothing:
a remote http(s) URL, a file: URL or any other scheme is refused), and every bound is
checked before the work it bounds: the base64 text's length against
`max_image_bytes` before any of it is decoded; the PNG signature and the IHDR's width
x height against `max_image_pixels` from the first 24 bytes, before the rest is decoded;
the decoded bytes against `max_image_bytes`; then `types.check_png` (CRCs, chunk order,
pixel data inflated under the size IHDR declares) through `Image.from_png`. PNG
metadata chunks (text, time, colour profile, physical size, ...) are dropped first, since
the typed Image holds pixels only; a chunk that changes the pixels' meaning (tRNS, ...)
is refused, not dropped. Each refusal is an `ApiError` 400 naming the rule, the part
(`param`) and the serve.limits field; no message quotes the URL's data.
"""

from __future__ import annotations

import base64
import binascii
import struct

from posttrain.errors import TaskError
from posttrain.serve.protocol import ApiError
from posttrain.types import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METADATA_CHUNKS = frozenset(
    {b"tEXt", b"zTXt", b"iTXt", b"tIME", b"pHYs", b"gAMA", b"cHRM", b"sRGB", b"iCCP", b"sBIT", b"eXIf", b"bKGD"}
)
"""PNG chunks that describe an image without changing its samples: dropped before the typed
Image is built (which holds pixels only). Any other chunk outside IHDR, PLTE, IDAT, IEND is refused."""
_FORMATS = ((b"\xff\xd8\xff", "JPEG"), (b"GIF8", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def _refuse(message: str, param: str, code: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


def decode_image_url(url: str, max_bytes: int, max_pixels: int, param: str) -> Image:
    """The `Image` of a `data:image/png;base64,...` URL under the bounds `max_bytes` (decoded PNG
    bytes) and `max_pixels` (width x height); ApiError 400 naming the rule otherwise (`param` is
    the part's field, e.g. `messages.0.content.1.image_url.url`)."""
    scheme, colon, rest = url.partition(":")
    scheme = scheme.strip().lower()
    if not colon or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise _refuse("not a URL; send an image as a data URL (data:image/png;base64,...)", param, "invalid_image_url")
    if scheme in ("http", "https"):
        raise _refuse(
            "remote image URLs are not fetched; send the image inline as a data URL (data:image/png;base64,...)",
            param,
            "invalid_image_url",
        )
    if scheme != "data":
        raise _refuse(
            f"{scheme[:20]!r} URLs are not accepted; only data URLs (data:image/png;base64,...)",
            param,
            "invalid_image_url",
        )
    header, comma, payload = rest.partition(",")
    if not comma:
        raise _refuse("a data URL needs a ',' before its data (data:image/png;base64,...)", param, "invalid_image_url")
    fields = [f.strip().lower() for f in header.split(";")]
    if fields[0] != "image/png":
        raise _refuse(
            f"media type {fields[0][:40]!r} is not accepted; this server takes PNG images only "
            "(data:image/png;base64,...): convert the image to PNG",
            param,
            "invalid_image",
        )
    if "base64" not in fields[1:]:
        raise _refuse("the data URL is not base64 (data:image/png;base64,...)", param, "invalid_image_url")
    payload = payload.strip()
    if len(payload) > 4 * -(-max_bytes // 3):
        raise _refuse(
            f"the image's base64 is {len(payload):,} characters, over {max_bytes:,} bytes decoded; "
            f"this server's limit is {max_bytes:,} bytes (serve.limits.max_image_bytes)",
            param,
            "image_too_large",
        )
    head = _b64(payload[:32], param)  # the signature and IHDR's size, before the rest is decoded
    if not head.startswith(PNG_SIGNATURE):
        named = next((name for magic, name in _FORMATS if head.startswith(magic)), None)
        named = "WEBP" if head[:4] == b"RIFF" and head[8:12] == b"WEBP" else named
        said = f"a {named} image" if named else "not a PNG image (it does not start with the PNG signature)"
        raise _refuse(f"the data is {said}; this server takes PNG images only", param, "invalid_image")
    width, height = struct.unpack(">II", head[16:24]) if len(head) >= 24 else (0, 0)
    if head[12:16] == b"IHDR" and width * height > max_pixels:
        raise _refuse(
            f"the image is {width}x{height} = {width * height:,} pixels; this server's limit is "
            f"{max_pixels:,} pixels (serve.limits.max_image_pixels)",
            param,
            "image_too_large",
        )
    data = _b64(payload, param)
    if len(data) > max_bytes:
        raise _refuse(
            f"the image is {len(data):,} bytes; this server's limit is {max_bytes:,} bytes "
            "(serve.limits.max_image_bytes)",
            param,
            "image_too_large",
        )
    try:
        return Image.from_png(strip_metadata(data))
    except TaskError as exc:
        raise _refuse(str(exc), param, "invalid_image") from None


def _b64(text: str, param: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(
            "the data URL's data is not valid base64 (A-Z a-z 0-9 + /, '=' padding, no line breaks)",
            param,
            "invalid_image",
        ) from None


def strip_metadata(data: bytes) -> bytes:
    """`data` without its METADATA_CHUNKS; `data` itself when it is not a well-formed chunk
    sequence (the PNG check then says what is wrong)."""
    if not data.startswith(PNG_SIGNATURE):
        return data
    out, pos = [PNG_SIGNATURE], len(PNG_SIGNATURE)
    while pos < len(data):
        if len(data) - pos < 12:
            return data
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        end = pos + 12 + length
        if end > len(data):
            return data
        kind = data[pos + 4 : pos + 8]
        if kind not in METADATA_CHUNKS:
            out.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break
    out.append(data[pos:])  # bytes after IEND stay, for the PNG check to refuse
    return b"".join(out)
