"""Backend options and model parameters declared as dataclasses, parsed by the core with one vocabulary
and one error format: --backend-config (global and per backend), config parameters, `triton-serve plugins`."""
from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import _backend_config, build_parser, main, options_from_args
from triton_serve._engine.options import declared_options, describe_options
from triton_serve.plugin import (AutoCompleteOptions, BackendRegistry, ModelConfig, ModelSpec, NoOptions,
                                 ServerError, Status, hookimpl, model_parameters, option, parse_bool, parse_options)
from triton_serve.testing import TOY_BACKENDS, PluginHost

from .conftest import write_model


def _at_least_one_mib(size: int) -> None:
    if size < 1 << 20:
        raise ValueError("shm-default-byte-size can't be smaller than 4 MiBs")


@dataclass(frozen=True)
class EveryType:
    flag: bool = option(False, doc="a bool")
    count: int = option(3, minimum=0, doc="an int >= 0")
    ratio: float = option(0.5, doc="a float")
    label: str = option("x", doc="a str")
    hint: Literal["LATENCY", "THROUGHPUT"] = option("LATENCY", key="PERFORMANCE_HINT", doc="a choice of words")
    mode: Literal[0, 1] = option(0, key="execution_mode", doc="a choice of numbers")
    maybe: bool | None = option(None, doc="unset unless given")
    arena: int = option(1 << 20, key="shm-default-byte-size", check=_at_least_one_mib, doc="Triton's own check")


def parse(values: dict[str, str]) -> EveryType:
    return parse_options(EveryType, values, backend="demo", source="--backend-config option")


def test_every_type_parses() -> None:
    parsed = parse({"flag": "on", "count": "7", "ratio": "2.5", "label": "a,b=c", "PERFORMANCE_HINT": "throughput",
                    "execution_mode": "1", "maybe": "0", "shm-default-byte-size": "2097152"})
    assert parsed == EveryType(flag=True, count=7, ratio=2.5, label="a,b=c", hint="THROUGHPUT", mode=1,
                               maybe=False, arena=2 << 20)


def test_defaults_and_unknown_keys() -> None:
    assert parse({"not-declared": "whatever", "default-max-batch-size": "x"}) == EveryType()
    assert EveryType().maybe is None


@pytest.mark.parametrize(("word", "value"), [("true", True), ("TRUE", True), ("On", True), ("1", True),
                                             ("false", False), ("False", False), ("OFF", False), ("0", False)])
def test_tritons_boolean_words(word: str, value: bool) -> None:
    assert parse_bool(word) is value
    assert parse({"flag": word}).flag is value


@pytest.mark.parametrize("word", ["yes", "no", "", " true", "2", "enabled"])
def test_other_words_are_not_booleans(word: str) -> None:  # Triton's ParseBoolValue accepts only the six words
    with pytest.raises(ServerError) as caught:
        parse({"flag": word})
    assert caught.value.message == (f"backend 'demo': --backend-config option 'flag' has invalid value '{word}': "
                                    "expected true/false, on/off or 1/0")


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("count", "lots", "expected an integer >= 0"),
    ("count", "1.5", "expected an integer >= 0"),
    ("count", "-1", "expected an integer >= 0"),
    ("ratio", "half", "expected a number"),
    ("ratio", "nan", "expected a number"),
    ("PERFORMANCE_HINT", "FASTEST", "expected one of LATENCY, THROUGHPUT"),
    ("execution_mode", "2", "expected one of 0, 1"),
    ("execution_mode", "one", "expected one of 0, 1"),
    ("shm-default-byte-size", "4096", "shm-default-byte-size can't be smaller than 4 MiBs"),
])
def test_bad_values_name_backend_option_and_value(key: str, value: str, reason: str) -> None:
    with pytest.raises(ServerError) as caught:
        parse({key: value})
    assert caught.value.status == Status.INVALID_ARG
    assert caught.value.message == (f"backend 'demo': --backend-config option '{key}' has invalid value '{value}': "
                                    f"{reason}")


@dataclass(frozen=True)
class WithRequired:
    threads: int = option(0, minimum=0, doc="a default comes first")
    factor: float = option(doc="no default: required")


def test_an_option_without_a_default_is_required() -> None:
    parsed = parse_options(WithRequired, {"factor": "2.5"}, backend="demo", source="model 'm' parameter")
    assert parsed == WithRequired(factor=2.5)
    with pytest.raises(ServerError) as caught:
        parse_options(WithRequired, {"threads": "2"}, backend="demo", source="model 'm' parameter")
    assert caught.value.message == "backend 'demo': model 'm' parameter 'factor' is required"
    assert caught.value.status is Status.INVALID_ARG
    assert [item.key for item in declared_options(WithRequired)] == ["threads", "factor"]


def test_declarations_are_checked_when_a_backend_registers() -> None:
    @dataclass(frozen=True)
    class Undocumented:
        plain: int = 3

    @dataclass(frozen=True)
    class Unsupported:
        sizes: list = option(None, doc="a list")  # type: ignore[type-arg]

    @dataclass(frozen=True)
    class Unresolved:
        size: Undefined = option(0, doc="a type its module lacks")  # type: ignore[name-defined] # noqa: F821

    for options, message in ((Undocumented, "Undocumented.plain is not declared with option"),
                             (Unsupported, "an option is a bool, int, float, str or Literal"),
                             (Unresolved, "Unresolved: cannot read the type of an option")):
        backend = type("Broken", (TOY_BACKENDS[0],), {"name": "broken", "platforms": (), "Options": options})
        with pytest.raises(TypeError, match=message):
            BackendRegistry().add(backend)


@dataclass(frozen=True)
class DemoOptions(AutoCompleteOptions):
    verbose: bool = option(False, doc="log each request")


@dataclass(frozen=True)
class DemoParameters:
    verbose: bool = option(False, doc="log each request of this model")
    threads: int = option(0, key="intra_op_thread_count", minimum=0, doc="threads of one model")


class DemoBackend(TOY_BACKENDS[0]):  # type: ignore[misc,valid-type]
    """toy_identity with declared options and parameters."""

    name = "demo"
    platforms = ()
    Options = DemoOptions
    Parameters = DemoParameters


class RequiringBackend(TOY_BACKENDS[0]):  # type: ignore[misc,valid-type]
    """toy_identity whose models must set a parameter."""

    name = "requiring"
    platforms = ()
    Parameters = WithRequired


def registry_with(*flags: str) -> BackendRegistry:
    registry = BackendRegistry()
    registry.add(DemoBackend)
    registry.add(TOY_BACKENDS[1])
    registry.options = options_from_args(build_parser().parse_args(list(flags))).backend_config
    return registry


def test_global_and_per_backend_settings() -> None:
    registry = registry_with("--backend-config=default-max-batch-size=8", "--backend-config=verbose=true")
    assert registry.instance("demo").options == DemoOptions(default_max_batch_size=8, verbose=True)
    assert registry.instance("toy_add_sub").options == NoOptions()  # it declares none: global settings are ignored
    registry = registry_with("--backend-config=demo,default-max-batch-size=2",
                             "--backend-config=default-max-batch-size=8")
    assert registry.instance("demo").options.default_max_batch_size == 2  # the backend's own setting wins
    assert registry_with().instance("demo").options == DemoOptions()  # Triton's default 4


def test_a_bad_global_setting_names_the_backend_that_reads_it() -> None:
    registry = registry_with("--backend-config=default-max-batch-size=many")
    assert registry.instance("toy_add_sub") is not None
    with pytest.raises(ServerError, match="backend 'demo': --backend-config option 'default-max-batch-size' has "
                                          "invalid value 'many': expected an integer >= 0"):
        registry.instance("demo")


@pytest.mark.parametrize(("flag", "parsed"), [
    ("python,shm-region-prefix-name=a,b=c", ("python", {"shm-region-prefix-name": "a,b=c"})),
    ("default-max-batch-size=4", ("", {"default-max-batch-size": "4"})),
])
def test_backend_config_flag_is_read_as_triton_reads_it(flag: str, parsed: tuple[str, dict[str, str]]) -> None:
    assert _backend_config(flag) == parsed


@pytest.mark.parametrize(("flag", "message"), [
    (",default-max-batch-size=3", "No backend specified. --backend-config option format is <backend name>,"
                                  "<setting>=<value> or <setting>=<value>. Got ,default-max-batch-size=3"),
    ("default-max-batch-size=", "--backend-config option format is '<backend name>,<setting>=<value>'. "
                                "Got default-max-batch-size="),
    ("default-max-batch-size", "--backend-config option format is '<backend name>,<setting>=<value>'. "
                               "Got default-max-batch-size"),
    ("python,=3", "--backend-config option format is '<backend name>,<setting>=<value>'. Got python,=3"),
])
def test_malformed_backend_config_flags(flag: str, message: str) -> None:  # Triton's L0_backend_config cases
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        _backend_config(flag)
    assert str(caught.value) == message


def spec_with(parameters: str) -> ModelSpec:
    config = text_format.Parse(parameters, ModelConfig())
    return ModelSpec("m", 1, config, Path("m"), Path("m/1"))


def test_config_parameters_parse_into_the_parameters_dataclass() -> None:
    backend = DemoBackend(DemoOptions(verbose=True))
    assert model_parameters(backend, spec_with("")) == DemoParameters(verbose=True)  # the server-wide value
    spec = spec_with('parameters { key: "verbose" value { string_value: "off" } } '
                     'parameters { key: "intra_op_thread_count" value { string_value: "2" } } '
                     'parameters { key: "unrelated" value { string_value: "?" } }')
    assert model_parameters(backend, spec) == DemoParameters(verbose=False, threads=2)
    with pytest.raises(ServerError) as caught:
        model_parameters(backend, spec_with('parameters { key: "intra_op_thread_count" value { string_value: "-2" } }'))
    assert caught.value.message == ("backend 'demo': model 'm' parameter 'intra_op_thread_count' has invalid value "
                                    "'-2': expected an integer >= 0")


def test_backends_take_typed_options() -> None:
    with pytest.raises(TypeError, match="backend 'demo' takes its options as a DemoOptions, not dict"):
        DemoBackend({"verbose": "true"})


def test_plugins_command_shows_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert describe_options(DemoBackend) == [
        "--backend-config=demo,<key>=<value>:",
        "    default-max-batch-size: int >= 0, default 4",
        "        the max_batch_size auto-complete gives a model that can batch (Triton's default 4)",
        "    verbose: bool, default false",
        "        log each request",
        "model config parameters { key: ... value { string_value: ... } }:",
        "    verbose: bool, default false",
        "        log each request of this model",
        "    intra_op_thread_count: int >= 0, default 0",
        "        threads of one model"]
    assert describe_options(RequiringBackend)[-2:] == ["    factor: float, required", "        no default: required"]
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    onnx = out[out.index("backend onnxruntime:"):]
    assert ("    --backend-config=onnxruntime,<key>=<value>:\n"
            "        default-max-batch-size: int >= 0, default 4") in onnx


def test_plugin_readmes_list_every_option() -> None:
    host = PluginHost()
    for name in host.backends.names():
        backend = host.backends.get(name)
        assert backend is not None
        readme = next(folder / "README.md" for folder in Path(inspect.getfile(backend)).parents
                      if (folder / "README.md").is_file())
        for declaration in (backend.Options, backend.Parameters):
            missing = [item.key for item in declared_options(declaration) if item.key not in readme.read_text()]
            assert not missing, f"{readme} does not document backend {name}'s {missing}"


class DemoPlugin:
    @hookimpl
    def tserve_register_backends(self, registry: BackendRegistry) -> None:
        registry.add(DemoBackend)
        registry.add(RequiringBackend)


IDENTITY = ('backend: "demo"\nmax_batch_size: 0\ninput [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]\n')


def test_bad_values_fail_model_loads_through_tritonclient(tmp_path: Path, tserve: Any) -> None:
    write_model(tmp_path, "bad_parameter",
                IDENTITY + 'parameters { key: "intra_op_thread_count" value { string_value: "many" } }')
    write_model(tmp_path, "good", IDENTITY)
    server = tserve(tmp_path, extra_plugins=[("demo", DemoPlugin())], model_control_mode="explicit")
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="backend 'demo': model 'bad_parameter' parameter "
                                                       "'intra_op_thread_count' has invalid value 'many': "
                                                       "expected an integer >= 0"):
        client.load_model("bad_parameter")
    client.load_model("good")
    assert client.is_model_ready("good")

    server = tserve(tmp_path, extra_plugins=[("demo", DemoPlugin())], model_control_mode="explicit",
                    backend_config={"demo": {"verbose": "maybe"}})
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="backend 'demo': --backend-config option 'verbose' has "
                                                       "invalid value 'maybe'"):
        client.load_model("good")


def test_a_missing_required_parameter_fails_the_load_through_tritonclient(tmp_path: Path, tserve: Any) -> None:
    requiring = IDENTITY.replace('backend: "demo"', 'backend: "requiring"')
    write_model(tmp_path, "unset", requiring)
    write_model(tmp_path, "set", requiring + 'parameters { key: "factor" value { string_value: "2" } }')
    server = tserve(tmp_path, extra_plugins=[("demo", DemoPlugin())], model_control_mode="explicit")
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException,
                       match="backend 'requiring': model 'unset' parameter 'factor' is required"):
        client.load_model("unset")
    client.load_model("set")
    assert client.is_model_ready("set") and not client.is_model_ready("unset")
