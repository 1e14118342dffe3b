"""Node power and energy, from LLMServingSim's per-node ``power`` blocks.

Per node:
- ``base_node_power`` (W), always on;
- ``npu.<hardware>``: ``idle_power``, ``active_power`` and ``standby_power`` (W) with
  ``standby_duration`` (ms): an NPU draws active power while an iteration of its instance
  runs, standby power for up to ``standby_duration`` after it, and idle power otherwise;
- ``cpu``: ``idle_power`` + (``active_power`` - ``idle_power``) * ``util``, constant;
- ``dram``: ``idle_power`` per DIMM (``cpu_mem.mem_size / dimm_size`` DIMMs) plus
  ``energy_per_bit`` (pJ) for every bit an iteration reads from memory (weights and KV);
- ``link``: ``num_links`` * ``idle_power`` plus ``energy_per_bit`` (pJ) for every bit moved
  over links (tensor-parallel all-reduces, KV transfers);
- ``nic`` and ``storage``: count * ``idle_power``.

Energy is accumulated per component into fixed-width time buckets; the power time series
is that energy divided by the bucket width, so the series integrates to the total exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.cluster import ClusterConfig, GiB
from sim.errors import InputError

COMPONENTS = ("base", "npu", "cpu", "dram", "link", "nic", "storage")
_REQUIRED = {
    "npu": ("idle_power", "active_power", "standby_power", "standby_duration"),
    "cpu": ("idle_power", "active_power", "util"),
    "dram": ("dimm_size", "idle_power", "energy_per_bit"),
    "link": ("num_links", "idle_power", "energy_per_bit"),
    "nic": ("num_nics", "idle_power"),
    "storage": ("num_devices", "idle_power"),
}


@dataclass
class _NodePower:
    base_W: float
    npu: dict[str, dict]
    cpu_W: float
    dram_idle_W: float
    dram_pJ_per_bit: float
    link_idle_W: float
    link_pJ_per_bit: float
    nic_W: float
    storage_W: float


def _block(power: dict, key: str, where: str) -> dict:
    b = power.get(key)
    if not isinstance(b, dict):
        raise InputError(f"power block has no {key!r} section (needs {list(_REQUIRED[key])})",
                         source=where)
    missing = [f for f in _REQUIRED[key] if f not in b]
    if missing:
        raise InputError(f"power.{key} is missing {missing}", source=where)
    return b


class PowerModel:
    def __init__(self, cluster: ClusterConfig, interval_ns: int) -> None:
        with_power = [n for n in cluster.nodes if n.power]
        without = [n.node_id for n in cluster.nodes if not n.power]
        if with_power and without:
            raise InputError(f"{cluster.source}: nodes {without} have no power block while other "
                             "nodes do; give every node one (or none) so energy is not "
                             "silently partial")
        self.interval_ns = interval_ns
        self.nodes: dict[int, _NodePower] = {}
        for n in with_power:
            where = f"{cluster.source}: nodes[{n.node_id}].power"
            p = n.power
            if "base_node_power" not in p:
                raise InputError("power block is missing 'base_node_power'", source=where)
            npu = p.get("npu")
            if not isinstance(npu, dict):
                raise InputError("power block has no 'npu' section", source=where)
            for hw in {i.hardware for i in n.instances}:
                if hw not in npu:
                    raise InputError(f"power.npu has no entry for hardware {hw!r} "
                                     f"(has {sorted(npu)})", source=where)
                missing = [f for f in _REQUIRED["npu"] if f not in npu[hw]]
                if missing:
                    raise InputError(f"power.npu.{hw} is missing {missing}", source=where)
            cpu, dram = _block(p, "cpu", where), _block(p, "dram", where)
            link, nic, sto = _block(p, "link", where), _block(p, "nic", where), _block(p, "storage", where)
            dimms = (n.cpu_mem.mem_size_gib / dram["dimm_size"]) if n.cpu_mem else 0
            self.nodes[n.node_id] = _NodePower(
                base_W=float(p["base_node_power"]), npu=npu,
                cpu_W=cpu["idle_power"] + (cpu["active_power"] - cpu["idle_power"]) * cpu["util"],
                dram_idle_W=dimms * dram["idle_power"], dram_pJ_per_bit=dram["energy_per_bit"],
                link_idle_W=link["num_links"] * link["idle_power"],
                link_pJ_per_bit=link["energy_per_bit"],
                nic_W=nic["num_nics"] * nic["idle_power"],
                storage_W=sto["num_devices"] * sto["idle_power"])
        self.enabled = bool(self.nodes)
        self._energy: dict[str, list[float]] = {c: [] for c in COMPONENTS}

    # ------------------------------------------------------------- accumulation
    def _add(self, comp: str, start: int, end: int, watts: float) -> None:
        """Spread ``watts`` over [start, end) ns into the buckets (J)."""
        if end <= start or watts == 0:
            return
        buckets = self._energy[comp]
        iv = self.interval_ns
        b = start // iv
        while start < end:
            stop = min(end, (b + 1) * iv)
            while len(buckets) <= b:
                buckets.append(0.0)
            buckets[b] += watts * (stop - start) * 1e-9
            start = stop
            b += 1

    def _add_energy(self, comp: str, t: int, joules: float) -> None:
        buckets = self._energy[comp]
        b = t // self.interval_ns
        while len(buckets) <= b:
            buckets.append(0.0)
        buckets[b] += joules

    def add_link_bytes(self, node_id: int, t_ns: int, num_bytes: int) -> None:
        """Energy of moving ``num_bytes`` over a node's links at time ``t_ns``."""
        node = self.nodes.get(node_id)
        if node is not None and num_bytes:
            self._add_energy("link", t_ns, num_bytes * 8 * node.link_pJ_per_bit * 1e-12)

    def finalize(self, instances, iterations: dict[int, list[tuple[int, int, int, int]]],
                 end_ns: int) -> dict:
        """Energy of the run. ``iterations[instance]`` lists (start, end, memory bytes read,
        link bytes moved) for every step of that instance."""
        for np_ in self.nodes.values():
            for comp, w in (("base", np_.base_W), ("cpu", np_.cpu_W), ("dram", np_.dram_idle_W),
                            ("link", np_.link_idle_W), ("nic", np_.nic_W),
                            ("storage", np_.storage_W)):
                self._add(comp, 0, end_ns, w)
        for inst in instances:
            node = self.nodes.get(inst.config.node_id)
            if node is None:
                continue
            spec = node.npu[inst.config.hardware]
            n = inst.config.num_npus
            idle, active = spec["idle_power"] * n, spec["active_power"] * n
            standby, standby_ns = spec["standby_power"] * n, int(spec["standby_duration"] * 1e6)
            t = 0
            for start, end, mem_bytes, link_bytes in iterations.get(inst.instance_id, ()):
                if start > t:
                    gap_standby = min(start, t + standby_ns) if t > 0 else t
                    self._add("npu", t, gap_standby, standby)
                    self._add("npu", gap_standby, start, idle)
                self._add("npu", max(start, t), end, active)
                t = max(t, end)
                self._add_energy("dram", end, mem_bytes * 8 * node.dram_pJ_per_bit * 1e-12)
                self._add_energy("link", end, link_bytes * 8 * node.link_pJ_per_bit * 1e-12)
            if end_ns > t:
                stop = min(end_ns, t + standby_ns) if t > 0 else t
                self._add("npu", t, stop, standby)
                self._add("npu", stop, end_ns, idle)
        width = max(len(v) for v in self._energy.values())
        for v in self._energy.values():
            v.extend([0.0] * (width - len(v)))
        by_comp = {c: sum(v) for c, v in self._energy.items()}
        return {"energy_j": sum(by_comp.values()), "energy_by_component_j": by_comp}

    def power_series(self) -> dict[str, list[float]]:
        """Average power (W) per bucket, per component and in total."""
        sec = self.interval_ns / 1e9
        width = max((len(v) for v in self._energy.values()), default=0)
        out = {f"power_{c}_w": [e / sec for e in self._energy[c]] for c in COMPONENTS}
        out["power_w"] = [sum(self._energy[c][i] for c in COMPONENTS) / sec for i in range(width)]
        return out


def iteration_memory_bytes(inst, shape) -> int:
    """Bytes an iteration reads from NPU memory: the weights once per NPU plus the KV read."""
    model = inst.model
    weights = model.weight_bytes(inst.config.tp_size, inst.config.pp_size,
                                 inst.config.ep_size) * inst.config.num_npus
    kv_tokens = shape.decode_kv_sum + shape.prefill_kv + shape.prefill_tokens
    return int(weights + kv_tokens * model.kv_bytes_per_token())


def iteration_link_bytes(inst, shape) -> int:
    """Bytes a step moves over links: the ring all-reduces of tensor parallelism."""
    tp = inst.config.tp_size
    if tp <= 1:
        return 0
    model = inst.model
    per_ar = shape.num_tokens * model.hidden_size * model.dtype_bytes * 2 * (tp - 1) / tp
    return int(per_ar * tp * 2 * model.num_hidden_layers)


__all__ = ["COMPONENTS", "GiB", "PowerModel", "iteration_link_bytes", "iteration_memory_bytes"]
