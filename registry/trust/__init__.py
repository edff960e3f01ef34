"""Checks at the trust boundary: what a store, a server, a request or a record carries, checked
(and JSON parsed with bounds) before any of it is used."""
