"""sim: an iteration-level, vLLM-style LLM serving simulator.

Public API::

    import sim
    cluster = sim.load_cluster("cluster.json")        # or sim.parse_cluster(mapping)
    workload = sim.load_jsonl("requests.jsonl")        # or sim.generate(sim.WorkloadSpec(...))
    result = sim.simulate(cluster, workload, sim.SimOptions(max_num_seqs=128))
    result.summary, result.requests_table(), result.timeseries_table()
    sim.kv_capacity(cluster, sim.SimOptions())         # KV caches and vLLM's start-up check
"""

# (first: it loads the compiled simulator modules where a matching build exists)
from sim.native import status as native_status

from sim.backend import make_backend
from sim.capacity import InstanceCapacity, kv_capacity
from sim.cluster import ClusterConfig, load_cluster, parse_cluster, unsupported_features
from sim.engine import Simulator, simulate, validate_cluster
from sim.errors import InputError
from sim.metrics import RunResult
from sim.options import ALL2ALL_BACKENDS, SimOptions
from sim.workload import (
                          LengthDist,
                          Workload,
                          WorkloadSpec,
                          generate,
                          load_jsonl,
                          workload_from_mapping,
)

__all__ = [
                          "ALL2ALL_BACKENDS",
                          "ClusterConfig",
                          "InputError",
                          "InstanceCapacity",
                          "LengthDist",
                          "RunResult",
                          "SimOptions",
                          "Simulator",
                          "Workload",
                          "WorkloadSpec",
                          "generate",
                          "kv_capacity",
                          "load_cluster",
                          "load_jsonl",
                          "make_backend",
                          "native_status",
                          "parse_cluster",
                          "simulate",
                          "unsupported_features",
                          "validate_cluster",
                          "workload_from_mapping",
]
