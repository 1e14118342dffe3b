"""One canonical form per configuration: knobs that cannot change the outcome are normalised.

Two trials that differ only in a knob with no effect (the routing policy when one instance
takes every new request, ``dp`` with a dense model or one replica, two ``pd_ratio`` values
that realise the same prefill/decode split, a prefix tier when prefix caching is off) are
the same configuration: the report lists it once, exports it once, and the study loop can
skip the repeat by comparing :func:`config_key`.

The rules follow what the simulator does with each knob (sim/engine.py): the request
router chooses among the entry instances only (every instance, or the prefill instances
with PD disaggregation); ``dp_group`` changes only how MoE instances step; lower prefix
tiers exist only with prefix caching on; a shared tier differs from per-instance tiers only
when a node holds more than one instance. The canonical parameters are still a valid
configuration with the same cluster and the same simulated result.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dse.space import KNOB_DEFAULTS, KNOB_ORDER, Space, pd_split

__all__ = ["canonical_params", "config_key", "entry_instances", "effective_split", "inert_knobs"]


def _replicas(space: Space, params: dict) -> int:
    from dse.config import replicas_for

    return replicas_for(space, params)


def effective_split(space: Space, params: dict) -> tuple[int, int] | None:
    """(prefill, decode) instance counts when PD disaggregation is on, else None."""
    if not params.get("pd"):
        return None
    replicas = _replicas(space, params)
    if replicas < 2:
        return (1, 0)  # rejected before simulation; kept distinct from a real split
    return pd_split(str(params.get("pd_ratio", "1:1")), replicas)


def entry_instances(space: Space, params: dict) -> int:
    """How many instances the request router chooses among."""
    split = effective_split(space, params)
    return split[0] if split is not None else _replicas(space, params)


def inert_knobs(space: Space, params: dict[str, Any]) -> set[str]:
    """The knobs of (completed) ``params`` that cannot change the simulated result: the
    router's policy with one entry instance, the PD ratio without PD, ``dp`` on a dense model
    or with one replica, the all-to-all backend without a DP group of two or more,
    lower prefix tiers without prefix caching, a shared tier with one instance per node,
    sub-batch interleaving without PIM or with pipeline stages."""
    p = params
    inert: set[str] = set()
    if entry_instances(space, p) <= 1:
        inert.add("routing_policy")
    if effective_split(space, p) is None:
        inert.add("pd_ratio")
    replicas = _replicas(space, p)
    if not space.is_moe or replicas <= 1:
        inert.add("dp")
    if "dp" in inert or min(int(p.get("dp", 1)), replicas) <= 1:
        inert.add("all2all_backend")  # no DP group of two or more: nothing is exchanged
    if not p.get("enable_prefix_caching", True):
        inert.add("prefix_tier")
    per_instance = int(p["tp"]) * int(p["pp"])
    per_node = max(1, space.devices_per_node // per_instance) if per_instance else 1
    if "prefix_tier" in inert or p.get("prefix_tier", "npu") == "npu" \
            or min(per_node, _replicas(space, p)) <= 1:
        inert.add("prefix_sharing")
    if p.get("pim_mode", "off") == "off" or int(p["pp"]) > 1:
        inert.add("sub_batch_interleaving")
    return inert


def canonical_params(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` completed with defaults, every no-effect knob (:func:`inert_knobs`) set to
    its default and ``pd_ratio`` written as the split it realises (e.g. '3:1' for 2:1 and
    3:1 on 4 replicas). Keys starting with '_' are dropped."""
    p = {k: v for k, v in space.complete(dict(params)).items() if not k.startswith("_")}
    p["replicas"] = _replicas(space, p)
    inert = inert_knobs(space, p)
    split = effective_split(space, p)
    if split is None:
        p.pop("pd_ratio", None)
        p["pd"] = False
    else:
        p["pd_ratio"] = f"{split[0]}:{split[1]}"
    if "routing_policy" in inert:
        p["routing_policy"] = KNOB_DEFAULTS["routing_policy"]
    # DP groups are consecutive replicas; only MoE instances step together in them.
    p["dp"] = 1 if "dp" in inert else min(int(p.get("dp", 1)), p["replicas"])
    if "all2all_backend" in inert:
        p["all2all_backend"] = KNOB_DEFAULTS["all2all_backend"]
    if "prefix_tier" in inert:
        p["prefix_tier"] = KNOB_DEFAULTS["prefix_tier"]
    if "prefix_sharing" in inert:
        p["prefix_sharing"] = False
    if "sub_batch_interleaving" in inert:
        p["sub_batch_interleaving"] = False
    order = {k: i for i, k in enumerate(KNOB_ORDER)}
    return dict(sorted(p.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def config_key(space: Space, params: dict[str, Any]) -> str:
    """A short stable string naming the canonical configuration (equal iff the same)."""
    canon = canonical_params(space, params)
    text = json.dumps(canon, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class KeyCache:
    """:func:`config_key` of one space, memoised on the parameters given (a search asks
    for the keys of the same few hundred configurations thousands of times)."""

    def __init__(self, space: Space) -> None:
        self.space = space
        self._keys: dict[tuple, str] = {}

    def __call__(self, params: dict[str, Any]) -> str:
        try:
            # (the type too: 1 and 1.0 are equal keys of a dict, not of config_key)
            memo = tuple(sorted((k, type(v).__name__, v) for k, v in params.items()))
            key = self._keys.get(memo)
        except TypeError:  # an unhashable value: not memoised
            return config_key(self.space, params)
        if key is None:
            key = self._keys[memo] = config_key(self.space, params)
        return key
