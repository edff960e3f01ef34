"""Push a version to an OCI registry as a ModelPack artifact whose layers are its blobs.

Each layer is looked for first (``HEAD``); one the repository lacks but another repository of
the same registry received from this machine is mounted from there; only the rest is uploaded,
in chunks, several layers at once. The config and the manifest go last, so a failed push leaves
no tag pointing at missing layers.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .. import manifest as mf
from .._progress import transfer
from ..catalog.records import VersionRecord
from ..errors import RefError
from ..io.digests import sha256_bytes
from ..io.parallel import UPLOAD_CONCURRENCY, concurrently
from . import modelpack
from .results import OciPush
from .transport import OciClient

BlobPath = Callable[[str, int], Path]
MAX_MEMO_ENTRIES = 100_000


class MountMemo:
    """Which repository of a registry host received each blob from this machine: a layer
    another repository holds is mounted from it instead of uploaded again."""

    def __init__(self, root: Path, host: str) -> None:
        self.path = root / f"{host.replace(':', '_')}.json"
        self._lock = threading.Lock()

    def load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
            if isinstance(data, dict) else {}

    def save(self, digests: list[str], repository: str) -> None:
        with self._lock:
            table = self.load()
            table.update(dict.fromkeys(digests, repository))
            if len(table) > MAX_MEMO_ENTRIES:
                table = dict(list(table.items())[-MAX_MEMO_ENTRIES:])
            with contextlib.suppress(OSError):  # a memo only saves uploads
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".memo-")
                with os.fdopen(fd, "w") as fh:
                    json.dump(table, fh)
                os.replace(tmp, self.path)


def push_version(record: VersionRecord, client: OciClient, blob_path: BlobPath,
                 memo: MountMemo, extra: tuple[list[modelpack.Layer], dict[str, bytes]] = ([], {})
                 ) -> OciPush:
    """Write ``record`` to ``client``'s repository under its tag (default ``v<N>``), with
    ``extra`` layers given with their bytes (its signatures, signed.py)."""
    ref = client.ref
    if ref.digest is not None:
        raise RefError(f"cannot push to {ref}: a push names a tag (oci://HOST/REPO:TAG), the "
                       "digest is what it returns")
    if ref.tag is None:
        ref = client.ref = ref.with_tag(f"v{record.version}")
    manifest_bytes = mf.dumps(record.manifest)
    layers = modelpack.layers_for(record.manifest, manifest_bytes) + extra[0]
    # Small layers sent from memory: the manifest layer and the signatures.
    inline = {**extra[1], sha256_bytes(manifest_bytes): manifest_bytes}
    config = modelpack.encode(modelpack.config_for(record.manifest, layers))
    body = modelpack.manifest_for(config, layers, modelpack.annotations_for(record.manifest))

    unique = list({layer.digest: layer for layer in layers}.values())
    sizes = concurrently(lambda layer: client.blob_size(layer.digest), unique)
    missing = [layer for layer, size in zip(unique, sizes, strict=True) if size != layer.size]
    known = memo.load()
    mounted: list[str] = []
    uploaded: list[modelpack.Layer] = []

    def send(layer: modelpack.Layer, progress: Callable[[int], None]) -> None:
        session = None
        source = known.get(layer.digest)
        if source is not None and source != ref.repository:
            session = client.mount(layer.digest, source)
            if session is None:
                mounted.append(layer.digest)
                progress(layer.size)
                return
        if layer.digest in inline:
            client.put_blob(layer.digest, inline[layer.digest])
        else:
            client.upload(layer.digest, blob_path(layer.digest, layer.size), layer.size,
                          session=session, progress=progress)
        uploaded.append(layer)

    with transfer(sum(layer.size for layer in missing), f"push {ref}") as progress:
        lock = threading.Lock()

        def locked(n: int) -> None:
            with lock:
                progress(n)

        concurrently(lambda layer: send(layer, locked), missing, workers=UPLOAD_CONCURRENCY)
    client.put_blob(sha256_bytes(config), config)
    client.put_manifest(ref.tag or "", body, modelpack.OCI_MANIFEST)
    memo.save([layer.digest for layer in unique], ref.repository)
    return OciPush(str(ref), sha256_bytes(body), len(layers), len(uploaded), len(mounted),
                   sum(layer.size for layer in uploaded))

