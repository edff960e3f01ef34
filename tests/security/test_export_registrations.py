"""Exports registered through a server come from a client the server cannot check fully: it
checks the blob's sha256, size and format, marks the record as the uploader's claim (never as
verified by itself), and takes an export blob upload only for a registration that asked for it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import httpx
import pytest

from tests.integration.serving import Service

API = "/api/v1"
EXPORTS = API + "/models/seeded/versions/1/exports"


def _record(data: bytes, fmt: str = "onnx") -> dict[str, Any]:
    return {"format": fmt, "key": hashlib.sha256(data + fmt.encode()).hexdigest(),
            "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data),
            "max_abs_diff": 0.0, "tolerance": 1e-4, "params": {}, "versions": {"torch": "2"},
            "created_at": "2026-01-01T00:00:00+00:00"}


def _register(server: Service, data: bytes, fmt: str = "onnx") -> httpx.Response:
    record = _record(data, fmt)
    first = httpx.post(server.url + EXPORTS, json={"record": record})
    assert first.status_code == 200, first.text
    (target,) = first.json()["uploads"]
    put = httpx.put(server.url + target["url"], content=data,
                    headers={"Content-Type": "application/octet-stream"})
    assert put.status_code == 201, put.text
    return httpx.post(server.url + EXPORTS, json={"record": record})


def test_random_bytes_are_not_registered_as_an_onnx_export(server: Service) -> None:
    answer = _register(server, b"\x00" + os.urandom(4095))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "export_failed"
    listed = httpx.get(server.url + EXPORTS).json()["exports"]
    assert not [r for r in listed if r["format"] == "onnx"]


def test_a_registered_export_is_marked_as_the_uploaders_claim(server: Service) -> None:
    data = b"\x08\x07" + os.urandom(1000)  # starts as a ModelProto does; nothing else checked
    answer = _register(server, data)
    assert answer.status_code == 200, answer.text
    assert answer.json()["export"]["versions"]["verified_by"] == "uploader"


@pytest.mark.parametrize("registered", [False, True])
def test_an_export_blob_no_registration_asked_for_is_refused(server: Service,
                                                             registered: bool) -> None:
    data = b"PK\x03\x04" + os.urandom(512)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if registered:  # a registration asks for these bytes, and no more
        first = httpx.post(server.url + EXPORTS, json={"record": _record(data, "torchscript")})
        assert first.json()["uploads"], first.text
        data += b"more"
    put = httpx.put(f"{server.url}{EXPORTS}/blobs/{digest}", content=data,
                    headers={"Content-Type": "application/octet-stream"})
    assert put.status_code == 409, put.text
    assert put.json()["error"]["code"] == "unexpected_upload"
