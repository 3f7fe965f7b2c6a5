"""The same behaviour from every cloud: S3 (moto), GCS (gcp-storage-emulator) and Azure (azurite)."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import tritonclient.grpc as grpc
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve_storage.plugin import tserve_repository_source


@pytest.fixture(params=["s3", "gs", "as"])
def bucket(request: pytest.FixtureRequest, cloud_env: Path, monkeypatch: pytest.MonkeyPatch):
    """A fresh bucket in the cloud's emulator, with the environment set to reach it."""
    emulator = request.getfixturevalue(f"{request.param}_emulator")
    emulator.configure(monkeypatch)
    return emulator.new_bucket()


def cached_model(cache: Path, model: str) -> Path:
    """The one local copy of ``model`` under the cache folder."""
    (found,) = cache.glob(f"*/models/{model}")
    return found


def files_under(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}


def test_serves_models_beside_a_local_repository(bucket, tserve, toy, kit, tmp_path: Path) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    local = kit.write(tmp_path / "local", {f"add_sub/{path}": data for path, data in kit.add_sub_model().items()})
    server = tserve(bucket.location, local, extra_plugins=toy)
    client = http.InferenceServerClient(server.http_url)
    assert kit.top_label(client, "labelled") == "dog"
    assert kit.add_sub(client, "add_sub") == [11, 22, 33, 44]
    index = {entry["name"]: entry["state"] for entry in client.get_model_repository_index()}
    assert index == {"labelled": "READY", "add_sub": "READY"}


def test_downloads_only_the_versions_the_policy_selects(bucket, tserve, toy, kit, cloud_env: Path) -> None:
    files = kit.labelled_model(versions=(1, 2, 3))
    files["extras/notes.txt"] = b"a folder that is not a version comes along"
    bucket.upload({f"labelled/{path}": data for path, data in files.items()})
    server = tserve(bucket.location, extra_plugins=toy)
    client = http.InferenceServerClient(server.http_url)
    assert client.is_model_ready("labelled", "3") and not client.is_model_ready("labelled", "1")
    assert files_under(cached_model(cloud_env, "labelled")) == {
        "config.pbtxt", "labels.txt", "extras/notes.txt", "3/toy_identity.toy"}


def test_reload_fetches_changed_and_new_files_and_drops_removed_ones(bucket, tserve, toy, kit, cloud_env: Path) -> None:
    files = kit.labelled_model(versions=(1,))
    files["extras/old.txt"] = b"removed before the reload"
    bucket.upload({f"labelled/{path}": data for path, data in files.items()})
    server = tserve(bucket.location, extra_plugins=toy, model_control_mode="explicit", load_models=["labelled"])
    client = http.InferenceServerClient(server.http_url)
    assert kit.top_label(client, "labelled") == "dog"
    local = cached_model(cloud_env, "labelled")
    unchanged = os.stat(local / "config.pbtxt")
    replaced = os.stat(local / "labels.txt")

    bucket.put("models/labelled/labels.txt", b"kitten\npuppy\nchick\n")
    bucket.put("models/labelled/2/toy_identity.toy", b"# version 2\n")
    bucket.delete("models/labelled/extras/old.txt")
    client.load_model("labelled")

    assert kit.top_label(client, "labelled") == "puppy"
    assert client.is_model_ready("labelled", "2") and not client.is_model_ready("labelled", "1")
    assert files_under(local) == {"config.pbtxt", "labels.txt", "1/toy_identity.toy", "2/toy_identity.toy"}
    assert not (local / "extras").exists()  # the folder went with its last file
    kept = os.stat(local / "config.pbtxt")
    assert (kept.st_ino, kept.st_mtime_ns) == (unchanged.st_ino, unchanged.st_mtime_ns)  # not downloaded again
    assert os.stat(local / "labels.txt").st_ino != replaced.st_ino


def test_a_model_name_that_leaves_the_repository_is_refused(bucket, tserve, toy, kit, cloud_env: Path) -> None:
    files = kit.labelled_model()
    bucket.upload({f"labelled/{path}": data for path, data in files.items()})
    bucket.upload({f"outside/{path}": data for path, data in files.items()}, prefix="")  # beside "models/"
    server = tserve(bucket.location, extra_plugins=toy, model_control_mode="explicit")
    client = grpc.InferenceServerClient(server.grpc_url)
    for name in ("../outside", "labelled/../../outside", "..", ""):
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(name)
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert raised.value.message().startswith(f"invalid model name '{name}': a model name must be one folder name")
    client.load_model("labelled")
    assert kit.top_label(http.InferenceServerClient(server.http_url), "labelled") == "dog"
    assert not list(cloud_env.rglob("outside"))  # nothing came from outside the repository into the cache


def test_fingerprint_changes_exactly_when_an_object_does(bucket, kit) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    source = tserve_repository_source(bucket.location)

    async def fingerprints() -> tuple[str, str]:
        return await source.fingerprint("labelled"), await source.fingerprint("labelled")

    before, again = asyncio.run(fingerprints())
    bucket.put("models/labelled/labels.txt", b"kitten\npuppy\nchick\n")
    after, _ = asyncio.run(fingerprints())
    assert before == again != after


def test_listing_versions_and_existence_read_the_store_only(bucket, kit, cloud_env: Path) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model(versions=(1, 2, 10)).items()})
    bucket.put("models/labelled/01/ignored.txt", b"a leading zero is not a version")
    bucket.put("models/.hidden/config.pbtxt", b"")
    source = tserve_repository_source(bucket.location)

    async def look() -> tuple[list[str], bool, bool, list[int]]:
        return (await source.list_models(), await source.exists("labelled"), await source.exists("absent"),
                await source.versions("labelled"))

    assert asyncio.run(look()) == (["labelled"], True, False, [1, 2, 10])
    assert source.name == "models"
    assert not cloud_env.exists()  # nothing was downloaded


def test_a_missing_bucket_fails_start_up_naming_the_location(bucket, kit) -> None:
    missing = bucket.location.replace("bucket-", "absent-").replace("container-", "absent-")
    message = kit.start_error(missing)
    assert f"model repository '{missing}'" in message and "does not exist" in message, message
