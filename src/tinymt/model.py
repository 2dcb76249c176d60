"""The encoder-decoder Transformer (Vaswani et al., 2017), in paper order.

source tokens -> embeddings (scaled by sqrt(d_model)) + positions -> N encoder layers -> memory
target tokens -> embeddings + positions -> N decoder layers (masked self-attention,
cross-attention to the memory, feed-forward) -> hidden states -> logits over the vocabulary

Pre-LN (``norm_first=True``, the default: LayerNorm before each sub-layer and after the last
layer of each stack) or the paper's post-LN. Every attention layer can return its per-head
weights: ``{"encoder_self": [...], "decoder_self": [...], "cross": [...]}``, one
``(B, h, T_query, T_key)`` tensor per layer.

The two masks are built here, once: :meth:`Transformer.padding_mask` (a query may look at
every real token, never at padding) and :func:`causal_mask` (the decoder's triangle: target
position ``i`` sees positions ``0..i`` only).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tinymt.errors import TinyMTError
from tinymt.layers import DecoderLayer, EncoderLayer, LearnedPositions, SinusoidalPositions

Attn = dict[str, list[Tensor]] | None  # attention weights by kind, one tensor per layer
KINDS = ("encoder_self", "decoder_self", "cross")


def causal_mask(T: int, device=None) -> Tensor:
    """``(T, T)`` bool, True on and below the diagonal: position i may look at 0..i.

    >>> causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


# --------------------------------------------------------------------------- the model
class Transformer(nn.Module):
    """Encoder-decoder Transformer for translation.

    Args:
        cfg: a :class:`tinymt.config.ModelConfig` (or anything with the same attributes).
        src_vocab_size, tgt_vocab_size: vocabulary sizes.
        shared_vocab: source and target use one vocabulary; with ``cfg.tie_embeddings``
            the source embedding, target embedding and output projection share one matrix.
            Without a shared vocabulary ``tie_embeddings`` ties the target embedding to the
            output projection only.
        pad_id: the padding token id.
    """

    def __init__(self, cfg, src_vocab_size: int, tgt_vocab_size: int, shared_vocab: bool,
                 pad_id: int = 0):
        super().__init__()
        add_embeddings(self, cfg, src_vocab_size, tgt_vocab_size, shared_vocab, pad_id)
        d = cfg.d_model
        layer_args = (d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                      cfg.activation, cfg.norm_first)
        self.encoder_layers = nn.ModuleList(
            [EncoderLayer(*layer_args) for _ in range(cfg.n_encoder_layers)])
        self.decoder_layers = nn.ModuleList(
            [DecoderLayer(*layer_args) for _ in range(cfg.n_decoder_layers)])
        # pre-LN leaves the residual stream un-normalised: normalise the final outputs
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=False)  # hidden -> logits
        init_weights(self)

    def padding_mask(self, tokens: Tensor) -> Tensor:
        """``(B, T)`` tokens -> ``(B, 1, 1, T)`` bool: True on real tokens, False on padding."""
        return tokens.ne(self.pad_id)[:, None, None, :]

    # ----------------------------------------------------------------- encoder
    def encode(self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = False
               ) -> tuple[Tensor, Attn]:
        """Source tokens ``(B, S)`` -> memory ``(B, S, d)`` and ``{"encoder_self": [...]}``."""
        if src_mask is None:
            src_mask = self.padding_mask(src)  # (B, 1, 1, S)
        x = embed(self, src, self.src_embed, self.src_pos, "a source sentence")  # (B, S, d)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, src_mask, need_weights)  # (B, S, d)
            weights.append(w)
        memory = self.encoder_norm(x)  # (B, S, d)
        return memory, ({"encoder_self": weights} if need_weights else None)

    # ----------------------------------------------------------------- decoder
    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               need_weights: bool = False) -> tuple[Tensor, Attn]:
        """Teacher forcing: target tokens ``(B, T)`` (BOS first) -> hidden states
        ``(B, T, d)``, position ``t`` ready to predict token ``t + 1``, and
        ``{"decoder_self": [...], "cross": [...]}``."""
        T = tgt_in.size(1)
        tgt_mask = self.padding_mask(tgt_in) & causal_mask(T, tgt_in.device)  # (B, 1, T, T)
        x = embed(self, tgt_in, self.tgt_embed, self.tgt_pos, "a target sentence")  # (B, T, d)
        self_ws, cross_ws = [], []
        for layer in self.decoder_layers:
            x, self_w, cross_w = layer(x, memory, src_mask, tgt_mask, need_weights)
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        attn = {"decoder_self": self_ws, "cross": cross_ws} if need_weights else None
        return self.decoder_norm(x), attn  # (B, T, d)

    def logits(self, hidden: Tensor) -> Tensor:
        """Hidden states ``(..., d)`` -> unnormalised scores over the target vocabulary
        ``(..., V_tgt)``."""
        return self.output_proj(hidden)

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False
                ) -> tuple[Tensor, Attn]:
        """``(src (B, S), tgt_in (B, T))`` -> ``(hidden (B, T, d), attn or None)``; the
        logits are ``self.logits(hidden)``, the loss :func:`tinymt.loss.sequence_loss`."""
        src_mask = self.padding_mask(src)  # (B, 1, 1, S)
        memory, enc_attn = self.encode(src, src_mask, need_weights)  # (B, S, d)
        hidden, dec_attn = self.decode(tgt_in, memory, src_mask, need_weights)  # (B, T, d)
        return hidden, ({**enc_attn, **dec_attn} if need_weights else None)


# --------------------------------------------------------------------------- shared parts
# Ours and the benchmark's nn.Transformer peer (tinymt.bench.peer) are built around the same
# embeddings, positions, output projection and initialisation: these functions.
def add_embeddings(model: nn.Module, cfg, src_vocab_size: int, tgt_vocab_size: int,
                   shared_vocab: bool, pad_id: int) -> None:
    """Check the arguments, then give ``model`` its plain attributes (``config``, vocabulary
    sizes, ``pad_id``, ``d_model``, ``n_heads``, ``max_positions``, ``embed_scale``) and, in
    this order, ``src_embed``, ``tgt_embed``, ``src_pos``, ``tgt_pos`` and ``dropout``."""
    check_model_args(cfg, src_vocab_size, tgt_vocab_size, shared_vocab)
    model.config = cfg
    model.src_vocab_size, model.tgt_vocab_size = src_vocab_size, tgt_vocab_size
    model.shared_vocab = shared_vocab
    model.pad_id = pad_id
    model.d_model = d = cfg.d_model
    model.n_heads = cfg.n_heads
    model.max_positions = cfg.max_positions
    model.embed_scale = math.sqrt(d)
    model.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=pad_id)
    model.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=pad_id)
    Positions = SinusoidalPositions if cfg.positional == "sinusoidal" else LearnedPositions
    model.src_pos = Positions(cfg.max_positions, d)
    model.tgt_pos = Positions(cfg.max_positions, d)
    model.dropout = nn.Dropout(cfg.dropout)


@torch.no_grad()
def init_weights(model: nn.Module) -> None:
    """Xavier-uniform projections (``nn.Linear``, and ``nn.MultiheadAttention``'s packed
    input projection), zero biases; N(0, d^-1/2) embeddings and output projection, zero pad
    rows. Then ``cfg.tie_embeddings`` ties the output projection to the target embedding
    and, with a shared vocabulary, the source embedding too."""
    std = model.d_model**-0.5
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.MultiheadAttention):
            nn.init.xavier_uniform_(module.in_proj_weight)
            nn.init.zeros_(module.in_proj_bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
    nn.init.normal_(model.output_proj.weight, mean=0.0, std=std)
    model.src_embed.weight[model.pad_id].zero_()
    model.tgt_embed.weight[model.pad_id].zero_()
    if model.config.tie_embeddings:
        if model.shared_vocab:
            model.tgt_embed.weight = model.src_embed.weight
        model.output_proj.weight = model.tgt_embed.weight


def embed(model: nn.Module, tokens: Tensor, embedding: nn.Embedding, positions: nn.Module,
          what: str, offset: int = 0) -> Tensor:
    """``(B, T)`` tokens at positions ``offset..offset+T-1`` -> scaled embeddings plus
    positions, dropped out ``(B, T, d)``; ``what`` names them when too long."""
    T = tokens.size(1)
    if offset + T > model.max_positions:
        raise TinyMTError(
            f"{what} of {offset + T} tokens is longer than model.max_positions="
            f"{model.max_positions}; shorten the input (e.g. data.max_len) or train a "
            "model with a larger model.max_positions"
        )
    return model.dropout(embedding(tokens) * model.embed_scale + positions(T, offset=offset))

def check_model_args(cfg, src_vocab_size: int, tgt_vocab_size: int, shared_vocab: bool) -> None:
    """The config and vocabulary checks every encoder-decoder here makes (ours, the peer)."""
    if cfg.activation not in ("relu", "gelu"):
        raise TinyMTError(f"model.activation={cfg.activation!r}: expected relu or gelu")
    if cfg.positional not in ("sinusoidal", "learned"):
        raise TinyMTError(f"model.positional={cfg.positional!r}: expected sinusoidal or learned")
    if cfg.d_model % cfg.n_heads:
        raise TinyMTError(
            f"model.d_model={cfg.d_model} is not divisible by model.n_heads={cfg.n_heads}")
    if shared_vocab and src_vocab_size != tgt_vocab_size:
        raise TinyMTError(
            f"a shared vocabulary needs equal sizes, got source {src_vocab_size} "
            f"and target {tgt_vocab_size}"
        )


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
