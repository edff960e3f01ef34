"""Fault injection: SIGKILL, a cut or stalled network, flipped bytes; each guarantee is counted
(trials, violations) and must hold every time (docs/reliability.md)."""
