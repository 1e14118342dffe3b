"""Simulation options: the vLLM engine knobs plus simulator settings.

Defaults follow vLLM 0.19's engine defaults where they exist (block_size 16, prefix
caching on, chunked prefill on, max_num_seqs 256) and the validation setup's token budget
(max_num_batched_tokens 2048). Per-instance values in the cluster config override these.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from sim.errors import InputError

#: vLLM 0.19's ParallelConfig.all2all_backend values the simulator models (the first is
#: vLLM 0.19's default)
ALL2ALL_BACKENDS = ("allgather_reducescatter", "naive", "deepep_high_throughput",
                    "deepep_low_latency")


@dataclass(frozen=True)
class SimOptions:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    #: 0 = no per-request cap on a prefill chunk (vLLM's default)
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    #: vLLM's scheduler_reserve_full_isl: admit a waiting request only if its whole
    #: sequence fits in free KV blocks, not merely its first chunk
    reserve_full_isl: bool = True
    #: vLLM's async scheduling (step N+1 is scheduled before step N's outputs are
    #: processed); None follows the simulated vLLM version (on from 0.14, as in 0.19)
    async_scheduling: bool | None = None
    #: the vLLM release whose defaults are simulated where rules changed between releases
    vllm_version: str = "0.19.0"
    #: waiting-queue order and preemption victim: "fcfs" or "priority" (vLLM's policy)
    scheduling_policy: str = "fcfs"
    #: longest sequence (prompt + output); longer prompts are rejected, outputs stop
    #: there. None: no limit beyond the KV capacity
    max_model_len: int | None = None
    #: lower prefix-cache tier for blocks evicted from the NPU: None, "CPU" or "CXL"
    prefix_storage: str | None = None
    #: all instances of a node share one lower-tier pool
    enable_prefix_sharing: bool = False
    routing_policy: str = "LOAD"
    #: run decode attention on the node's PIM devices (cpu_mem.pim_config)
    enable_attn_offloading: bool = False
    #: "local": PIM in the node's CPU memory (q/out over the memory bus); "pool": a PIM pool
    #: reached over the cluster's links
    pim_mode: str = "local"
    #: NeuPIMs sub-batch interleaving: two sub-batches overlap NPU work and PIM attention
    enable_sub_batch_interleaving: bool = False
    #: MoE expert-gate policy (BALANCED, RR, RAND or a registered one)
    expert_routing_policy: str = "RAND"
    #: how MoE layers exchange tokens across a DP group (vLLM's all2all_backend):
    #: allgather_reducescatter (vLLM 0.19's default), naive, deepep_high_throughput,
    #: deepep_low_latency
    all2all_backend: str = "allgather_reducescatter"
    #: largest CUDA-graph batch (vLLM's max_cudagraph_capture_size); DP ranks pad to a common
    #: token count when all of them run a graph. None: vLLM's default, min(2 * max_num_seqs,
    #: 512); 0: eager mode (no graphs, no DP padding)
    max_cudagraph_capture_size: int | None = None
    #: PD disaggregation: how a finished prefill picks its decode instance (LOAD, RR, LEAST_KV)
    pd_decode_policy: str = "LOAD"
    seed: int = 0
    #: weight quantization as vLLM's --quantization: None (the checkpoint's) or "fp8" (W8A8)
    quantization: str | None = None
    #: vLLM's --kv-cache-dtype: "auto" (the model dtype), "fp8", "fp8_e4m3", "fp8_e5m2", ...
    kv_cache_dtype: str = "auto"
    #: "auto" (measured bundle, then aiconfigurator's database, then roofline) or a
    #: registered provider name (sim.latency.base.LATENCY_PROVIDERS)
    latency_provider: str = "auto"
    #: extra folders searched for profile bundles (before the project's and ../shared's)
    profiles_dirs: tuple[str, ...] = ()
    #: "inproc" (default) or "subprocess" (a long-lived astra-sim process)
    backend: str = "inproc"
    astra_sim_bin: str | None = None
    #: remember the backend's results for repeated iteration parts (LLMServingSim's
    #: computation reuse); off sends every iteration to the backend
    computation_reuse: bool = True
    #: width of the time-series buckets
    timeseries_interval_ns: int = 1_000_000_000
    #: stop after this much simulated time (None = run to completion)
    max_sim_time_ns: int | None = None
    progress: bool = False
    #: leap over stretches of pure-decode steps in one computation (sim.leap); off steps
    #: every iteration (the reference: both give identical output)
    event_leaping: bool = True
    extra: dict = field(default_factory=dict)

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
        if not isinstance(self.timeseries_interval_ns, int) or self.timeseries_interval_ns < 1:
            raise InputError("option timeseries_interval_ns must be a positive integer, got "
                             f"{self.timeseries_interval_ns!r}")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(v).split(".")[:3])


OPTION_NAMES = tuple(f.name for f in fields(SimOptions))


#: block sizes vLLM 0.19 accepts (vllm/config/cache.py, ``BlockSize``)
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)


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
