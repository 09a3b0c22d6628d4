"""KV cache groups: which model layers each group of a KV manager serves, from the groups' windows alone.

A KV manager keeps one or more KV cache groups (sim/kv/base.py, `KVManager.windows` and `group_tables`). One group of
full attention serves every layer; the hybrid manager (sim/kv/hybrid.py) groups a model's layers by attention window,
as vLLM's hybrid KV cache manager does, and an engine lays its cache tensors out by these groups
(reference/engine/kv_groups.py) without knowing which policy made them.
"""
from __future__ import annotations

from typing import Sequence

from .base import cdiv


def group_size(layer_counts: Sequence[int]) -> int:
    """Layers per KV cache group by vLLM's rule (`_get_kv_cache_groups_uniform_page_size`), from the number of layers
    of each attention window: the smallest count, or the largest when it is within 25% of the smallest (Gemma-3-270m:
    3 full and 15 sliding layers -> 3; 10 and 12 -> 12). A window's last group is padded with empty layers."""
    smallest, largest = min(layer_counts), max(layer_counts)
    return largest if largest < 1.25 * smallest else smallest


def layer_groups(layer_windows: Sequence[int | None], windows: Sequence[int | None]) -> list[list[int]]:
    """Which model layers each KV cache group serves: `layer_windows[i]` is layer i's attention window (None: full
    attention), `windows` a manager's groups (`KVManager.windows`). One full-attention group, `(None,)`, serves every
    layer (it keeps every token; a sliding layer reads its window of them). Otherwise vLLM's rule: the layers of each
    window, in order, `group_size` at a time, go to the groups of that window in `windows` order:

        Gemma-3-270m (layers 5, 11, 17 full, the others sliding), windows (None, 512, 512, 512, 512, 512):
        group 0: 5, 11, 17   group 1: 0, 1, 2   group 2: 3, 4, 6   ...   group 5: 14, 15, 16

    One line of ValueError when the groups do not fit the layers (a window no layer has or no group serves, too many
    or too few groups of a window)."""
    windows = tuple(windows)
    if windows == (None,):
        return [list(range(len(layer_windows)))]
    by_window: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        by_window.setdefault(window, []).append(layer)
    size = group_size([len(layers) for layers in by_window.values()]) if by_window else 1
    wanted = {w: cdiv(len(layers), size) for w, layers in by_window.items()}
    if {w: windows.count(w) for w in set(windows)} != wanted:
        raise ValueError(f"KV cache groups of windows {list(windows)} do not fit the model's layers (groups of {size} "
                         f"layers per window: {dict(sorted(wanted.items(), key=str))})")
    groups, taken = [], dict.fromkeys(by_window, 0)
    for w in windows:
        groups.append(by_window[w][taken[w] * size:(taken[w] + 1) * size])
        taken[w] += 1
    return groups
