"""One exception type for everything a user can get wrong.

Scripts catch :class:`TinyMTError` and print its message on one line (no traceback),
then exit with status 2. Raise it with a message that says what was expected where
and how to fix it.
"""


class TinyMTError(Exception):
    """A user-facing error: bad input, bad config, missing files."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 200 characters), or its type's
    name: what a one-line error quotes of a library's failure."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
