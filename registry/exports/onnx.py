"""ONNX: ``torch.onnx.export(..., dynamo=True)`` of the ``torch.export`` program, verified with
an ONNX Runtime ``InferenceSession`` on the CPU. onnx, onnxscript and onnxruntime are imported
here only, when an ONNX export runs (``pip install 'torch-registry[export]'``)."""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import ExportError
from . import pt2
from .common import ExportRequest, failure

INSTEAD = ("rewrite data-dependent branches with torch.cond, or use format='torchscript' "
           "(tracing records the one path the example inputs take)")
_NUMPY_UNSAFE = (torch.bfloat16,)


def _require(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ExportError(f"format='onnx' needs {name}, which is not installed; run "
                          "pip install 'torch-registry[export]'") from None


def export(module: torch.nn.Module, args: tuple[torch.Tensor, ...], request: ExportRequest,
           path: Path, ref: str) -> dict[str, Any]:
    onnx = _require("onnx")
    _require("onnxscript")
    ort = _require("onnxruntime")
    if any(t.dtype in _NUMPY_UNSAFE for t in args):
        raise ExportError(f"onnx export of {ref} in bfloat16 cannot be verified with ONNX "
                          "Runtime on the CPU; pass dtype='float32' (or 'float16')")
    # The program comes from torch.export first, so the ONNX exporter has no fallback path that
    # could quietly record one branch of data-dependent control flow.
    program = pt2.exported_program(module, args, request, ref, "onnx", INSTEAD)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            onnx_program = torch.onnx.export(program, (), dynamo=True, opset_version=request.opset,
                                             external_data=False, verbose=False)
            assert onnx_program is not None
            onnx_program.save(str(path))
    except ExportError:
        raise
    except Exception as exc:
        raise failure("onnx", ref, exc, INSTEAD) from exc
    model = onnx.load(str(path), load_external_data=False)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "opset": opset}


def run(path: Path, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    ort = _require("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(args):
        raise ExportError(f"the onnx artifact takes {len(names)} inputs but {len(args)} were "
                          "given; pass example_inputs matching forward()")
    feed = {n: a.detach().cpu().numpy() for n, a in zip(names, args, strict=True)}
    return [torch.from_numpy(o) for o in session.run(None, feed)]
