"""The catalog's record of what the MLflow mirror wrote for each version, and the claims that let
several server replicas run the mirror on one catalog without mirroring a version twice.

``registry_versions.mlflow_synced`` holds the fingerprint of what was mirrored (None: nothing
yet). A mirror that is about to work on a version first swaps the value it read for a claim
``claim:<worker>:<unix time>`` in one conditional UPDATE; a replica that read the same value
finds its swap matching no row and leaves the version alone. The claim is swapped for the new
fingerprint when the work is done, or back when it failed. A claim older than
:data:`CLAIM_TTL_S` belonged to a worker that died and may be taken over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .models import DELETED, PENDING, READY, TRASHED, ModelRow, VersionRow, aware

CLAIM_PREFIX = "claim:"
CLAIM_TTL_S = 600


def claim_token(worker: str, now: float | None = None) -> str:
    """A claim for ``worker`` (a few hex digits) made at ``now``."""
    return f"{CLAIM_PREFIX}{worker}:{int(time.time() if now is None else now)}"


def live_claim(synced: str | None, now: float | None = None) -> bool:
    """Whether ``synced`` is a claim some worker still holds (younger than the TTL)."""
    if synced is None or not synced.startswith(CLAIM_PREFIX):
        return False
    try:
        made = int(synced.rsplit(":", 1)[1])
    except ValueError:
        return False
    return (time.time() if now is None else now) - made < CLAIM_TTL_S


class MirrorStates:
    """Catalog methods of the MLflow mirror (mixed into :class:`Catalog`)."""

    session: Callable[[], AbstractContextManager[Session]]

    def mirror_states(self) -> list[tuple[str, int, str, str | None]]:
        """(name, version, state, mlflow_synced) of every ready, trashed (removed from MLflow
        like a deleted one; a restore re-mirrors it) or deleted version, and of
        every push in progress younger than :data:`CLAIM_TTL_S`: the mirror creates a model's
        MLflow versions in number order, so it waits for those before going past them."""
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=CLAIM_TTL_S)
        with self.session() as s:
            rows = s.execute(select(ModelRow.name, VersionRow.version, VersionRow.state,
                                    VersionRow.mlflow_synced, VersionRow.created_at)
                             .join(ModelRow, ModelRow.id == VersionRow.model_id)
                             .where(VersionRow.state.in_((READY, DELETED, TRASHED,
                                                          PENDING)))
                             .order_by(ModelRow.name, VersionRow.version)).all()
            return [(r[0], int(r[1]), r[2], r[3]) for r in rows
                    if r[2] != PENDING or aware(r[4]) >= cutoff]

    def set_mirror_state(self, name: str, version: int, synced: str | None) -> None:
        """Record what the mirror wrote for ``name:vN`` (None marks it pending)."""
        with self.session() as s:
            model_id = select(ModelRow.id).where(ModelRow.name == name).scalar_subquery()
            s.execute(update(VersionRow).where(VersionRow.model_id == model_id,
                                               VersionRow.version == version)
                      .values(mlflow_synced=synced))

    def swap_mirror_state(self, name: str, version: int, seen: str | None,
                          new: str | None) -> bool:
        """Set ``name:vN``'s mirror state to ``new`` only if it is still ``seen``; whether it
        was (one conditional UPDATE, so of two replicas that read ``seen`` exactly one wins)."""
        with self.session() as s:
            model_id = select(ModelRow.id).where(ModelRow.name == name).scalar_subquery()
            still = (VersionRow.mlflow_synced.is_(None) if seen is None
                     else VersionRow.mlflow_synced == seen)
            result = s.execute(update(VersionRow).where(VersionRow.model_id == model_id,
                                                        VersionRow.version == version, still)
                               .values(mlflow_synced=new))
            return bool(getattr(result, "rowcount", 0) == 1)

