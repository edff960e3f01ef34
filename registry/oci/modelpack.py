"""The CNCF ModelPack format: a version as an OCI artifact, and an artifact read back.

    manifest (application/vnd.oci.image.manifest.v1+json,
              artifactType application/vnd.cncf.model.manifest.v1+json)
    ├── config   application/vnd.cncf.model.config.v1+json   descriptor / config / modelfs
    └── layers   one per file, uncompressed (".raw"), each annotated org.cncf.model.filepath
        ├── ...weight.v1.raw          model.safetensors, model-00001-of-00003.safetensors, ...
        ├── ...weight.config.v1.raw   config.json, tokenizer.json, ... (attached files)
        ├── ...doc.v1.raw / code.v1.raw  README.md, LICENSE / *.py
        ├── application/vnd.registry.manifest.v1+json   registry-manifest.json (ours)
        └── signatures (signed.py)  signatures/<hex>.sig, registry-signatures.json

A raw layer's bytes are the file's bytes, so its digest is the registry's blob digest and its
DiffID is the same digest. Another producer's ``.tar`` / ``.tar+gzip`` layers are read too
(unpacked by unpack.py). Everything read back is checked here before a byte is fetched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import OciArtifactError, RefError, quoted
from ..files import attached_files, check_file_name, weight_files
from ..io.digests import check_digest, sha256_bytes
from ..trust import boundedjson

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
# The spec's earlier (CNAI) names, still written by older producers.
ARTIFACT_TYPES = (ARTIFACT_TYPE, "application/vnd.cnai.model.manifest.v1+json")
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
CONFIG_TYPES = (CONFIG_TYPE, "application/vnd.cnai.model.config.v1+json")
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
MAX_MANIFEST_BYTES = 4 * 2**20  # what the distribution registry itself accepts
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
DATASET = "application/vnd.cncf.model.dataset.v1.raw"
REGISTRY_MANIFEST = "application/vnd.registry.manifest.v1+json"
# A version's signatures (signed.py): OMS bundles (Sigstore bundles) and their records.
SIGNATURE_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
SIGNATURE_RECORDS = "application/vnd.registry.signatures.v1+json"
SIGNATURE_RECORDS_PATH = "registry-signatures.json"
# Layers of this registry's own that are not files of the model.
OWN_TYPES = (REGISTRY_MANIFEST, SIGNATURE_BUNDLE, SIGNATURE_RECORDS)
RAW_TYPES = (WEIGHT, WEIGHT_CONFIG, DOC, CODE, DATASET, *OWN_TYPES)
# The spec's archived layers (other producers write them): unpacked on import and pull
# (unpack.py). zstd is refused with the fix: Python's tarfile reads no zstd before 3.14.
TAR_TYPES = tuple(t.replace(".raw", suffix) for suffix in (".tar", ".tar+gzip")
                  for t in (WEIGHT, WEIGHT_CONFIG, DOC, CODE, DATASET))
ZSTD_SUFFIX = ".tar+zstd"
FILEPATH = "org.cncf.model.filepath"
REGISTRY_MANIFEST_PATH = "registry-manifest.json"
MAX_LAYERS = 10_000
MAX_CONFIG_BYTES = 1 << 20
# Annotations of the manifest: what the ModelPack config has no field for.
ANNOTATION_PREFIX = "io.github.registry."


@dataclass(frozen=True)
class Layer:
    """One layer: a file of the version, by media type, content address and path."""

    media_type: str
    digest: str
    size: int
    filepath: str

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                "annotations": {FILEPATH: self.filepath}}


@dataclass(frozen=True)
class Artifact:
    """A ModelPack artifact read back and checked: its layers and its config descriptor."""

    layers: list[Layer]
    config: Layer
    annotations: dict[str, str]

    def of_type(self, *media_types: str) -> list[Layer]:
        return [layer for layer in self.layers if layer.media_type in media_types]

    @property
    def archived(self) -> bool:
        return any(layer.media_type in TAR_TYPES for layer in self.layers)


def is_tar(media_type: str) -> bool:
    return media_type in TAR_TYPES


def _attachment_type(name: str) -> str:
    base = name.rsplit("/", 1)[-1].lower()
    if base.endswith(".md") or base.startswith(("readme", "license", "licence", "notice")):
        return DOC
    if base.endswith(".py"):
        return CODE
    return WEIGHT_CONFIG


def layers_for(manifest: dict[str, Any], manifest_bytes: bytes) -> list[Layer]:
    """The layers of a version: its shards, its attached files, then its own manifest."""
    layers = [Layer(WEIGHT, f.digest, f.size, f.name) for f in weight_files(manifest)]
    layers += [Layer(_attachment_type(f.name), f.digest, f.size, f.name)
               for f in attached_files(manifest)]
    layers.append(Layer(REGISTRY_MANIFEST, sha256_bytes(manifest_bytes), len(manifest_bytes),
                        REGISTRY_MANIFEST_PATH))
    return layers


def param_size(count: int) -> str:
    """A parameter count in the spec's ``<count><scale>`` form: 11689512 -> ``11.7m``."""
    for scale, letter in ((10**15, "q"), (10**12, "t"), (10**9, "b"), (10**6, "m"),
                          (10**3, "k")):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + letter
    return str(count)


def config_for(manifest: dict[str, Any], layers: list[Layer]) -> dict[str, Any]:
    """The ModelPack config (``application/vnd.cncf.model.config.v1+json``) of a version."""
    source = manifest.get("source", {})
    architecture = manifest.get("architecture", {})
    dtypes = sorted(source.get("dtypes") or {spec["dtype"] for spec in
                                             manifest["tensors"].values()})
    config: dict[str, Any] = {"format": "safetensors", "precision": ",".join(dtypes)}
    if isinstance(source.get("params"), int):
        config["paramSize"] = param_size(source["params"])
    if isinstance(architecture.get("class"), str):
        config["architecture"] = architecture["class"].rpartition(":")[2]
    descriptor = {"name": manifest["name"], "version": f"v{manifest['version']}",
                  "createdAt": manifest["created_at"]}
    if isinstance(architecture.get("factory"), str):
        descriptor["family"] = architecture["factory"]
    return {"descriptor": descriptor, "config": config,
            "modelfs": {"type": "layers", "diffIds": [layer.digest for layer in layers]}}


def annotations_for(manifest: dict[str, Any]) -> dict[str, str]:
    """What the config has no field for: where the weights were trained, and how wrapped."""
    source = manifest.get("source", {})
    out = {"org.opencontainers.image.created": manifest["created_at"],
           "org.opencontainers.image.title": f"{manifest['name']}:v{manifest['version']}",
           "org.opencontainers.image.version": f"v{manifest['version']}",
           f"{ANNOTATION_PREFIX}digest": manifest["digest"]}
    for key in ("devices", "wrapping"):
        if source.get(key):
            out[f"{ANNOTATION_PREFIX}source.{key}"] = ",".join(map(str, source[key]))
    if isinstance(source.get("precision"), str):
        out[f"{ANNOTATION_PREFIX}source.precision"] = source["precision"]
    return out


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def manifest_for(config: bytes, layers: list[Layer], annotations: dict[str, str]) -> bytes:
    return encode({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256_bytes(config),
                   "size": len(config)},
        "layers": [layer.descriptor() for layer in layers],
        "annotations": annotations,
    })


# -- reading an artifact back -------------------------------------------------------------------

def read(body: bytes, media_type: str, *, origin: str, max_bytes: int) -> Artifact:
    """Check a manifest fetched from an OCI registry: a ModelPack artifact of raw layers, each
    with a safe, unique file path and a size at most ``max_bytes`` (all of them together too);
    else :class:`OciArtifactError` naming what it is instead."""
    try:
        doc = boundedjson.loads(body, max_bytes=MAX_MANIFEST_BYTES)
    except ValueError as exc:
        raise OciArtifactError(f"{origin} is not a JSON manifest of at most "
                               f"{MAX_MANIFEST_BYTES} bytes ({exc})") from None
    if not isinstance(doc, dict):
        raise OciArtifactError(f"{origin} is not a JSON manifest object")
    kind = doc.get("mediaType") or media_type
    if kind in (OCI_INDEX, DOCKER_LIST) or "manifests" in doc:
        raise OciArtifactError(f"{origin} is an image index (a manifest list), not a model "
                               "artifact; name one model manifest by its @sha256: digest")
    if kind not in (OCI_MANIFEST, DOCKER_MANIFEST) or doc.get("schemaVersion") != 2:
        raise OciArtifactError(f"{origin} has media type {quoted(kind, 80)}; expected an OCI "
                               f"image manifest ({OCI_MANIFEST}) of a ModelPack artifact")
    config = _descriptor(doc.get("config"), "config", origin, max_bytes=MAX_CONFIG_BYTES)
    artifact_type = doc.get("artifactType")
    if config["mediaType"] not in CONFIG_TYPES and artifact_type not in ARTIFACT_TYPES:
        raise OciArtifactError(
            f"{origin} is not a model artifact: its config is {quoted(config['mediaType'], 80)}"
            f" (a container image, or another artifact); expected artifactType {ARTIFACT_TYPE}"
            f" with a {CONFIG_TYPE} config")
    raw_layers = doc.get("layers")
    if not isinstance(raw_layers, list) or not 1 <= len(raw_layers) <= MAX_LAYERS:
        raise OciArtifactError(f"{origin} lists no layers (or more than {MAX_LAYERS})")
    layers: list[Layer] = []
    paths: set[str] = set()
    for i, raw in enumerate(raw_layers):
        d = _descriptor(raw, f"layers[{i}]", origin, max_bytes=max_bytes)
        layer_type = d["mediaType"]
        if layer_type.startswith("application/vnd.cncf.model.") \
                and layer_type.endswith(ZSTD_SUFFIX):
            raise OciArtifactError(
                f"{origin}: layers[{i}] is zstd-compressed ({layer_type}), which this registry "
                "cannot unpack; ask the producer for .tar, .tar+gzip or .raw layers")
        if layer_type not in RAW_TYPES and layer_type not in TAR_TYPES:
            raise OciArtifactError(
                f"{origin}: layers[{i}] has media type {quoted(layer_type, 80)}; this registry "
                f"reads ModelPack layers ({', '.join(RAW_TYPES[:5])}, and their .tar and "
                ".tar+gzip forms)")
        annotations = raw.get("annotations") or {}
        path = annotations.get(FILEPATH) if isinstance(annotations, dict) else None
        if layer_type in TAR_TYPES and path is None:
            path = f"layer-{i}.tar"  # an archive's members carry the names (unpack.py)
        try:
            path = check_file_name(path)
        except RefError as exc:
            raise OciArtifactError(f"{origin}: layers[{i}] annotation {FILEPATH}: {exc}; the "
                                   "artifact was not used") from None
        if path in paths:
            raise OciArtifactError(f"{origin}: two layers claim the file path {path!r}")
        paths.add(path)
        layers.append(Layer(d["mediaType"], d["digest"], d["size"], path))
    total = sum(layer.size for layer in layers)
    if total > max_bytes:
        raise OciArtifactError(f"{origin} declares {total} bytes of layers, more than the "
                               f"{max_bytes} bytes free in the cache; free space or set "
                               "REGISTRY_CACHE_DIR elsewhere")
    annotations = doc.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise OciArtifactError(f"{origin}: annotations must be a JSON object")
    return Artifact(layers, Layer(config["mediaType"], config["digest"], config["size"],
                                  "config.json"),
                    {str(k): str(v)[:1000] for k, v in list(annotations.items())[:1000]})


def _descriptor(value: object, what: str, origin: str, *, max_bytes: int) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("mediaType"), str):
        raise OciArtifactError(f"{origin}: {what} is not a descriptor with a mediaType")
    try:
        check_digest(value.get("digest"), f"{what}.digest")
    except RefError as exc:
        raise OciArtifactError(f"{origin}: {exc}") from None
    size = value.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise OciArtifactError(f"{origin}: {what}.size is {quoted(size)}, expected a byte count")
    if size > max_bytes:
        raise OciArtifactError(
            f"{origin}: {what} declares {size} bytes, more than the {max_bytes} this pull "
            "accepts (the free space of the cache); it was not downloaded")
    return value
