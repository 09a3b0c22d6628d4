"""Lab 11, correct but different: a block is named by the whole token prefix it ends (a tuple, no hash chain), the
LRU is a plain list (least recently freed first), and blocks are counted, not named."""


def prefix_names(token_ids, num_blocks, block_size):
    return [tuple(token_ids[: (i + 1) * block_size]) for i in range(num_blocks)]


class MyPrefixCacheEconomics:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.lru = []  # [(name, serial), ...] of the freed cached blocks, least recently freed first
        self.serial = 0  # counts the blocks computed: the first cached copy of a name has the lowest serial
        self.prompt_tokens = self.hit_tokens = 0

    def lookup(self, token_ids, num_prompt_tokens):
        hits = 0
        for name in prefix_names(token_ids, (num_prompt_tokens - 1) // self.block_size, self.block_size):
            if not any(n == name for n, _ in self.lru):
                break
            hits += 1
        return hits * self.block_size

    def serve(self, token_ids, num_prompt_tokens):
        bs = self.block_size
        hits = self.lookup(token_ids, num_prompt_tokens) // bs
        names = prefix_names(token_ids, len(token_ids) // bs, bs)
        revived = []
        for name in names[:hits]:  # revive the first cached copy of each hit
            copy = min((e for e in self.lru if e[0] == name), key=lambda e: e[1])
            self.lru.remove(copy)
            revived.append(copy)
        need = -(-len(token_ids) // bs) - hits
        short = need - (self.num_blocks - len(self.lru) - hits)
        if short > 0:
            del self.lru[:short]
        fresh = [(name, self.serial + i) for i, name in enumerate(names[hits:])]
        self.serial += need
        self.lru += list(reversed(revived + fresh))  # freed tail first
        self.prompt_tokens += num_prompt_tokens
        self.hit_tokens += hits * bs
        return hits * bs

    @property
    def num_cached_blocks(self):
        return len(self.lru)

    @property
    def hit_rate(self):
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
