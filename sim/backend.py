"""The system-backend boundary: time one iteration of one instance.

The engine hands the backend an instance and its batch shape; the backend asks the
instance's latency provider for per-layer compute times, builds the iteration's execution
graph (compute, TP all-reduces, PP send/recv, KV loads; see ``sim.graph_generator``) and
returns the iteration's duration in ns (= cycles). Two implementations give identical
cycles on the same input:

- ``AstraInprocBackend`` (``--backend inproc``, the default): the astra-sim engine called as a
  library, graphs passed as objects;
- ``AstraSubprocessBackend`` (``--backend subprocess``): one long-lived ``astra-sim`` process
  per instance network, graphs written as Chakra .et files and LLMServingSim's text
  protocol. It can drive an upstream ASTRA-Sim binary given by path.

Each instance gets its own network: dimension 0 is its TP group, dimension 1 (when pp > 1)
its pipeline, with the cluster's intra-node link bandwidth and latency.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Protocol

import yaml
from astrasim import Engine, MemoryConfig, Network, SystemConfig, write_workload

from sim.errors import InputError
from sim.graph_generator import build_graphs, stage_transfer_graphs
from sim.latency.base import BatchShape, LayerTimes


class SystemBackend(Protocol):
    name: str

    def iteration_ns(self, inst, shape: BatchShape, load_bytes: int = 0) -> int: ...

    def run_graphs(self, network: dict, graphs: dict, memory: dict | None = None,
                   name: str = "graph") -> int: ...

    def close(self) -> None: ...


def instance_network(tp: int, pp: int, link_bw: float, link_latency: float) -> dict:
    """An instance's own network: dimension 0 its TP group, dimension 1 its pipeline."""
    dims = [tp] + ([pp] if pp > 1 else [])
    return {"topology": ["Ring"] * len(dims), "npus_count": dims,
            "bandwidth": [link_bw] * len(dims), "latency": [link_latency] * len(dims)}


SYSTEM = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
          "preferred-dataset-splits": 1, "all-reduce-implementation": ["ring", "ring"],
          "all-gather-implementation": ["ring", "ring"],
          "reduce-scatter-implementation": ["ring", "ring"],
          "all-to-all-implementation": ["direct", "direct"],
          "collective-optimization": "localBWAware", "local-mem-bw": 1600}


def _memory(inst) -> dict:
    tier = getattr(inst, "lower_tier", None)
    if tier is None:
        return {"memory-type": "NO_MEMORY_EXPANSION"}
    return {"memory-type": "NO_MEMORY_EXPANSION",
            "local-mem-bw": tier.bytes_per_ns * 1e9 / (1 << 30),
            "local-mem-latency": tier.latency_ns}


def _system_for(network: dict) -> dict:
    nd = len(network["npus_count"])
    return {k: (v[:nd] if isinstance(v, list) else v) for k, v in SYSTEM.items()}


def _act_bytes(inst, shape: BatchShape) -> int:
    return shape.num_tokens * inst.model.hidden_size * inst.model.dtype_bytes


def decomposed_iteration_ns(run, inst, lt: LayerTimes, act: int, load_bytes: int) -> int:
    """An iteration from three small graphs instead of the whole one (layer-block reuse).

    With one batch in flight every NPU's work is a dependency chain (stage by stage when
    pipelined), so the iteration takes the sum of its parts: the graph of one decoder block
    (simulated once, standing for all ``num_blocks``), the prologue/head/KV-load graph, and
    one pipeline-stage transfer per stage boundary. ``run(graphs, name)`` simulates a
    graph set and returns its cycles."""
    ndims = 2 if inst.pp > 1 else 1
    t_block = run(build_graphs(LayerTimes((), lt.block, (), 1), inst.tp, 1, act, ndims=ndims),
                  "block")
    t_ends = run(build_graphs(LayerTimes(lt.prologue, (), lt.head, 0), inst.tp, 1, act,
                              load_bytes, ndims=ndims), "ends")
    t_hop = run(stage_transfer_graphs(inst.tp, act), "hop") if inst.pp > 1 else 0
    return t_ends + lt.num_blocks * t_block + (inst.pp - 1) * t_hop


_NO_MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}


def _key(network: dict, memory: dict) -> str:
    return json.dumps([network, memory], sort_keys=True)


class AstraInprocBackend:
    """The astra-sim engine as a library. Engines are cached per distinct instance network,
    so one backend serves any number of simulations (a search worker keeps one)."""

    name = "inproc"

    def __init__(self) -> None:
        self._engines: dict[str, Engine] = {}

    def _engine_for(self, network: dict, memory: dict) -> Engine:
        key = _key(network, memory)
        eng = self._engines.get(key)
        if eng is None:
            eng = Engine(Network.from_dict(network), SystemConfig.from_dict(_system_for(network)),
                         MemoryConfig.from_dict(memory))
            self._engines[key] = eng
        return eng

    def _engine(self, inst) -> Engine:
        return self._engine_for(inst.network, _memory(inst))

    def run_graphs(self, network: dict, graphs: dict, memory: dict | None = None,
                   name: str = "graph") -> int:
        """Simulate one set of per-NPU graphs on ``network``; the slowest NPU's cycles."""
        engine = self._engine_for(network, memory or _NO_MEMORY)
        return max(r.cycles for r in engine.run(graphs).values())

    def iteration_ns(self, inst, shape: BatchShape, load_bytes: int = 0) -> int:
        if inst.tp == 1 and inst.pp == 1 and not load_bytes:
            # One NPU, no communication: the graph is a single chain of compute, whose time
            # providers can give from pre-summed tables.
            fast = getattr(inst.provider, "iteration_ns", None)
            return fast(shape) if fast else inst.provider.layer_times(shape).total_ns()
        lt = inst.provider.layer_times(shape)
        memory = _memory(inst)
        return decomposed_iteration_ns(
            lambda graphs, name: self.run_graphs(inst.network, graphs, memory, name),
            inst, lt, _act_bytes(inst, shape), load_bytes)

    def close(self) -> None:
        self._engines.clear()


_FINISHED = re.compile(r"sys\[(\d+)\] iteration (\d+) finished, (\d+) cycles")


class AstraSubprocessBackend:
    """Drives long-lived ``astra-sim`` processes with the interactive text protocol."""

    name = "subprocess"

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary
        self.workdir = Path(tempfile.mkdtemp(prefix="llmsim-astra-"))
        self._procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        #: processes started (a restart after a crash counts)
        self.starts = 0

    def _command(self, folder: Path) -> list[str]:
        args = [f"--network-configuration={folder / 'network.yml'}",
                f"--system-configuration={folder / 'system.json'}",
                f"--remote-memory-configuration={folder / 'memory.json'}"]
        if self.binary:
            if shutil.which(self.binary) is None and not Path(self.binary).is_file():
                raise InputError(f"--astra-sim-bin {self.binary!r} is not an executable")
            return [self.binary, *args]
        return [sys.executable, "-m", "astrasim", *args, "--interactive"]

    def _proc(self, network: dict, memory: dict) -> tuple[subprocess.Popen, Path]:
        key = _key(network, memory)
        entry = self._procs.get(key)
        if entry is not None and entry[0].poll() is None:
            return entry
        folder = self.workdir / f"net{len(self._procs)}-{self.starts}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "network.yml").write_text(yaml.safe_dump(network, default_flow_style=None))
        (folder / "system.json").write_text(json.dumps(_system_for(network)))
        (folder / "memory.json").write_text(json.dumps(memory))
        proc = subprocess.Popen(self._command(folder), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.starts += 1
        self._read_until_waiting(proc)
        self._procs[key] = (proc, folder)
        return proc, folder

    @staticmethod
    def _read_until_waiting(proc) -> list[int]:
        cycles = []
        while True:
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read().strip()
                raise RuntimeError(f"astra-sim exited unexpectedly: {err or 'no message'}")
            m = _FINISHED.search(line)
            if m:
                cycles.append(int(m.group(3)))
            if "Waiting" in line:
                return cycles

    def run_graphs(self, network: dict, graphs: dict, memory: dict | None = None,
                   name: str = "graph") -> int:
        """Simulate one set of per-NPU graphs on ``network``; the slowest NPU's cycles."""
        memory = memory or _NO_MEMORY
        for attempt in (1, 2):
            proc, folder = self._proc(network, memory)
            prefix = folder / name
            write_workload(prefix, graphs)
            try:
                proc.stdin.write(f"{prefix}\n")
                proc.stdin.flush()
                cycles = self._read_until_waiting(proc)
            except (OSError, RuntimeError):
                # The process died: start a fresh one and replay this graph once.
                proc.kill()
                if attempt == 2:
                    raise
                continue
            if not cycles:
                raise RuntimeError("astra-sim reported no finished NPU for the iteration")
            return max(cycles)
        raise AssertionError("unreachable")

    def iteration_ns(self, inst, shape: BatchShape, load_bytes: int = 0) -> int:
        lt = inst.provider.layer_times(shape)
        memory = _memory(inst)
        return decomposed_iteration_ns(
            lambda graphs, name: self.run_graphs(inst.network, graphs, memory, name),
            inst, lt, _act_bytes(inst, shape), load_bytes)

    def close(self) -> None:
        for proc, _ in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.stdin.write("exit\n")
                    proc.stdin.flush()
                    proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
        self._procs.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


def make_backend(options) -> SystemBackend:
    """The backend ``options.backend`` names; reusable across simulations."""
    if options.backend == "subprocess":
        return AstraSubprocessBackend(options.astra_sim_bin)
    return AstraInprocBackend()
