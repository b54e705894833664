"""Images of a chat request, bounded in the front before anything reaches the worker.

The field report's fault came from a very large image, so every bound is enforced here, in
this order: count, encoded bytes, format, pixel count (read from the header, before any
decoding: a decompression bomb never decodes), then a downscale to --max-edge (aspect kept)
and a re-encode to PNG. The worker gets plain bytes and never sees a URL or a path.
Decoding runs in a thread: the event loop never blocks on Pillow.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import re
from dataclasses import dataclass

import httpx

from steward.config import ServeConfig
from steward.errors import ApiError

FORMATS = {"JPEG", "PNG", "WEBP", "GIF"}
DATA_URL = re.compile(r"data:image/(jpeg|jpg|png|webp|gif);base64,(.*)", re.DOTALL)


@dataclass(frozen=True)
class ImageLimits:
    max_edge: int
    max_pixels: int
    max_bytes: int
    max_images: int
    allow_urls: bool

    @classmethod
    def of(cls, config: ServeConfig) -> ImageLimits:
        return cls(
            config.max_edge,
            config.max_image_pixels,
            config.max_image_bytes,
            config.max_images,
            config.allow_image_urls,
        )


async def load_images(urls: list[str], limits: ImageLimits) -> list[bytes]:
    """Each image URL as PNG bytes within the limits, or the ApiError that says which bound."""
    if len(urls) > limits.max_images:
        raise ApiError(
            "validation_error", f"{len(urls)} images; at most {limits.max_images} per request."
        )
    return [await asyncio.to_thread(prepare, await fetch(url, limits), limits) for url in urls]


async def fetch(url: str, limits: ImageLimits) -> bytes:
    if match := DATA_URL.fullmatch(url):
        if len(match[2]) * 3 // 4 > limits.max_bytes:
            raise too_large(f"an image exceeds {limits.max_bytes} bytes")
        try:
            return base64.b64decode(match[2], validate=True)
        except binascii.Error as exc:
            raise ApiError("validation_error", f"image data URL is not base64: {exc}") from exc
    if not url.startswith(("http://", "https://")):
        raise ApiError(
            "validation_error",
            "image_url must be a data:image/(jpeg|png|webp|gif);base64 URL"
            + (" or an http(s) URL." if limits.allow_urls else "."),
        )
    if not limits.allow_urls:
        raise ApiError(
            "validation_error", "remote image URLs are refused (the server allows data: URLs)."
        )
    return await download(url, limits.max_bytes)


async def download(url: str, max_bytes: int) -> bytes:
    """A remote image, streamed and cut off at `max_bytes`."""
    data = bytearray()
    try:
        async with (
            httpx.AsyncClient(timeout=10, follow_redirects=True) as client,
            client.stream("GET", url) as response,
        ):
            response.raise_for_status()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > max_bytes:
                    raise too_large(f"the image at {url} exceeds {max_bytes} bytes")
    except httpx.HTTPError as exc:
        raise ApiError("validation_error", f"could not fetch image {url}: {exc}") from exc
    return bytes(data)


def prepare(data: bytes, limits: ImageLimits) -> bytes:
    """Check, downscale and re-encode one image (runs in a thread)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > limits.max_bytes:
        raise too_large(f"an image of {len(data)} bytes exceeds {limits.max_bytes}")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError as exc:  # far beyond Pillow's own bound
        raise too_large(f"an image exceeds Pillow's pixel bound: {exc}") from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise ApiError("validation_error", f"not a readable image: {exc}") from exc
    if image.format not in FORMATS:
        raise ApiError("validation_error", f"image format {image.format} not accepted")
    width, height = image.size
    if width * height > limits.max_pixels:
        raise too_large(
            f"an image of {width}x{height} pixels exceeds {limits.max_pixels} (max-image-pixels)"
        )
    try:
        image = image.convert("RGB")  # decodes; the first frame of an animation
    except (OSError, Image.DecompressionBombError) as exc:
        raise ApiError("validation_error", f"image could not be decoded: {exc}") from exc
    image.thumbnail((limits.max_edge, limits.max_edge))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def too_large(message: str) -> ApiError:
    return ApiError("request_too_large", message[0].upper() + message[1:] + ".")
