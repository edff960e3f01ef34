"""JSON from outside cannot freeze a reader (issue 45): the depth scan of ``boundedjson`` is
linear on every input, so a signature bundle of ``[`` x 65, ``"`` and ``\\"`` repeated (quadratic
under the old scan, holding the GIL) neither stops the server's ``/healthz`` nor hangs any client
path that parses outside JSON (an OCI manifest, a token answer, a server's answer, a stored
bundle). No test here times anything: a hang is caught by a generous hard timeout on a thread or
a subprocess, and linearity is shown structurally."""

from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import registry
from registry.io.digests import sha256_bytes
from registry.trust import boundedjson
from tests.integration.serving import Service

from .hostile import HostileServer
from .oci_fake import FakeOci

HANG = 120.0  # seconds: far beyond what a linear parse of these inputs needs, a hang is caught


def freezing(pairs: int) -> str:
    """The input that froze the server: deep enough to be scanned, then an unterminated string
    of escaped quotes."""
    return "[" * 65 + '"' + '\\"' * pairs


def refusal(call: str, home: Path, uri: str | None = None) -> str:
    """``call`` (a statement using ``reg``, a Registry on ``home``) run in a fresh interpreter
    that is killed after :data:`HANG` seconds (a hang fails the test; a thread would not do:
    the old scan held the GIL); the error it raised, as ``Name: message``."""
    code = (f"import registry\nreg = registry.Registry({uri!r}, home={str(home)!r})\n"
            f"try:\n    {call}\nexcept Exception as exc:\n"
            "    print(type(exc).__name__ + ': ' + str(exc))\nelse:\n    print('no error')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


# -- the scan itself -----------------------------------------------------------------------------

def test_the_string_pattern_never_fails_from_a_quote() -> None:
    """Why the scan is linear: from any quote the string pattern matches (to the closing quote or
    to the end) without backtracking, so ``sub`` never retries inside a string it gave up on
    (the old pattern failed on an unterminated string and was retried from each quote in it)."""
    rng = random.Random(45)
    for _ in range(3000):
        text = "".join(rng.choice('"\\a[]') for _ in range(rng.randrange(1, 40)))
        for at, char in enumerate(text):
            if char == '"':
                assert boundedjson.STRING.match(text, at) is not None, (text, at)
    hostile = freezing(1000)
    spans = [m.span() for m in boundedjson.STRING.finditer(hostile)]
    assert spans == [(65, len(hostile))]  # one attempt, one match: the whole unterminated string


def test_strings_with_brackets_do_not_count_as_depth() -> None:
    deep = "[" * 70 + "]" * 70
    with pytest.raises(boundedjson.TooDeepError):
        boundedjson.loads(deep)
    assert boundedjson.loads(json.dumps(["[" * 500, '\\"{' * 100])) == ["[" * 500, '\\"{' * 100]
    assert boundedjson.loads('{"a\\"[[": [[1]]}') == {'a"[[': [[1]]}
    with pytest.raises(boundedjson.TooLargeError):
        boundedjson.loads(b"[1, 2]", max_bytes=5)


def test_ten_times_the_freezing_input_is_refused_at_once() -> None:
    """800,000 pairs: the old scan needed hours (8,000 took 1.5 s, growing with the square)."""
    code = ("from registry.trust import boundedjson\n"
            "text = '[' * 65 + chr(34) + (chr(92) + chr(34)) * 800_000\n"
            "try:\n    boundedjson.loads(text)\nexcept ValueError as exc:\n"
            "    print(type(exc).__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "JSONDecodeError"


# -- the server --------------------------------------------------------------------------------

def test_the_server_answers_healthz_while_parsing_a_freezing_bundle(server: Service) -> None:
    bundle = freezing(340_000).encode()  # ~680 KB, as base64 just under the 1 MiB body limit
    body = {"record": {"digest": sha256_bytes(bundle), "size": len(bundle), "method": "key",
                       "signer": "x", "created_at": "2026-01-01T00:00:00Z", "pretrained": None},
            "bundles": {sha256_bytes(bundle): base64.b64encode(bundle).decode()}}
    answers: list[httpx.Response] = []
    poster = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{server.url}/api/v1/models/seeded/versions/1/signatures", json=body, timeout=HANG)),
        daemon=True)
    poster.start()
    for _ in range(5):  # each must come back; a frozen server lets them time out
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    poster.join(HANG)
    assert not poster.is_alive()
    assert answers[0].status_code == 400, answers[0].text
    assert answers[0].json()["error"]["code"] == "signature_invalid"


# -- the clients -------------------------------------------------------------------------------

@pytest.fixture
def fake() -> Iterator[FakeOci]:
    server = FakeOci().start()
    yield server
    server.close()


def test_a_freezing_oci_manifest_is_refused(fake: FakeOci, home: Path) -> None:
    fake.manifests["/v2/m/manifests/v1"] = (
        freezing(400_000).encode(), "application/vnd.oci.image.manifest.v1+json")
    assert refusal(f"reg.pull({fake.ref('m:v1')!r}, device='cpu')", home).startswith(
        "OciArtifactError: ")


def _token_answer(fake: FakeOci, body: bytes | Callable[[], Iterator[bytes]]) -> None:
    fake.token = "issued-token"
    fake.manifests["/v2/m/manifests/v1"] = (b"{}", "application/vnd.oci.image.manifest.v1+json")
    fake.overrides[("GET", "/token")] = lambda: (200, {}, body if isinstance(body, bytes)
                                                 else body())


def test_a_freezing_token_answer_is_refused(fake: FakeOci, home: Path) -> None:
    _token_answer(fake, freezing(400_000).encode())
    assert "without a token" in refusal(f"reg.pull({fake.ref('m:v1')!r}, device='cpu')", home)


def test_an_endless_token_answer_is_cut_off_while_reading(fake: FakeOci,
                                                          reg: registry.Registry) -> None:
    def endless() -> Iterator[bytes]:
        piece = b" " * 2**16
        for _ in range(2**10):  # 64 MiB at most, if nothing stops reading
            yield piece

    _token_answer(fake, endless)
    with pytest.raises(registry.OciUnavailableError, match="more than 1048576 bytes"):
        reg.pull(fake.ref("m:v1"), device="cpu")
    assert fake.streamed < 16 * 2**20  # the client hung up long before the end


def test_a_token_with_a_line_break_is_a_typed_error(fake: FakeOci,
                                                    reg: registry.Registry) -> None:
    _token_answer(fake, json.dumps({"token": "abc\r\nX-Injected: 1"}).encode())
    with pytest.raises(registry.OciUnavailableError, match="cannot be sent as a header"):
        reg.pull(fake.ref("m:v1"), device="cpu")
    assert not any("X-Injected" in str(h) for _m, _p, h in fake.requests)


def test_a_configured_token_with_a_line_break_names_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_TOKEN", "secret\r\nX-Injected: 1")
    with pytest.raises(registry.SettingsError, match="REGISTRY_TOKEN") as caught:
        registry.Settings.from_env()
    assert "secret" not in str(caught.value)
    monkeypatch.delenv("REGISTRY_TOKEN")
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps({"ghcr.io": {"token": "a\nb"}}))
    with pytest.raises(registry.SettingsError, match="REGISTRY_OCI_AUTH"):
        registry.Settings.from_env()


def test_a_freezing_server_answer_is_refused(hostile: HostileServer, home: Path) -> None:
    hostile.answer("GET", "/api/v1/resolve", freezing(400_000).encode(), raw=True)
    assert "not JSON" in refusal("reg.show('seeded:v1')", home, hostile.url)


def test_a_server_answer_over_the_cap_is_cut_off(hostile: HostileServer,
                                                 hostile_client: registry.Registry,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.http import transport

    monkeypatch.setattr(transport, "MAX_ANSWER", 2**20)
    hostile.answer("GET", "/api/v1/resolve", b" " * (4 * 2**20), raw=True)
    with pytest.raises(registry.RegistryError, match="more than"):
        hostile_client.show("seeded:v1")



def test_upload_headers_from_a_server_answer_are_checked_before_use() -> None:
    from registry.http.transport import upload_headers

    assert upload_headers({"x-amz-checksum-sha256": "abc="}, "http://s") == {
        "x-amz-checksum-sha256": "abc="}
    for bad in ({"x-amz": "a\r\nX-Injected: 1"}, {"bad name": "v"}, {"x": 1}, ["x"]):
        with pytest.raises(registry.RegistryError, match="registry server http://s"):
            upload_headers(bad, "http://s")


def test_a_freezing_stored_bundle_is_refused_under_require(home: Path, work: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("model_signing")
    from tests.keys import ec_key_pair
    from tests.security.test_signatures import _replace_bundle

    key = ec_key_pair(work / "keys", "producer")
    reg = registry.Registry(home=home)
    reg.push(registry_model(), "mlp", sign_key=key.private)
    reg.push(registry_model(), "mlp", sign_key=key.private)
    _replace_bundle(home, 2, freezing(400_000).encode())
    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(key.public))
    answer = refusal("reg.pull_state_dict('mlp:v2', device='cpu')", home)
    assert answer.startswith("SignatureError: ") and "not an OMS" in answer


def registry_model() -> Any:
    from tests.helpers import trained_mlp

    return trained_mlp()
