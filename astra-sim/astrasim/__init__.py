"""astrasim: an ASTRA-Sim-compatible system backend in pure Python.

Chakra execution graphs in, cycles out (1 cycle = 1 ns). See README.md.
"""

from astrasim.chakra import CollectiveCommType, NodeType
from astrasim.collectives import CollectiveModel, UnsupportedCollective
from astrasim.config import ConfigError, Dim, MemoryConfig, Network, SystemConfig
from astrasim.engine import Engine, Result, WorkloadError
from astrasim.et import EtFormatError, et_path, read_et, read_workload, write_et, write_workload
from astrasim.graph import Graph, GraphBuilder, Node

__all__ = [
                         "CollectiveCommType",
                         "CollectiveModel",
                         "ConfigError",
                         "Dim",
                         "Engine",
                         "EtFormatError",
                         "Graph",
                         "GraphBuilder",
                         "MemoryConfig",
                         "Network",
                         "Node",
                         "NodeType",
                         "Result",
                         "SystemConfig",
                         "UnsupportedCollective",
                         "WorkloadError",
                         "et_path",
                         "read_et",
                         "read_workload",
                         "write_et",
                         "write_workload",
]
