"""The search-space file's shape as pydantic models (unknown fields refused everywhere).

The models check what a field *is* (a mapping with these fields, an integer >= 1, one of
these names); :mod:`dse.space` then checks what the values *mean* (a known model, knob
domains, workload files). A :class:`pydantic.ValidationError` becomes one
:class:`~sim.errors.InputError` naming the field path and what is allowed, as every
other input error. The README's field reference is generated from these models
(``python -m dse.reference``). Imported only when a space is parsed: pydantic costs about
0.2 s to import and build the models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model, model_validator

from dse.vocab import BACKENDS, SAMPLERS, SLO_KEYS, SLO_METRICS, SLO_STATS
from sim.options import DEFAULT_MEM_UTIL
from sim.schema import Bool, Section, choice, field_rule, model_at, num, reference_default
from sim.schema import validate as validate  # noqa: PLC0414 - dse.space calls schema.validate


def latency_providers() -> list[str]:
    """sim's registry of latency providers (plus ``auto``): the only list of names."""
    from sim.latency.base import provider_names

    return provider_names()


# ---------------------------------------------------------------- the sections
#: devices a budget may hold: each configuration is built and checked as a cluster of up
#: to this many devices (10^5 took 20 s and 10^6 70 s and 3 GB in `dse check`; 10^12 ran
#: out of memory), and each trial simulates its instances
MAX_DEVICES = 65_536


class Budget(Section):
    total_devices: num(integer=True, minimum=1, maximum=MAX_DEVICES, required=True) = Field(
        description="devices the whole configuration may use (required)")
    devices_per_node: num(integer=True, minimum=1, maximum=MAX_DEVICES) = Field(
        None, description="devices per node (default: min(total_devices, 8))")
    price_per_device_hour: num(minimum=0) = Field(
        None, description="USD per device-hour for cost_per_million_tokens (default: the "
                          "hardware catalogue's)")


class CpuMem(Section):
    mem_size: num(minimum=0, exclusive=True) = Field(1024.0, description="GiB per node")
    mem_bw: num(minimum=0, exclusive=True) = Field(512.0, description="GB/s")
    mem_latency: num(minimum=0) = Field(0.0, description="ns")


class ClusterDefaults(Section):
    link_bw: num(minimum=0, exclusive=True) = Field(
        None, description="GPU-to-GPU link as a cluster file reads it: ASTRA-Sim's GB/s "
        "(2^30 B/s), one FullyConnected hop (default: the hardware catalogue's physical link)")
    link_latency: num(minimum=0) = Field(
        None, description="ns per GPU-to-GPU message, as a cluster file reads it (default: "
        "the hardware catalogue's per-hop latency)")
    cpu_mem: CpuMem = Field(default_factory=CpuMem, description="each node's CPU memory")
    mem_util: num(minimum=0, exclusive=True, maximum=1) = Field(
        DEFAULT_MEM_UTIL, description="vLLM's gpu_memory_utilization of every instance")
    npu_mem_size: num(minimum=0, exclusive=True) = Field(
        None, description="GiB per device (default: the hardware's)")
    npu_mem_bw: num(minimum=0, exclusive=True) = Field(
        None, description="GB/s per device (default: the hardware's)")


class Attainment(Section):
    target: num(minimum=0, exclusive=True, maximum=1) = Field(
        0.9, description="share of requests that must meet every limit")
    ttft_ms: num(minimum=0, exclusive=True) = Field(None, description="per-request TTFT limit")
    tpot_ms: num(minimum=0, exclusive=True) = Field(None, description="per-request TPOT limit")
    e2e_ms: num(minimum=0, exclusive=True) = Field(None, description="per-request E2E limit")


Slo = create_model(
    "Slo", __base__=Section, __doc__="Latency SLOs in ms: <stat>_<metric>_ms.",
    **{k: (num(minimum=0, exclusive=True), Field(None, description="limit in ms"))
       for k in SLO_KEYS},
    attainment=(Attainment | None, Field(None, description="per-request limits and the share "
                                                           "of requests that must meet them")))


class Simulator(Section):
    latency_provider: choice(latency_providers, "auto or a name in sim.latency's registry") = Field(
        "auto", description="latency provider of every trial")
    backend: choice(BACKENDS) = Field("auto", description="system backend")
    seed: num(integer=True, minimum=0) = Field(0, description="simulator seed")
    max_sim_time_s: num(minimum=0, exclusive=True) = Field(
        None, description="stop each simulation after this much simulated time")


class Capacity(Section):
    enabled: Bool = Field(None, description="find each configuration's highest rate within "
                                            "the SLOs (default: on when the block is given)")
    start_rate: num(minimum=0, exclusive=True) = Field(1.0, description="first probe, req/s")
    max_rate: num(minimum=0, exclusive=True) = Field(1000.0, description="highest probe, req/s")
    tolerance: num(minimum=0, exclusive=True) = Field(0.05, description="relative bisection "
                                                                         "tolerance")
    max_probes: num(integer=True, minimum=2) = Field(16, description="probes per configuration")


class Search(Section):
    sampler: choice(SAMPLERS) = Field(
        None, description="auto (the default): NSGA-II with an initial design and local "
                          "search (dse/sampling.py); nsga2, tpe, random, grid")
    n_trials: num(integer=True, minimum=1) = Field(50, description="distinct configurations "
                                                                    "to evaluate")
    timeout_s: num(minimum=0, exclusive=True) = Field(None, description="stop after this long")
    seed: num(integer=True, minimum=0, maximum=2**32 - 1) = Field(
        0, description="sampler seed (Optuna's samplers take 0..2**32-1)")
    workers: num(integer=True, minimum=0) = Field(
        None, description="Ray actors (default: one per free CPU; 0: in the driver)")
    population_size: num(integer=True, minimum=2) = Field(16, description="NSGA-II population")
    trial_timeout_s: num(minimum=0, exclusive=True) = Field(600.0, description="per trial")
    initial_design: num(integer=True, minimum=0) = Field(
        None, description="configurations of the initial design (default: NSGA-II's "
                          "population, a quarter of n_trials for TPE; 0: none)")
    local_search: num(minimum=0, maximum=1) = Field(
        None, description="share of the draws that are one-knob neighbours of the front "
                          "(default 0.5; 0: none)")
    polish: num(minimum=0, maximum=1) = Field(
        None, description="share of n_trials, at the end of the budget, spent on one-knob "
                          "neighbours of the best feasible configurations by the objectives "
                          "in their order (default 0.1; 0: none)")


class Workload(Section):
    file: Any = Field(None, description="a JSONL trace (relative to the space file)")
    limit: num(integer=True, minimum=1) = Field(None, description="replay the first N entries")
    generate: Any = Field(None, description="a generator spec (workload.generate.*)")


class Length(Section):
    kind: choice(("fixed", "uniform", "zipf", "file")) = Field("fixed", description="length "
                                                                          "distribution")
    value: Any = None
    low: Any = None
    high: Any = None
    theta: Any = None
    path: Any = None


class Generate(Section):
    num_requests: num(integer=True, minimum=1) = Field(100, description="requests")
    arrival: choice(("poisson", "gamma")) = Field("poisson", description="arrival process")
    rate: num(minimum=0, exclusive=True) = Field(10.0, description="req/s")
    cv: num(minimum=0, exclusive=True) = Field(1.0, description="gamma arrivals' coefficient "
                                                                "of variation")
    input: Any = Field(None, description="prompt length: an integer or {kind: fixed|uniform|"
                                         "zipf|file, value, low, high, theta, path}")
    output: Any = Field(None, description="output length, as input")
    seed: Any = Field(None, description="generator seed")
    concurrency: num(integer=True, minimum=0) = Field(
        0, description="closed loop: this many requests in flight (0: open loop)")
    sample_file: Any = Field(None, description="JSONL to sample lengths from")


class ObjectiveItem(Section):
    name: Any = None
    direction: Any = None


class SpaceFile(Section):
    """A search space: what to serve, on what, under which SLOs, searching which knobs."""

    name: Any = Field(None, description="study name, the folder runs/<name> (default: the "
                                        "file name)")
    model: Any = Field(None, description="model name (profiles/models) (required)")
    hardware: Any = Field(None, description="a hardware name or a list of them (a menu) "
                                            "(required)")
    budget: Budget = Field(description="device budget")
    cluster: ClusterDefaults = Field(description="what every trial's cluster shares")
    workload: Any = Field(None, description="'file' + 'limit', or 'generate' (required)")
    slo: Slo = Field(description="SLOs: <mean|p50|p90|p95|p99>_<ttft|tpot|itl|e2e>_ms, "
                                 "attainment")
    objectives: Any = Field(None, description="names or {name, direction} (default: "
                                              "throughput_per_device, p99_ttft)")
    knobs: Any = Field(None, description="knob -> domain: a value, a list, {values: [...]} or "
                                         "{low, high, step, log}")
    simulator: Simulator = Field(description="simulator settings")
    capacity: Capacity = Field(description="capacity search (true, or the block)")
    search: Search = Field(description="the study's settings")

    @model_validator(mode="before")
    @classmethod
    def _absent_sections_are_empty(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for key in ("budget", "cluster", "slo", "simulator", "capacity", "search"):
                if data.get(key) is None:
                    data[key] = {}
            if isinstance(data["capacity"], bool):
                data["capacity"] = {"enabled": data["capacity"]}
        return data


TOP_KEYS = tuple(SpaceFile.model_fields)


# ---------------------------------------------------------------- the reference
def markdown_reference() -> str:
    """The README's space-file table: one row per field, from these models."""
    rows = ["| field | accepts | default | meaning |", "|---|---|---|---|"]
    _rows(SpaceFile, "", rows)
    return "\n".join(rows) + "\n"


def _rows(model: type[BaseModel], prefix: str, rows: list[str]) -> None:
    for name, f in model.model_fields.items():
        path = prefix + name
        sub = model_at(model, (name,)) or _DOCUMENTED.get(path)
        if sub is Slo:
            stats, metrics = "\\|".join(SLO_STATS), "\\|".join(SLO_METRICS)
            rows.append(f"| `{path}.<{stats}>_<{metrics}>_ms` | number > 0 |  | "
                        "limit on that statistic of the trial's requests, in ms |")
            _rows(Attainment, f"{path}.attainment.", rows)
            continue
        rule = field_rule(f)
        default = reference_default(f)
        shown = "" if default is None or sub is not None else f"`{default!r}`"
        meaning = (f.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {rule or ('mapping' if sub else '')} | {shown} | {meaning} |")
        if sub is not None:
            _rows(sub, path + ".", rows)


#: fields read as Any (their checks need the file's folder) whose models are documented
_DOCUMENTED = {"workload": Workload, "workload.generate": Generate}
