"""Each instance's KV cache and the max_model_len vLLM would start with, without simulating.

:func:`kv_capacity` sizes every instance's KV cache as a run would (``memory_budget`` with
the instance's own options and DP group) and answers the questions a deployment asks
before starting vLLM: how many tokens the cache holds, the max_model_len the simulation
serves with, whether vLLM 0.19 would refuse to start at a given max_model_len (its
``check_enough_kv_cache_memory``, worded by :meth:`MemoryBudget.start_refusal`), and the
longest request the cache can hold alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.cluster import ClusterConfig
from sim.memory import MemoryBudget, blocks_per_request, effective_max_model_len, memory_budget
from sim.options import SimOptions
from sim.validate import dp_group_size, instance_model


@dataclass(frozen=True)
class InstanceCapacity:
    """One instance's KV cache as vLLM sizes it."""

    instance_id: int
    #: the binding worker's accounting; None when the KV cache lives in PIM devices
    #: (``enable_attn_offloading``: no vLLM start-up check applies)
    budget: MemoryBudget | None
    #: the max_model_len the simulation serves with: the option, else the model's
    #: max_position_embeddings (vLLM's default)
    max_model_len: int
    #: whether ``max_model_len`` was given as an option (else it is the model's default)
    max_model_len_set: bool

    @property
    def block_size(self) -> int:
        return self.budget.block_size if self.budget is not None else 0

    @property
    def startable_blocks(self) -> int:
        """The blocks vLLM's start-up check counts (the profiled ones, also under
        num_gpu_blocks_override); 0 in PIM."""
        if self.budget is None:
            return 0
        b = self.budget
        return b.profiled_blocks if b.profiled_blocks is not None else b.num_blocks

    @property
    def longest_startable(self) -> int:
        """The longest max_model_len vLLM starts with (whole blocks)."""
        return self.startable_blocks * self.block_size

    @property
    def longest_request(self) -> int | None:
        """The most tokens (prompt + output) one request can reach in this cache alone
        (None in PIM): its last step holds the KV of all but its last output token, in the
        blocks the block pool hands out, all but the one vLLM keeps as its null block
        (``KVCacheManager``). A longer request is never scheduled: vLLM leaves it waiting,
        the simulation stops at it. vLLM's start-up check counts the null block too, so it
        starts with a max_model_len up to ``block_size - 1`` tokens beyond this."""
        if self.budget is None:
            return None
        return (self.budget.num_blocks - 1) * self.block_size + 1

    def holds(self, tokens: int) -> bool:
        """Whether one request reaching ``tokens`` tokens fits this cache alone."""
        return self.budget is None or tokens <= self.longest_request

    def blocks_needed(self, max_model_len: int) -> int:
        """KV blocks one request of ``max_model_len`` tokens holds."""
        return blocks_per_request(max_model_len, self.block_size) if self.budget else 0

    def start_refusal(self, max_model_len: int | None = None) -> str:
        """Why vLLM would refuse to start at ``max_model_len`` (default: the one the
        simulation serves with), or "" when it starts."""
        if self.budget is None:
            return ""
        return self.budget.start_refusal(self.max_model_len if max_model_len is None
                                         else max_model_len)


def kv_capacity(cluster: ClusterConfig, opts: SimOptions) -> list[InstanceCapacity]:
    """Every instance's KV capacity, in instance order (arithmetic only: nothing is built
    or simulated; instances alike but for their ids are sized once). Raises InputError
    where ``memory_budget`` does (weights that do not fit, no room for two blocks): call it
    on a cluster ``validate_cluster`` accepts."""
    out = []
    alike: dict[str, MemoryBudget | None] = {}
    for inst in cluster.instances:
        o = opts.for_instance(inst.overrides)
        model = instance_model(inst, o)
        dp = dp_group_size(cluster, inst)
        key = repr((replace(inst, instance_id=0, node_id=0, dp_group=None), dp))
        if key not in alike:
            alike[key] = None if o.enable_attn_offloading else memory_budget(
                inst, model, o.block_size, o.max_num_batched_tokens, o.max_num_seqs, dp)
        out.append(InstanceCapacity(inst.instance_id, alike[key],
                                    effective_max_model_len(o, model), bool(o.max_model_len)))
    return out
