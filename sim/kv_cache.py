"""Paged KV-cache blocks with prefix caching, following vLLM V1's block pool.

Blocks hold ``block_size`` tokens. Full blocks whose token ids are known are entered in a
radix tree keyed by each block's token ids (a path from the root spells a prefix, one
block per edge), so a new request reuses the longest cached prefix of whole blocks. Freed
blocks go to an LRU free queue but keep their cached contents until the queue hands them
out again; a prefix hit on a free cached block revives it.

Rules taken from vLLM (v0.19) and implemented here:
- one block is reserved as the null block, so ``num_blocks - 1`` are usable;
- a full-prompt hit still recomputes the last token (the hit is capped at
  ``(num_tokens - 1) // block_size`` blocks);
- freed blocks enter the free queue tail-first (a request's last blocks are evicted
  before its first ones), and allocation takes from the head (least recently freed);
- ``reserve_full_isl``: a waiting request is admitted only if blocks for its whole current
  sequence, not just this chunk, are free.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.request import Request


class RadixNode:
    __slots__ = ("block_id", "children", "key", "parent")

    def __init__(self, key, parent, block_id: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict = {}
        self.block_id = block_id


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 lower_tier: PrefixTier | None = None) -> None:
        if num_blocks < 2:
            raise ValueError("need at least 2 KV blocks (one is the null block)")
        self.block_size = block_size
        self.num_blocks = num_blocks - 1  # usable blocks (vLLM reserves a null block)
        self.enable_prefix_caching = enable_prefix_caching
        self.ref = [0] * self.num_blocks
        self.node: list[RadixNode | None] = [None] * self.num_blocks
        # LRU free queue of block ids (insertion order = eviction order).
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.num_blocks))
        self.root = RadixNode(None, None, -1)
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.lower_tier = lower_tier if enable_prefix_caching else None
        self.lower_hit_tokens = 0

    # -------------------------------------------------------------- accounting
    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def usage(self) -> float:
        return self.num_used / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -------------------------------------------------------------- prefix cache
    def _block_key(self, req: Request, i: int) -> tuple:
        """Token ids of block ``i`` of ``req``'s sequence (prompt then generated tokens)."""
        bs = self.block_size
        lo, hi = i * bs, (i + 1) * bs
        ids, n_in = req.input_ids, req.input_len
        if hi <= n_in:
            return tuple(ids[lo:hi])
        out = req.output_ids
        if lo >= n_in:
            return tuple(out[lo - n_in:hi - n_in])
        return tuple(ids[lo:]) + tuple(out[:hi - n_in])

    def lookup_lower(self, req: Request, npu_blocks: int) -> int:
        """Blocks beyond the NPU hit that the lower tier holds (to be loaded)."""
        tier = self.lower_tier
        if tier is None or req.input_ids is None:
            return 0
        known = req.input_len + (req.num_output if req.output_ids else 0)
        max_blocks = (min(req.num_tokens, known + 1) - 1) // self.block_size
        if max_blocks <= npu_blocks:
            return 0
        return max(0, tier.match(lambda i: self._block_key(req, i), max_blocks) - npu_blocks)

    def lookup(self, req: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``req`` (at most num_tokens - 1)."""
        if not self.enable_prefix_caching or req.input_ids is None:
            return []
        known = req.input_len + (req.num_output if req.output_ids else 0)
        max_blocks = (min(req.num_tokens, known + 1) - 1) // self.block_size
        node = self.root
        hit: list[int] = []
        for i in range(max_blocks):
            child = node.children.get(self._block_key(req, i))
            if child is None:
                break
            hit.append(child.block_id)
            node = child
        return hit

    def cache_full_blocks(self, req: Request) -> None:
        """Enter ``req``'s newly full, computed blocks into the radix tree."""
        full = req.num_computed // self.block_size
        start = req.cached_hashes or 0
        if full <= start or req.input_ids is None:
            return
        if full * self.block_size > req.input_len and not req.output_ids:
            full = req.input_len // self.block_size  # generated ids unknown: prompt only
            if full <= start:
                return
        node = req.cache_node if start else self.root
        if node is None or (start and self.node[req.block_ids[start - 1]] is not node):
            # The path to our last cached block was evicted meanwhile: re-walk from root.
            node, start = self.root, 0
        for i in range(start, full):
            key = self._block_key(req, i)
            child = node.children.get(key)
            bid = req.block_ids[i]
            if child is None:
                if self.node[bid] is not None:  # this block is already cached elsewhere
                    child = self.node[bid]
                else:
                    child = RadixNode(key, node, bid)
                    node.children[key] = child
                    self.node[bid] = child
            node = child
        req.cached_hashes = full
        req.cache_node = node

    def _path_keys(self, node: RadixNode) -> list[tuple]:
        keys = []
        while node is not None and node.key is not None:
            keys.append(node.key)
            node = node.parent
        keys.reverse()
        return keys

    def _evict(self, bid: int) -> None:
        n = self.node[bid]
        if n is not None:
            if self.lower_tier is not None and n.parent is not None:
                # Evicted from the NPU: keep the block in the lower tier.
                self.lower_tier.insert_path(self._path_keys(n))
            if n.parent is not None and n.parent.children.get(n.key) is n:
                del n.parent.children[n.key]
            self.node[bid] = None

    # -------------------------------------------------------------- allocation
    def can_admit(self, req: Request, hit_blocks: list[int], reserve_full: bool,
                  num_new: int) -> bool:
        hit_free = sum(1 for b in hit_blocks if self.ref[b] == 0)
        tokens = req.num_tokens if reserve_full else len(hit_blocks) * self.block_size + num_new
        need = self.blocks_for(tokens) - len(hit_blocks)
        return need <= len(self.free) - hit_free

    def allocate(self, req: Request, num_new: int, hit_blocks: list[int] | None = None) -> bool:
        """Make room for ``num_new`` more tokens of ``req``; False if blocks run out."""
        if hit_blocks:
            hit_free = sum(1 for b in hit_blocks if self.ref[b] == 0)
            need = self.blocks_for(len(hit_blocks) * self.block_size + num_new) - len(hit_blocks)
            if need > len(self.free) - hit_free:
                return False
            for b in hit_blocks:
                if self.ref[b] == 0:
                    del self.free[b]
                self.ref[b] += 1
            req.block_ids = list(hit_blocks)
            req.cached_hashes = len(hit_blocks)
            req.cache_node = self.node[hit_blocks[-1]]
        computed = len(hit_blocks) * self.block_size if hit_blocks else req.num_computed
        need = self.blocks_for(computed + num_new) - len(req.block_ids)
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        free = self.free
        for _ in range(need):
            bid, _ = free.popitem(last=False)
            if self.node[bid] is not None:
                self._evict(bid)
            self.ref[bid] = 1
            req.block_ids.append(bid)
        return True

    def free_request(self, req: Request) -> None:
        free = self.free
        for bid in reversed(req.block_ids):
            self.ref[bid] -= 1
            if self.ref[bid] == 0:
                free[bid] = None
        req.block_ids = []
        req.cached_hashes = None
        req.cache_node = None


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

    def insert_path(self, keys: list[tuple]) -> None:
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
