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
        cfg: a :class:`tinymt.config.ModelConfig` (or anything with the same attributes),
            its values already checked (by the config and checkpoint loaders).
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
        self.config = cfg
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.shared_vocab = shared_vocab
        self.pad_id = pad_id
        self.d_model = d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.max_positions = cfg.max_positions
        # token embeddings, scaled by sqrt(d_model) (3.4), plus positions (3.5)
        self.embed_scale = math.sqrt(d)
        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=pad_id)
        Positions = SinusoidalPositions if cfg.positional == "sinusoidal" else LearnedPositions
        self.src_pos = Positions(cfg.max_positions, d)
        self.tgt_pos = Positions(cfg.max_positions, d)
        self.dropout = nn.Dropout(cfg.dropout)
        # the two stacks (3.1)
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
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Xavier-uniform projections, zero biases; N(0, d^-1/2) embeddings and output
        projection, zero pad rows. Then ``cfg.tie_embeddings`` ties the output projection to
        the target embedding and, with a shared vocabulary, the source embedding too."""
        std = self.d_model**-0.5
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        nn.init.normal_(self.output_proj.weight, mean=0.0, std=std)
        self.src_embed.weight[self.pad_id].zero_()
        self.tgt_embed.weight[self.pad_id].zero_()
        if self.config.tie_embeddings:
            if self.shared_vocab:
                self.tgt_embed.weight = self.src_embed.weight
            self.output_proj.weight = self.tgt_embed.weight

    def padding_mask(self, tokens: Tensor) -> Tensor:
        """``(B, T)`` tokens -> ``(B, 1, 1, T)`` bool: True on real tokens, False on padding."""
        return tokens.ne(self.pad_id)[:, None, None, :]

    def embed(self, tokens: Tensor, embedding: nn.Embedding, positions: nn.Module, what: str,
              offset: int = 0) -> Tensor:
        """``(B, T)`` tokens at positions ``offset..offset+T-1`` -> scaled embeddings plus
        positions, dropped out ``(B, T, d)``; ``what`` names them when too long."""
        T = tokens.size(1)
        if offset + T > self.max_positions:
            raise TinyMTError(
                f"{what} of {offset + T} tokens is longer than model.max_positions="
                f"{self.max_positions}; shorten the input (e.g. data.max_len) or train a "
                "model with a larger model.max_positions"
            )
        return self.dropout(embedding(tokens) * self.embed_scale + positions(T, offset=offset))

    # ----------------------------------------------------------------- encoder
    def encode(self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = False
               ) -> tuple[Tensor, Attn]:
        """Source tokens ``(B, S)`` -> memory ``(B, S, d)`` and ``{"encoder_self": [...]}``."""
        if src_mask is None:
            src_mask = self.padding_mask(src)  # (B, 1, 1, S)
        x = self.embed(src, self.src_embed, self.src_pos, "a source sentence")  # (B, S, d)
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
        x = self.embed(tgt_in, self.tgt_embed, self.tgt_pos, "a target sentence")  # (B, T, d)
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


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
