"""Every format and output mode, served through tritonclient HTTP and gRPC, matches the framework's own predictions."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import xgboost

PROTOCOLS = ["http", "grpc"]
# Triton FIL's performance parameters, and cpu_nthread: accepted; predictions stay the same
TUNING_KNOBS = {"cpu_nthread": "1", "algo": "ALGO_AUTO", "storage_type": "AUTO", "threads_per_tree": "4",
                "blocks_per_sm": "2", "use_experimental_optimizations": "true", "transfer_threshold": "2",
                "layout": "depth_first", "chunk_size": "4"}


def _xgb(booster: xgboost.Booster, rows: np.ndarray) -> np.ndarray:
    return booster.predict(xgboost.DMatrix(rows))


# name -> (how to write it, what the framework itself predicts for rows, as output__0)
def _models(kit: Any, trained: Any) -> dict[str, tuple[Callable[[Path], None], Callable[[np.ndarray], np.ndarray]]]:
    binary, multi, reg = trained.xgb_binary, trained.xgb_multiclass, trained.xgb_regressor

    def model(name: str, config: str, files: dict[str, Callable[[Path], None]]) -> Callable[[Path], None]:
        return lambda repo: kit.write_model(repo, name, config, files)

    def column(values: np.ndarray) -> np.ndarray:  # dims [1], squeezed to [batch] as Triton's FIL backend does
        return values.reshape(-1).astype(np.float32)

    return {
        "xgb_binary_class": (
            model("xgb_binary_class", kit.config("xgboost_json", [1], output_class="true"),
                  {"xgboost.json": kit.save_xgboost(binary, "json")}),
            lambda rows: column(_xgb(binary, rows) > 0.5)),
        "xgb_binary_threshold": (
            model("xgb_binary_threshold", kit.config("xgboost_json", [1], output_class="true", threshold="0.3"),
                  {"xgboost.json": kit.save_xgboost(binary, "json")}),
            lambda rows: column(_xgb(binary, rows) > 0.3)),
        "xgb_binary_proba": (
            model("xgb_binary_proba", kit.config("xgboost_ubj", [2], output_class="true", predict_proba="true"),
                  {"xgboost.ubj": kit.save_xgboost(binary, "ubj")}),
            lambda rows: np.stack([1 - _xgb(binary, rows), _xgb(binary, rows)], axis=1)),
        "xgb_binary_proba_one_column": (
            model("xgb_binary_proba_one_column",
                  kit.config("xgboost_ubj", [1], is_classifier="true", predict_proba="true"),
                  {"xgboost.ubj": kit.save_xgboost(binary, "ubj")}),
            lambda rows: column(_xgb(binary, rows))),
        "xgb_binary_score": (
            model("xgb_binary_score", kit.config("xgboost_ubj", [1], output_class="false"),
                  {"xgboost.ubj": kit.save_xgboost(binary, "ubj")}),
            lambda rows: column(_xgb(binary, rows))),
        "xgb_multiclass_proba": (
            model("xgb_multiclass_proba",
                  kit.config("xgboost_json", [3], output_class="true", predict_proba="true", **TUNING_KNOBS),
                  {"xgboost.json": kit.save_xgboost(multi, "json")}),
            lambda rows: _xgb(multi, rows)),
        "xgb_multiclass_class": (
            model("xgb_multiclass_class", kit.config("xgboost_ubj", [1], output_class="true"),
                  {"xgboost.ubj": kit.save_xgboost(multi, "ubj")}),
            lambda rows: column(np.argmax(_xgb(multi, rows), axis=1))),
        "xgb_regressor": (
            model("xgb_regressor",
                  kit.config("xgboost_json", [1], output_class="false", xgboost_allow_unknown_field="true"),
                  {"xgboost.json": kit.save_xgboost(reg, "json")}),
            lambda rows: column(_xgb(reg, rows))),
        "xgb_custom_filename": (
            model("xgb_custom_filename",
                  kit.config("xgboost_ubj", [1], output_class="false", extra='default_model_filename: "trees.bin"\n'),
                  {"trees.bin": kit.save_xgboost(reg, "ubj")}),
            lambda rows: column(_xgb(reg, rows))),
        "lgb_multiclass_proba": (
            model("lgb_multiclass_proba", kit.config("lightgbm", [3], output_class="true", predict_proba="true"),
                  {"model.txt": kit.save_lightgbm(trained.lgb_multiclass)}),
            lambda rows: trained.lgb_multiclass.predict(rows)),
        "lgb_regressor": (
            model("lgb_regressor", kit.config("lightgbm", [1], output_class="false"),
                  {"model.txt": kit.save_lightgbm(trained.lgb_regressor)}),
            lambda rows: column(trained.lgb_regressor.predict(rows))),
        "rf_classifier_proba": (
            model("rf_classifier_proba",
                  kit.config("treelite_checkpoint", [2], output_class="true", predict_proba="true"),
                  {"checkpoint.tl": kit.save_checkpoint(trained.rf_classifier)}),
            lambda rows: trained.rf_classifier.predict_proba(rows)),
        "rf_classifier_class": (
            model("rf_classifier_class", kit.config("treelite_checkpoint", [1], output_class="true"),
                  {"checkpoint.tl": kit.save_checkpoint(trained.rf_classifier)}),
            lambda rows: column(trained.rf_classifier.predict(rows))),
        "rf_regressor": (
            model("rf_regressor", kit.config("treelite_checkpoint", [1], output_class="false"),
                  {"checkpoint.tl": kit.save_checkpoint(trained.rf_regressor)}),
            lambda rows: column(trained.rf_regressor.predict(rows))),
        "autocompleted": (
            model("autocompleted",
                  'parameters [{ key: "model_type" value: { string_value: "xgboost_json" } },\n'
                  '            { key: "predict_proba" value: { string_value: "true" } }]\n',
                  {"xgboost.json": kit.save_xgboost(binary, "json")}),
            lambda rows: np.stack([1 - _xgb(binary, rows), _xgb(binary, rows)], axis=1)),
        "variable_features": (
            model("variable_features", kit.config("xgboost_json", [1], input_dims=[-1], output_class="false"),
                  {"xgboost.json": kit.save_xgboost(reg, "json")}),
            lambda rows: column(_xgb(reg, rows))),
    }


# name -> (config, files, words its load error must contain)
def _broken(kit: Any, trained: Any) -> dict[str, tuple[str, dict[str, Callable[[Path], None]], str]]:
    json_binary = {"xgboost.json": kit.save_xgboost(trained.xgb_binary, "json")}
    return {
        "bad_model_type": (kit.config("catboost", [1]), json_binary,
                           ("backend 'fil': model 'bad_model_type' parameter 'model_type' has invalid value "
                            "'catboost': expected one of xgboost, xgboost_json, xgboost_ubj, lightgbm, "
                            "treelite_checkpoint")),
        "default_model_type": (kit.config(None, [1]), json_binary,
                               "model file '1/xgboost.model' does not exist (model_type 'xgboost')"),
        "missing_file": (kit.config("xgboost_ubj", [1]), {},
                         "model file '1/xgboost.ubj' does not exist (model_type 'xgboost_ubj')"),
        "corrupt_file": (kit.config("xgboost_json", [1]), {"xgboost.json": kit.save_text('{"trees": 1}')},
                         ("cannot read '1/xgboost.json' as model_type 'xgboost_json': "
                          "Provided JSON could not be parsed as XGBoost model")),
        "ubj_as_legacy_binary": (kit.config("xgboost", [1]),
                                 {"xgboost.model": kit.save_xgboost(trained.xgb_binary, "ubj")},
                                 ("XGBoost 2.1 and later save UBJSON even to a '.model' name: try model_type "
                                  "'xgboost_ubj'")),
        "wrong_features": (kit.config("xgboost_json", [1], input_dims=[7]), json_binary,
                           "input 'input__0' has dims [7], but the model reads 5 features: use dims [5]"),
        "wrong_output_dims": (kit.config("xgboost_json", [1], predict_proba="true",
                                         output_class="true").replace("dims: [1]", "dims: [3]"), json_binary,
                              ("output 'output__0' has dims [3], but this model writes [2] or [1] "
                               "(a binary classifier's probabilities, predict_proba true)")),
        "int_input": (kit.config("xgboost_json", [1]).replace("TYPE_FP32 dims: [5]", "TYPE_INT32 dims: [5]"),
                      json_binary, "input 'input__0' has data_type TYPE_INT32; FIL models use TYPE_FP32"),
        "bad_threshold": (kit.config("xgboost_json", [1], output_class="true", threshold="high"), json_binary,
                          "parameter 'threshold' has invalid value 'high': expected a number"),
        "bad_bool": (kit.config("xgboost_json", [1], predict_proba="yes"), json_binary,
                     "parameter 'predict_proba' has invalid value 'yes': expected true/false, on/off or 1/0"),
        "treeshap_output": (kit.config("xgboost_json", [1])
                            + 'output [{ name: "treeshap_output" data_type: TYPE_FP32 dims: [6] }]\n', json_binary,
                            "output(s) ['treeshap_output'] are not supported"),
    }


@pytest.fixture(scope="module")
def served(kit: Any, trained: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One server for the whole module: every good and broken model in one repository."""
    repo = tmp_path_factory.mktemp("fil_repo")
    models = _models(kit, trained)
    for write, _expected in models.values():
        write(repo)
    broken = _broken(kit, trained)
    for name, (config, files, _words) in broken.items():
        kit.write_model(repo, name, config, files)
    server = kit.start_server(repo)
    yield {"server": server, "expected": {name: predict for name, (_w, predict) in models.items()},
           "broken": {name: words for name, (_c, _f, words) in broken.items()}}
    server.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("name", [
    "xgb_binary_class", "xgb_binary_threshold", "xgb_binary_proba", "xgb_binary_proba_one_column",
    "xgb_binary_score", "xgb_multiclass_proba", "xgb_multiclass_class", "xgb_regressor", "xgb_custom_filename",
    "lgb_multiclass_proba", "lgb_regressor", "rf_classifier_proba", "rf_classifier_class", "rf_regressor",
    "autocompleted", "variable_features",
])
def test_outputs_match_the_framework(served: dict[str, Any], kit: Any, name: str, protocol: str) -> None:
    rows = kit.rows(4 if name == "autocompleted" else 17)  # the auto-completed max_batch_size is 4
    got = kit.infer(served["server"], protocol, name, rows)
    expected = np.asarray(served["expected"][name](rows), dtype=np.float32)
    assert got.dtype == np.float32
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_threshold_changes_the_decision(served: dict[str, Any], kit: Any) -> None:
    rows = kit.rows(64, seed=3)
    at_half = kit.infer(served["server"], "http", "xgb_binary_class", rows)
    at_0_3 = kit.infer(served["server"], "http", "xgb_binary_threshold", rows)
    assert set(np.unique(at_0_3)) <= {0.0, 1.0}
    assert (at_0_3 >= at_half).all() and (at_0_3 > at_half).any()


def test_auto_complete_fills_the_config_from_the_model(served: dict[str, Any]) -> None:
    client = httpclient.InferenceServerClient(served["server"].http_url)
    config = client.get_model_config("autocompleted")
    client.close()
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("input__0", "TYPE_FP32", [5])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("output__0", "TYPE_FP32", [2])]


@pytest.mark.parametrize("name", [
    "bad_model_type", "default_model_type", "missing_file", "corrupt_file", "ubj_as_legacy_binary",
    "wrong_features", "wrong_output_dims", "int_input", "bad_threshold", "bad_bool", "treeshap_output",
])
def test_broken_models_fail_to_load_with_the_reason(served: dict[str, Any], name: str) -> None:
    client = httpclient.InferenceServerClient(served["server"].http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    ready = client.is_model_ready(name)
    client.close()
    assert not ready
    assert index[name]["state"] == "UNAVAILABLE"
    assert name in index[name]["reason"]
    assert served["broken"][name] in index[name]["reason"]
