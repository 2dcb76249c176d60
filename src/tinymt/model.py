"""The encoder-decoder Transformer (Vaswani et al., 2017), in paper order.

embeddings (scaled by sqrt(d_model)) + positions -> N encoder layers -> memory
embeddings + positions -> N decoder layers (masked self-attn, cross-attn, FFN) -> logits

Pre-LN (``norm_first=True``, the default: LayerNorm before each sub-layer, a final
LayerNorm after the last encoder and decoder layer) or the paper's post-LN. Every
attention layer can return its per-head weights; they come back as
``{"encoder_self": [...], "decoder_self": [...], "cross": [...]}``, one
``(B, h, T_query, T_key)`` tensor per layer.

For incremental decoding: ``init_cache(memory, src_pad_mask)`` computes the
cross-attention keys/values once, and ``decode_step(tokens, cache)`` feeds one new
target token per sentence, reusing and growing the cache.

Head masks: persistent buffers ``head_mask_encoder_self`` ``(n_encoder_layers, h)``,
``head_mask_decoder_self`` and ``head_mask_cross`` ``(n_decoder_layers, h)``, all ones
by default. Every path (training, teacher forcing, incremental decoding) gates head
``(l, i)`` of a kind by ``head_mask[l, i] * head_gates[kind][l, i]``, so a pruned model
is just a state_dict with zeros in these buffers (``scripts/analyze_heads.py prune=...``)
and loads like any other checkpoint. While every mask is all ones and no gates are
given, no gating happens at all (the fast path is unchanged).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tinymt.attention import DecoderCache, KVCache
from tinymt.errors import TinyMTError
from tinymt.layers import DecoderLayer, Dropout, EncoderLayer, LearnedPositions, SinusoidalPositions
from tinymt.loss import linear_cross_entropy

Attn = dict[str, list[Tensor]] | None  # attention weights by kind, one tensor per layer
HeadGates = dict[str, Tensor] | None  # kind -> (n_layers, n_heads) (or (n_layers, B, n_heads))
KINDS = ("encoder_self", "decoder_self", "cross")


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
        pad_id: padding token id (masks are computed from it when not given).
    """

    def __init__(
        self,
        cfg,
        src_vocab_size: int,
        tgt_vocab_size: int,
        shared_vocab: bool,
        pad_id: int = 0,
    ):
        super().__init__()
        add_embeddings(self, cfg, src_vocab_size, tgt_vocab_size, shared_vocab, pad_id)
        d = cfg.d_model

        # layers
        layer_args = (
            d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout, cfg.activation,
            cfg.norm_first,
        )
        self.encoder_layers = nn.ModuleList(
            [EncoderLayer(*layer_args) for _ in range(cfg.n_encoder_layers)]
        )
        self.decoder_layers = nn.ModuleList(
            [DecoderLayer(*layer_args) for _ in range(cfg.n_decoder_layers)]
        )
        # pre-LN leaves the residual stream un-normalised: normalise the final outputs
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=False)

        # persistent head masks (1 = head on, 0 = pruned); saved in the state_dict
        n_layers = {"encoder_self": cfg.n_encoder_layers, "decoder_self": cfg.n_decoder_layers,
                    "cross": cfg.n_decoder_layers}
        for kind in KINDS:
            self.register_buffer(f"head_mask_{kind}", torch.ones(n_layers[kind], cfg.n_heads))
        self._masks_checked: tuple | None = None  # buffer versions when last found all ones

        init_weights(self)

    # ----------------------------------------------------------------- helpers
    def head_mask(self, kind: str) -> Tensor:
        """The persistent mask of ``kind``: ``(n_layers, h)``, 1 = head on, 0 = masked."""
        return getattr(self, f"head_mask_{kind}")

    @torch.no_grad()
    def set_head_masks(self, masks: dict[str, Tensor]) -> None:
        """Copy ``{kind: (n_layers, h)}`` into the mask buffers (kinds not given stay)."""
        for kind, m in masks.items():
            if kind not in KINDS:
                raise TinyMTError(f"head mask kind {kind!r}: choose from {', '.join(KINDS)}")
            self.head_mask(kind).copy_(torch.as_tensor(m))

    def _masks_all_ones(self) -> bool:
        """Are all mask buffers all ones? Checked on the device only after a buffer was
        written (tensor version counters), so the per-step cost is a few integer compares."""
        if torch.compiler.is_compiling():
            return False  # no data-dependent branch under compile; x * 1.0 is exact anyway
        masks = [self.head_mask(k) for k in KINDS]
        key = tuple((m.data_ptr(), m._version) for m in masks)
        if self._masks_checked == key:
            return True
        if all(bool(m.eq(1).all()) for m in masks):
            self._masks_checked = key
            return True
        return False

    def _kind_gates(self, head_gates: HeadGates, kind: str, use_masks: bool) -> Tensor | None:
        """Effective gates of ``kind`` for all layers: ``mask * head_gates[kind]``, the mask
        alone, the gates alone (all masks ones), or None (nothing to gate)."""
        gates = None if head_gates is None else head_gates.get(kind)
        if not use_masks:
            return gates  # (n_layers, [B,] h) or None
        mask = self.head_mask(kind)  # (n_layers, h)
        if gates is None:
            return mask
        if gates.dim() == 3:  # per-sentence gates (n_layers, B, h)
            mask = mask[:, None, :]
        return mask * gates

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints from before head masks existed: every head on
        for kind in KINDS:
            key = f"{prefix}head_mask_{kind}"
            if key not in state_dict:
                state_dict[key] = torch.ones_like(self.head_mask(kind))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ----------------------------------------------------------------- encoder
    def encode(
        self,
        src: Tensor,
        src_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        head_gates: HeadGates = None,
    ) -> tuple[Tensor, Attn]:
        """Source tokens ``(B, S)`` -> memory ``(B, S, d)`` and ``{"encoder_self": [...]}``."""
        if src_pad_mask is None:
            src_pad_mask = src.eq(self.pad_id)  # (B, S)
        x = embed(self, src, self.src_embed, self.src_pos, "a source sentence")  # (B, S, d)
        gates = self._kind_gates(head_gates, "encoder_self", not self._masks_all_ones())
        weights = []
        for i, layer in enumerate(self.encoder_layers):
            x, w = layer(x, src_pad_mask, need_weights, None if gates is None else gates[i])
            weights.append(w)
        memory = self.encoder_norm(x)  # (B, S, d)
        return memory, ({"encoder_self": weights} if need_weights else None)

    # ----------------------------------------------------------------- decoder
    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor | None,
        tgt_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        head_gates: HeadGates = None,
        last_only: bool = False,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> tuple[Tensor, Attn]:
        """Teacher-forced decoder: ``tgt_in`` ``(B, T)`` -> logits ``(B, T, V_tgt)``.

        Returns ``(logits, {"decoder_self": [...], "cross": [...]})`` (None without
        ``need_weights``). ``tgt_pad_mask`` defaults to ``tgt_in == pad_id``.
        ``last_only``: logits of the last position only, ``(B, V_tgt)`` (decoding
        without a cache needs no more); then ``tgt_pad_mask`` defaults to none at all:
        padding only trails, so under the causal mask it cannot reach a last position that
        is not padding itself, and attention keeps its causal fast path.
        ``targets`` ``(B, T)``: return the summed token loss (a scalar,
        :func:`tinymt.loss.linear_cross_entropy`) in place of the logits; on a CPU no
        ``(B, T, V_tgt)`` logits are made and padding positions cost nothing.
        """
        if tgt_pad_mask is None and not last_only:
            tgt_pad_mask = tgt_in.eq(self.pad_id)  # (B, T)
        x = embed(self, tgt_in, self.tgt_embed, self.tgt_pos, "a target sentence")  # (B, T, d)
        use_masks = not self._masks_all_ones()
        self_g = self._kind_gates(head_gates, "decoder_self", use_masks)
        cross_g = self._kind_gates(head_gates, "cross", use_masks)
        self_ws, cross_ws = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, self_w, cross_w = layer(
                x, memory, src_pad_mask, tgt_pad_mask, need_weights,
                self_gate=None if self_g is None else self_g[i],
                cross_gate=None if cross_g is None else cross_g[i],
            )
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        attn = {"decoder_self": self_ws, "cross": cross_ws} if need_weights else None
        if targets is not None:
            loss = linear_cross_entropy(self.decoder_norm(x), self.output_proj.weight, targets,
                                        self.pad_id, label_smoothing)
            return loss, attn
        if last_only:
            x = x[:, -1]  # (B, d)
        logits = self.output_proj(self.decoder_norm(x))  # (B, T, V_tgt) or (B, V_tgt)
        return logits, attn

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_pad_mask: Tensor | None = None,
        tgt_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        head_gates: HeadGates = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> tuple[Tensor, Attn]:
        """``(src (B, S), tgt_in (B, T))`` -> ``(logits (B, T, V_tgt), attn or None)``.

        With ``targets`` ``(B, T)`` (``tgt_out``): ``(summed token loss, attn or None)``, the
        training step's loss (see :meth:`decode`)."""
        if src_pad_mask is None:
            src_pad_mask = src.eq(self.pad_id)  # (B, S)
        memory, enc_attn = self.encode(src, src_pad_mask, need_weights, head_gates)
        out, dec_attn = self.decode(
            tgt_in, memory, src_pad_mask, tgt_pad_mask, need_weights, head_gates,
            targets=targets, label_smoothing=label_smoothing,
        )
        attn = {**enc_attn, **dec_attn} if need_weights else None
        return out, attn  # logits (B, T, V_tgt), or the loss with targets

    # ----------------------------------------------------------------- incremental
    def init_cache(self, memory: Tensor, src_pad_mask: Tensor | None) -> DecoderCache:
        """Empty self-attention caches and the cross-attention keys/values of ``memory``."""
        self_caches, cross_caches = [], []
        for layer in self.decoder_layers:
            self_caches.append(KVCache())
            cross = KVCache(static=True)
            cross.update(*layer.cross_attn.project_kv(memory))  # 2 x (B, h, S, d_head)
            cross_caches.append(cross)
        return DecoderCache(self_caches, cross_caches, src_pad_mask, step=0)

    def decode_step(
        self,
        tokens: Tensor,
        cache: DecoderCache,
        need_weights: bool = False,
        head_gates: HeadGates = None,
    ) -> tuple[Tensor, Attn]:
        """Feed the next target token(s) ``(B, 1)`` (or ``(B, T)``) and extend ``cache``.

        Returns the logits of the last fed position ``(B, V_tgt)`` and, with
        ``need_weights``, ``{"decoder_self": [(B, h, T, step+T)], "cross": [(B, h, T, S)]}``.
        Target tokens fed this way are never padding.
        """
        x = embed(self, tokens, self.tgt_embed, self.tgt_pos, "a target prefix",
                  offset=cache.step)  # (B, T, d)
        use_masks = not self._masks_all_ones()
        self_g = self._kind_gates(head_gates, "decoder_self", use_masks)
        cross_g = self._kind_gates(head_gates, "cross", use_masks)
        self_ws, cross_ws = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, self_w, cross_w = layer(
                x, None, cache.src_pad_mask, None, need_weights,
                self_gate=None if self_g is None else self_g[i],
                cross_gate=None if cross_g is None else cross_g[i],
                self_cache=cache.self_attn[i],
                cross_cache=cache.cross_attn[i],
                beam_slots=None if cache.slots is None else (cache.slots, cache.beam),
            )
            self_ws.append(self_w)
            cross_ws.append(cross_w)
        cache.step += tokens.size(1)
        logits = self.output_proj(self.decoder_norm(x[:, -1]))  # (B, V_tgt)
        attn = {"decoder_self": self_ws, "cross": cross_ws} if need_weights else None
        return logits, attn


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
    model.dropout = Dropout(cfg.dropout)


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
