"""tinymt: a tiny Transformer translator that shows every head's attention."""

__version__ = "0.1.0"

# The model's three kinds of attention, in this order wherever they are listed: the model's
# weights by kind, the viewer's records, the `attention_kinds` option.
KINDS = ("encoder_self", "decoder_self", "cross")
