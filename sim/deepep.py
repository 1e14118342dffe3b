"""DeepEP's dispatch and combine kernels as measured on a card, for an MoE layer's exchange
with vLLM's ``deepep_low_latency`` / ``deepep_high_throughput`` all2all backends.

aiconfigurator-core (the ``aic`` extra) ships DeepEP's own kernels timed inside one node
of H100, H200 and B200 GPUs (8 of them; SGLang's harness: ``comm/sglang/<version>/
wideep_deepep_ll_perf.parquet`` and ``wideep_deepep_normal_perf.parquet``), per MoE shape
(hidden size, top-k, experts) and tokens a rank: low-latency dispatch / combine, and the
high-throughput (normal) kernels at each SM budget, of which vLLM's 20 SMs are read. The
time depends on the shape beyond its bytes (few experts concentrate the traffic on a few
ranks: Mixtral's 8 experts take several times what 128 do at the same bytes), so only a
model whose shape was measured takes these times; any other runs on the link model.

Dispatch was measured in FP8 with one fp32 scale per 128 values (what SGLang sends); vLLM
dispatches an unquantized model's activations in its own dtype, so such a dispatch is read
at the token count that moves the same bytes in FP8 (about twice as many for bf16). The
combine returns the expert outputs in bf16 in both. vLLM sends a rank's tokens through the
low-latency kernels ``VLLM_MOE_DP_CHUNK_SIZE`` (256) at a time, a dispatch and a combine
per chunk. The measurements are of 8-rank groups;
a smaller EP group inside one node takes them as they are (the kernels' per-call latency
and per-byte cost, which dominate, are the node's).
"""

from __future__ import annotations

import re
from functools import cache

from sim.backend import interpolate_log_log

#: vLLM 0.19's DeepEP high-throughput kernels run on this many SMs (its DeepEP manager)
VLLM_DEEPEP_HT_SMS = 20
#: vLLM sends a rank's tokens through DeepEP's low-latency kernels this many at a time
#: (VLLM_MOE_DP_CHUNK_SIZE's default: the batched-activation kernels' buffer size)
VLLM_MOE_DP_CHUNK_SIZE = 256
#: FP8 dispatch: one byte a value and one fp32 scale per 128 values
FP8_SCALE_GROUP = 128
FILES = {"deepep_low_latency": "wideep_deepep_ll_perf.parquet",
         "deepep_high_throughput": "wideep_deepep_normal_perf.parquet"}


@cache
def _tables(hardware: str, kind: str) -> dict | None:
    """{(hidden, topk, experts): (dispatch curve, combine curve)} of ``kind`` on the card,
    each ((tokens, us), ...), from the newest aiconfigurator SGLang version that measured
    it; None without the data (aiconfigurator-core absent, or not this card)."""
    from sim.latency.aic import aic_system_data

    root = aic_system_data(hardware)
    files = [] if root is None else sorted(
        root.glob(f"comm/sglang/*/{FILES[kind]}"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)])
    if not files:
        return None
    import pandas as pd

    df = pd.read_parquet(files[-1])
    if kind == "deepep_low_latency":
        dispatch, combine = df["dispatch_avg_t_us"], df["combine_avg_t_us"]
    else:
        df = df[(df["dispatch_sms"] == VLLM_DEEPEP_HT_SMS)
                & (df["combine_sms"] == VLLM_DEEPEP_HT_SMS)]
        dispatch = df["dispatch_transmit_us"] + df["dispatch_notify_us"]
        combine = df["combine_transmit_us"] + df["combine_notify_us"]
    df = df.assign(dispatch=dispatch, combine=combine)
    out = {}
    for shape, g in df.groupby(["hidden_size", "num_topk", "num_experts"]):
        g = g.sort_values("num_token")
        tokens = [int(t) for t in g["num_token"]]
        out[tuple(int(x) for x in shape)] = tuple(
            tuple(zip(tokens, (float(x) for x in g[col]))) for col in ("dispatch", "combine"))
    return out


def deepep_exchange_ns(hardware: str, kind: str, hidden: int, topk: int, experts: int,
                       tokens: int, dispatch_bytes: int) -> int | None:
    """One MoE layer's DeepEP dispatch + combine for a rank with ``tokens`` tokens, ns, as
    measured on ``hardware`` for the shape (``hidden`` values a token, ``topk`` of
    ``experts``), dispatching ``dispatch_bytes`` a value (2 for bf16, 1 for FP8); None
    where that card or shape was not measured."""
    tables = _tables(hardware, kind)
    row = None if tables is None else tables.get((hidden, topk, experts))
    if row is None or tokens <= 0:
        return None
    dispatch, combine = row
    # the FP8 token count that moves the same bytes as a dispatch of n tokens
    fp8_bytes = hidden + hidden // FP8_SCALE_GROUP * 4
    scale = hidden * dispatch_bytes / fp8_bytes if dispatch_bytes > 1 else 1.0

    def call(n: int) -> float:
        return interpolate_log_log(dispatch, n * scale) + interpolate_log_log(combine, n)

    if kind != "deepep_low_latency":
        return int(call(tokens) * 1e3)
    # the low-latency kernels take the rank's tokens a chunk at a time
    full, rest = divmod(tokens, VLLM_MOE_DP_CHUNK_SIZE)
    us = full * call(VLLM_MOE_DP_CHUNK_SIZE) + (call(rest) if rest else 0.0)
    return int(us * 1e3)
