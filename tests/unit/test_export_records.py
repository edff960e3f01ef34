"""Export options and records: every bad option names itself and its fix; every record read
back from a store, a server or a request is checked before it names a blob."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from registry.errors import ManifestError, SettingsError
from registry.exports import common, records

GOOD: dict[str, Any] = {
    "format": "onnx", "key": "a" * 64, "digest": "sha256:" + "b" * 64, "size": 10,
    "max_abs_diff": 1e-6, "tolerance": 1e-4, "params": {}, "versions": {"torch": "2"},
    "created_at": "2026-11-23T00:00:00+00:00",
}


def request(**changes: Any) -> common.ExportRequest:
    options: dict[str, Any] = {"input_shapes": [(1, 3, 8, 8)], "example_inputs": None,
                               "dynamic_batch": False, "dynamic_axes": None, "opset": None,
                               "device": "cpu", "dtype": "auto", "tolerance": None}
    options.update(changes)
    fmt = options.pop("format", "onnx")
    return common.make_request(fmt, **options)


def test_the_key_depends_on_every_option_that_changes_the_artifact() -> None:
    base = request()
    assert base.key == request().key and len(base.key) == 64
    for change in ({"format": "pt2"}, {"dynamic_batch": True}, {"opset": 18},
                   {"input_shapes": [(2, 3, 8, 8)]}, {"dtype": "float16"},
                   {"dynamic_axes": [[2]]}):
        assert request(**change).key != base.key, change
    # The tolerance decides acceptance only, not what is exported.
    assert request(tolerance=0.5).key == base.key


def test_example_inputs_give_shapes_and_dtypes() -> None:
    ids = torch.randint(0, 10, (2, 5))
    made = request(input_shapes=None, example_inputs=(ids,), dynamic_axes=[[1]])
    assert made.inputs[0].to_json() == {"shape": [2, 5], "dtype": "int64", "dynamic": [1]}
    (tensor,) = common.make_inputs(made, torch.float32, torch.device("cpu"), grow=2)
    assert tensor.shape == (2, 7) and tensor.dtype == torch.int64 and int(tensor.max()) <= 9


def test_a_dynamic_dim_of_size_one_is_traced_at_two() -> None:
    made = request(dynamic_batch=True)
    (traced,) = common.trace_inputs(made, torch.float32, torch.device("cpu"))
    assert traced.shape == (2, 3, 8, 8)
    shapes = [b[0].shape for b in common.check_inputs(made, torch.float32, torch.device("cpu"))]
    assert shapes == [(1, 3, 8, 8), (3, 3, 8, 8)]


@pytest.mark.parametrize(("changes", "message"), [
    ({"format": "tflite"}, "invalid export format 'tflite'"),
    ({"input_shapes": "1x3"}, "invalid input_shapes '1x3'"),
    ({"input_shapes": [(1, -3)]}, r"invalid input shape \(1, -3\)"),
    ({"dynamic_axes": [[9]]}, r"invalid dynamic_axes\[0\] \[9\]"),
    ({"opset": 3}, "invalid opset 3"),
    ({"tolerance": -1.0}, "invalid tolerance -1.0"),
    ({"dynamic_batch": "yes"}, "dynamic_batch must be True or False"),
    ({"device": "cuda:../x"}, "invalid export device"),
])
def test_bad_options_are_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        request(**changes)


def test_cli_shapes_parse() -> None:
    assert common.parse_shape("1x3x224x224") == (1, 3, 224, 224)
    with pytest.raises(SettingsError, match="such as 1x3x224x224"):
        common.parse_shape("1x3xfoo")


@pytest.mark.parametrize(("field", "value"), [
    ("digest", "sha256:../../etc/passwd"), ("digest", "md5:" + "0" * 32),
    ("format", "pickle"), ("key", "../x"), ("size", -1), ("size", True),
    ("max_abs_diff", float("nan")), ("params", []), ("created_at", "x" * 100),
])
def test_hostile_records_are_refused(field: str, value: object) -> None:
    assert records.check(GOOD, "test") == GOOD
    bad = copy.deepcopy(GOOD)
    bad[field] = value
    with pytest.raises(ManifestError, match=f"invalid {field}"):
        records.check(bad, "test")


def test_a_stored_exports_file_must_name_its_own_version() -> None:
    data = records.dumps("m", 2, [GOOD])
    assert records.loads(data, "m", 2, "k") == [GOOD]
    with pytest.raises(ManifestError, match="does not describe the exports of m:v3"):
        records.loads(data, "m", 3, "k")
    with pytest.raises(ManifestError, match="exactly the fields"):
        records.check({**GOOD, "extra": 1}, "test")


def test_onnx_without_its_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from registry.errors import ExportError
    from registry.exports import onnx

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(ExportError,
                       match=r"needs onnxruntime.*pip install 'torch-registry\[export\]'"):
        onnx._require("onnxruntime")


def test_importing_registry_loads_no_exporter() -> None:
    import subprocess
    import sys

    code = ("import sys, registry; print(sorted(m for m in ('onnx', 'onnxruntime', 'onnxscript',"
            " 'torch._dynamo', 'torch.onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"
