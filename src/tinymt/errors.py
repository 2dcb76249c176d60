"""One exception type for everything a user can get wrong.

Scripts catch :class:`TinyMTError` and print its message on one line (no traceback),
then exit with status 2. Raise it with a message that says what was expected where
and how to fix it.
"""


class TinyMTError(Exception):
    """A user-facing error: bad input, bad config, missing files."""
