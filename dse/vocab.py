"""Names a search-space file and the ``dse`` flags share: plain constants, no imports, so
the CLI, the space loader and the pydantic models (``dse/schema.py``) read one list."""

SLO_STATS = ("mean", "p50", "p90", "p95", "p99")
SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
SLO_KEYS = tuple(f"{s}_{m}_ms" for s in SLO_STATS for m in SLO_METRICS)
SAMPLERS = ("auto", "nsga2", "tpe", "random", "grid")
#: system backends: ``auto`` is a long-lived astra-sim process per Ray actor (the design's
#: shape) and in-process ASTRA-Sim when trials run in the driver (``--workers 0``)
BACKENDS = ("auto", "subprocess", "inproc")
