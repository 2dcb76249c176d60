"""One exception type for everything a user can get wrong: scripts print its message on
one line (no traceback) and exit with status 2. Its message says what was expected where
and how to fix it."""


class TinyMTError(Exception):
    """A user-facing error: bad input, bad config, missing files."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 200 characters), or its type's
    name: what a one-line error quotes of a library's failure."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal (SIGTERM, Ctrl-C) after saving its work; scripts print
    the message (when there is one) and exit with ``128 + signum``."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum
        self.message = message
