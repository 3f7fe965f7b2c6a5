"""S3 specifics against moto: requests counted at the server, the credential file, endpoints, errors."""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http
from tritonclient.utils import InferenceServerException

from triton_serve.plugin import ServerError
from triton_serve.testing import EXAMPLE_REPOSITORY, free_port
from triton_serve_storage.plugin import tserve_repository_source



@pytest.fixture
def bucket(s3_emulator, cloud_env: Path, monkeypatch: pytest.MonkeyPatch):
    s3_emulator.configure(monkeypatch)
    return s3_emulator.new_bucket()


def test_reload_and_restart_get_only_changed_objects(bucket, s3_emulator, tserve, toy, kit) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model(versions=(1, 2)).items()})
    objects = f"/{bucket.name}/models/labelled/"
    server = tserve(bucket.location, extra_plugins=toy, model_control_mode="explicit", load_models=["labelled"])
    client = http.InferenceServerClient(server.http_url)
    assert sorted(s3_emulator.log.gets(objects)) == [objects + name for name in
                                                     ("2/toy_identity.toy", "config.pbtxt", "labels.txt")]
    bucket.put("models/labelled/labels.txt", b"kitten\npuppy\nchick\n")
    before = len(s3_emulator.log.requests)
    client.load_model("labelled")
    assert kit.top_label(client, "labelled") == "puppy"
    assert s3_emulator.log.gets(objects, since=before) == [objects + "labels.txt"]
    server.stop()

    before = len(s3_emulator.log.requests)  # a new server on the same cache folder downloads nothing
    restarted = tserve(bucket.location, extra_plugins=toy)
    assert kit.top_label(http.InferenceServerClient(restarted.http_url), "labelled") == "puppy"
    assert s3_emulator.log.gets(objects, since=before) == []


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def test_poll_mode_follows_changes_in_the_bucket(bucket, s3_emulator, tserve, toy, kit) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    server = tserve(bucket.location, extra_plugins=toy, model_control_mode="poll", repository_poll_secs=0.2)
    client = http.InferenceServerClient(server.http_url)
    assert kit.top_label(client, "labelled") == "dog"
    before = len(s3_emulator.log.requests)
    bucket.put("models/labelled/labels.txt", b"kitten\npuppy\nchick\n")
    bucket.upload({f"add_sub/{path}": data for path, data in kit.add_sub_model().items()})
    wait_for(lambda: kit.top_label(client, "labelled") == "puppy", "the changed labels")
    wait_for(lambda: client.is_model_ready("add_sub"), "the new model")
    assert kit.add_sub(client, "add_sub") == [11, 22, 33, 44]
    assert s3_emulator.log.gets(f"/{bucket.name}/models/labelled/", since=before) == [
        f"/{bucket.name}/models/labelled/labels.txt"]


@pytest.mark.parametrize("frontend_processes", [2])
def test_serves_through_front_end_processes(bucket, tserve, toy, kit, frontend_processes: int) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    server = tserve(bucket.location, extra_plugins=toy, frontend_processes=frontend_processes)
    client = http.InferenceServerClient(server.http_url)
    assert kit.top_label(client, "labelled") == "dog"
    index = client.get_model_repository_index()
    assert index == [{"name": "labelled", "version": "1", "state": "READY", "reason": ""}]


def test_python_example_model_from_s3(bucket, tserve) -> None:
    bucket.upload_folder(EXAMPLE_REPOSITORY / "add_sub", "models/add_sub/")
    server = tserve(bucket.location)
    client = http.InferenceServerClient(server.http_url)
    inputs = []
    for name, values in (("INPUT0", np.arange(16, dtype=np.int32)), ("INPUT1", np.ones(16, np.int32))):
        tensor = http.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(values.reshape(1, 16))
        inputs.append(tensor)
    result = client.infer("add_sub", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]


def test_triton_mount_directory_variable_places_the_cache(bucket, tserve, toy, kit, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_AWS_MOUNT_DIRECTORY", str(tmp_path / "mount"))
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    tserve(bucket.location, extra_plugins=toy)
    assert [path.name for path in (tmp_path / "mount").glob("models-*/models/labelled/labels.txt")] == ["labels.txt"]


def test_credential_file_longest_matching_name_wins(bucket, s3_emulator, tserve, toy, kit, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    other = s3_emulator.new_bucket()
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    other.upload({f"add_sub/{path}": data for path, data in kit.add_sub_model().items()})
    credentials = tmp_path / "cloud_credential.json"
    credentials.write_text(json.dumps({"s3": {
        "": {"key_id": "AKIAFALLBACK", "secret_key": "any", "region": "eu-west-1"},
        f"s3://{bucket.location.split('/')[2]}/{bucket.name}": {"key_id": "AKIABUCKET", "secret_key": "any",
                                                                "region": "us-east-2"}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(credentials))  # wins over the environment's keys
    before = len(s3_emulator.log.requests)
    server = tserve(bucket.location, other.location, extra_plugins=toy)
    client = http.InferenceServerClient(server.http_url)
    assert kit.top_label(client, "labelled") == "dog" and kit.add_sub(client, "add_sub") == [11, 22, 33, 44]
    assert s3_emulator.log.credentials(f"/{bucket.name}", since=before) == {"AKIABUCKET/us-east-2"}
    assert s3_emulator.log.credentials(f"/{other.name}", since=before) == {"AKIAFALLBACK/eu-west-1"}


@contextmanager
def signatures_checked(s3_emulator) -> Iterator[None]:
    """While inside, moto rejects requests whose key is not one of its IAM keys (it accepts any by default)."""
    def reset_auth(free_requests: str) -> None:
        request = urllib.request.Request(f"{s3_emulator.endpoint}/moto-api/reset-auth", data=free_requests.encode(),
                                         headers={"Content-Type": "text/plain"}, method="POST")
        urllib.request.urlopen(request).close()

    reset_auth("0")
    try:
        yield
    finally:
        reset_auth("inf")


def test_unknown_keys_fail_start_up_naming_the_location(bucket, s3_emulator, kit) -> None:
    bucket.upload({f"labelled/{path}": data for path, data in kit.labelled_model().items()})
    with signatures_checked(s3_emulator):
        message = kit.start_error(bucket.location)
    assert message.startswith(f"cannot list model repository '{bucket.location}': access denied "
                              "(InvalidAccessKeyId: "), message
    assert message.endswith("; check the credentials"), message


def test_credential_file_without_a_matching_name_is_an_error(tmp_path: Path, cloud_env: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = tmp_path / "cloud_credential.json"
    credentials.write_text(json.dumps({"s3": {"s3://other-bucket": {"key_id": "a", "secret_key": "b"}}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(credentials))
    with pytest.raises(ServerError, match="has no \"s3\" credential whose name starts model repository "
                                          "'s3://bucket/models'"):
        tserve_repository_source("s3://bucket/models")
    credentials.write_text("{not json")
    with pytest.raises(ServerError, match=f"cannot read the TRITON_CLOUD_CREDENTIAL_PATH file '{credentials}'"):
        tserve_repository_source("s3://bucket/models")


def test_unreachable_endpoint_fails_start_up_naming_the_location(kit, cloud_env: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    location = f"s3://127.0.0.1:{free_port()}/bucket/models"
    message = kit.start_error(location)
    assert message.startswith(f"cannot list model repository '{location}': cannot reach the S3 endpoint"), message


def test_loading_from_a_bucket_that_is_gone_fails_naming_the_location(bucket, s3_emulator, tserve, toy, kit) -> None:
    files = kit.labelled_model()
    bucket.upload({f"labelled/{path}": data for path, data in files.items()})
    server = tserve(bucket.location, extra_plugins=toy, model_control_mode="explicit")
    for path in files:
        bucket.delete(f"models/labelled/{path}")
    s3_emulator.client.delete_bucket(Bucket=bucket.name)
    with pytest.raises(InferenceServerException) as raised:
        http.InferenceServerClient(server.http_url).load_model("labelled")
    assert f"model repository '{bucket.location}': bucket '{bucket.name}' does not exist" in str(raised.value)
