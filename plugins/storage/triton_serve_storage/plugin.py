"""The plugin behind the ``cloud_storage`` entry point: serves ``s3://``, ``gs://`` and ``as://`` repositories."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from triton_serve.plugin import RepositorySource, ServerError, hookimpl

from .locations import ObjectLocation, parse_azure, parse_gcs, parse_s3
from .source import ObjectStoreRepositorySource
from .store import StoreError


@dataclass(frozen=True)
class Cloud:
    """One location scheme: how to parse it, the client module that opens its store, and its pip extra."""

    parse: Callable[[str], ObjectLocation]
    module: str
    extra: str
    sdk: str


CLOUDS = {
    "s3": Cloud(parse_s3, "s3", "s3", "boto3"),
    "gs": Cloud(parse_gcs, "gcs", "gcs", "google-cloud-storage"),
    "as": Cloud(parse_azure, "azure_blob", "azure", "azure-storage-blob"),
}


@hookimpl
def tserve_repository_source(location: str) -> RepositorySource | None:
    scheme, separator, _ = location.partition("://")
    cloud = CLOUDS.get(scheme) if separator else None
    if cloud is None:
        return None
    where = cloud.parse(location)
    try:
        client = importlib.import_module(f"{__package__}.{cloud.module}")
    except ImportError as error:
        raise ServerError(f"model repository '{location}' needs {cloud.sdk} ({error}): "
                          f"pip install 'triton-serve-storage[{cloud.extra}]'") from None
    try:
        store = client.open_store(where)
    except StoreError as error:
        raise ServerError(f"model repository '{location}': {error}") from None
    return ObjectStoreRepositorySource.create(scheme, where, store)
