"""The error a subcommand raises for bad input: exit status 2, no traceback."""


class UsageError(ValueError):
    """Bad command-line input; `main` prints the message and exits with 2."""
