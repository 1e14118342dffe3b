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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, \
    create_model, model_validator
from pydantic_core import PydanticCustomError

from dse.vocab import BACKENDS, SAMPLERS, SLO_KEYS, SLO_METRICS, SLO_STATS
from sim.errors import InputError
from sim.options import DEFAULT_MEM_UTIL

#: a field given as null takes its default, as if absent
_DEFAULT = object()



def latency_providers() -> list[str]:
    """sim's registry of latency providers (plus ``auto``): the only list of names."""
    from sim.latency.base import provider_names

    return provider_names()


def _allowed(names) -> str:
    return ", ".join(str(n) for n in names)


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError("dse", "{m}", {"m": message})


@dataclass(frozen=True)
class Rule:
    """What a field accepts, in words (for the field reference)."""

    text: str


def num(*, integer: bool = False, minimum: float | None = None, exclusive: bool = False,
        maximum: float | None = None, required: bool = False) -> Any:
    """A finite number (an integer where ``integer``; 4.0 reads as 4), |v| <= 1e15, above
    ``minimum`` (``exclusive``: strictly), at most ``maximum``; null takes the default."""
    def check(v: Any) -> Any:
        if v is None:
            if required:
                raise _fail("required")
            return _DEFAULT
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or (integer and int(v) != v):
            raise _fail(f"must be {'an integer' if integer else 'a (finite) number'}, got {v!r}")
        if abs(v) > 1e15:
            raise _fail(f"must be <= 1e15, got {v!r}")
        if minimum is not None and (v <= minimum if exclusive else v < minimum):
            raise _fail(f"must be {'>' if exclusive else '>='} {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise _fail(f"must be in ({minimum}, {maximum}], got {v}")
        return int(v) if integer else float(v)

    text = "integer" if integer else "number"
    if minimum is not None:
        text += f" {'>' if exclusive else '>='} {minimum}"
    if maximum is not None:
        text += f", <= {maximum}"
    return Annotated[Any, BeforeValidator(check), Rule(text)]


def choice(allowed: tuple | Callable[[], list], text: str = "") -> Any:
    """One of ``allowed`` (a tuple, or a function returning the names: a registry)."""
    def check(v: Any) -> Any:
        names = allowed() if callable(allowed) else allowed
        if not isinstance(v, (str, int, float, bool, type(None))) or v not in names:
            raise _fail(f"unknown value {v!r}; allowed: {_allowed(names)}")
        return v

    text = text or "one of " + _allowed(allowed)
    return Annotated[Any, BeforeValidator(check), Rule(text)]


def _bool_check(v: Any) -> bool:
    if not isinstance(v, bool):
        raise _fail(f"must be true or false, got {v!r}")
    return v


Bool = Annotated[Any, BeforeValidator(_bool_check), Rule("true or false")]


class Section(BaseModel):
    """A mapping of known fields; null fields take their defaults."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _null_is_default(self):
        for name, f in type(self).model_fields.items():
            if getattr(self, name) is _DEFAULT:
                object.__setattr__(self, name, f.get_default(call_default_factory=True))
        return self


# ---------------------------------------------------------------- the sections
class Budget(Section):
    total_devices: num(integer=True, minimum=1, required=True) = Field(
        description="devices the whole configuration may use (required)")
    devices_per_node: num(integer=True, minimum=1) = Field(
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
    seed: num(integer=True, minimum=0) = Field(0, description="sampler seed")
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


# ---------------------------------------------------------------- errors
def validate(model: type[BaseModel], data: Any, where: str = "") -> Any:
    """``model`` validated from ``data``, or one InputError naming the field path (under
    ``where``) and what is allowed."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _input_error(exc, model, where) from None


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model that reads the mapping at ``loc`` below ``model``."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        sub = next((a for a in getattr(ann, "__args__", (ann,))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is None:
            return None
        model = sub
    return model


def _input_error(exc: ValidationError, model: type[BaseModel], where: str) -> InputError:
    err = exc.errors(include_url=False)[0]
    loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
    path = ".".join([where] * bool(where) + [str(p) for p in loc])
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = ".".join([where] * bool(where) + [str(p) for p in loc[:-1]])
        fields = _model_at(model, loc[:-1]).model_fields
        msg = f"unknown field {str(loc[-1])!r}; allowed: {_allowed(fields)}"
        return InputError(f"{parent}: {msg}" if parent else msg)
    if kind == "missing":
        return InputError(f"{path}: required")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        sub = _model_at(model, loc)
        fields = _allowed(sub.model_fields) if sub is not None else "(a mapping)"
        msg = f"must be a mapping with fields {fields}"
        return InputError(f"{path}: {msg}" if path else msg)
    return InputError(f"{path}: {err['msg']}" if path else err["msg"])


# ---------------------------------------------------------------- the reference
def markdown_reference() -> str:
    """The README's space-file table: one row per field, from these models."""
    rows = ["| field | accepts | default | meaning |", "|---|---|---|---|"]
    _rows(SpaceFile, "", rows)
    return "\n".join(rows) + "\n"


def _rows(model: type[BaseModel], prefix: str, rows: list[str]) -> None:
    for name, f in model.model_fields.items():
        path = prefix + name
        sub = _model_at(model, (name,)) or _DOCUMENTED.get(path)
        if sub is Slo:
            stats, metrics = "\\|".join(SLO_STATS), "\\|".join(SLO_METRICS)
            rows.append(f"| `{path}.<{stats}>_<{metrics}>_ms` | number > 0 |  | "
                        "limit on that statistic of the trial's requests, in ms |")
            _rows(Attainment, f"{path}.attainment.", rows)
            continue
        rule = next((m.text for m in f.metadata if isinstance(m, Rule)), "")
        default = None if f.is_required() else f.get_default(call_default_factory=False)
        shown = "" if default is None or sub is not None else f"`{default!r}`"
        meaning = (f.description or "").replace("|", "\\|")
        rows.append(f"| `{path}` | {rule or ('mapping' if sub else '')} | {shown} | {meaning} |")
        if sub is not None:
            _rows(sub, path + ".", rows)


#: fields read as Any (their checks need the file's folder) whose models are documented
_DOCUMENTED = {"workload": Workload, "workload.generate": Generate}
