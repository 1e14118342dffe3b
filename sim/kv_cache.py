# mypy: disable-error-code="union-attr,index,arg-type,attr-defined"
# (compiled by mypyc where a C compiler is at hand: sim/native.py. Those checks stay off
# because an Optional read after a guard compiles to a generic, checked operation.)
"""Paged KV-cache blocks with prefix caching, following vLLM V1's block pool (v0.19).

Blocks hold ``block_size`` tokens. Every full block of a request's known tokens has a
hash chained on its parent's (``hash((parent, token ids))``), as vLLM's block hasher
makes them; a hash table maps each hash to the cached blocks holding it. A new request
reuses the longest run of leading block hashes found in the table. Freed blocks go to an
LRU free queue but keep their cached contents until the queue hands them out again; a
prefix hit on a free cached block revives it.

Rules taken from vLLM (``kv_cache_manager.py``, ``block_pool.py``,
``single_type_kv_cache_manager.py``) and implemented here:
- one block is reserved as the null block, so ``num_blocks - 1`` are usable;
- a full-prompt hit still recomputes the last token (the hit is capped at
  ``(num_tokens - 1) // block_size`` blocks);
- blocks enter the prefix cache when they are allocated, up to the request's known
  tokens (``allocate`` caches ``min(computed + new, num_tokens)`` tokens): a request
  admitted later in the same step already shares them;
- an identical full block computed twice is cached twice (the table keeps both; a hit
  takes the first), and evicting a block drops only that block: blocks cached after it
  stay reachable once the same prefix is cached again;
- freed blocks enter the free queue tail-first (a request's last blocks are evicted
  before its first ones), and allocation takes from the head (least recently freed);
- requests without token ids still hash their blocks (salted by request id), so a
  preempted request hits its own blocks again; so do generated tokens whose ids the
  workload does not give;
- ``reserve_full_isl``: a waiting request is admitted only if blocks for its whole current
  sequence, not just this chunk, are free.

Private blocks (the simulator's runs: ``private_depths``). A block whose hash no other
request of the workload can have (its tokens from the start of the sequence are no other
request's: a hash chains on its parent, so every block after it is private too; a key
holding the request id, ``(-1, rid, i)`` or ``(-2, rid, i)``, always is) can only be hit
by the same request, looked up again after a preemption. Such blocks are cached without
entering the table: the request counts them (``cached_hashes``); they enter it (in block
order, as they would have) when the request is preempted, and a finished request's are
dropped. Lookups, evictions and the watched-hash checks of event leaps see what they
would with every block entered at once; nothing else reads the table. A lower tier
receives each evicted cached block: with one attached, every block enters at once.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import chain
from typing import Final

from sim.request import COMPILED, FINISHED, Request


#: the first private block (``KVCacheManager.private``) of a request without any
NONE_PRIVATE: Final = 1 << 62


class RadixNode:
    """A node of a lower tier's prefix tree (one block per edge)."""

    __slots__ = ("block_id", "children", "key", "parent")

    def __init__(self, key, parent, block_id: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict = {}
        self.block_id = block_id


def block_hashes(req: Request, block_size: int, n: int) -> list[int]:
    """The first ``n`` (at most) block hashes of ``req``'s known tokens, computed once."""
    hashes = req.block_hashes
    if hashes is None:
        hashes = req.block_hashes = []
    have = len(hashes)
    if have >= n:
        return hashes
    n_in = req.input_len
    known = (n_in + req.num_output) // block_size
    if n > known:
        n = known
    ids, out = req.input_ids, req.output_ids
    parent = hashes[-1] if have else None
    for i in range(have, n):
        lo, hi = i * block_size, (i + 1) * block_size
        key: tuple
        if ids is None:
            key = (-1, req.rid, i)
        elif hi <= n_in:
            key = tuple(ids[lo:hi])
        elif out is None or len(out) < hi - n_in:
            key = (-2, req.rid, i)  # generated ids unknown: unique to this request
        elif lo >= n_in:
            key = tuple(out[lo - n_in:hi - n_in])
        else:
            key = tuple(ids[lo:]) + tuple(out[:hi - n_in])
        parent = hash((parent, key))
        hashes.append(parent)
    return hashes


def private_depths(requests: list[Request], block_size: int) -> dict[int, int]:
    """Per request id, the index of the request's first private block: the first whose
    hash (that of its tokens from the start of the sequence: the prompt's and the
    generated ones the workload gives) no other request's sequence has at the same
    index, or the first past those tokens (its key holds the request id). Requests are
    grouped by their hashes block by block; only those still sharing go one further.
    Request ids must be unique (keys holding one are then the request's own)."""
    depth: dict[int, int] = {}
    group = []
    for r in requests:
        if r.input_ids is None:
            depth[r.rid] = 0
        else:
            group.append(r)
    level = 0
    while group:
        buckets: dict[int, list[Request]] = {}
        for r in group:
            out = r.output_ids
            n_out = len(out) if out is not None else 0
            if level >= (r.input_len + n_out) // block_size:
                depth[r.rid] = level
                continue
            if r.block_hashes is None or len(r.block_hashes) <= level:
                # (block_hashes is a pure cache: hashes past the known tokens are fine;
                # a few levels at a time)
                n_now = r.num_output
                r.num_output = n_out
                try:
                    block_hashes(r, block_size, level + 8 if level else 1)
                finally:
                    r.num_output = n_now
            bucket = buckets.setdefault(r.block_hashes[level], [])
            bucket.append(r)
        group = []
        for bucket in buckets.values():
            if len(bucket) == 1:
                depth[bucket[0].rid] = level
            else:
                group += bucket
        level += 1
    return depth


class FreeBlockQueue:
    """The LRU free queue of block ids, built lazily.

    A new pool's queue is every block in id order; freed blocks join at the tail and
    allocation takes from the head. Blocks never handed out yet therefore always lead the
    queue, in id order, ahead of every freed one: they are kept as the range
    ``[next_fresh, end)`` and only the freed ones are materialised.

    The freed ones are a list in the order they were freed, read from ``head`` on, with
    each block's place in it (``pos``; -1: not in the queue). A block taken out from the
    middle (a prefix hit reviving it) only loses its place: its entry stays behind, stale,
    and is skipped when the head gets there; a block freed again gets a new entry at the
    tail. The list is compacted once stale entries outnumber live ones twice. Iteration,
    ``popleft`` and ``len`` see exactly the queue a fully built one would hold."""

    __slots__ = ("count", "end", "freed", "head", "next_fresh", "pos")

    #: entries from which the list is compacted when at most a third of them are live
    COMPACT_FROM = 1024

    def __init__(self, num_blocks: int) -> None:
        self.end = num_blocks
        #: the lowest never-allocated block id (those from here to ``end`` are free)
        self.next_fresh = 0
        #: freed blocks, least recently freed first, from ``head`` on; an entry is live
        #: where ``pos`` of its block is its index
        self.freed: list[int] = []
        self.head = 0
        self.pos = [-1] * num_blocks
        #: live entries: the freed blocks in the queue
        self.count = 0

    def __len__(self) -> int:
        return self.end - self.next_fresh + self.count

    def __contains__(self, bid: int) -> bool:
        return self.next_fresh <= bid < self.end or (0 <= bid < self.end and self.pos[bid] >= 0)

    def __iter__(self):
        return chain(range(self.next_fresh, self.end), self._live())

    def _live(self):
        """The freed blocks in the queue, in order."""
        freed, pos = self.freed, self.pos
        for i in range(self.head, len(freed)):
            bid = freed[i]
            if pos[bid] == i:
                yield bid

    def popleft(self) -> int:
        """The head block, taken out of the queue."""
        bid = self.next_fresh
        if bid < self.end:
            self.next_fresh = bid + 1
            return bid
        return self.pop_freed()

    def pop_freed(self) -> int:
        """The least recently freed block in the queue (there must be one), taken out."""
        freed, pos = self.freed, self.pos
        i = self.head
        bid = freed[i]
        while pos[bid] != i:  # (stale: revived, or freed again further on)
            i += 1
            bid = freed[i]
        pos[bid] = -1
        self.head = i + 1
        self.count -= 1
        return bid

    def pop_freed_many(self, count: int) -> list[int]:
        """The ``count`` least recently freed blocks in the queue (there must be as many),
        taken out, in queue order."""
        freed, pos = self.freed, self.pos
        i = self.head
        out: list[int] = []
        while len(out) < count:
            bid = freed[i]
            if pos[bid] == i:
                pos[bid] = -1
                out.append(bid)
            i += 1
        self.head = i
        self.count -= count
        return out

    def append(self, bid: int) -> None:
        """Put a released block at the tail."""
        self.extend([bid])

    def extend(self, bids: list[int]) -> None:
        """Put released blocks at the tail, in order."""
        freed, pos = self.freed, self.pos
        for bid in bids:
            pos[bid] = len(freed)
            freed.append(bid)
        self.count += len(bids)
        if len(freed) > self.COMPACT_FROM and len(freed) > 3 * self.count:
            self.compact()

    def remove(self, bid: int) -> None:
        """Take a block out of the queue wherever it is (a prefix hit reviving it)."""
        if not 0 <= bid < self.end:
            raise KeyError(bid)
        if self.pos[bid] >= 0:
            self.pos[bid] = -1
            self.count -= 1
            return
        if bid < self.next_fresh:
            raise KeyError(bid)  # (handed out, not freed since)
        if bid == self.next_fresh:
            self.next_fresh += 1
            return
        # A never-used block from inside the range: materialise the whole queue.
        rest = [b for b in range(self.next_fresh, self.end) if b != bid]
        self.freed = rest + list(self._live())
        self.head = 0
        self.count = len(self.freed)
        for i, b in enumerate(self.freed):
            self.pos[b] = i
        self.next_fresh = self.end

    def compact(self) -> None:
        """Drop the stale entries: the live ones, in order, from index 0."""
        freed, pos = self.freed, self.pos
        live: list[int] = []
        for i in range(self.head, len(freed)):
            bid = freed[i]
            if pos[bid] == i:
                pos[bid] = len(live)  # (at most i: no later entry of it reads as live)
                live.append(bid)
        self.freed = live
        self.head = 0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 lower_tier: PrefixTier | None = None,
                 private: dict[int, int] | None = None) -> None:
        if num_blocks < 2:
            raise ValueError("need at least 2 KV blocks (one is the null block)")
        self.block_size = block_size
        self.num_blocks = num_blocks - 1  # usable blocks (vLLM reserves a null block)
        self.enable_prefix_caching = enable_prefix_caching
        self.ref = [0] * self.num_blocks
        #: hash of each cached block, by block id (None: not cached)
        self.block_hash: list[int | None] = [None] * self.num_blocks
        #: with a lower tier: where a cached block's hash chain lives (that request's hash
        #: list, index), to insert its path there when it is evicted
        self.block_src: dict[int, tuple[list[int], int]] = {}
        #: hash -> the first cached block holding it (the one a lookup hits)
        self.first: dict[int, int] = {}
        #: hash -> the other cached blocks holding it, first cached first
        self.dups: dict[int, dict[int, None]] = {}
        # LRU free queue of block ids (queue order = eviction order).
        self.free = FreeBlockQueue(self.num_blocks)
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.lower_tier = lower_tier if enable_prefix_caching else None
        self.lower_hit_tokens = 0
        #: request id -> its first private block (``private_depths``): private blocks
        #: enter the table only when their request is preempted (not while a lower tier
        #: is attached); None: every block enters it at once
        self.private = private if enable_prefix_caching else None

    def defers_private(self) -> bool:
        """Whether private blocks are cached without entering the table."""
        return self.private is not None and self.lower_tier is None

    # -------------------------------------------------------------- accounting
    @property
    def num_free(self) -> int:
        free = self.free  # (len(free), without its call: read several times a step)
        return free.end - free.next_fresh + free.count

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def usage(self) -> float:
        return (self.num_blocks - self.num_free) / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -------------------------------------------------------------- prefix cache
    def lookup_lower(self, req: Request, npu_blocks: int) -> int:
        """Blocks beyond the NPU hit that the lower tier holds (to be loaded)."""
        tier = self.lower_tier
        if tier is None:
            return 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        if max_blocks <= npu_blocks:
            return 0
        hashes = block_hashes(req, self.block_size, max_blocks)
        max_blocks = min(max_blocks, len(hashes))
        return max(0, tier.match(hashes.__getitem__, max_blocks) - npu_blocks)

    def lookup_span(self, req: Request) -> int:
        """Leading blocks of ``req`` a lookup reads: those of its first num_tokens - 1
        tokens, up to its first private block if it was never preempted (no block holds
        a private block's hash then: only it could have cached one)."""
        max_blocks = (req.input_len + req.num_output - 1) // self.block_size
        # (defers_private, inline: read at every step a request waits)
        if not req.preemptions and self.private is not None and self.lower_tier is None:
            p = self.private.get(req.rid, NONE_PRIVATE)
            if p < max_blocks:
                return p
        return max_blocks

    def lookup(self, req: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``req`` (at most num_tokens - 1)."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = self.lookup_span(req)
        if not max_blocks:
            return []
        hashes = req.block_hashes
        if hashes is None or len(hashes) < max_blocks:
            hashes = block_hashes(req, self.block_size, max_blocks)
        first = self.first
        if not hashes or hashes[0] not in first:
            return []
        n = len(hashes) if len(hashes) < max_blocks else max_blocks
        if COMPILED:  # (compiled, a loop to the first block not cached)
            found: list[int] = []
            for i in range(n):
                bid = first.get(hashes[i])
                if bid is None:
                    break
                found.append(bid)
            return found
        # (as Python) every block looked up at once; the hit ends at the first not cached
        hit = list(map(first.get, hashes[:n] if len(hashes) > n else hashes))
        if None in hit:
            del hit[hit.index(None):]
        return hit  # type: ignore[return-value]  # (no None left)

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Enter ``req``'s full blocks among its first ``num_tokens`` tokens in the cache
        (private ones only counted, with ``private``)."""
        if not self.enable_prefix_caching:
            return
        start = req.cached_hashes
        bs = self.block_size
        full = num_tokens // bs
        if full <= start:
            return
        if self.defers_private():
            p = self.private.get(req.rid, NONE_PRIVATE)
            if full > p:
                if start < p:
                    self._enter(req, start, p)
                known = (req.input_len + req.num_output) // bs
                req.cached_hashes = full if full < known else known
                return
        hashes = req.block_hashes
        if hashes is None or len(hashes) < full:
            hashes = block_hashes(req, bs, full)
            if len(hashes) < full:
                full = len(hashes)
        self._enter(req, start, full, hashes)
        req.cached_hashes = full

    def _enter(self, req: Request, start: int, full: int, hashes: list[int] | None = None,
               skip_cached: bool = False) -> None:
        """Enter blocks ``start .. full - 1`` of ``req`` in the table (``skip_cached``:
        those not already in it); a hash already cached in another block makes this
        block a duplicate, a lookup's hit only once the earlier ones are evicted."""
        if hashes is None:
            hashes = block_hashes(req, self.block_size, full)
        first, bh, bids = self.first, self.block_hash, req.block_ids
        for i in range(start, full):
            bid = bids[i]
            if skip_cached and bh[bid] is not None:
                continue  # (a prefix hit: in the table already)
            h = hashes[i]
            bh[bid] = h
            f = first.get(h)
            if f is None:
                first[h] = bid
            elif f != bid:
                dups = self.dups.get(h)
                if dups is None:
                    self.dups[h] = {bid: None}
                else:
                    dups[bid] = None
        if self.lower_tier is not None:
            src = self.block_src
            for i in range(start, full):
                src[bids[i]] = (hashes, i)

    def cache_full_blocks(self, req: Request) -> None:
        """Cache ``req``'s computed full blocks (those of its first num_computed tokens)."""
        self.cache_blocks(req, min(req.num_computed, req.num_tokens))

    def _evict(self, bid: int) -> None:
        h = self.block_hash[bid]
        if h is None:
            return
        self.block_hash[bid] = None
        first = self.first
        if first[h] == bid:
            dups = self.dups.get(h)
            if dups is None:
                del first[h]
            else:  # the next one cached takes its place
                nxt = next(iter(dups))
                first[h] = nxt
                del dups[nxt]
                if not dups:
                    del self.dups[h]
        else:
            dups = self.dups[h]
            del dups[bid]
            if not dups:
                del self.dups[h]
        if self.lower_tier is not None:
            # Evicted from the NPU: keep the block (and the path to it) in the lower tier.
            hashes, i = self.block_src.pop(bid)
            self.lower_tier.insert_path(hashes[:i + 1])

    # -------------------------------------------------------------- allocation
    def can_admit(self, req: Request, hit_blocks: list[int], reserve_full: bool,
                  num_new: int) -> bool:
        bs = self.block_size
        n_hit = len(hit_blocks)
        tokens = req.input_len + req.num_output if reserve_full else n_hit * bs + num_new
        need = -(-tokens // bs) - n_hit  # (blocks_for(tokens) - hit)
        return self._fits(need, hit_blocks)

    def _fits(self, need: int, hit_blocks: list[int]) -> bool:
        """Whether ``need`` new blocks are free besides the hit blocks that are in the free
        queue (which the hit takes out of it)."""
        free = self.free
        num_free = free.end - free.next_fresh + free.count
        if need > num_free:
            return False  # (even if no hit block is in the queue)
        if need + len(hit_blocks) <= num_free:
            return True  # (even if every one is)
        ref = self.ref
        return need + [ref[b] for b in hit_blocks].count(0) <= num_free

    def allocate(self, req: Request, num_new: int, hit_blocks: list[int] | None = None) -> bool:
        """Make room for ``num_new`` more tokens of ``req`` past its computed ones (and its
        prefix hit), and cache its full blocks among them; False if blocks run out."""
        bs = self.block_size
        computed = req.num_computed
        free, ref = self.free, self.ref
        if hit_blocks:
            computed += len(hit_blocks) * bs
            need = -(-(computed + num_new) // bs) - len(req.block_ids) - len(hit_blocks)
            if need < 0:
                need = 0
            if not self._fits(need, hit_blocks):
                return False
            for b in hit_blocks:
                if ref[b] == 0:
                    free.remove(b)
                ref[b] += 1
            req.block_ids = list(hit_blocks)
            req.cached_hashes = len(hit_blocks)
        else:
            need = -(-(computed + num_new) // bs) - len(req.block_ids)
            if need > self.num_free:
                return False
        if need > 0:
            req.block_ids += self.take_blocks(need)
        if self.enable_prefix_caching:
            n = computed + num_new
            known = req.input_len + req.num_output
            if n > known:
                n = known
            if n // bs > req.cached_hashes:
                self.cache_blocks(req, n)
        return True

    def take_blocks(self, count: int) -> list[int]:
        """The free queue's next ``count`` blocks (there must be as many), taken and held
        once: never-used ones first, then the least recently freed, their cached contents
        evicted."""
        free, ref = self.free, self.ref
        lo = free.next_fresh
        fresh = free.end - lo
        if fresh >= count:
            free.next_fresh = lo + count
            ref[lo:lo + count] = [1] * count
            return list(range(lo, lo + count))
        free.next_fresh = free.end
        ref[lo:free.end] = [1] * fresh
        taken = free.pop_freed_many(count - fresh)
        if self.first:
            block_hash = self.block_hash
            for bid in taken:
                ref[bid] = 1
                if block_hash[bid] is not None:
                    self._evict(bid)
        else:  # (an empty table: no block holds a hash)
            for bid in taken:
                ref[bid] = 1
        return list(range(lo, free.end)) + taken if fresh else taken

    def grow_one(self, req: Request) -> bool:
        """``allocate(req, 1)`` for a request without a prefix hit whose blocks hold its
        computed tokens: room for one more token (a new block when its blocks are full)
        and its full blocks cached; False if no block is free."""
        bs = self.block_size
        nc = req.num_computed + 1
        bids = req.block_ids
        if nc > len(bids) * bs:
            free = self.free
            bid = free.next_fresh
            if bid < free.end:
                free.next_fresh = bid + 1
            elif free.count:
                bid = free.pop_freed()
                if self.block_hash[bid] is not None:
                    self._evict(bid)
            else:
                return False
            self.ref[bid] = 1
            bids.append(bid)
        if self.enable_prefix_caching:
            known = req.input_len + req.num_output
            n = nc if nc < known else known
            if n // bs > req.cached_hashes:
                self.cache_blocks(req, n)
        return True

    def free_blocks(self, block_ids: list[int]) -> None:
        """Release blocks, last first (a request's tail blocks are evicted first)."""
        ref = self.ref
        released: list[int] = []
        for bid in reversed(block_ids):
            n = ref[bid] - 1
            ref[bid] = n
            if not n:
                released.append(bid)
        self.free.extend(released)

    def free_request(self, req: Request, finished: bool | None = None) -> None:
        """Free ``req``'s blocks. Its private blocks enter the table first, unless it is
        ``finished`` (default: its status says so): it can never hit them again."""
        if finished is None:
            finished = req.status == FINISHED
        if not finished and self.defers_private():
            cached = req.cached_hashes
            p = self.private.get(req.rid, NONE_PRIVATE)
            if cached > p:
                self._enter(req, p, cached, skip_cached=True)
        self.free_blocks(req.block_ids)
        req.block_ids = []
        req.cached_hashes = 0


class PrefixTier:
    """A lower prefix-cache tier (CPU memory or CXL) holding blocks evicted from NPUs.

    Blocks are kept by their radix path (the token ids of every block from the start of
    the sequence), with LRU eviction; evicting a block drops its descendants too, since
    they can no longer be reached. A hit costs a load of those blocks at the tier's
    bandwidth and latency. One tier may be shared by every instance of a node
    (``--enable-prefix-sharing``).
    """

    def __init__(self, name: str, capacity_blocks: int, bw_GBps: float, latency_ns: float) -> None:
        self.name = name
        self.capacity = max(0, capacity_blocks)
        self.bytes_per_ns = bw_GBps * (1 << 30) / 1e9
        self.latency_ns = latency_ns
        self.root = RadixNode(None, None, -1)
        self.lru: OrderedDict[RadixNode, None] = OrderedDict()
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self.lru)

    def insert_path(self, keys: list[int]) -> None:
        if self.capacity == 0:
            return
        node = self.root
        lru = self.lru
        for key in keys:
            child = node.children.get(key)
            if child is None:
                child = RadixNode(key, node, 0)
                node.children[key] = child
                lru[child] = None
                while len(lru) > self.capacity:
                    self._evict_lru(protect=child)
            else:
                lru.move_to_end(child)
            node = child

    def _evict_lru(self, protect: RadixNode) -> None:
        victim = next(iter(self.lru))
        if victim is protect or _is_ancestor(victim, protect):
            # Never drop the path being inserted; evict the next-oldest instead.
            for cand in self.lru:
                if cand is not protect and not _is_ancestor(cand, protect):
                    victim = cand
                    break
            else:
                return
        stack = [victim]
        while stack:
            n = stack.pop()
            self.lru.pop(n, None)
            stack.extend(n.children.values())
        if victim.parent is not None and victim.parent.children.get(victim.key) is victim:
            del victim.parent.children[victim.key]

    def match(self, keys_fn, max_blocks: int) -> int:
        """Number of leading blocks (from block 0) this tier holds."""
        node = self.root
        n = 0
        while n < max_blocks:
            child = node.children.get(keys_fn(n))
            if child is None:
                break
            self.lru.move_to_end(child)
            node = child
            n += 1
        return n

    def load_ns(self, num_bytes: float) -> int:
        if num_bytes <= 0:
            return 0
        return int(self.latency_ns + num_bytes / self.bytes_per_ns)


def _is_ancestor(a: RadixNode, b: RadixNode) -> bool:
    n = b.parent
    while n is not None:
        if n is a:
            return True
        n = n.parent
    return False
