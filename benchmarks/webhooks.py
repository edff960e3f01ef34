"""Webhooks (row 42): what subscribers cost a push. A push to a registry with three webhooks
subscribed to every event, its delivery worker running beside it and a receiver on loopback
(another process) taking the deliveries, against the same push to a registry without
webhooks. The push writes one outbox row per webhook in the event's transaction; the POSTs
happen on the worker's thread, off the push's path."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import registry
from registry.webhooks.worker import DeliveryWorker

from .helpers import FACTORY, Bench, Case, duration, env, interleaved, kwargs, local_backend
from .report import Row

WEBHOOKS = 3


# The receiver runs in a process of its own, as it would on another host: its work is not the
# registry's cost.
_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def webhook_rows(b: Bench) -> list[Row]:
    receiver = subprocess.Popen([sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE,
                                text=True)
    assert receiver.stdout is not None
    url = f"http://127.0.0.1:{int(receiver.stdout.readline())}/hooks"
    with env(REGISTRY_WEBHOOK_ALLOW_PRIVATE="1"):
        plain = registry.Registry(home=b.work / "webhooks-plain")
        hooked = registry.Registry(home=b.work / "webhooks-hooked")
    for _ in range(WEBHOOKS):
        hooked.add_webhook(url, "*")
    worker = DeliveryWorker(local_backend(hooked).webhooks)
    worker.start()
    names = itertools.count()

    def push(reg: registry.Registry) -> None:
        reg.push(b.net, f"bench-hooks-{next(names)}", factory=FACTORY,
                 factory_kwargs=kwargs(b.size))

    try:
        t = interleaved({
            "plain": Case(lambda: push(plain), prepare=os.sync),
            "hooked": Case(lambda: push(hooked), prepare=os.sync),
        }, runs=2 * b.runs)  # pushes write to disk, whose time spreads: twice the samples
    finally:
        worker.stop()
        receiver.terminate()
        receiver.wait(timeout=30)
        delivered = sum(len(hooked.webhook_deliveries(w.id)) for w in hooked.list_webhooks())
        plain.close()
        hooked.close()
    p, h = t["plain"].median, t["hooked"].median
    row = Row(*_ROWS[0])
    row.measured = f"3 webhooks {duration(h)}, none {duration(p)}"
    row.ratio = f"{h / p:.3f}x"
    row.ok = h / p <= 1.02
    row.notes.append(
        f"Samples (s): with webhooks {t['hooked'].spread()}, without {t['plain'].spread()}. "
        f"{delivered} deliveries were queued by the timed and warm-up pushes and sent by the "
        "worker thread meanwhile (a POST to a loopback receiver each).")
    return [row]


_ROWS = [
    (42, "push with three webhooks subscribed (worker delivering beside it)",
     "the same push without webhooks", "<= 1.02x"),
]
