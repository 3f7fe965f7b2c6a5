"""The deployment files under deploy/ and the Dockerfile: every kustomization renders with ``kubectl
kustomize``, every object validates against Kubernetes 1.30's schemas or the vendored CRD schemas, and
what they say about the server (flags, ports, probe paths, drain time, metric names, plugins) is what
the server does."""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kubernetes_validate
import pytest
import yaml

import triton_serve
from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.examples import EXAMPLE_REPOSITORY
from triton_serve._engine.server import ServerOptions

from .conftest import ADD_SUB, FRONTEND_MODES

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = sorted(path.parent.relative_to(DEPLOY).as_posix() for path in DEPLOY.rglob("kustomization.yaml"))
KUBERNETES = sorted(k for k in KUSTOMIZATIONS if k.startswith("kubernetes/"))
KUBERNETES_VERSION = "1.30.0"
USER_DOCS = [ROOT / "docs" / "deploy.md", DEPLOY / "README.md"]
# KServe model formats the runtime must serve, each with the plugin directory that serves it.
KSERVE_FORMATS = {"triton": None, "onnx": "onnx", "pytorch": "torch", "openvino": "openvino", "xgboost": "fil",
                  "lightgbm": "fil", "tensorrt": "tensorrt"}
DRAIN_MARGIN_S = 5  # what terminationGracePeriodSeconds leaves for unloading after the drain


def kubectl() -> str:
    """kubectl's path. CI installs it (scripts/install.sh), so there its absence fails the test."""
    path = shutil.which("kubectl")
    if path is None:
        message = "kubectl is not installed (scripts/install.sh installs Debian's kubernetes-client)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@functools.cache
def render(kustomization: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize deploy/<kustomization>`` writes."""
    done = subprocess.run([kubectl(), "kustomize", str(DEPLOY / kustomization)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with unknown fields rejected wherever it lists an object's fields, as the API
    server's strict field validation (kubectl's default) rejects them."""
    result = dict(schema)
    if "properties" in schema:
        result["properties"] = {name: closed(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            result["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            result[key] = closed(schema[key])
    return result


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """{(apiVersion, kind): validator} for the CRD schemas vendored in deploy/schemas/."""
    validators = {}
    for path in sorted((DEPLOY / "schemas").glob("*.json")):
        vendored = json.loads(path.read_text())
        validators[vendored["apiVersion"], vendored["kind"]] = jsonschema.Draft7Validator(
            closed(vendored["openAPIV3Schema"]))
    return validators


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """What is wrong with ``obj``, for Kubernetes or for the CRD that defines its kind."""
    where = f"{obj['kind']} {obj['metadata'].get('name')}"
    validator = crd_validators().get((obj["apiVersion"], obj["kind"]))
    if validator is not None:
        return [f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{where}: {'.'.join(map(str, error.absolute_path))}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"{where}: {error.message} (vendor its CRD schema in deploy/schemas/)"]
    return []


def server_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "triton-serve")


def server_options(container: dict[str, Any], objects: list[dict[str, Any]]) -> ServerOptions:
    """The options ``triton-serve`` starts with from this container's arguments, after Kubernetes
    expands their $(VAR) references from the container's environment."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({item["name"]: item["value"] for item in container.get("env", []) if "value" in item})
    args = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in container["args"]]
    assert not [arg for arg in args if "$(" in arg], f"undefined variables in {args}"
    return options_from_args(build_parser().parse_args(args))


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, rest), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def build_args_in_docs(name: str) -> list[str]:
    """Every value the user docs give build argument ``name`` (``--build-arg NAME="..."``)."""
    pattern = rf"--build-arg {name}=(\"[^\"]*\"|'[^']*'|\S+)"
    return [shlex.split(value)[0] for doc in USER_DOCS for value in re.findall(pattern, doc.read_text())]


def extras_of(pyproject: Path) -> set[str]:
    return set(tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {}))


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_kustomization_renders_objects_that_validate(kustomization: str) -> None:
    objects = render(kustomization)
    assert objects
    errors = [error for obj in objects for error in schema_errors(obj)]
    assert not errors, "\n".join(errors)


def test_schema_check_rejects_an_unknown_field_and_a_wrong_type() -> None:
    monitor = find(render("kubernetes/base"), "ServiceMonitor")
    assert not schema_errors(monitor)
    assert schema_errors({**monitor, "spec": {**monitor["spec"], "endpoint": []}})
    deployment = find(render("kubernetes/base"), "Deployment")
    assert schema_errors({**deployment, "spec": {**deployment["spec"], "replicas": "two"}})


@pytest.mark.parametrize("kustomization", KUBERNETES)
def test_deployment_agrees_with_the_server_it_runs(kustomization: str) -> None:
    objects = render(kustomization)
    container = server_container(objects)
    options = server_options(container, objects)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": options.http_port, "grpc": options.grpc_port, "metrics": options.metrics_port}
    for probe, path in (("startupProbe", "/v2/health/live"), ("livenessProbe", "/v2/health/live"),
                        ("readinessProbe", "/v2/health/ready")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    defaults = ServerOptions()
    service = find(objects, "Service")
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("http", defaults.http_port, "http"), ("grpc", defaults.grpc_port, "grpc"),
        ("metrics", defaults.metrics_port, "metrics")}
    pod = find(objects, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    monitor = find(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("metrics", "/metrics")]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= int(pre_stop[1]) + options.exit_timeout_secs + DRAIN_MARGIN_S
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("frontend_processes", FRONTEND_MODES)
def test_probe_and_scrape_paths_answer_on_a_running_server(add_model: Callable[..., Path],
                                                           toy_server: Callable[..., Any]) -> None:
    add_model("add_sub", ADD_SUB)
    server = toy_server()
    objects = render("kubernetes/base")
    container = server_container(objects)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        response = httpx.get(f"http://{server.http_url}{container[probe]['httpGet']['path']}", timeout=10)
        assert response.status_code == 200, probe
    path = find(objects, "ServiceMonitor")["spec"]["endpoints"][0]["path"]
    response = httpx.get(f"http://127.0.0.1:{server.options.metrics_port}{path}", timeout=10)
    assert response.status_code == 200 and "# TYPE nv_inference_count counter" in response.text


def test_autoscaler_metric_is_the_adapter_rule_over_an_exported_metric(add_model: Callable[..., Path],
                                                                      toy_server: Callable[..., Any]) -> None:
    objects = render("kubernetes/overlays/autoscaling")
    autoscaler = find(objects, "HorizontalPodAutoscaler")
    target = autoscaler["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", find(objects, "Deployment")["metadata"]["name"])
    rules = yaml.safe_load((DEPLOY / "kubernetes/overlays/autoscaling/prometheus-adapter-values.yaml").read_text())
    served = {}
    for rule in rules["rules"]["custom"]:
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"])[0]  # type: ignore[index]
        assert re.search(rule["name"]["matches"], series), rule
        served[rule["name"].get("as", series)] = series
    wanted = [m["pods"]["metric"]["name"] for m in autoscaler["spec"]["metrics"] if m["type"] == "Pods"]
    assert wanted and set(wanted) <= set(served), f"no prometheus-adapter rule serves {set(wanted) - set(served)}"
    add_model("add_sub", ADD_SUB)
    scrape = httpx.get(toy_server().metrics_url, timeout=10).text
    exported = set(re.findall(r"^# TYPE (\S+) ", scrape, re.MULTILINE))
    assert {served[name] for name in wanted} <= exported


def test_kserve_runtime_serves_v2_over_http_and_grpc_for_every_format() -> None:
    runtime = find(render("kserve"), "ClusterServingRuntime")
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert formats == set(KSERVE_FORMATS)
    for plugin in filter(None, KSERVE_FORMATS.values()):
        assert (ROOT / "plugins" / plugin / "pyproject.toml").is_file(), plugin
    container = next(c for c in spec["containers"] if c["name"] == "kserve-container")
    options = server_options(container, [])
    # KServe's conventions: the storage initializer's mount, HTTP on 8080, gRPC on 9000.
    assert (options.model_repositories, options.http_port, options.grpc_port) == (["/mnt/models"], 8080, 9000)
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(options.metrics_port)
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": options.http_port}

    sample = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    assert not schema_errors(sample)
    model = sample["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats and model["protocolVersion"] in spec["protocolVersions"]


def test_dockerfile_builds_the_server_for_a_non_root_user() -> None:
    instructions = dockerfile()
    assert {rest.split()[0] for op, rest in instructions if op == "FROM"} == {"python:3.11-slim"}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert [json.loads(rest) for op, rest in instructions if op == "ENTRYPOINT"] == [list(scripts)]
    defaults = ServerOptions()
    exposed = [rest.split() for op, rest in instructions if op == "EXPOSE"]
    assert exposed == [[str(defaults.http_port), str(defaults.grpc_port), str(defaults.metrics_port)]]

    user = [rest for op, rest in instructions if op == "USER"][-1]
    uid = int(user.split(":")[0])  # numeric, so that the kubelet can check runAsNonRoot
    assert uid != 0
    kubernetes = find(render("kubernetes/base"), "Deployment")["spec"]["template"]["spec"]["securityContext"]
    kserve = find(render("kserve"), "ClusterServingRuntime")["spec"]["containers"][0]["securityContext"]
    assert kubernetes["runAsUser"] == kserve["runAsUser"] == uid

    # The image has no CMD, so it serves the example repository of the triton-serve package in its venv;
    # the Deployment's default names that same folder.
    assert [rest for op, rest in instructions if op == "CMD"] == []
    [venv] = [rest.split()[-1] for op, rest in instructions if op == "RUN" and " -m venv " in rest]
    python = [rest.split()[0] for op, rest in instructions if op == "FROM"][-1].split(":")[1].split("-")[0]
    package = f"{venv}/lib/python{python}/site-packages/triton_serve"
    examples = find(render("kubernetes/base"), "ConfigMap")["data"]["MODEL_REPOSITORY"]
    assert examples == f"{package}/{EXAMPLE_REPOSITORY.relative_to(Path(triton_serve.__file__).parent)}"


def test_plugins_and_extras_the_build_arguments_name_exist() -> None:
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for op, rest in dockerfile() if op == "ARG" and "=" in rest}
    plugin_lists = [shlex.split(args["PLUGINS"])[0], *build_args_in_docs("PLUGINS")]
    assert len(plugin_lists) > 1, "the docs show no --build-arg PLUGINS=..."
    for plugins in plugin_lists:
        for plugin in plugins.split():
            directory, _, extras = plugin.partition("[")
            pyproject = ROOT / "plugins" / directory / "pyproject.toml"
            assert pyproject.is_file(), f"PLUGINS names '{plugin}': {pyproject} does not exist"
            assert set(filter(None, extras.rstrip("]").split(","))) <= extras_of(pyproject), plugin
    for extras in build_args_in_docs("CORE_EXTRAS"):
        assert set(extras.split(",")) <= extras_of(ROOT / "pyproject.toml"), extras
