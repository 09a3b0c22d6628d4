"""Solution to lab 5: the memory breakdown of a KV pool (notebooks/exercises/05_memory_accounting.ipynb).

The vLLM paper's Figure 2 splits a serving system's KV memory into token states, reservation, internal
fragmentation and external fragmentation; the lab adds free (idle) slots, so every slot of the pool is one of
five kinds. Computed here from the pool's state alone: block tables and token counts (paged), or the runs the
reservation rule and a buddy allocator set aside (contiguous), with each sequence's true final length.
"""
from __future__ import annotations

NAMES = ("token_states", "reservation", "internal_fragmentation", "external_fragmentation", "free")


def _breakdown(tokens: int, reservation: int, internal: int, external: int, free: int, waiting: bool) -> dict:
    if waiting:  # a request waits that cannot be admitted: idle slots are waste too
        external, free = external + free, 0
    return dict(zip(NAMES, (tokens, reservation, internal, external, free)))


def _next_power_of_two(n: int) -> int:
    return 0 if n == 0 else 1 << (n - 1).bit_length()


class MyMemoryAccounting:
    def paged(self, block_size: int, num_blocks: int, seqs: list, waiting: bool = False) -> dict[str, int]:
        """The five counts of a paged pool; `seqs` holds (block_table, num_tokens, final_len) per live sequence."""
        fill = {}  # physical block -> [slots holding tokens, slots some owner will still write up to]
        for table, num_tokens, final_len in seqs:
            for i, block in enumerate(table):
                filled = min(block_size, num_tokens - i * block_size)
                reach = max(filled, min(block_size, final_len - i * block_size))
                if block in fill:  # shared: counted once, as far as its furthest owner reaches
                    fill[block][1] = max(fill[block][1], reach)
                else:
                    fill[block] = [filled, reach]
        tokens = sum(filled for filled, _ in fill.values())
        reservation = sum(reach - filled for filled, reach in fill.values())
        internal = sum(block_size - reach for _, reach in fill.values())
        free = (num_blocks - len(fill)) * block_size
        return _breakdown(tokens, reservation, internal, 0, free, waiting)

    def contiguous(self, num_slots: int, reserve: str, max_seq_len: int, seqs: list,
                   waiting: bool = False) -> dict[str, int]:
        """The five counts of a contiguous pool (a buddy allocator over token slots); `seqs` holds
        (prompt_len, num_tokens, final_len) per live sequence."""
        tokens = reservation = internal = external = used = 0
        for prompt_len, num_tokens, final_len in seqs:
            if reserve == "max":
                reserved = max_seq_len
            elif reserve == "pow2":
                reserved = prompt_len + _next_power_of_two(final_len - prompt_len)
            else:  # oracle
                reserved = final_len
            run = _next_power_of_two(reserved)  # the buddy allocator hands out a power of two
            tokens += num_tokens
            reservation += final_len - num_tokens
            internal += reserved - final_len
            external += run - reserved
            used += run
        return _breakdown(tokens, reservation, internal, external, num_slots - used, waiting)
