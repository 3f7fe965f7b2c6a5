"""Fixtures for the fil backend tests: small tree models trained at test time, and repositories of them."""
from __future__ import annotations

import importlib.metadata
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm
import numpy as np
import pytest
import treelite
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import xgboost
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

from triton_serve.plugin import ServerOptions
from triton_serve.testing import RunningServer, free_port

FEATURES = 5


@dataclass(frozen=True)
class TrainedModels:
    """One small model of each kind, trained on the same 5-feature data."""

    xgb_binary: xgboost.Booster
    xgb_multiclass: xgboost.Booster
    xgb_regressor: xgboost.Booster
    lgb_multiclass: lightgbm.Booster
    lgb_regressor: lightgbm.Booster
    rf_classifier: RandomForestClassifier
    rf_regressor: RandomForestRegressor


def _train() -> TrainedModels:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, FEATURES)).astype(np.float32)
    binary = (x[:, 0] + 0.5 * x[:, 1] + rng.normal(scale=0.7, size=300) > 0).astype(np.int32)
    three = np.digitize(x[:, 0] - x[:, 2], [-0.5, 0.5]).astype(np.int32)
    value = (2.0 * x[:, 0] - x[:, 3] + 0.1 * rng.normal(size=300)).astype(np.float32)

    def xgb(params: dict[str, Any], label: np.ndarray) -> xgboost.Booster:
        return xgboost.train({"max_depth": 3, "eta": 0.3, "nthread": 1, **params},
                             xgboost.DMatrix(x, label=label), num_boost_round=20)

    def lgb(params: dict[str, Any], label: np.ndarray) -> lightgbm.Booster:
        return lightgbm.train({"num_leaves": 7, "min_data_in_leaf": 5, "verbose": -1, "num_threads": 1, **params},
                              lightgbm.Dataset(x, label=label), num_boost_round=20)

    return TrainedModels(
        xgb_binary=xgb({"objective": "binary:logistic"}, binary),
        xgb_multiclass=xgb({"objective": "multi:softprob", "num_class": 3}, three),
        xgb_regressor=xgb({"objective": "reg:squarederror"}, value),
        lgb_multiclass=lgb({"objective": "multiclass", "num_class": 3}, three),
        lgb_regressor=lgb({"objective": "regression"}, value),
        rf_classifier=RandomForestClassifier(n_estimators=12, max_depth=4, random_state=0, n_jobs=1).fit(x, binary),
        rf_regressor=RandomForestRegressor(n_estimators=12, max_depth=4, random_state=0, n_jobs=1).fit(x, value),
    )


class FilTestKit:
    """Helpers the tests reach through the ``kit`` fixture (test modules import nothing from here)."""

    FEATURES = FEATURES

    @staticmethod
    def rows(count: int, seed: int = 11) -> np.ndarray:
        return np.random.default_rng(seed).normal(size=(count, FEATURES)).astype(np.float32)

    @staticmethod
    def config(model_type: str | None, output_dims: list[int], *, input_dims: list[int] | None = None,
               max_batch_size: int = 64, extra: str = "", **parameters: str) -> str:
        """A Triton FIL config.pbtxt body (after ``backend: "fil"``), as FIL users write them."""
        if model_type is not None:
            parameters = {"model_type": model_type, **parameters}
        params = "\n".join(f'  {{ key: "{key}" value: {{ string_value: "{value}" }} }},'
                           for key, value in parameters.items()).rstrip(",")
        return textwrap.dedent(f"""\
            max_batch_size: {max_batch_size}
            input [{{ name: "input__0" data_type: TYPE_FP32 dims: {input_dims or [FEATURES]} }}]
            output [{{ name: "output__0" data_type: TYPE_FP32 dims: {output_dims} }}]
            """) + f"parameters [\n{params}\n]\n" + extra

    @staticmethod
    def write_model(repo: Path, name: str, config: str | None, files: dict[str, Callable[[Path], None]]) -> Path:
        """``<repo>/<name>/config.pbtxt`` (``backend: "fil"`` plus ``config``) and ``1/<file>`` per saver."""
        version_dir = repo / name / "1"
        version_dir.mkdir(parents=True)
        if config is not None:
            (repo / name / "config.pbtxt").write_text(f'backend: "fil"\n{config}')
        for filename, save in files.items():
            save(version_dir / filename)
        return repo / name

    @staticmethod
    def save_xgboost(booster: xgboost.Booster, fmt: str) -> Callable[[Path], None]:
        """Save as "json" or "ubj" whatever the target file is named (XGBoost picks the format by suffix)."""
        def save(path: Path) -> None:
            staged = path.with_name(f"staged.{fmt}")
            booster.save_model(str(staged))
            staged.rename(path)
        return save

    @staticmethod
    def save_lightgbm(booster: lightgbm.Booster) -> Callable[[Path], None]:
        return lambda path: booster.save_model(str(path))

    @staticmethod
    def save_checkpoint(estimator: Any) -> Callable[[Path], None]:
        return lambda path: treelite.sklearn.import_model(estimator).serialize(str(path))

    @staticmethod
    def save_text(text: str) -> Callable[[Path], None]:
        return lambda path: path.write_text(text)

    @staticmethod
    def infer(server: RunningServer, protocol: str, model: str, rows: np.ndarray,
              datatype: str = "FP32") -> np.ndarray:
        """``output__0`` for ``rows`` through the real tritonclient of ``protocol`` ("http" or "grpc")."""
        module = httpclient if protocol == "http" else grpcclient
        url = server.http_url if protocol == "http" else server.grpc_url
        client = module.InferenceServerClient(url)
        try:
            tensor = module.InferInput("input__0", list(rows.shape), datatype)
            tensor.set_data_from_numpy(rows)
            return client.infer(model, [tensor]).as_numpy("output__0")
        finally:
            client.close()

    @staticmethod
    def start_server(repo: Path, *packages: str, **options: Any) -> RunningServer:
        """A server loading only the entry points of ``packages`` (default: this plugin), so a broken
        plugin installed beside it cannot fail these tests. Stop it with ``.stop()``."""
        wanted = packages or ("triton_serve_fil",)
        names = [ep.name for ep in importlib.metadata.entry_points(group="triton_serve")
                 if ep.value.split(".")[0] in wanted]
        for key in ("http_port", "grpc_port", "metrics_port"):
            options.setdefault(key, free_port())
        for key in ("http_address", "grpc_address", "metrics_address"):
            options.setdefault(key, "127.0.0.1")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRITON_SERVE_PLUGINS", ",".join(names))
            return RunningServer(ServerOptions(model_repositories=[str(repo)], **options))


@pytest.fixture(scope="session")
def kit() -> type[FilTestKit]:
    return FilTestKit


@pytest.fixture(scope="session")
def trained() -> TrainedModels:
    return _train()


@pytest.fixture
def server_for() -> Iterator[Callable[..., RunningServer]]:
    """``server_for(repo, *packages, **options)``: a server that stops at the end of the test."""
    started: list[RunningServer] = []

    def start(repo: Path, *packages: str, **options: Any) -> RunningServer:
        started.append(FilTestKit.start_server(repo, *packages, **options))
        return started[-1]

    yield start
    for server in started:
        server.stop()
