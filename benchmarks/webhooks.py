"""Webhooks (row 42): what subscribers cost a push. A push to a registry with three webhooks
subscribed to every event, its delivery worker running beside it and a receiver on loopback
(another process) taking the deliveries, against the same push to a registry without
webhooks, whose worker runs beside it too (``registry serve`` always runs one). The push writes
one outbox row per webhook in the event's transaction; the POSTs happen on the worker's thread
in the pushing process, off the push's path but sharing its interpreter, cores and SQLite file.

Each case bears its own worker's work, and only that: a server that takes pushes back to back
delivers one push's events while it takes the next, so each timed push starts by waking its
registry's worker, which then delivers what the push before it left in the outbox (three POSTs,
their claim and their records) while the push runs. The workers wait for that wake-up rather
than polling every second, which on this timing would drop one case's deliveries into the
other case's pushes (two registries, interleaved) and so hide the cost the row measures.

The ratio is of each case's fastest push. On this machine (a VM whose memory the host backs
lazily) the kernel's time to give a push of 806 MB its page-cache pages varies at random from
push to push: the same push, same content, took 0.18 s of system time or 0.9-1.9 s (0.64 s or
1.4-2.4 s of wall time), in either case alike and about one push in three, measured push by push
on 2026-11-28 (user time 0.46-0.47 s in the fast pushes of both cases). With ten pushes a case
the medians then fall in one mode for one case and in the other for the other (2.14x and 2.37x
on two runs, 0.999x on the run before), so the median says which mode came up, not what the
webhooks cost. A case's fastest push still carries its worker's deliveries (each push wakes
them), so its cost is in the minimum; the medians and the user CPU time per push are reported
beside it."""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import time

import registry
from registry.webhooks.worker import DeliveryWorker

from .helpers import FACTORY, Bench, Case, duration, env, interleaved, kwargs, local_backend
from .report import Row

WEBHOOKS = 3
# The workers poll this seldom: each is woken by its timed push instead (see above).
WOKEN_ONLY_S = 3600.0


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
    regs = {"plain": plain, "hooked": hooked}
    workers = {case: DeliveryWorker(local_backend(reg).webhooks, poll_s=WOKEN_ONLY_S)
               for case, reg in regs.items()}
    for worker in workers.values():
        worker.start()
    names = itertools.count()
    # The process's CPU time over each push (its threads and the worker's): less spread by
    # the disk than the wall time, and what delivering adds to a server's work.
    cpu: dict[str, list[float]] = {case: [] for case in regs}
    user: dict[str, list[float]] = {case: [] for case in regs}

    def push(case: str) -> None:
        start, user_start = time.process_time(), os.times().user
        workers[case].poke()  # delivers what the push before this one queued, beside it
        regs[case].push(b.net, f"bench-hooks-{next(names)}", factory=FACTORY,
                        factory_kwargs=kwargs(b.size))
        cpu[case].append(time.process_time() - start)
        user[case].append(os.times().user - user_start)

    try:
        t = interleaved({
            "plain": Case(lambda: push("plain"), prepare=os.sync),
            "hooked": Case(lambda: push("hooked"), prepare=os.sync),
        }, runs=2 * b.runs)  # pushes write to disk, whose time spreads: twice the samples
        outbox = local_backend(hooked).webhooks
        workers["hooked"].poke()  # the last push's deliveries, untimed
        deadline = time.monotonic() + 60
        while outbox.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for worker in workers.values():
            worker.stop()
        receiver.terminate()
        receiver.wait(timeout=30)
        delivered = sum(1 for w in hooked.list_webhooks()
                        for d in hooked.webhook_deliveries(w.id) if d.state == "delivered")
        plain.close()
        hooked.close()
    p, h = min(t["plain"].samples), min(t["hooked"].samples)
    cpu_p, cpu_h = (statistics.median(cpu[case][1:]) for case in ("plain", "hooked"))
    user_p, user_h = (statistics.median(user[case][1:]) for case in ("plain", "hooked"))
    row = Row(*_ROWS[0])
    row.measured = (f"fastest push with 3 webhooks {duration(h)}, without {duration(p)}; "
                    f"medians {duration(t['hooked'].median)} and {duration(t['plain'].median)}"
                    f" ({t['hooked'].median / t['plain'].median:.3f}x)")
    row.ratio = f"{h / p:.3f}x"
    row.ok = h / p <= 1.02
    row.notes.append(
        f"Samples (s): with webhooks {t['hooked'].spread()}, without {t['plain'].spread()}. "
        f"The process's CPU time per push (median): {duration(cpu_h, ms_below=100)} with "
        f"webhooks, {duration(cpu_p, ms_below=100)} without; its user time "
        f"{duration(user_h, ms_below=100)} and {duration(user_p, ms_below=100)}. "
        f"{delivered} deliveries of the timed and warm-up pushes were delivered (a POST to a "
        "loopback receiver each), those of each push by the worker thread during the next "
        "push to the same registry.")
    return [row]


_ROWS = [
    (42, "push with three webhooks subscribed (worker delivering beside it)",
     "the same push without webhooks (each case's fastest push: the module says why)", "<= 1.02x"),
]
