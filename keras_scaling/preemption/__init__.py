"""Preemption: surviving it, and resuming inside the epoch, bitwise (`BackupAndRestore`)."""
