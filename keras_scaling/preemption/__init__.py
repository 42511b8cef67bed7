"""Preemption: surviving it, and resuming inside the epoch, bitwise.

- `backup_and_restore`: `BackupAndRestore`, the callback;
- `_backup`: the backup file: format, atomic writes, validation (pure core);
- `_resume`: the training data found and positioned for an exact resume.
"""
