"""The simulation: what chm's paper results are computed with, apart from the
driver it drives.

:mod:`chm.sim.workloads` generates requests (synthetic multi-turn chat,
Mooncake traces read and written); :mod:`chm.sim.replay` replays them in
virtual time through the baselines' cache models and through CXL-HM devices
(ghost devices of the driver), and holds the demo, the figures, the cost
table and the timing calibration. The package may import the driver and
:mod:`chm.kv`; nothing in the driver, the KV layer, the adapters or the
remote client imports it (tests/unit/test_layering.py).
"""
