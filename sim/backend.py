"""The system-backend boundary: time one iteration of one instance.

The engine hands the backend an instance and its batch shape; the backend asks the
instance's latency provider for per-layer compute times, builds the iteration's execution
graph (compute, TP all-reduces, PP send/recv, KV loads; see ``sim.graph_generator``) and
returns the iteration's duration in ns (= cycles). Two implementations give identical
cycles on the same input:

- ``AstraInprocBackend`` (``--backend inproc``, the default): the astra-sim engine called as a
  library, graphs passed as objects;
- ``AstraSubprocessBackend`` (``--backend subprocess``): one long-lived ``astra-sim`` process
  per instance network, kept on the client's CPU, graphs written as Chakra .et files and
  LLMServingSim's text protocol. It can drive an upstream ASTRA-Sim binary given by path.

Both share how an iteration is cut up (``decomposed_iteration_ns``): compute is summed
outside the system simulation, which times only the communication and memory traffic
(one decoder block's all-reduces standing for all of them, the KV load, the stage hop), and
computation reuse remembers those parts' results (``--no-computation-reuse`` turns that
off). A part without communication (every part of a one-NPU instance with nothing to
load) is not sent to either.

Each instance gets its own network (``sim.topology``): dimension 0 is its TP group,
dimension 1 (when pp > 1) its pipeline, on the node's intra-node link. A ``network``
argument is a ``sim.topology.Topology`` (network and system layer together) or a plain
network.yml dict (ring collectives, direct all-to-all).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from astrasim import Engine, MemoryConfig, Network, SystemConfig

from sim.errors import InputError
from sim.graph_generator import (build_graphs, logits_shard_bytes, stage_transfer_graphs,
                                 tp_collective_graphs)
from sim.latency.base import BatchShape, LayerTimes
from sim.model import TP_ALLREDUCE_AFTER
from sim.topology import network_dict, system_dict

if TYPE_CHECKING:
    import subprocess


class SystemBackend(Protocol):
    name: str

    def iteration_ns(self, inst, shape: BatchShape, load_bytes: int = 0) -> int: ...

    def run_graphs(self, network, graphs: dict, memory: dict | None = None,
                   name: str = "graph") -> int: ...

    def close(self) -> None: ...


def _memory(inst) -> dict:
    tier = getattr(inst, "lower_tier", None)
    if tier is None:
        return {"memory-type": "NO_MEMORY_EXPANSION"}
    return {"memory-type": "NO_MEMORY_EXPANSION",
            "local-mem-bw": tier.bytes_per_ns * 1e9 / (1 << 30),
            "local-mem-latency": tier.latency_ns}


def _act_bytes(inst, shape: BatchShape) -> int:
    """The activations one TP all-reduce moves: every row the step runs, CUDA-graph padding
    included (``LatencyProvider.dense_tokens``)."""
    return inst.provider.dense_tokens(shape.num_tokens) * inst.model.hidden_size \
        * inst.model.dtype_bytes


def _logits_bytes(inst, shape: BatchShape) -> int:
    """One TP rank's logits shard of this step (the per-rank size of their all-gather)."""
    m = inst.model
    return logits_shard_bytes(m.vocab_size, inst.tp, shape.num_seqs, m.dtype_bytes)


#: vLLM 0.19's custom all-reduce: its buffer size (CustomAllreduce max_size, 8 MiB), and
#: the smaller limits it takes where symmetric memory is available (NVLink GPUs of these
#: compute capabilities: all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES, two ranks)
CUSTOM_AR_MAX_BYTES = 8 << 20
CUSTOM_AR_MAX_BYTES_TP2 = {"9.0": 64 << 20, "10.0": 2 << 20, "10.3": 4 << 20}


def custom_all_reduce_below(inst) -> int:
    """All-reduces of fewer bytes run as vLLM's one-stage custom all-reduce on ``inst``
    (0: none do). vLLM 0.19 (CudaCommunicator.all_reduce, CustomAllreduce) takes it for a
    TP group of two GPUs with peer access (NVLink, or PCIe P2P) unless
    --disable-custom-all-reduce, for inputs below its limit; for two ranks it always runs
    the one-stage kernel. Larger groups keep the ring here (vLLM runs the custom kernel
    only on a fully NVLink-connected group, two-stage for large inputs; not modelled)."""
    from sim.hardware import load_hardware

    if inst.tp != 2 or getattr(inst.opts, "disable_custom_all_reduce", False):
        return 0
    try:
        hw = load_hardware(inst.config.hardware)
    except InputError:
        return 0
    if not hw.peer_access:
        return 0
    limit = CUSTOM_AR_MAX_BYTES
    if hw.link_type.lower().startswith("nvlink"):
        limit = min(limit, CUSTOM_AR_MAX_BYTES_TP2.get(str(hw.compute_capability), limit))
    return limit


@dataclass(frozen=True, eq=False)
class MeasuredCurve:
    """A collective's measured time against its size (``points``: (bytes, us), bytes
    increasing): vLLM's TP all-reduce, NCCL's all-gather or reduce-scatter; ``name``
    identifies it (card, collective, GPUs) in cache keys."""

    name: str
    points: tuple[tuple[int, float], ...]

    def ns(self, size_bytes: int) -> int:
        """The time at ``size_bytes`` (:func:`interpolate_log_log`), ns."""
        return int(interpolate_log_log(self.points, size_bytes) * 1e3)


def interpolate_log_log(points, x: float) -> float:
    """A measured curve ``points`` ((size, time), sizes increasing) read at ``x``: between
    the measured sizes on log-log axes; the smallest size's time below them; above them,
    the last stretch's slope (its bandwidth)."""
    if x <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if x <= b1:
            f = math.log(x / b0) / math.log(b1 / b0)
            return t0 * (t1 / t0) ** f
    (b0, t0), (b1, t1) = points[-2], points[-1]
    return t1 + (x - b1) * (t1 - t0) / (b1 - b0)


def measured_all_reduce(inst) -> MeasuredCurve | None:
    """vLLM's measured all-reduce for ``inst`` (the catalogue's ``vllm_all_reduce_us`` at its
    TP degree, inside a CUDA graph: the device's time; an eager step's host launch cost is
    hidden behind the queued kernels of a busy step), where the TP group is on the
    catalogue's link within one node. None where the card has no curve for the degree,
    where a cluster file gives the link (the link as LLMServingSim gives it to ASTRA-Sim:
    the all-reduce runs on it), or with --disable-custom-all-reduce (vLLM then always takes
    NCCL, which the curve is not): the all-reduce then runs on the link."""
    from sim.hardware import load_hardware
    from sim.topology import physical_intra_node_link

    if inst.tp < 2 or getattr(inst.opts, "disable_custom_all_reduce", False):
        return None
    try:
        hw = load_hardware(inst.config.hardware)
    except InputError:
        return None
    points = hw.vllm_all_reduce_us.get(inst.tp)
    dim = inst.network.dims[0]
    if points is None or dim.npus < inst.tp or dim.link != physical_intra_node_link(hw):
        return None
    return MeasuredCurve(f"{hw.name}/tp{inst.tp}", _rising(points))


def _rising(points) -> tuple[tuple[int, float], ...]:
    """vLLM's measured all-reduce held non-decreasing: the measurement's noise aside, a
    larger all-reduce never takes less time."""
    return tuple(zip((b for b, _ in points), accumulate((t for _, t in points), max)))


def measured_collectives(hardware: str, network, ranks: int) -> dict[str, MeasuredCurve]:
    """The measured collectives among ``ranks`` cards of ``hardware``, where ``network``'s
    first dimension (a DP group's network, or a TP instance's within its node) holds them
    on the catalogue's intra-node link: they sit in one node and no cluster file gave the
    link (a file's link is LLMServingSim's input to ASTRA-Sim, and the collectives run on
    it).
    Keys: the catalogue's ``nccl_us`` ops at that GPU count (NCCL's all_gather and
    reduce_scatter, read at the whole buffer's bytes), ``vllm_all_reduce`` (vLLM's own
    all-reduce at that count, ``vllm_all_reduce_us``, held non-decreasing as
    :func:`measured_all_reduce` holds it) and ``broadcast`` (one rank's buffer to the
    others: NCCL's 2-GPU all-gather, which sends each rank's half across the link once,
    read at twice the bytes; with more ranks a ring broadcast pipelines the same bytes
    through the other hops, a chunk's time each, which this leaves out). Empty otherwise;
    a key is missing where the card has no curve for it."""
    from sim.hardware import load_hardware
    from sim.topology import physical_intra_node_link

    try:
        hw = load_hardware(hardware)
    except InputError:
        return {}
    dim = network.dims[0]
    if dim.npus < ranks or dim.link != physical_intra_node_link(hw):
        return {}
    out = {}
    for op, by_ranks in hw.nccl_us.items():
        points = by_ranks.get(ranks)
        if points is not None:
            # as measured: NCCL switches protocol and algorithm by size, so its time may
            # dip where a larger message takes a faster path
            out[op] = MeasuredCurve(f"{hw.name}/{op}/{ranks}", points)
    pair = hw.nccl_us.get("all_gather", {}).get(2)
    if pair is not None:
        out["broadcast"] = MeasuredCurve(f"{hw.name}/broadcast/{ranks}",
                                         tuple((b // 2, t) for b, t in pair))
    points = hw.vllm_all_reduce_us.get(ranks)
    if points is not None:
        out["vllm_all_reduce"] = MeasuredCurve(f"{hw.name}/vllm_all_reduce/{ranks}",
                                               _rising(points))
    return out


#: entries a backend's reuse cache holds before it starts over (a few MB)
REUSE_CACHE_MAX = 1 << 17


def decomposed_iteration_ns(run_many, inst, lt: LayerTimes, act: int, load_bytes: int,
                            cache: dict | None = None, logits_bytes: int = 0,
                            one_shot_below: int = 0,
                            all_reduce_curve: MeasuredCurve | None = None) -> int:
    """An iteration from a few small graphs instead of the whole one (layer-block reuse),
    with their results reused across iterations (computation reuse).

    With one batch in flight every NPU's work is a dependency chain (stage by stage when
    pipelined), so the iteration takes the sum of its parts: one decoder block (standing
    for all ``num_blocks``), the KV-load/prologue/head part, and one pipeline-stage
    transfer per stage boundary.

    Compute that every NPU runs for the same time inside such a chain adds to the chain's
    time exactly: removing it from a node shifts every later event on every NPU by the
    same amount. So only what the compute leaves behind is simulated (LLMServingSim does
    the same for attention, the one layer that depends on the KV lengths): the block's TP
    all-reduces of the activations, the KV load, the stage hop, and the TP collectives of
    the ends (the embedding's all-reduce, the logits' all-gather of ``logits_bytes`` per
    rank). The TP all-reduces take vLLM's measured time where ``all_reduce_curve`` gives it
    (:func:`measured_all_reduce`), else those below ``one_shot_below`` bytes run as vLLM's
    one-stage custom all-reduce on the link (:func:`custom_all_reduce_below`) and the rest
    as a ring. Each such part is a
    function of one size (the activation bytes, the KV-load bytes), ``cache`` (key ->
    cycles) remembers it across iterations, and a part with no communication (a TP=1
    block, nothing to load) takes no system simulation at all.

    ``run_many([(name, build), ...])`` simulates graph sets, each made by calling its
    ``build()``, and returns their cycles."""
    compute_ns = 0
    collectives = 0
    for name, ns in lt.block:
        compute_ns += ns
        if name in TP_ALLREDUCE_AFTER:
            collectives += 1
    # the parts with communication, by key (None: nothing to simulate)
    # how the all-reduce of this size runs: vLLM's measured curve, one-stage, or a ring
    how = all_reduce_curve.name if all_reduce_curve is not None else act < one_shot_below
    block_key = ("block", act, collectives, how) if inst.tp > 1 and collectives else None
    ends_key = ("ends", load_bytes) if load_bytes else None
    # the TP collectives of the ends: the embedding's all-reduce, the logits' all-gather
    embed_key = ("embed", act, how) if inst.tp > 1 else None
    gather_key = ("gather", logits_bytes) if inst.tp > 1 and logits_bytes else None
    hop_key = ("hop", act) if inst.pp > 1 else None
    if cache is None:
        cache = {}
    keys = (block_key, ends_key, hop_key, embed_key, gather_key)
    misses = [k for k in keys if k is not None and k not in cache]
    if misses:
        ndims = 2 if inst.pp > 1 else 1

        def block():
            # the block's layers that end in an all-reduce, with no compute left
            reducing = tuple((name, 0) for name, _ in lt.block if name in TP_ALLREDUCE_AFTER)
            return build_graphs(LayerTimes((), reducing, (), 1), inst.tp, 1, act, ndims=ndims,
                                ends=False, one_shot_below=one_shot_below,
                                all_reduce_curve=all_reduce_curve)

        def ends():
            return build_graphs(LayerTimes((), (), (), 0), inst.tp, 1, act, load_bytes,
                                ndims=ndims, ends=False)

        def hop():
            return stage_transfer_graphs(inst.tp, act)

        builders = {"block": block, "ends": ends, "hop": hop,
                    "embed": lambda: tp_collective_graphs(inst.tp, "all_reduce", act, ndims,
                                                          one_shot_below, all_reduce_curve),
                    "gather": lambda: tp_collective_graphs(inst.tp, "all_gather",
                                                           logits_bytes, ndims)}
        if len(cache) + len(misses) > REUSE_CACHE_MAX:
            cache.clear()
        cycles = run_many([(key[0], builders[key[0]]) for key in misses])
        cache.update(zip(misses, cycles, strict=True))
    t_ends = sum(t for _, t in lt.prologue) + sum(t for _, t in lt.head)
    t_ends += sum(cache[k] for k in (ends_key, embed_key, gather_key) if k)
    t_block = compute_ns + (cache[block_key] if block_key else 0)
    t_hop = cache[hop_key] if hop_key else 0
    return t_ends + lt.num_blocks * t_block + (inst.pp - 1) * t_hop


_NO_MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}


def _key(network, memory: dict) -> str:
    return json.dumps([network_dict(network), system_dict(network), memory], sort_keys=True)


def _graphs_of(job):
    """A job's graphs: given as a dict, or made by calling it."""
    return job() if callable(job) else job


class _GraphBackend(ABC):
    """What both astra-sim clients share: per-instance iteration timing through
    ``decomposed_iteration_ns`` with one reuse cache per distinct network and memory.
    Subclasses implement ``run_many``."""

    name = "graph"

    def __init__(self, reuse: bool = True) -> None:
        #: computation reuse on (results of identical iteration parts remembered)
        self.reuse = reuse
        self._reuse: dict[str, dict] = {}
        # id(inst.network) -> (network, memory, key, cache); holding the network keeps
        # the id from being recycled while the entry lives
        self._inst_keys: dict[int, tuple] = {}
        # id(inst) -> (inst, custom_all_reduce_below(inst), measured_all_reduce(inst))
        self._all_reduce: dict[int, tuple] = {}

    @abstractmethod
    def run_many(self, network, memory: dict, jobs: list,
                 key: str | None = None) -> list[int]:
        """Simulate each job's graphs on ``network`` with ``memory`` (``key``: their
        ``_key``, when the caller has it); the slowest NPU's cycles of each."""

    def run_graphs(self, network, graphs: dict, memory: dict | None = None,
                   name: str = "graph") -> int:
        """Simulate one set of per-NPU graphs on ``network``; the slowest NPU's cycles."""
        return self.run_many(network, memory or _NO_MEMORY, [(name, graphs)])[0]

    def _context(self, inst) -> tuple:
        ctx = self._inst_keys.get(id(inst.network))
        memory = _memory(inst)
        if ctx is None or ctx[0] is not inst.network or ctx[1] != memory:
            key = _key(inst.network, memory)
            cache = self._reuse.setdefault(key, {}) if self.reuse else None
            if len(self._inst_keys) > 1024:
                self._inst_keys.clear()
            ctx = self._inst_keys[id(inst.network)] = (inst.network, memory, key, cache)
        return ctx

    def iteration_ns(self, inst, shape: BatchShape, load_bytes: int = 0) -> int:
        if inst.tp == 1 and inst.pp == 1 and not load_bytes:
            # One NPU, no communication, no memory traffic: the graph is a single chain of
            # compute, whose time is its sum (providers can give it from pre-summed
            # tables). There is nothing for a system simulation to add, in either client.
            return inst.provider.iteration_ns(shape)
        return self._decomposed(inst, shape, load_bytes)

    def decode_stretch(self, inst, shape: BatchShape, steps: int):
        """``iteration_ns`` of a stretch of pure-decode steps at once (event leaping), where
        the iteration is the provider's compute alone (one NPU, nothing loaded); None
        otherwise (the caller times step by step)."""
        if inst.tp == 1 and inst.pp == 1:
            return inst.provider.decode_stretch(shape, steps)
        return None

    def _decomposed(self, inst, shape: BatchShape, load_bytes: int) -> int:
        network, memory, key, cache = self._context(inst)
        ar = self._all_reduce.get(id(inst))
        if ar is None or ar[0] is not inst:
            if len(self._all_reduce) > 1024:
                self._all_reduce.clear()
            ar = self._all_reduce[id(inst)] = (inst, custom_all_reduce_below(inst),
                                               measured_all_reduce(inst))
        return decomposed_iteration_ns(
            lambda jobs: self.run_many(network, memory, jobs, key),
            inst, inst.provider.layer_times(shape), _act_bytes(inst, shape), load_bytes,
            cache, _logits_bytes(inst, shape), ar[1], ar[2])

    def reuse_entries(self) -> int:
        """Iteration parts remembered so far, over every network."""
        return sum(len(c) for c in self._reuse.values())

    def clear_reuse(self) -> None:
        """Forget every remembered iteration part (the next iterations are simulated)."""
        for cache in self._reuse.values():
            cache.clear()

    def close(self) -> None:
        self._reuse.clear()
        self._inst_keys.clear()
        self._all_reduce.clear()


class AstraInprocBackend(_GraphBackend):
    """The astra-sim engine as a library. Engines are cached per distinct instance network,
    so one backend serves any number of simulations (a search worker keeps one)."""

    name = "inproc"

    def __init__(self, reuse: bool = True) -> None:
        super().__init__(reuse)
        self._engines: dict[str, Engine] = {}

    def _engine_for(self, network, memory: dict, key: str | None = None) -> Engine:
        key = key or _key(network, memory)
        eng = self._engines.get(key)
        if eng is None:
            eng = Engine(Network.from_dict(network_dict(network)),
                         SystemConfig.from_dict(system_dict(network)),
                         MemoryConfig.from_dict(memory))
            self._engines[key] = eng
        return eng

    def _engine(self, inst) -> Engine:
        return self._engine_for(inst.network, _memory(inst))

    def run_many(self, network, memory: dict, jobs: list,
                 key: str | None = None) -> list[int]:
        engine = self._engine_for(network, memory, key)
        return [max(r.cycles for r in engine.run(_graphs_of(job)).values()) for _, job in jobs]

    def close(self) -> None:
        super().close()
        self._engines.clear()


_FINISHED = re.compile(rb"sys\[\d+\] iteration \d+ finished, (\d+) cycles")


def _scratch_root() -> str | None:
    """Where trace files go: a RAM-backed folder when the machine has one (rewriting a
    small file there costs ~20 us, against ~180 us on a disk-backed /tmp)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


#: a subprocess backend's scratch folder: ``<prefix><owner pid>-<random>``
SCRATCH_PREFIX = "llmsim-astra-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process: alive
        return True
    return True


def sweep_orphaned_scratch(root: str | None) -> int:
    """Remove the scratch folders of subprocess backends whose process has died (a Ray actor
    killed at a search's end never runs ``close``); the number removed. Folders without an
    owner pid in their name are left alone."""
    import shutil
    import tempfile

    base = Path(root or tempfile.gettempdir())
    removed = 0
    try:
        entries = list(base.glob(f"{SCRATCH_PREFIX}*-*"))
    except OSError:
        return 0
    for folder in entries:
        owner = folder.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _pid_alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def _libc_sched_getcpu():
    """glibc's ``sched_getcpu`` (the CPU the calling thread runs on), or None."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None).sched_getcpu
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return fn if fn() >= 0 else None
    except (OSError, AttributeError):
        return None


class _CoreFollower:
    """Keeps a co-process on the CPU its client is running on while they take turns.

    For a single graph set the client waits while astra-sim simulates, so the two never
    need two cores at once, and on two every exchange pays for waking a sleeping core
    (measured here: a pipe round trip of 75-150 us between cores, 10-40 us on one).
    Before such an exchange the process is moved to the client's current CPU if it is not
    there. Several graph sets in one exchange do overlap (the process simulates one while
    the client writes the next), so for those the process may run on any of the client's
    CPUs. An affinity call is made only when that changes. Where the platform has no
    affinity control, or refuses it, nothing is done."""

    def __init__(self) -> None:
        self._getcpu = _libc_sched_getcpu()
        self._anywhere = frozenset(os.sched_getaffinity(0)) if self._getcpu else frozenset()
        self._where: dict[int, frozenset] = {}  # pid -> the CPUs it is held to

    def follow(self, pid: int, overlapping: bool = False) -> None:
        """Place process ``pid`` for the next exchange."""
        if self._getcpu is None:
            return
        cpus = self._anywhere if overlapping else frozenset((self._getcpu(),))
        if self._where.get(pid) != cpus:
            try:
                os.sched_setaffinity(pid, cpus)
            except OSError:  # not allowed here (a container's CPU set, a foreign pid)
                self._getcpu = None
                return
            self._where[pid] = cpus

    def forget(self, pid: int) -> None:
        self._where.pop(pid, None)


class AstraSubprocessBackend(_GraphBackend):
    """Drives long-lived ``astra-sim`` processes with the interactive text protocol.

    The graph sets of one iteration go out together: each set's trace files are written
    and its workload line sent at once, and the replies are read after the last line (the
    protocol is line by line, so the process simply finds the next line waiting)."""

    name = "subprocess"

    def __init__(self, binary: str | None = None, reuse: bool = True,
                 same_core: bool = True) -> None:
        super().__init__(reuse)
        self.binary = binary
        # run each astra-sim process on the client's current core (see _CoreFollower)
        self._follower = _CoreFollower() if same_core else None
        # subprocess, shutil, tempfile: imported by the client that uses them (not at the
        # module's import, which every `llmsim run` pays)
        import tempfile

        root = _scratch_root()
        sweep_orphaned_scratch(root)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
        self._procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        #: processes started (a restart after a crash counts)
        self.starts = 0
        #: workload lines answered
        self.exchanges = 0
        self._pending: dict[int, bytes] = {}  # pid -> output read but not yet consumed
        from astrasim.et import LinkingWriter

        self._writer = LinkingWriter()

    def _command(self, folder: Path) -> list[str]:
        args = [f"--network-configuration={folder / 'network.yml'}",
                f"--system-configuration={folder / 'system.json'}",
                f"--remote-memory-configuration={folder / 'memory.json'}"]
        if self.binary:
            from sim.paths import check_executable

            return [check_executable(self.binary, "--astra-sim-bin"), *args]
        return [sys.executable, "-m", "astrasim", *args, "--interactive"]

    def _proc(self, network, memory: dict, key: str) -> tuple[subprocess.Popen, Path]:
        """The process serving ``key``'s network, started on first use (a process that
        died is dropped by ``run_many`` and started again here)."""
        entry = self._procs.get(key)
        if entry is not None:
            return entry
        folder = self.workdir / f"net{len(self._procs)}-{self.starts}"
        folder.mkdir(parents=True, exist_ok=True)
        import yaml

        (folder / "network.yml").write_text(yaml.safe_dump(network_dict(network),
                                                           default_flow_style=None))
        (folder / "system.json").write_text(json.dumps(system_dict(network)))
        (folder / "memory.json").write_text(json.dumps(memory))
        # The replies are flushed at each "Waiting" line; an unbuffered child (the
        # environment's PYTHONUNBUFFERED) would pay a write call per output line.
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        proc = subprocess.Popen(self._command(folder), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                env=env)
        self.starts += 1
        self._pending[proc.pid] = b""
        self._read_reply(proc)
        self._procs[key] = (proc, folder)
        return proc, folder

    def _read_reply(self, proc) -> list[int]:
        """The cycles of the ``sys[N] iteration M finished`` lines up to the next line
        containing ``Waiting``, read from the pipe in whatever pieces arrive (bytes, no
        text layer; output past that line is kept for the next reply)."""
        fd = proc.stdout.fileno()
        pending = self._pending.get(proc.pid, b"")
        while True:
            mark = pending.find(b"Waiting")
            if mark >= 0:
                eol = pending.find(b"\n", mark)
                if eol >= 0:
                    reply, self._pending[proc.pid] = pending[:eol + 1], pending[eol + 1:]
                    return [int(m.group(1)) for m in _FINISHED.finditer(reply)]
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                err = proc.stderr.read().decode(errors="replace").strip()
                raise RuntimeError(f"astra-sim exited unexpectedly: {err or 'no message'}")
            pending += chunk

    def run_many(self, network, memory: dict, jobs: list,
                 key: str | None = None) -> list[int]:
        key = key or _key(network, memory)
        for attempt in (1, 2):
            try:
                proc, folder = self._proc(network, memory, key)
            except (OSError, RuntimeError) as exc:
                self._refuse_binary(exc)
                raise
            if self._follower is not None:
                self._follower.follow(proc.pid, overlapping=len(jobs) > 1)
            try:
                for name, job in jobs:
                    # each line goes out as soon as its files exist, so the process
                    # simulates one graph set while the next is being written
                    prefix = f"{folder / name}"
                    self._writer.write(prefix, _graphs_of(job))
                    proc.stdin.write(f"{prefix}\n".encode())
                replies = [self._read_reply(proc) for _ in jobs]
            except (OSError, RuntimeError) as exc:
                # The process died: start a fresh one and replay these graphs once.
                proc.kill()
                proc.wait()
                del self._procs[key]
                self._pending.pop(proc.pid, None)
                if self._follower is not None:
                    self._follower.forget(proc.pid)
                if attempt == 2:
                    self._refuse_binary(exc)
                    raise
                continue
            if not all(replies):
                exc = RuntimeError("astra-sim reported no finished NPU for an iteration")
                self._refuse_binary(exc)
                raise exc
            self.exchanges += len(jobs)
            return [max(c) for c in replies]
        raise AssertionError("unreachable")

    def _refuse_binary(self, exc: Exception) -> None:
        """Where the process is the user's ``--astra-sim-bin``, its failure ``exc`` is an
        input error naming it (the project's own astra-sim failing is a bug, left to the
        caller to re-raise as it is)."""
        if not self.binary:
            return
        why = str(exc).removeprefix("astra-sim ").splitlines()[0] if str(exc) else repr(exc)
        raise InputError(f"--astra-sim-bin {self.binary!r}: {why}; it must be an astra-sim "
                         "binary speaking the interactive protocol (LLMServingSim's: a "
                         "workload prefix per line on stdin, 'sys[N] iteration M finished, "
                         "C cycles' and 'Waiting' on stdout)") from None

    def close(self) -> None:
        import shutil
        import subprocess

        super().close()
        for proc, _ in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.stdin.write(b"exit\n")
                    proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
        self._procs.clear()
        self._pending.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)


def make_backend(options) -> SystemBackend:
    """The backend ``options.backend`` names; reusable across simulations."""
    reuse = getattr(options, "computation_reuse", True)
    if options.backend == "subprocess":
        return AstraSubprocessBackend(options.astra_sim_bin, reuse=reuse)
    return AstraInprocBackend(reuse=reuse)
