"""tinymt: a tiny Transformer translator that shows every head's attention."""

__version__ = "0.1.0"
