"""sim: PagedAttention's serving system as a model with a simulated clock (pure Python + numpy)."""
