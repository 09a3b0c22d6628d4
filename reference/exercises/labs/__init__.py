"""Labs whose checks run tensors: one module per lab, as in sim/exercises/labs (same `EXERCISE` shape)."""
