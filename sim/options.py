"""Simulation options: the vLLM engine knobs plus simulator settings, each declared once.

Defaults follow vLLM 0.19's engine defaults where they exist (block_size 16, prefix
caching on, chunked prefill on, max_num_seqs 256) and the validation setup's token budget
(max_num_batched_tokens 2048). Per-instance values in the cluster config override these.

Every field of :class:`SimOptions` carries its declaration (:class:`Option` in the field's
metadata): help text, allowed values, scope (``instance``: a cluster file's instance may
override it) and, where searched, its dse knob (:class:`Knob`). The ``llmsim run`` flags
(:func:`add_cli_flags`, :func:`options_from_args`), the cluster loader's per-instance keys
(:data:`INSTANCE_OPTIONS`), dse's knob table (:func:`knob_table`) and the README's option
reference (``python -m dse.reference``) are generated from it, so adding an
option the scheduler understands to ``llmsim run`` and to the search touches this file only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from sim.errors import InputError

#: vLLM 0.19's ParallelConfig.all2all_backend values the simulator models (the first is
#: vLLM 0.19's default)
ALL2ALL_BACKENDS = ("allgather_reducescatter", "naive", "deepep_high_throughput",
                    "deepep_low_latency")
#: block sizes vLLM 0.19 accepts (vllm/config/cache.py, ``BlockSize``)
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)

#: vLLM's default gpu_memory_utilization: a cluster instance's npu_mem.mem_util when absent
#: (not a SimOptions field: it belongs to the cluster file, and llmsim's
#: --gpu-memory-utilization overrides it there)
DEFAULT_MEM_UTIL = 0.9

GLOBAL, INSTANCE = "global", "instance"


def _routing_policies() -> list[str]:
    from sim.router import ROUTING_POLICIES

    return list(ROUTING_POLICIES.names())


def _latency_providers() -> list[str]:
    from sim.latency.base import provider_names

    return provider_names()


def _kv_cache_dtypes() -> list[str]:
    from sim.model import KV_CACHE_DTYPES

    return list(KV_CACHE_DTYPES)


@dataclass(frozen=True)
class Knob:
    """How an option is searched by dse: where it is drawn and which values a space may give.

    ``after``: the knob drawn just before this one (conditions look at earlier knobs); None:
    right after the option knob declared before it. ``values``: the values a space may
    search (a tuple or a function returning the names), None: any of the option's type.
    ``minimum``: the least integer. ``none``: how a space spells the option's None.
    """

    after: str | None = None
    values: tuple | Callable[[], list] | None = None
    minimum: int = 1
    none: str | None = None
    #: why a value outside ``values`` is refused (integers): "is not one vLLM accepts"
    refusal: str = "is not allowed"


@dataclass(frozen=True)
class VllmArg:
    """How a value is spelled on vLLM 0.19's ``vllm serve`` command line (an option here, or
    a cluster file's field in :mod:`sim.cluster_schema`): ``flag`` and the value; booleans
    as ``flag`` / ``--no-<flag>`` (``negatable``) or ``flag`` alone when true. ``omit``:
    values that leave the flag out (vLLM's own default, or "not set"); ``switch``: the flag
    alone whenever the value is not omitted; ``special``: (value, arguments) pairs spelled
    otherwise; ``needs``: flags that must be on the line for this one to matter."""

    flag: str
    omit: tuple = ()
    switch: bool = False
    negatable: bool = True
    special: tuple[tuple[Any, tuple[str, ...]], ...] = ()
    needs: tuple[str, ...] = ()

    def render(self, value: Any) -> list[str]:
        """The arguments that give ``value`` (none where omitted)."""
        if any(value == v and type(value) is type(v) for v in self.omit):
            return []
        for v, args in self.special:
            if value == v and type(value) is type(v):
                return list(args)
        if self.switch:
            return [self.flag]
        if isinstance(value, bool):
            return [self.flag] if value else ([f"--no-{self.flag[2:]}"] if self.negatable
                                              else [])
        return [self.flag, str(value)]

    def spelled(self, boolean: bool = False) -> str:
        """The flag as the reference shows it (``boolean``: the value is true or false)."""
        out = self.flag
        if boolean and self.negatable and not self.switch:
            out += f" / --no-{self.flag[2:]}"
        notes = [f"{' '.join(args)} for {v!r}" for v, args in self.special]
        left_out = [repr(v) for v in self.omit if v is not None]
        if left_out:
            notes.append(f"left out for {', '.join(left_out)}")
        return out + (f" ({'; '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class Option:
    """One option's declaration. ``flag``: the ``llmsim run`` flag ("" derives it from the
    name, None: no flag); ``choices``: what the flag accepts (checked by argparse);
    ``cli_type``/``cli_default``/``from_cli``: a flag in other units than the field."""

    help: str
    scope: str = GLOBAL
    flag: str | None = ""
    choices: tuple | Callable[[], list] | None = None
    knob: Knob | None = None
    cli_type: type | None = None
    cli_default: Any = None
    from_cli: Callable[[Any], Any] | None = None
    #: accepted values named in the reference where the flag does not check them
    allowed: str = ""
    #: the least value an integer option takes (checked in a cluster file's instance)
    minimum: int | None = None
    #: what a cluster file's instance may give where ``choices`` is None (None: any value
    #: of the option's type)
    accepts: tuple | Callable[[], list] | None = None
    #: how ``vllm serve`` spells it (None: not a vLLM engine flag)
    vllm: VllmArg | None = None


def option(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING,
           **meta) -> Any:
    """A SimOptions field with its declaration."""
    return field(default=default, default_factory=default_factory,
                 metadata={"option": Option(help=help, **meta)})


@dataclass(frozen=True)
class SimOptions:
    max_num_seqs: int = option(
        256, "most requests in one step (vLLM's max_num_seqs)", scope=INSTANCE,
        knob=Knob(after="prefix_sharing"), minimum=1, vllm=VllmArg("--max-num-seqs"))
    max_num_batched_tokens: int = option(
        2048, "token budget of one step (vLLM's max_num_batched_tokens; 0 = no budget, as "
        "LLMServingSim's decode instances use)", scope=INSTANCE, knob=Knob(), minimum=0,
        vllm=VllmArg("--max-num-batched-tokens", omit=(0,)))
    long_prefill_token_threshold: int = option(
        0, "cap on one request's prefill chunk per step (0 = no cap, vLLM's default)",
        scope=INSTANCE, knob=Knob(minimum=0), minimum=0,
        vllm=VllmArg("--long-prefill-token-threshold", omit=(0,)))
    block_size: int = option(
        16, "tokens per KV block", scope=INSTANCE,
        knob=Knob(values=VLLM_BLOCK_SIZES, refusal="is not one vLLM accepts"), minimum=1,
        vllm=VllmArg("--block-size"))
    enable_prefix_caching: bool = option(
        True, "vLLM's automatic prefix caching", scope=INSTANCE, knob=Knob(),
        vllm=VllmArg("--enable-prefix-caching"))
    enable_chunked_prefill: bool = option(
        True, "split long prompts over steps within the token budget", scope=INSTANCE,
        knob=Knob(), vllm=VllmArg("--enable-chunked-prefill"))
    reserve_full_isl: bool = option(
        True, "vLLM's scheduler_reserve_full_isl admission rule: admit a waiting request only "
        "if its whole sequence fits in free KV blocks, not merely its first chunk")
    async_scheduling: bool | None = option(
        None, "vLLM's async scheduling: step N+1 is scheduled before step N's outputs are "
        "processed (default: as the simulated --vllm-version, on from 0.14)",
        vllm=VllmArg("--async-scheduling", omit=(None,)))
    vllm_version: str = option(
        "0.19.0", "vLLM release whose defaults are simulated where rules changed")
    scheduling_policy: str = option(
        "fcfs", "waiting order and preemption victim (requests' 'priority' field)",
        choices=("fcfs", "priority"), vllm=VllmArg("--scheduling-policy", omit=("fcfs",)))
    max_model_len: int | None = option(
        None, "longest sequence (prompt + output): longer prompts are rejected, outputs stop "
        "there (default: the model's max_position_embeddings, as vLLM derives it)",
        vllm=VllmArg("--max-model-len", omit=(None,)))
    prefix_storage: str | None = option(
        None, "keep blocks evicted from the NPU in a lower tier (cluster cpu_mem/cxl_mem)",
        choices=("CPU", "CXL"))
    enable_prefix_sharing: bool = option(
        False, "all instances of a node share the lower-tier prefix pool")
    routing_policy: str = option(
        "LOAD", "how the router picks an instance for a new request",
        flag="--request-routing-policy", knob=Knob(values=_routing_policies),
        allowed="a registered routing policy (sim.router)")
    enable_attn_offloading: bool = option(
        False, "run decode attention on the node's PIM devices (cpu_mem.pim_config)")
    pim_mode: str = option(
        "local", "local: PIM in the node's CPU memory (q/out over the memory bus); pool: a PIM "
        "pool reached over the cluster's links", choices=("local", "pool"))
    enable_sub_batch_interleaving: bool = option(
        False, "NeuPIMs: overlap two sub-batches' NPU work and PIM attention")
    expert_routing_policy: str = option(
        "RAND", "MoE gate policy: BALANCED, RR, RAND or a registered one")
    all2all_backend: str = option(
        ALL2ALL_BACKENDS[0], "how MoE layers exchange tokens across a DP group (vLLM's "
        "all2all_backend; default: vLLM 0.19's allgather_reducescatter)", scope=INSTANCE,
        choices=ALL2ALL_BACKENDS, knob=Knob(after="dp"),
        vllm=VllmArg("--all2all-backend",
                     needs=("--data-parallel-size", "--enable-expert-parallel")))
    disable_custom_all_reduce: bool = option(
        False, "vLLM's --disable-custom-all-reduce: TP all-reduces always through NCCL (a "
        "ring on the link). Otherwise on the catalogue's link a TP all-reduce takes vLLM's "
        "measured time for the card and TP degree (the catalogue's vllm_all_reduce_us); on "
        "a cluster file's link, at tp 2 on GPUs with peer access, one below vLLM's custom "
        "all-reduce limit (8 MiB; 2 MiB on compute capability 10.0, 4 MiB on 10.3) runs as "
        "its one-stage kernel: one transfer of the whole buffer from the peer",
        scope=INSTANCE,
        vllm=VllmArg("--disable-custom-all-reduce", omit=(False,), switch=True,
                     negatable=False))
    max_cudagraph_capture_size: int | None = option(
        None, "largest CUDA-graph batch (vLLM's max_cudagraph_capture_size): a step of at "
        "most that many tokens runs its token-wise layers and TP all-reduces padded to the "
        "next capture size, and DP ranks pad to a common token count when all of them run a "
        "graph. Default: min(2 * max_num_seqs, 512); 0: eager mode", flag=None,
        vllm=VllmArg("--max-cudagraph-capture-size", omit=(None,),
                     special=((0, ("--enforce-eager",)),)))
    pd_decode_policy: str = option(
        "LOAD", "PD disaggregation: how a finished prefill picks its decode instance: LOAD, "
        "RR or LEAST_KV")
    seed: int = option(0, "random seed (gate policies, sampled lengths)")
    quantization: str | None = option(
        None, "weight quantization as vllm serve: fp8 (W8A8); default: the checkpoint's",
        scope=INSTANCE, knob=Knob(after="collective_algorithm", values=("none", "fp8"),
                                  none="none"), allowed="fp8", accepts=("fp8",),
        vllm=VllmArg("--quantization", omit=(None,)))
    kv_cache_dtype: str = option(
        "auto", "KV-cache dtype as vllm serve: auto (the model dtype), fp8, fp8_e4m3, "
        "fp8_e5m2, bfloat16", scope=INSTANCE, knob=Knob(values=("auto", "fp8")),
        accepts=_kv_cache_dtypes, vllm=VllmArg("--kv-cache-dtype", omit=("auto",)))
    latency_provider: str = option(
        "auto", "auto (measured bundle, then aiconfigurator's database, then roofline) or a "
        "registered provider", choices=_latency_providers,
        allowed="auto or a name in sim.latency's registry")
    profiles_dirs: tuple[str, ...] = option(
        (), "extra folder of profile bundles (<HW>/<org>/<model>/<variant>/), searched before "
        "the project's and ../shared's; repeatable", flag="--profiles", cli_default=[],
        from_cli=tuple)
    backend: str = option(
        "inproc", "system backend: in-process ASTRA-Sim or a long-lived astra-sim process",
        choices=("inproc", "subprocess"))
    astra_sim_bin: str | None = option(None, "astra-sim executable for --backend subprocess")
    computation_reuse: bool = option(
        True, "reuse the backend's results for identical iteration parts (LLMServingSim's "
        "computation reuse; off simulates every one anew: same output, slower)")
    event_leaping: bool = option(
        True, "advance stretches of pure-decode steps in one computation (sim.leap); off "
        "steps every iteration (the reference: same output, slower)")
    timeseries_interval_ns: int = option(
        1_000_000_000, "width of the time-series buckets", flag="--timeseries-interval-s",
        cli_type=float, cli_default=1.0, from_cli=lambda s: int(s * 1e9))
    max_sim_time_ns: int | None = option(
        None, "stop after this much simulated time (default: run to completion)", flag=None)
    progress: bool = option(False, "a progress line on stderr", flag=None)
    extra: dict = option(help="free-form settings for experiments", default_factory=dict,
                         flag=None)

    @property
    def async_enabled(self) -> bool:
        """Whether async scheduling is on: the option, or the simulated version's default."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        return _version_tuple(self.vllm_version) >= (0, 14)

    def replace(self, **kw) -> SimOptions:
        return replace(self, **kw)

    def for_instance(self, overrides: dict) -> SimOptions:
        """These options with an instance's per-instance overrides applied."""
        return replace(self, **overrides) if overrides else self

    def validate(self) -> None:
        def pos(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"option {name} must be a positive integer, got {v!r}")
        for name in ("max_num_seqs", "block_size"):
            pos(name)
        mnbt = self.max_num_batched_tokens
        if not isinstance(mnbt, int) or isinstance(mnbt, bool) or mnbt < 0:
            raise InputError("option max_num_batched_tokens must be a positive integer (0 = no "
                             f"token budget, as LLMServingSim's decode instances use), got {mnbt!r}")
        if self.long_prefill_token_threshold < 0:
            raise InputError("option long_prefill_token_threshold must be >= 0")
        if self.prefix_storage not in (None, "CPU", "CXL"):
            raise InputError(f"prefix_storage must be CPU or CXL, got {self.prefix_storage!r}")
        if self.enable_prefix_sharing and self.prefix_storage is None:
            raise InputError("enable_prefix_sharing needs a prefix_storage tier (CPU or CXL)")
        if self.pim_mode not in ("local", "pool"):
            raise InputError(f"pim_mode must be local or pool, got {self.pim_mode!r}")
        if self.enable_sub_batch_interleaving and not self.enable_attn_offloading:
            raise InputError("sub-batch interleaving overlaps NPU work with PIM attention: it "
                             "needs --enable-attn-offloading")
        from sim.model import check_precision
        check_precision(self.quantization, self.kv_cache_dtype, quant_label="option quantization",
                        kv_label="option kv_cache_dtype")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise InputError(f"option scheduling_policy must be fcfs or priority, got "
                             f"{self.scheduling_policy!r}")
        if self.max_model_len is not None and (
                not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise InputError(f"option max_model_len must be an integer >= 2, got "
                             f"{self.max_model_len!r}")
        try:
            _version_tuple(self.vllm_version)
        except ValueError:
            raise InputError(f"option vllm_version must look like 0.19.0, got "
                             f"{self.vllm_version!r}") from None
        if self.all2all_backend not in ALL2ALL_BACKENDS:
            raise InputError(f"all2all_backend must be one of {', '.join(ALL2ALL_BACKENDS)}, "
                             f"got {self.all2all_backend!r}")
        cap = self.max_cudagraph_capture_size
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 0):
            raise InputError("option max_cudagraph_capture_size must be an integer >= 0 (0 = "
                             f"eager mode), got {cap!r}")
        if self.backend not in ("inproc", "subprocess"):
            raise InputError(f"unknown backend {self.backend!r}; known: inproc, subprocess")
        if self.astra_sim_bin is not None:
            if self.backend != "subprocess":
                raise InputError(f"option astra_sim_bin (--astra-sim-bin {self.astra_sim_bin!r}) "
                                 "is used only with --backend subprocess; backend is "
                                 f"{self.backend!r}")
            from sim.paths import check_executable
            check_executable(self.astra_sim_bin, "--astra-sim-bin")
        if not isinstance(self.timeseries_interval_ns, int) or \
                not 10**6 <= self.timeseries_interval_ns <= 10**18:
            raise InputError("option timeseries_interval_ns must be an integer in "
                             f"10**6..10**18 (1 ms..1e9 s), got {self.timeseries_interval_ns!r}")


def _version_tuple(v: str) -> tuple[int, ...]:
    """``"0.19.0"`` as ``(0, 19, 0)`` (parts past the third, like ``dev1``, ignored); a
    part that is not plain digits (``-1``, ``+0``, `` 0``) is a ValueError."""
    parts = str(v).split(".")[:3]
    if not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(v)
    return tuple(int(p) for p in parts)


OPTION_NAMES = tuple(f.name for f in fields(SimOptions))


# ---------------------------------------------------------------- what the declarations give
def declarations() -> list[tuple[str, str, Any, Option]]:
    """(name, value type, default, declaration) of every option, in declaration order.
    The value type is the field's annotation without ``| None`` (int, bool, str, ...)."""
    out = []
    for f in fields(SimOptions):
        default = f.default if f.default is not MISSING else f.default_factory()
        kind = str(f.type).split(" | ")[0].split("[")[0]
        out.append((f.name, kind, default, f.metadata["option"]))
    return out


def _resolve(values) -> list | None:
    return list(values()) if callable(values) else (list(values) if values is not None else None)


#: options a cluster file's instance may set for itself (LLMServingSim's per-instance fields)
INSTANCE_OPTIONS = tuple(name for name, _, _, o in declarations() if o.scope == INSTANCE)


def flag_of(name: str, opt: Option) -> str | None:
    return None if opt.flag is None else (opt.flag or "--" + name.replace("_", "-"))


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def add_cli_flags(parser, names: tuple[str, ...] | None = None,
                  aliases: dict[str, str] | None = None) -> None:
    """One ``llmsim run`` flag per option with a flag, as its declaration says (``names``:
    only these options; ``aliases``: option -> an extra short flag)."""
    import argparse

    for name, kind, default, opt in declarations():
        flag = flag_of(name, opt)
        if flag is None or (names is not None and name not in names):
            continue
        kw: dict[str, Any] = {"help": opt.help}
        if kind == "bool":
            if default is False:
                kw["action"] = "store_true"
            else:
                kw.update(action=argparse.BooleanOptionalAction, default=default)
        elif kind == "tuple":
            kw.update(action="append", default=list(opt.cli_default))
        else:
            kw["default"] = default if opt.cli_default is None else opt.cli_default
            if kind != "str" or opt.cli_type is not None:
                kw["type"] = opt.cli_type or {"int": int, "float": float}[kind]
            if opt.choices is not None:
                kw["choices"] = _resolve(opt.choices)
        parser.add_argument(flag, *([aliases[name]] if aliases and name in aliases else []),
                            **kw)


def options_from_args(args, **extra) -> SimOptions:
    """The SimOptions the flags of :func:`add_cli_flags` name; ``extra`` sets the rest."""
    kw = {}
    for name, _, _, opt in declarations():
        flag = flag_of(name, opt)
        if flag is None:
            continue
        value = getattr(args, _dest(flag))
        kw[name] = opt.from_cli(value) if opt.from_cli else value
    return SimOptions(**kw, **extra)


@dataclass(frozen=True)
class KnobSpec:
    """A dse knob of an option: its type, default as a space spells it, allowed values,
    least integer, the knob it is drawn after."""

    name: str
    kind: str  # "int" | "bool" | "str"
    default: Any
    values: list | None
    minimum: int
    after: str
    none: str | None
    refusal: str

    def to_option(self, value: Any) -> Any:
        """The SimOptions value of a knob value ("none" -> None where so declared)."""
        return None if self.none is not None and value == self.none else value


def knob_table() -> list[KnobSpec]:
    """Every option searched by dse, in declaration order (values resolved now)."""
    out, prev = [], None
    for name, kind, default, opt in declarations():
        k = opt.knob
        if k is None:
            continue
        values = _resolve(k.values)
        if values is None and opt.choices is not None:
            values = _resolve(opt.choices)
        space_default = k.none if default is None and k.none is not None else default
        out.append(KnobSpec(name, kind, space_default, values, k.minimum, k.after or prev,
                            k.none, k.refusal))
        prev = name
    return out


def markdown_reference() -> str:
    """The README's option table: one row per option."""
    rows = ["| option | `llmsim run` flag | scope | dse knob | `vllm serve` | default | allowed | "
            "meaning |", "|---|---|---|---|---|---|---|---|"]
    for name, kind, default, opt in declarations():
        flag = flag_of(name, opt)
        if kind == "bool" and flag and default is not False:
            flag = f"{flag} / --no-{flag[2:]}"
        allowed = opt.allowed
        if not allowed and isinstance(opt.choices, tuple):  # a registry: named in `allowed`
            allowed = ", ".join(map(str, opt.choices))
        if opt.knob is not None and isinstance(opt.knob.values, tuple):
            knob = "yes: " + ", ".join(map(str, opt.knob.values))
        else:
            knob = "yes" if opt.knob is not None else ""
        vllm = f"`{opt.vllm.spelled(kind == 'bool')}`" if opt.vllm is not None else ""
        cells = [f"`{name}`", f"`{flag}`" if flag else "", opt.scope if opt.scope == INSTANCE
                 else "", knob, vllm, f"`{default!r}`", allowed, opt.help.replace("|", "\\|")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"



def vllm_refusal(max_num_seqs: int, max_num_batched_tokens: int, block_size: int) -> str | None:
    """Why vLLM would refuse to start with these scheduler settings, or None.

    vLLM's SchedulerConfig refuses a token budget below max_num_seqs (whether or not
    chunked prefill is on) and its CacheConfig a block size outside ``VLLM_BLOCK_SIZES``.
    A budget of 0 means "no budget" here (LLMServingSim's decode instances) and is allowed.
    The simulator itself could run these; the user-facing entry points (``llmsim run``,
    the search) refuse them so that nothing is simulated that vLLM would not serve.
    """
    if block_size not in VLLM_BLOCK_SIZES:
        return (f"block_size {block_size} is not one vLLM accepts; allowed: "
                + ", ".join(map(str, VLLM_BLOCK_SIZES)))
    if 0 < max_num_batched_tokens < max_num_seqs:
        return (f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                f"({max_num_seqs}), as vLLM requires")
    return None



def check_profile_dirs(dirs) -> None:
    """Each ``--profiles`` folder exists, or an InputError naming it."""
    from sim.paths import is_dir

    for d in dirs:
        if not str(d):  # Path('') is the working folder
            raise InputError("--profiles '' is empty; give a folder of profile bundles "
                             "(<HW>/<org>/<model>/<variant>/)")
        if not is_dir(d):
            raise InputError(f"--profiles {d!r}: no such folder (a folder of profile bundles "
                             "<HW>/<org>/<model>/<variant>/)")


def check_engine_flags(args) -> None:
    """The checks ``llmsim run`` and ``llmsim bench`` share on their engine flags, before
    anything is simulated: the seed, the profile folders, and what vLLM would refuse."""
    if args.seed < 0:
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    check_profile_dirs(args.profiles)
    why = vllm_refusal(args.max_num_seqs, args.max_num_batched_tokens, args.block_size)
    if why:
        raise InputError(f"--max-num-seqs/--max-num-batched-tokens/--block-size: {why}")
