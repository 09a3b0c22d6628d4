"""The prefix-economics lab's solution with one rule broken (tests/notebooks/test_grader.py grades each)."""

from __future__ import annotations


def _keys(token_ids, num_blocks, block_size, chained=True):
    keys, parent = [], None
    for i in range(num_blocks):
        block = tuple(token_ids[i * block_size : (i + 1) * block_size])
        parent = hash((parent, block)) if chained else hash(block)
        keys.append(parent)
    return keys


def _lookup(self, token_ids, num_prompt_tokens, *, window=None, chained=True):
    """The solution's lookup over the first `window` tokens (num_prompt_tokens - 1 if None)."""
    hits, window = 0, num_prompt_tokens - 1 if window is None else window
    for key in _keys(token_ids, window // self.block_size, self.block_size, chained):
        if key not in self.copies:
            break
        hits += 1
    return hits * self.block_size


def _serve(self, token_ids, num_prompt_tokens, *, head_first=False, one_copy=False, cache_replies=True, chained=True):
    """The solution's serve with a switch per bug (the solution keeps `lru` and `copies`; one_copy keeps a block)."""
    bs = self.block_size
    hits = self.lookup(token_ids, num_prompt_tokens) // bs
    keys = _keys(token_ids, (len(token_ids) if cache_replies else num_prompt_tokens) // bs, bs, chained)
    table = [self.copies[key] if one_copy else self.copies[key][0] for key in keys[:hits]]
    for block in table:
        del self.lru[block]
    need = -(-len(token_ids) // bs) - hits
    for _ in range(max(0, need - (self.num_blocks - len(self.lru) - hits))):
        block, key = self.lru.popitem(last=False)
        if one_copy:
            self.copies.pop(key, None)  # drops the hash, though a newer copy of the prefix may still be cached
            continue
        self.copies[key].remove(block)
        if not self.copies[key]:
            del self.copies[key]
    table += range(self.next_block, self.next_block + need)
    self.next_block += need
    for i in range(hits, len(keys)):
        if one_copy:
            self.copies[keys[i]] = table[i]  # the newest copy replaces the older one
        else:
            self.copies.setdefault(keys[i], []).append(table[i])
    for i in range(len(keys)) if head_first else reversed(range(len(keys))):
        self.lru[table[i]] = keys[i]
    self.prompt_tokens += num_prompt_tokens
    self.hit_tokens += hits * bs
    return hits * bs


def lookup_covers_last_token(base):
    class LookupCoversLastToken(base):
        def lookup(self, token_ids, num_prompt_tokens):  # may hit the block holding the prompt's last token
            return _lookup(self, token_ids, num_prompt_tokens, window=num_prompt_tokens)

    return LookupCoversLastToken


def hash_ignores_parent(base):
    class HashIgnoresParent(base):
        def lookup(self, token_ids, num_prompt_tokens):  # a block is named by its own tokens only
            return _lookup(self, token_ids, num_prompt_tokens, chained=False)

        def serve(self, token_ids, num_prompt_tokens):
            return _serve(self, token_ids, num_prompt_tokens, chained=False)

    return HashIgnoresParent


def frees_head_first(base):
    class FreesHeadFirst(base):
        def serve(self, token_ids, num_prompt_tokens):  # the prompt's head becomes the least recently freed
            return _serve(self, token_ids, num_prompt_tokens, head_first=True)

    return FreesHeadFirst


def one_copy_per_prefix(base):
    class OneCopyPerPrefix(base):
        def serve(self, token_ids, num_prompt_tokens):  # a prefix computed twice keeps only its newest block
            return _serve(self, token_ids, num_prompt_tokens, one_copy=True)

    return OneCopyPerPrefix


def replies_not_cached(base):
    class RepliesNotCached(base):
        def serve(self, token_ids, num_prompt_tokens):  # only the prompt's full blocks are cached
            return _serve(self, token_ids, num_prompt_tokens, cache_replies=False)

    return RepliesNotCached


PLANTED = [
    (
        "lookup-covers-last-token",
        lookup_covers_last_token,
        (),
        ["except the one holding its last token", "serve of request 2: the first block only: expected 4, found 8"],
    ),
    (
        "hash-ignores-parent",
        hash_ignores_parent,
        (),
        [
            "a block's hash chains its parent's",
            "lookup([5, 6, 7, 8, 9], 5): [5 6 7 8] is cached, but after [1 2 3 4]: expected 0, found 4",
        ],
    ),
    (
        "frees-head-first",
        frees_head_first,
        (),
        ["a request frees its tail first", "only the head block is left: expected 2, found 0"],
    ),
    (
        "one-copy-per-prefix",
        one_copy_per_prefix,
        (),
        ["a block computed twice is cached twice", "the newer copy of [3 4] still hit: expected 4, found 2"],
    ),
    (
        "replies-not-cached",
        replies_not_cached,
        (),
        ["the generated tokens' full blocks are cached", "num_cached_blocks after request 1: expected 2, found 0"],
    ),
]
