class KagtplError(Exception):
    """A user-facing error: the CLI prints its message as one red line and exits 1."""
