"""Replica sync: proving the mirrored copies of every weight stay equal.

- `replica_sync_check`: `ReplicaSyncCheck` and `ReplicaDivergenceError`, the
  callback: a thin adapter that decides when to compare and acts on the report;
- `replica_state`: the public names of the comparing core, usable on its own;
- `_copy_comparison`: how the copies of a variable differ, in plain NumPy;
- `_tracked_variables`: which distributed variables a model and its
  optimizer hold, and what each one is (Keras);
- `_replica_state_checker` and `_fingerprint`: reading every replica's copies
  on the devices and comparing them (TensorFlow).
"""
