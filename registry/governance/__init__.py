"""Governance of versions and aliases: protected aliases, holds, retention policies and the
trash, as values (the dataclasses below); one component per backend does the work
(``local.LocalGovernance`` over a catalog and a store, ``remote.ServerGovernance`` over a
server).

The checks themselves live where each change is made, in the catalog's operations
(``registry/catalog/governance.py``, ``repository.delete_version``, ``aliases.py``): moving or
deleting a protected alias needs ``force`` (the server passes it for an ``admin`` caller only),
a held version is never deleted, trashed or expired, and a trashed version neither resolves nor
lists. This component adds what follows a change in the store (the copies ``db rebuild`` reads)
and what ``gc`` does with policies: expire versions past them, then purge the trash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import RefError, RegistryError
from ..refs import MAX_VERSION, validate_alias
from ..settings import parse_duration

if TYPE_CHECKING:
    from ..catalog.records import VersionRecord

MAX_REASON = 1000
MAX_KEEP_LAST = 1_000_000


@dataclass(frozen=True)
class Hold:
    """Why a version may not be deleted, by whom and since when."""

    reason: str
    actor: str
    at: str

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "actor": self.actor, "at": self.at}


@dataclass(frozen=True)
class Retention:
    """A model's retention policy: gc trashes a version only when it is not among the
    ``keep_last`` newest (if set) and older than ``max_age`` (if set); never one an alias points
    at, one that is held, or one an adapter names as its base."""

    keep_last: int | None = None
    max_age: timedelta | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"keep_last": self.keep_last,
                "max_age_s": None if self.max_age is None else int(self.max_age.total_seconds())}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Retention:
        age = data.get("max_age_s")
        return cls(keep_last=data.get("keep_last"),
                   max_age=None if age is None else timedelta(seconds=int(age)))


@dataclass(frozen=True)
class Trashed:
    """A deleted version in the trash: restorable until ``restorable_until``."""

    name: str
    version: int
    digest: str
    deleted_at: str
    restorable_until: str
    expired: bool = False  # trashed by its model's retention policy, not by a delete

    @property
    def ref(self) -> str:
        return f"{self.name}:v{self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "digest": self.digest,
                "deleted_at": self.deleted_at, "restorable_until": self.restorable_until,
                "expired": self.expired}


@dataclass(frozen=True)
class ModelGovernance:
    """A model's governance facts: protected aliases, held versions, retention policy."""

    protected: tuple[str, ...] = ()
    holds: dict[int, Hold] = field(default_factory=dict)
    retention: Retention | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"protected": list(self.protected),
                "holds": {str(v): h.to_dict() for v, h in sorted(self.holds.items())},
                "retention": None if self.retention is None else self.retention.to_dict()}


def check_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise RefError(f"a hold needs a reason of 1-{MAX_REASON} characters (who asked, which "
                       "case), e.g. --reason 'audit 2026-Q4'")
    return reason.strip()


def check_retention(keep_last: object, max_age: object) -> Retention:
    """The policy ``keep_last`` (a count) and ``max_age`` (``"90d"``, a timedelta or seconds)
    describe; at least one of them."""
    if keep_last is not None and (isinstance(keep_last, bool) or not isinstance(keep_last, int)
                                  or not 1 <= keep_last <= MAX_KEEP_LAST):
        raise RefError(f"keep_last must be a whole number from 1 to {MAX_KEEP_LAST}, not "
                       f"{keep_last!r}")
    age = None
    if max_age is not None:
        if isinstance(max_age, str) and len(max_age) < 40 and \
                (weeks := re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*[wW]\s*", max_age)):
            max_age = timedelta(weeks=float(weeks.group(1)))
        try:
            age = parse_duration(max_age, "max_age")  # type: ignore[arg-type]
        except RegistryError as exc:
            raise RefError(str(exc).replace("'6h', '30m', '90s' or '0'", "'90d', '12w' or "
                                            "'36h'")) from None
        if age.total_seconds() <= 0:
            raise RefError("max_age must be longer than 0; use --clear to drop the policy")
    if keep_last is None and age is None:
        raise RefError("a retention policy needs keep_last, max_age or both (or clear it with "
                       "set_retention(name) / registry retention NAME --clear)")
    return Retention(keep_last, age)


class GovernanceOps(Protocol):
    """What the facade needs of a backend's governance (local or through a server)."""

    def protect_alias(self, name: str, alias: str, protected: bool) -> None: ...
    def hold(self, name: str, version: int, reason: str) -> VersionRecord: ...
    def release(self, name: str, version: int) -> VersionRecord: ...
    def set_retention(self, name: str, policy: Retention | None) -> None: ...
    def restore_version(self, name: str, version: int) -> VersionRecord: ...
    def trash(self, name: str | None = None) -> list[Trashed]: ...
    def state(self, name: str) -> ModelGovernance: ...


def governance_from_dict(data: object, *, origin: str,
                         error: type[RegistryError] = RegistryError) -> ModelGovernance:
    """A model's governance facts read from outside (a server's answer, a store object),
    checked."""
    try:
        assert isinstance(data, dict)
        protected = data.get("protected") or []
        assert isinstance(protected, list) and len(protected) <= 10_000
        holds = data.get("holds") or {}
        assert isinstance(holds, dict) and len(holds) <= 1_000_000
        parsed: dict[int, Hold] = {}
        for version, hold in holds.items():
            number = int(version)
            assert 1 <= number <= MAX_VERSION and isinstance(hold, dict)
            parsed[number] = Hold(reason=check_reason(hold["reason"]),
                                  actor=str(hold["actor"])[:128], at=str(hold["at"])[:40])
        retention = data.get("retention")
        policy = None
        if retention is not None:
            assert isinstance(retention, dict)
            age = retention.get("max_age_s")
            policy = check_retention(retention.get("keep_last"),
                                     None if age is None else int(age))
        return ModelGovernance(tuple(validate_alias(a) for a in protected), parsed, policy)
    except (AssertionError, KeyError, TypeError, ValueError, RegistryError) as exc:
        raise error(f"{origin} holds malformed governance facts ({type(exc).__name__}); "
                    "remove or repair them") from None
