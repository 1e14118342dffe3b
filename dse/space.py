"""Search-space files: parse and validate the YAML a user writes, then sample from it.

A space names the model, the hardware (or a menu of it), a device budget, the workload,
SLOs, objectives and the knobs with their domains. Every mistake is an
:class:`~sim.errors.InputError` whose message names the field and what is allowed; the
CLI turns it into exit status 2. Knobs that need a feature the simulator does not model
yet are refused here, at load time, by asking sim about a representative cluster, so the
refusal disappears by itself when sim learns the feature.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dse.vocab import SLO_KEYS
from sim.errors import InputError, read_text_input
from sim.options import KnobSpec, knob_table
from sim.topology import ALGORITHMS as COLLECTIVE_ALGORITHMS

# ---------------------------------------------------------------- vocabularies
ATTAINMENT_KEYS = ("target", "ttft_ms", "tpot_ms", "e2e_ms")

#: objective -> default direction
OBJECTIVES = {
    "throughput_per_device": "maximize",
    "goodput_per_device": "maximize",
    "p99_ttft": "minimize",
    "p99_tpot": "minimize",
    "cost_per_million_tokens": "minimize",
    "energy_per_token": "minimize",
    "devices_used": "minimize",
    "avg_power": "minimize",
}
PREFIX_TIERS = ("npu", "cpu", "cxl")
PIM_MODES = ("off", "local", "pool")
#: knobs that shape the cluster (dse's own): name -> (type, default; None: none or derived),
#: in drawing order. Knobs of SimOptions fields are declared in sim/options.py (a field's
#: ``knob``) and drawn where their declaration says.
CLUSTER_KNOBS: dict[str, tuple[str, Any]] = {
    "hardware": ("str", None), "tp": ("int", 1), "pp": ("int", 1), "ep": ("int", 1),
    "dp": ("int", 1), "replicas": ("int", None), "pd": ("bool", False), "pd_ratio": ("str", None),
    "pim_mode": ("str", "off"), "sub_batch_interleaving": ("bool", False),
    "prefix_tier": ("str", "npu"), "prefix_sharing": ("bool", False),
    "collective_algorithm": ("str", None),
}
#: knobs that become SimOptions fields, from their declarations
OPTION_KNOBS: dict[str, KnobSpec] = {k.name: k for k in knob_table()}


def _knob_order() -> tuple[str, ...]:
    """Structural knobs first so conditions can look at them; each option knob right after
    the knob its declaration names."""
    order = list(CLUSTER_KNOBS)
    for k in OPTION_KNOBS.values():
        order.insert(order.index(k.after) + 1 if k.after else len(order), k.name)
    return tuple(order)


_KINDS = {**{n: kind for n, (kind, _) in CLUSTER_KNOBS.items()},
          **{n: k.kind for n, k in OPTION_KNOBS.items()}}
BOOL_KNOBS = tuple(n for n, kind in _KINDS.items() if kind == "bool")
INT_KNOBS = tuple(n for n, kind in _KINDS.items() if kind == "int")
STR_KNOBS = tuple(n for n, kind in _KINDS.items() if kind == "str")
KNOBS = INT_KNOBS + BOOL_KNOBS + STR_KNOBS
#: sampling order: structural knobs first so conditions can look at them
KNOB_ORDER = _knob_order()
#: vLLM defaults used when a knob is absent
KNOB_DEFAULTS: dict[str, Any] = {
    **{n: d for n, (_, d) in CLUSTER_KNOBS.items() if d is not None},
    **{n: k.default for n, k in OPTION_KNOBS.items()}}
_PD_RATIO = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
#: a study name becomes the default folder runs/<name>: one path component, no traversal
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def latency_providers() -> list[str]:
    """The latency providers a space may choose: sim's registry (``auto`` picks per
    instance); the registry is the only list of names."""
    from sim.latency.base import provider_names

    return provider_names()


def _allowed(names) -> str:
    return ", ".join(str(n) for n in names)


# ---------------------------------------------------------------- domains
# A range with more values than this is never listed: it is sampled as a continuous one.
ENUMERABLE_VALUES = 100_000


@dataclass(frozen=True)
class Domain:
    """A knob's domain: fixed value, categorical list, or int/float range."""

    kind: str  # "fixed" | "choice" | "int" | "float"
    values: tuple = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    @property
    def fixed(self) -> bool:
        return self.kind == "fixed" or (self.kind == "choice" and len(self.values) == 1)

    def size(self) -> int | None:
        """How many values the domain holds, counted without listing them (None: a
        continuous or log range)."""
        if self.kind in ("fixed", "choice"):
            return len(self.values)
        if self.kind == "int" and not self.log:
            return max(0, (int(self.high) - int(self.low)) // int(self.step or 1) + 1)
        if self.kind == "float" and self.step and not self.log:
            return round((self.high - self.low) / self.step) + 1
        return None

    def finite_values(self) -> list | None:
        """The domain's values in order; None for a continuous or log range, and for a
        range too long to list (it is sampled like a continuous one: listing a range of
        10^9 integers would take tens of GB)."""
        n = self.size()
        if n is None or n > ENUMERABLE_VALUES:
            return None
        if self.kind in ("fixed", "choice"):
            return list(self.values)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        return [self.low + i * self.step for i in range(n)]

    def contains(self, v) -> bool:
        """Whether the domain can take ``v``."""
        vals = self.finite_values()
        if vals is not None:
            return v in vals
        if not self.low <= v <= self.high:
            return False
        return self.kind != "int" or self.log or (v - int(self.low)) % int(self.step or 1) == 0

    def may_take(self, pred) -> bool:
        vals = self.finite_values()
        if vals is None:
            return pred(self.low) or pred(self.high)
        return any(pred(v) for v in vals)

    def describe(self) -> str:
        if self.kind == "fixed":
            return repr(self.values[0])
        if self.kind == "choice":
            return "[" + ", ".join(repr(v) for v in self.values) + "]"
        s = f"{self.kind} [{self.low}, {self.high}]"
        if self.step:
            s += f" step {self.step}"
        return s + (" log" if self.log else "")


def _check_value(name: str, v: Any, where: str) -> Any:
    kind = _KINDS[name]
    if kind == "bool":
        if not isinstance(v, bool):
            raise InputError(f"{where}: {name} takes true or false, got {v!r}")
        return v
    if kind == "int":
        return _check_int(name, v, where)
    if name == "pim_mode" and v is False:
        v = "off"  # YAML reads a bare `off` as false
    if not isinstance(v, str):
        raise InputError(f"{where}: {name} takes strings, got {v!r}")
    if name == "pim_mode" and v == "none":
        v = "off"  # "none" and "off" both mean no PIM offload
    if name == "pd_ratio":
        m = _PD_RATIO.match(v)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise InputError(f"{where}: pd_ratio must look like 'P:D' with P, D >= 1 "
                             f"(e.g. '1:3'), got {v!r}")
    allowed = {"prefix_tier": PREFIX_TIERS, "pim_mode": PIM_MODES,
               "collective_algorithm": COLLECTIVE_ALGORITHMS}.get(name)
    if name in OPTION_KNOBS:
        allowed = OPTION_KNOBS[name].values
    if allowed is not None and v not in allowed:
        raise InputError(f"{where}: unknown {name} {v!r}; allowed: {_allowed(allowed)}")
    return v


def _check_int(name: str, v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{where}: {name} takes integers, got {v!r}")
    spec = OPTION_KNOBS.get(name)
    lo = spec.minimum if spec else 1
    if v < lo:
        raise InputError(f"{where}: {name} must be >= {lo}, got {v}")
    if v > 2**31:
        raise InputError(f"{where}: {name} must be <= 2**31, got {v}")
    if spec and spec.values is not None and v not in spec.values:
        raise InputError(f"{where}: {name} {v} {spec.refusal}; allowed: "
                         f"{_allowed(spec.values)}")
    return v


def parse_domain(name: str, raw: Any, where: str) -> Domain:
    """``x`` (fixed), ``[a, b]`` (categorical), ``{low, high, step?, log?}`` (range),
    ``{values: [...]}`` or ``{value: x}``."""
    if isinstance(raw, list):
        if not raw:
            raise InputError(f"{where}: an empty list has nothing to search; give at least one value")
        vals = tuple(_check_value(name, v, where) for v in raw)
        if len(set(vals)) != len(vals):
            raise InputError(f"{where}: duplicate values in {list(raw)}")
        return Domain("choice", vals)
    if isinstance(raw, dict):
        keys = set(raw)
        if keys <= {"value"} and keys:
            return Domain("fixed", (_check_value(name, raw["value"], where),))
        if keys <= {"values"} and keys:
            return parse_domain(name, raw["values"] if isinstance(raw["values"], list)
                                else [raw["values"]], where)
        allowed = {"low", "high", "step", "log"}
        bad = keys - allowed
        if bad:
            raise InputError(f"{where}: unknown domain field(s) {sorted(bad)}; a domain is a "
                             "value, a list, {values: [...]}, or a range {low, high, step, log}")
        if name not in INT_KNOBS:
            raise InputError(f"{where}: {name} is not numeric; give a value or a list "
                             "(ranges are for integer knobs)")
        if "low" not in raw or "high" not in raw:
            raise InputError(f"{where}: a range needs both 'low' and 'high'")
        lo, hi = raw["low"], raw["high"]
        for k, v in (("low", lo), ("high", hi)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(f"{where}.{k}: must be a number, got {v!r}")
        is_int = isinstance(lo, int) and isinstance(hi, int)
        if not is_int:
            raise InputError(f"{where}: {name} takes integers; low/high must be integers")
        _check_value(name, lo, where)
        if hi < lo:
            raise InputError(f"{where}: high ({hi}) must be >= low ({lo})")
        log = raw.get("log", False)
        if not isinstance(log, bool):
            raise InputError(f"{where}.log: must be true or false, got {log!r}")
        step = raw.get("step")
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, int) or step < 1:
                raise InputError(f"{where}.step: must be a positive integer, got {step!r}")
            if log:
                raise InputError(f"{where}: 'step' and 'log' cannot be combined")
            if (hi - lo) % step:
                raise InputError(f"{where}: high - low ({hi - lo}) must be a multiple of step "
                                 f"({step})")
        if log and lo < 1:
            raise InputError(f"{where}: a log range needs low >= 1")
        return Domain("int", (), lo, hi, step, log)
    return Domain("fixed", (_check_value(name, raw, where),))


# ---------------------------------------------------------------- the space
@dataclass(frozen=True)
class Objective:
    name: str
    direction: str


@dataclass(frozen=True)
class Attainment:
    target: float
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


@dataclass(frozen=True)
class Capacity:
    enabled: bool = False
    start_rate: float = 1.0
    max_rate: float = 1000.0
    tolerance: float = 0.05
    max_probes: int = 16


@dataclass(frozen=True)
class SearchSettings:
    sampler: str
    n_trials: int
    timeout_s: float | None
    seed: int
    #: Ray actors; None sizes the pool from the cluster's free CPUs, 0 runs in-process
    workers: int | None
    population_size: int
    trial_timeout_s: float
    #: configurations of the initial design (dse.sampling); None: the sampler's default
    initial_design: int | None = None
    #: share of draws that are one-knob neighbours of the front (dse.sampling); None: default
    local_search: float | None = None
    #: share of n_trials at the end spent around the best configurations (dse.sampling);
    #: None: default
    polish: float | None = None


@dataclass(frozen=True)
class Space:
    path: str
    name: str
    model: str
    hardware: tuple[str, ...]
    total_devices: int
    devices_per_node: int
    price_per_device_hour: float | None
    cluster_defaults: dict
    workload: dict  # {"kind": "file"|"generate", ...}
    slo: dict[str, float]
    attainment: Attainment | None
    objectives: tuple[Objective, ...]
    knobs: dict[str, Domain]
    simulator: dict
    capacity: Capacity
    search: SearchSettings
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    digest: str = ""
    is_moe: bool = False
    hw_info: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------ sampling
    @property
    def searched_knobs(self) -> list[str]:
        return [k for k in KNOB_ORDER if k in self.knobs and not self.knobs[k].fixed]

    def active(self, name: str, params: dict) -> bool:
        """Whether ``name`` applies given the knobs chosen so far (conditional knobs)."""
        if name == "ep":
            return self.is_moe
        if name == "all2all_backend":
            # the MoE exchange across a DP group; nothing to exchange without one
            return self.is_moe and int(params.get("dp", 1)) > 1
        if name == "pd_ratio":
            return bool(params.get("pd", False))
        if name == "prefix_sharing":
            return params.get("prefix_tier", "npu") != "npu"
        if name == "pim_mode":
            hw = params.get("hardware", self.hardware[0])
            return _has_pim(self.hw_info[hw])
        if name == "sub_batch_interleaving":
            return params.get("pim_mode", "off") != "off" and int(params.get("pp", 1)) == 1
        return True

    def suggest(self, trial) -> dict[str, Any]:
        """Draw one configuration with an Optuna trial (define-by-run, conditional)."""
        params: dict[str, Any] = {}
        for name in KNOB_ORDER:
            dom = self.knobs.get(name)
            if dom is None or not self.active(name, params):
                continue
            if dom.fixed:
                params[name] = dom.values[0]
            elif dom.kind == "choice":
                params[name] = trial.suggest_categorical(name, list(dom.values))
            else:
                params[name] = trial.suggest_int(name, int(dom.low), int(dom.high),
                                                 step=int(dom.step or 1), log=dom.log)
        return self.complete(params)

    def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        """Fill absent knobs: the space's fixed knobs (one value: Optuna records only the
        searched ones) where they apply, then the defaults (hardware from the space)."""
        out = dict(params)
        for name in KNOB_ORDER:
            dom = self.knobs.get(name)
            if dom is not None and dom.fixed and name not in out and self.active(name, out):
                out[name] = dom.values[0]
        out.setdefault("hardware", self.hardware[0])
        for k, v in KNOB_DEFAULTS.items():
            if k in ("pd_ratio",):
                continue
            out.setdefault(k, v)
        if out.get("pd") and "pd_ratio" not in out:
            out["pd_ratio"] = "1:1"
        if not self.is_moe:
            out["ep"] = 1
        if not self.is_moe or int(out.get("dp", 1)) == 1:
            out["all2all_backend"] = KNOB_DEFAULTS["all2all_backend"]
        if out.get("prefix_tier", "npu") == "npu":
            out["prefix_sharing"] = False
        hw = out["hardware"]
        if hw in self.hw_info and not _has_pim(self.hw_info[hw]):
            out["pim_mode"] = "off"
        if out.get("pim_mode", "off") == "off":
            out["sub_batch_interleaving"] = False
        return out

    def grid(self) -> list[dict[str, Any]]:
        """Every distinct configuration of a finite space, conditional knobs collapsed."""
        names = self.searched_knobs
        domains = []
        for n in names:
            vals = self.knobs[n].finite_values()
            if vals is None:
                raise InputError(f"{self.path}: search.sampler grid needs finite domains; "
                                 f"knobs.{n} is {self.knobs[n].describe()} (give a list or "
                                 f"a range with step and at most {ENUMERABLE_VALUES:,} values)")
            domains.append(vals)
        seen, out = set(), []
        for combo in itertools.product(*domains):
            p = dict(zip(names, combo))
            p = {k: v for k, v in p.items() if self.active(k, p)}
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out

    def grid_size(self) -> int:
        return len(self.grid())


# ---------------------------------------------------------------- loading
def load_space(path: str | Path) -> Space:
    """Read and validate a search-space YAML file."""
    path = Path(path)
    text = read_text_input(path, "a search space", "a YAML")
    from sim.yamlio import strict_load, yaml_problem

    try:
        data = strict_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: YAML syntax error: {yaml_problem(exc)}") from None
    except RecursionError:
        raise InputError(f"{path}: YAML nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise InputError(f"{path}: YAML value out of range ({exc})") from None
    return parse_space(data, str(path), base_dir=path.parent, text=text)


def parse_space(data: Any, source: str = "<space>", base_dir: Path | None = None,
                text: str | None = None) -> Space:
    try:
        return _parse_space(data, source, base_dir or Path.cwd(), text)
    except InputError as exc:
        msg = str(exc)
        raise InputError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def _parse_space(data: Any, source: str, base_dir: Path, text: str | None) -> Space:
    from dse import schema

    if not isinstance(data, dict) or not data:
        raise InputError(f"a search space must be a mapping with fields "
                         f"{_allowed(schema.TOP_KEYS)}")
    top = schema.validate(schema.SpaceFile, data)
    spec = _model_spec(top.model)
    hw_info = _hardware(top.hardware)
    objectives = _parse_objectives(top.objectives)
    knobs = _parse_knobs(top.knobs, list(hw_info))
    space = Space(
        path=source, name=_study_name(top.name, source), model=spec.name,
        hardware=tuple(hw_info), total_devices=top.budget.total_devices,
        devices_per_node=top.budget.devices_per_node or min(top.budget.total_devices, 8),
        price_per_device_hour=top.budget.price_per_device_hour,
        cluster_defaults=_cluster_defaults(top.cluster),
        workload=_parse_workload(top.workload, base_dir, spec), slo=_slo(top.slo, data),
        attainment=_attainment(top.slo.attainment), objectives=objectives, knobs=knobs,
        simulator=top.simulator.model_dump(), capacity=_capacity(top.capacity, data),
        search=_search(top.search, objectives), raw=data,
        digest=hashlib.sha256((text or yaml.safe_dump(data, sort_keys=True)).encode())
        .hexdigest()[:16],
        is_moe=spec.is_moe, hw_info=hw_info)
    _check_semantics(space, spec)
    return space


def _model_spec(model: Any):
    from sim.model import known_models, load_model

    if not isinstance(model, str) or not model:
        raise InputError(f"model: required, one of {_allowed(known_models())}")
    try:
        return load_model(model)
    except InputError as exc:
        raise InputError(f"model: {exc}") from None


def _hardware(hw_raw: Any) -> dict:
    """One hardware or a menu of it: catalogue name -> entry."""
    from sim.hardware import known_hardware, load_hardware

    hw_list = hw_raw if isinstance(hw_raw, list) else [hw_raw]
    if hw_raw is None or not hw_list or not all(isinstance(h, str) and h for h in hw_list):
        raise InputError("hardware: required, a name or a list of names; known: "
                         f"{_allowed(sorted(known_hardware()))}")
    hw_info = {}
    for h in hw_list:
        try:
            info = load_hardware(h)
        except InputError as exc:
            raise InputError(f"hardware: {exc}") from None
        if info.name in hw_info:
            raise InputError(f"hardware: {h!r} is listed twice (as {info.name!r})")
        hw_info[info.name] = info
    return hw_info


def _cluster_defaults(c) -> dict:
    out = {k: getattr(c, k) for k in ("link_bw", "link_latency", "npu_mem_size", "npu_mem_bw")}
    out["mem_util"] = c.mem_util
    out["cpu_mem"] = c.cpu_mem.model_dump()
    return out


def _slo(s, data: dict) -> dict[str, float]:
    given = data.get("slo") or {}
    # (null is no limit, as it is the default for every other field)
    return {k: getattr(s, k) for k in SLO_KEYS if k in given and getattr(s, k) is not None}


def _attainment(a) -> Attainment | None:
    if a is None:
        return None
    limits = {k: getattr(a, k) for k in ATTAINMENT_KEYS[1:]}
    if not any(limits.values()):
        raise InputError("slo.attainment: give at least one per-request limit: "
                         f"{_allowed(ATTAINMENT_KEYS[1:])}")
    return Attainment(target=a.target, **limits)


def _parse_knobs(kraw: Any, hw_list: list[str]) -> dict[str, Domain]:
    kraw = {} if kraw is None else kraw
    if not isinstance(kraw, dict):
        raise InputError(f"knobs: must be a mapping of knob -> domain; knobs: {_allowed(KNOBS)}")
    knobs: dict[str, Domain] = {}
    for name, raw in kraw.items():
        if name not in KNOBS or name == "hardware":
            allowed = [k for k in KNOBS if k != "hardware"]
            raise InputError(f"knobs: unknown knob {name!r}; allowed: {_allowed(allowed)}")
        knobs[name] = parse_domain(name, raw, f"knobs.{name}")
    if len(hw_list) > 1:
        knobs["hardware"] = Domain("choice", tuple(hw_list))
    return knobs


def _capacity(c, data: dict) -> Capacity:
    given = data.get("capacity")
    enabled = c.enabled if c.enabled is not None else bool(given)
    return Capacity(enabled=enabled, start_rate=c.start_rate, max_rate=c.max_rate,
                    tolerance=c.tolerance, max_probes=c.max_probes)


def _search(se, objectives) -> SearchSettings:
    # auto: NSGA-II after an initial design, with local search on enumerable spaces
    # (dse.sampling; experiments/search_quality.py measured the choice)
    return SearchSettings(sampler=se.sampler or "auto", n_trials=se.n_trials,
                          timeout_s=se.timeout_s, seed=se.seed, workers=se.workers,
                          population_size=se.population_size,
                          trial_timeout_s=se.trial_timeout_s,
                          initial_design=se.initial_design, local_search=se.local_search,
                          polish=se.polish)


def _study_name(name: Any, source: str) -> str:
    if name is None:  # from the file name, made safe for runs/<name>
        name = re.sub(r"[^A-Za-z0-9._-]", "-", Path(source).stem).lstrip("._-")[:100] or "space"
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"name: {name!r} is not a study name; use letters, digits, '.', '_' "
                         "or '-' (it names the folder runs/<name>), starting with a letter or "
                         "digit, at most 100 characters")
    return name


def _parse_workload(raw: Any, base_dir: Path, model=None) -> dict:
    from dse import schema

    if raw is None:
        raise InputError("workload: required; give 'file: trace.jsonl' or 'generate: {...}'")
    w = schema.validate(schema.Workload, raw, "workload")
    if (w.file is not None) == (w.generate is not None):
        raise InputError("workload: give exactly one of 'file' (a JSONL trace) or 'generate' "
                         "(a generator spec)")
    if w.file is not None:
        return _workload_file(w.file, w.limit, base_dir, model)
    gen = w.generate
    schema.validate(schema.Generate, gen, "workload.generate")
    gen = dict(gen)
    for key in ("input", "output"):
        v = gen.get(key)
        if isinstance(v, dict):
            schema.validate(schema.Length, v, f"workload.generate.{key}")
            if isinstance(v.get("path"), str) and v["path"] and "\0" not in v["path"]:
                gen[key] = {**v, "path": str((base_dir / v["path"]).resolve())}
        elif v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InputError(f"workload.generate.{key}: an integer length >= 1 or a mapping "
                             "{kind: fixed|uniform|zipf|file, value, low, high, theta, path}")
    sample = gen.get("sample_file")
    if isinstance(sample, str) and sample and "\0" not in sample:
        gen["sample_file"] = str((base_dir / sample).resolve())
    import sim

    sim.workload_from_mapping(gen, source="workload.generate")  # every field, files loaded
    return {"kind": "generate", "spec": gen}


def _workload_file(raw_path: Any, limit: int | None, base_dir: Path, model=None) -> dict:
    if not isinstance(raw_path, str) or not raw_path or "\0" in raw_path:
        raise InputError(f"workload.file: a path to a JSONL trace, got {raw_path!r}")
    from sim.paths import exists, is_file

    p = Path(raw_path)
    if not p.is_absolute():
        p = (base_dir / p) if exists(base_dir / p) else p.resolve()
    if not is_file(p):
        raise InputError(f"workload.file: no such file {str(p)!r}")
    import sim

    from sim.validate import check_span, check_token_ids

    try:  # every line checked now, not by each trial
        workload = sim.load_jsonl(p, limit=limit)
        check_span(workload, sim.SimOptions().timeseries_interval_ns)
        if model is not None:
            check_token_ids(workload, model.vocab_size, model.name)
    except InputError as exc:
        raise InputError(f"workload.file: {exc}") from None
    return {"kind": "file", "path": str(p.resolve()), "limit": limit}


def _parse_objectives(raw: Any) -> tuple[Objective, ...]:
    from dse import schema

    if raw is None:
        raw = ["throughput_per_device", "p99_ttft"]
    if not isinstance(raw, list) or not raw:
        raise InputError(f"objectives: a non-empty list from {_allowed(OBJECTIVES)}")
    out = []
    for i, item in enumerate(raw):
        where = f"objectives[{i}]"
        if isinstance(item, str):
            name, direction = item, None
        elif isinstance(item, dict):
            o = schema.validate(schema.ObjectiveItem, item, where)
            name, direction = o.name, o.direction
        else:
            raise InputError(f"{where}: an objective name or {{name, direction}}")
        if not isinstance(name, str) or name not in OBJECTIVES:
            raise InputError(f"{where}: unknown objective {name!r}; allowed: {_allowed(OBJECTIVES)}")
        direction = OBJECTIVES[name] if direction is None else direction
        if not isinstance(direction, str) or direction not in ("minimize", "maximize"):
            raise InputError(f"{where}.direction: unknown value {direction!r}; allowed: "
                             "minimize, maximize")
        if any(o.name == name for o in out):
            raise InputError(f"{where}: objective {name!r} listed twice")
        out.append(Objective(name, direction))
    return tuple(out)


def _check_semantics(space: Space, spec) -> None:
    k = space.knobs
    if "ep" in k and not spec.is_moe and k["ep"].may_take(lambda v: v > 1):
        raise InputError(f"knobs.ep: expert parallelism applies only to MoE models; "
                         f"{space.model} is dense (remove the knob or set it to 1)")
    if "pd_ratio" in k and not ("pd" in k and k["pd"].may_take(lambda v: v)):
        raise InputError("knobs.pd_ratio: applies only when PD disaggregation is on; add "
                         "'pd: true' or 'pd: [false, true]'")
    if "pim_mode" in k and k["pim_mode"].may_take(lambda v: v != "off"):
        no_pim = [h for h in space.hardware if not _has_pim(space.hw_info[h])]
        if len(no_pim) == len(space.hardware):
            raise InputError(f"knobs.pim_mode: hardware {_allowed(no_pim)} has no PIM; "
                             "pim_mode applies only to hardware with PIM")
    for key in ("tp", "pp"):
        if key in k and not k[key].may_take(lambda v: v <= space.devices_per_node):
            raise InputError(f"knobs.{key}: every value exceeds budget.devices_per_node "
                             f"({space.devices_per_node})")
    _check_fits_at_all(space, spec)
    if space.attainment is None and any(o.name == "goodput_per_device" for o in space.objectives):
        raise InputError("objectives: goodput_per_device needs slo.attainment (per-request "
                         "limits) to decide which requests are good")
    if any(o.name == "cost_per_million_tokens" for o in space.objectives) \
            and space.price_per_device_hour is None:
        missing = [h for h in space.hardware if space.hw_info[h].price_per_hour_usd is None]
        if missing:
            raise InputError("objectives: cost_per_million_tokens needs a price; set "
                             "budget.price_per_device_hour (the hardware catalogue has no "
                             f"price for {_allowed(missing)})")
    if space.capacity.enabled:
        if space.workload["kind"] != "generate" or space.workload["spec"].get("concurrency"):
            raise InputError("capacity: capacity search varies the arrival rate; it needs an "
                             "open-loop 'workload.generate' spec (no concurrency)")
        if not space.slo and space.attainment is None:
            raise InputError("capacity: capacity search needs SLOs (slo.*) to decide the "
                             "highest rate that still meets them")
    if space.search.sampler == "grid":
        space.grid()  # raises on infinite domains


def _least(dom: Domain | None) -> int:
    """The smallest value an integer knob's domain takes (1 when it is not a knob)."""
    if dom is None:
        return 1
    vals = dom.finite_values()
    return int(min(vals) if vals is not None else dom.low)


def _check_fits_at_all(space: Space, spec) -> None:
    """Refuse a space none of whose configurations can run (every trial would be rejected):
    no tp value divides the model's attention heads, or even the smallest tp x pp x
    replicas needs more devices than the budget."""
    k = space.knobs
    heads = spec.num_attention_heads
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    if "tp" in k and not any(k["tp"].contains(d) for d in divisors):
        raise InputError(f"knobs.tp: no value divides num_attention_heads={heads} of "
                         f"{space.model}; allowed: {', '.join(map(str, divisors))}")
    if "replicas" in k:
        least = {n: _least(k.get(n)) for n in ("tp", "pp", "replicas")}
        need = least["tp"] * least["pp"] * least["replicas"]
        if need > space.total_devices:
            raise InputError(f"knobs: the smallest configuration (tp={least['tp']}, "
                             f"pp={least['pp']}, replicas={least['replicas']}) needs {need} "
                             f"devices, over budget.total_devices ({space.total_devices})")


def pd_split(ratio: str, replicas: int) -> tuple[int, int]:
    """Prefill/decode instance counts for ``replicas`` instances at ratio 'P:D'."""
    m = _PD_RATIO.match(ratio)
    p, d = int(m.group(1)), int(m.group(2))
    n_p = max(1, min(replicas - 1, round(replicas * p / (p + d))))
    return n_p, replicas - n_p


def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _has_pim(info) -> bool:
    """Whether a hardware catalogue entry pairs with PIM devices."""
    return getattr(info, "pim_config", None) is not None
