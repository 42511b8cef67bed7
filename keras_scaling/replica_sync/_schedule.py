"""When `ReplicaSyncCheck` compares: plain arithmetic on optimizer steps."""


def check_is_due(step, last_checked_step, every_n_steps):
    """Whether a comparison is due at optimizer step `step`.

    Due at the first look (`last_checked_step` None), and whenever a
    multiple of `every_n_steps` was passed since the last comparison: with
    `every_n_steps=100`, at the first look at or after step 100, 200, ...,
    however many steps one call of the train function ran.

    Args:
        step: int, the optimizer steps (weight updates) so far, or an upper
            bound of them.
        last_checked_step: int, the step of the last comparison, or None.
        every_n_steps: int, positive.

    Returns:
        bool.
    """
    if last_checked_step is None:
        return True
    return step // every_n_steps > last_checked_step // every_n_steps
