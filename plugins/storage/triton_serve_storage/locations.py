"""Parsing ``s3://``, ``gs://`` and ``as://`` model repository locations, with Triton's rules."""
from __future__ import annotations

import re
from dataclasses import dataclass

from triton_serve.plugin import ServerError

# s3://[http://|https://]host:port/bucket[/path]: a custom endpoint (Triton's S3 regex, minus its
# character limits on the path, which only made other paths fall back to the bucket form).
_S3_ENDPOINT = re.compile(r"(https?://)?([0-9a-zA-Z\-.]+):([0-9]+)/(.*)")
# as://account/container[/path][?query]: Triton's AS_URL_PATTERN.
_AZURE = re.compile(r"as://([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)?")


@dataclass(frozen=True)
class ObjectLocation:
    """Where a repository lives in an object store: a bucket (or container) and a key prefix.

    ``prefix`` is empty for the bucket's root, else ends with "/". ``endpoint`` is an ``http(s)://host:port``
    URL for ``s3://host:port/...`` locations; ``account`` is the storage account of ``as://`` locations.
    """

    location: str
    bucket: str
    prefix: str
    endpoint: str = ""
    account: str = ""

    @property
    def name(self) -> str:
        """The repository's name: the prefix's last segment, or the bucket when there is no prefix."""
        return self.prefix.rstrip("/").rsplit("/", 1)[-1] or self.bucket


def _clean_path(path: str) -> str:
    """The path with leading, trailing and repeated slashes removed (Triton's CleanPath)."""
    return "/".join(part for part in path.split("/") if part)


def _split(path: str, location: str) -> tuple[str, str]:
    """The bucket and the key prefix ("" or ending with "/") of a cleaned ``bucket/path``."""
    bucket, _, prefix = path.partition("/")
    if not bucket:
        raise ServerError(f"No bucket name found in path: {location}")
    return bucket, prefix + "/" if prefix else ""


def parse_s3(location: str) -> ObjectLocation:
    """``s3://bucket/path``, or ``s3://[http://|https://]host:port/bucket/path`` for an S3-compatible
    server at that endpoint (http unless https:// is given, as in Triton)."""
    rest = location.removeprefix("s3://")
    scheme = ""
    for candidate in ("https://", "http://"):
        if rest.startswith(candidate):
            scheme, rest = candidate, rest.removeprefix(candidate)
            break
    path = _clean_path(rest)
    custom = _S3_ENDPOINT.fullmatch(path)
    endpoint = ""
    if custom is not None:
        endpoint = f"{scheme or 'http://'}{custom.group(2)}:{custom.group(3)}"
        path = custom.group(4)
    elif scheme:
        raise ServerError(f"model repository '{location}': an {scheme} endpoint needs a port "
                          f"(s3://{scheme}host:port/bucket/path)")
    bucket, prefix = _split(path, location)
    if ":" in bucket:  # s3://host:port with nothing after it
        raise ServerError(f"No bucket name found in path: {location}")
    return ObjectLocation(location, bucket, prefix, endpoint=endpoint)


def parse_gcs(location: str) -> ObjectLocation:
    """``gs://bucket/path``."""
    bucket, prefix = _split(_clean_path(location.removeprefix("gs://")), location)
    return ObjectLocation(location, bucket, prefix)


def parse_azure(location: str) -> ObjectLocation:
    """``as://account/container/path`` (the account may be written ``<account>.blob.core.windows.net``)."""
    match = _AZURE.fullmatch(location)
    if match is None:
        raise ServerError(f"Invalid azure storage path: {location}")
    host, container, path, _query = match.groups()
    account = host.removesuffix(".blob.core.windows.net")
    prefix = _clean_path(path or "")
    return ObjectLocation(location, container, prefix + "/" if prefix else "", account=account)
