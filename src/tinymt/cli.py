"""What every script does with a user error: one line on stderr, exit status 2."""

from __future__ import annotations

import functools
import sys

from tinymt.errors import TinyMTError


def one_line_errors(fn):
    """Run ``fn``; a :class:`TinyMTError` becomes ``error: <message>`` and exit code 2,
    Ctrl-C becomes ``interrupted`` and exit code 130 (checkpoints already written stay)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TinyMTError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    return wrapper
