"""Building a module at pull: its architecture recorded and rebuilt, its parameters on ``meta``, the
stored tensors materialized on the requested devices and dtype, and why keys do not fit."""
