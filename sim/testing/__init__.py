"""Reusable hypothesis state machines that grade any allocator or KV manager against the lab's contracts.

They take the implementation under test as a factory, so the same checks run on the reference classes
here and on a student's own (the classroom exercises). Importing this package needs `hypothesis`
(a dev dependency); nothing else in `sim` imports it.
"""
from .blocks import BlockAllocatorMachine, machine_settings, make_block_allocator_test
from .kv import KVManagerMachine, make_kv_manager_test
from .slots import SlotAllocatorMachine, make_slot_allocator_test

__all__ = [
    "BlockAllocatorMachine",
    "KVManagerMachine",
    "machine_settings",
    "make_block_allocator_test",
    "make_kv_manager_test",
    "SlotAllocatorMachine",
    "make_slot_allocator_test",
]
