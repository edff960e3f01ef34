"""The server's routes, one ``APIRouter`` per resource; ``server.app.create_app`` includes them.

- ``models``: model and version reads, aliases, tags, deletes;
- ``pushes``: the two-phase push (begin, commit, abort);
- ``blobs``: blob uploads of a push, links and downloads;
- ``exports``: export registrations and their blobs;
- ``signatures``: a version's signature records;
- ``admin``: health, gc, the MLflow mirror's sync;
- ``events``: a model's history and the audit log (the event log);
- ``webhooks``: subscriptions, their test ping and deliveries (admin scope).
- ``governance``: protected aliases, holds, retention policies, the trash.

Each route reads what it needs from the app's state (``server.dependencies``).
"""
