"""Governance through a registry server's REST API (server/routes/governance.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RegistryError
from ..events import Event
from ..http.transport import segment
from ..trust.validate import answer_object
from . import ModelGovernance, Retention, Trashed, governance_from_dict

if TYPE_CHECKING:
    from ..catalog.records import VersionRecord
    from ..http.transport import Transport


class ServerGovernance:
    """Governance through a registry server's REST API."""

    def __init__(self, transport: Transport, record: Callable[[Any], VersionRecord]) -> None:
        self.transport = transport
        self.record = record

    def protect_alias(self, name: str, alias: str, protected: bool) -> None:
        self.transport.call("PUT" if protected else "DELETE",
                            f"/models/{segment(name)}/aliases/{segment(alias)}/protection")

    def hold(self, name: str, version: int, reason: str) -> VersionRecord:
        return self.record(self.transport.call(
            "PUT", f"/models/{segment(name)}/versions/{version}/hold", json={"reason": reason}))

    def release(self, name: str, version: int) -> VersionRecord:
        return self.record(self.transport.call(
            "DELETE", f"/models/{segment(name)}/versions/{version}/hold"))

    def set_retention(self, name: str, policy: Retention | None) -> None:
        path = f"/models/{segment(name)}/retention"
        if policy is None:
            self.transport.call("DELETE", path)
        else:
            self.transport.call("PUT", path, json=policy.to_dict())

    def restore_version(self, name: str, version: int) -> VersionRecord:
        return self.record(self.transport.call(
            "POST", f"/models/{segment(name)}/versions/{version}/restore"))

    def trash(self, name: str | None = None) -> list[Trashed]:
        path = "/trash" if name is None else f"/models/{segment(name)}/trash"
        answer = answer_object(self.transport.call("GET", path), "trash list")
        return [_trashed(item, self.transport.url) for item in _items(answer, "trash")]

    def state(self, name: str) -> ModelGovernance:
        answer = answer_object(self.transport.call("GET", f"/models/{segment(name)}/governance"),
                               "governance")
        return governance_from_dict(answer, origin=f"registry server {self.transport.url}")


def _items(answer: dict[str, Any], key: str) -> list[Any]:
    items = answer.get(key)
    if not isinstance(items, list) or len(items) > 100_000:
        raise RegistryError(f"a registry server sent a malformed {key} list")
    return items


def _trashed(item: object, url: str) -> Trashed:
    try:
        assert isinstance(item, dict)
        trashed = Trashed(name=item["name"], version=item["version"], digest=item["digest"],
                          deleted_at=item["deleted_at"],
                          restorable_until=item["restorable_until"],
                          expired=bool(item.get("expired", False)))
        # The same checks an event's name, version and times get.
        Event.from_dict({"id": 1, "at": trashed.deleted_at, "actor": "x",
                         "kind": "version.deleted", "name": trashed.name,
                         "version": trashed.version, "alias": None, "previous": None,
                         "details": {}}, origin="a trash entry", error=RegistryError)
        return trashed
    except (AssertionError, KeyError, TypeError, RegistryError):
        raise RegistryError(f"registry server {url} sent a malformed trash entry; is "
                            "REGISTRY_URI a registry server of this version?") from None


