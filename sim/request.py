"""Requests: plain data mutated by the scheduler, read by metrics.

A request is created from a workload line (or a generator), routed to one instance, and
moves WAITING -> RUNNING (-> PREEMPTED -> RUNNING ...) -> FINISHED. Token accounting
follows vLLM: ``num_computed`` counts the tokens whose KV is computed or scheduled (it
advances when a step is scheduled, as vLLM's ``num_computed_tokens`` does); the sequence
is the prompt plus the ``num_output`` tokens generated so far; ``num_placeholders`` counts
tokens being sampled by steps still in flight (async scheduling).
"""

from __future__ import annotations

from typing import Final

# (Final: compiled, each use is the number itself, not a lookup of the module's globals)
WAITING: Final = 0
RUNNING: Final = 1
FINISHED: Final = 2
PREEMPTED: Final = 3

def _code_of(f) -> object:
    return getattr(f, "__code__", None)


#: whether the simulator's hot modules run compiled (``sim.native`` loads all of them or
#: none; a compiled function has no Python code object). Where a loop in them would be
#: slower than the builtins' passes as Python, the two ways are chosen by it; both give
#: the same numbers.
COMPILED: Final = _code_of(_code_of) is None

#: a request's fields (its slots), grouped by meaning
FIELDS: Final = (
    # from the workload
    "rid", "arrival_ns", "input_len", "output_len", "input_ids", "output_ids",
    "session_id", "sub_index", "tool_ns", "next_sub", "client_id",
    # scheduling and KV-cache state
    "instance_id", "status", "num_computed", "num_output", "num_placeholders", "num_blocks",
    "block_ids", "prefix_hit", "lower_hit", "cached_hashes", "block_hashes", "preemptions",
    "priority", "rejected",
    # timestamps (ns)
    "queued_ns", "first_scheduled_ns", "first_token_ns", "last_token_ns", "finish_ns",
    "itl_max_ns",
    # PD disaggregation: the KV a decode instance pulls from the prefill instance
    "remote_kv", "ready_ns", "prefill_instance", "kv_transfer_ns", "handoff_blocks",
    "kv_transfer_tokens",
)


class Request:
    __slots__ = FIELDS

    def __init__(self, rid: int, arrival_ns: int, input_len: int, output_len: int,
                 input_ids: list[int] | None = None, output_ids: list[int] | None = None,
                 session_id: str | None = None, sub_index: int = 0, tool_ns: int = 0) -> None:
        self.rid = rid
        self.arrival_ns = arrival_ns
        self.input_len = input_len
        self.output_len = output_len
        self.input_ids = input_ids
        self.output_ids = output_ids
        self.session_id = session_id
        self.sub_index = sub_index
        self.tool_ns = tool_ns
        self.next_sub: Request | None = None
        self.client_id = -1
        self.instance_id = -1
        self.status = WAITING
        self.num_computed = 0
        self.num_output = 0
        self.num_blocks = 0
        self.block_ids: list[int] = []
        self.prefix_hit = 0
        self.preemptions = 0
        #: when its engine took it into the scheduler (vLLM's QUEUED event: the engine
        #: core reads new requests between steps, or at once when idle)
        self.queued_ns = -1
        self.first_scheduled_ns = -1
        self.first_token_ns = -1
        self.last_token_ns = -1
        self.finish_ns = -1
        self.itl_max_ns = 0
        #: leading full blocks of its sequence in the prefix cache (entered, or counted)
        self.cached_hashes = 0
        self.block_hashes: list[int] | None = None
        self.num_placeholders = 0
        self.lower_hit = 0
        self.remote_kv = False
        self.ready_ns = -1
        self.prefill_instance = -1
        self.kv_transfer_ns = 0
        #: scheduling priority (lower runs first) under the "priority" policy
        self.priority = 0
        #: refused at arrival (prompt longer than max_model_len)
        self.rejected = False
        #: PD prefill side: blocks held until the decode side has read them
        self.handoff_blocks: list[int] | None = None
        #: PD decode side: prompt tokens whose KV is transferred (those not cached there)
        self.kv_transfer_tokens = 0

    @property
    def num_tokens(self) -> int:
        """Length of the sequence so far: prompt plus generated tokens."""
        return self.input_len + self.num_output

    def token_ids(self) -> list[int] | None:
        """Token ids of the current sequence, when the workload gave them."""
        if self.input_ids is None:
            return None
        if self.num_output and self.output_ids:
            return self.input_ids + self.output_ids[: self.num_output]
        return self.input_ids

    def __reduce__(self):
        # Pickled and copied field by field: the class compiled (sim.native) has no
        # default way to, and both forms must travel alike (a Workload sent to a worker).
        return (_new_request, (self.rid, self.arrival_ns, self.input_len, self.output_len),
                {name: getattr(self, name) for name in FIELDS})

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        return (f"Request(rid={self.rid}, in={self.input_len}, out={self.output_len}, "
                f"computed={self.num_computed}, generated={self.num_output})")


def _new_request(rid: int, arrival_ns: int, input_len: int, output_len: int) -> Request:
    return Request(rid, arrival_ns, input_len, output_len)
