"""The benchmark's peer: the same translator built from ``torch.nn.Transformer``.

:class:`PeerTransformer` has exactly the architecture of :class:`tinymt.model.Transformer`
-- the same embeddings (scaled by ``sqrt(d_model)``, tied the same way), the same position
encodings, ``nn.Transformer`` with the same width, heads, depth, FFN, activation,
dropout and LayerNorm placement (``batch_first=True``; pre-LN adds the same final encoder
and decoder LayerNorms), and the same bias-free output projection -- so it has the same
parameters, one for one. Only the attention and layer code is PyTorch's instead of ours.

It speaks the same interface:

* ``forward(src, tgt_in) -> (logits, None)`` (teacher forcing, for training),
* ``encode(src, src_pad_mask) -> (memory, None)`` and
  ``decode(tgt_in, memory, src_pad_mask) -> (logits, None)``, so that
  :func:`tinymt.decoding.beam_search` / ``greedy_decode`` can drive it with
  ``use_cache=False`` (it has no KV cache),
* :meth:`PeerTransformer.greedy_decode`: its own greedy loop that recomputes the whole
  target prefix at every step (the usual ``nn.Transformer`` recipe) and projects only the
  last position to the vocabulary.

:meth:`PeerTransformer.load_from_ours` copies the weights of one of our models in, after
which both compute the same function (up to floating-point rounding).
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from torch import Tensor, nn

from tinymt.errors import TinyMTError
from tinymt.model import LearnedPositions, SinusoidalPositions, check_model_args


class PeerTransformer(nn.Module):
    """Encoder-decoder translator on ``torch.nn.Transformer``, shaped like ours.

    Args mirror :class:`tinymt.model.Transformer`: ``cfg`` (a ``ModelConfig``),
    ``src_vocab_size``, ``tgt_vocab_size``, ``shared_vocab``, ``pad_id``.
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
        check_model_args(cfg, src_vocab_size, tgt_vocab_size, shared_vocab)
        self.config = cfg
        self.src_vocab_size = src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        self.shared_vocab = shared_vocab
        self.pad_id = pad_id
        self.d_model = d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.max_positions = cfg.max_positions
        self.embed_scale = d**0.5

        self.src_embed = nn.Embedding(src_vocab_size, d, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d, padding_idx=pad_id)
        Positions = SinusoidalPositions if cfg.positional == "sinusoidal" else LearnedPositions
        self.src_pos = Positions(cfg.max_positions, d)
        self.tgt_pos = Positions(cfg.max_positions, d)
        self.dropout = nn.Dropout(cfg.dropout)

        layer_kw = {
            "d_model": d,
            "nhead": cfg.n_heads,
            "dim_feedforward": cfg.d_ff,
            "dropout": cfg.dropout,
            "activation": cfg.activation,
            "batch_first": True,
            "norm_first": cfg.norm_first,
        }
        # built by hand only so that post-LN gets no final norms (as ours); for pre-LN this
        # is exactly what nn.Transformer builds itself
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer_kw),
            cfg.n_encoder_layers,
            norm=nn.LayerNorm(d) if cfg.norm_first else None,
            enable_nested_tensor=False,  # unused with norm_first anyway; avoids a warning
        )
        decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer_kw),
            cfg.n_decoder_layers,
            norm=nn.LayerNorm(d) if cfg.norm_first else None,
        )
        self.transformer = nn.Transformer(
            d_model=d,
            nhead=cfg.n_heads,
            custom_encoder=encoder,
            custom_decoder=decoder,
            batch_first=True,
            norm_first=cfg.norm_first,
        )
        for module in self.transformer.modules():  # attention dropout, as ours, separately
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = cfg.attention_dropout
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=False)

        self._init_weights()
        if cfg.tie_embeddings:
            if shared_vocab:
                self.tgt_embed.weight = self.src_embed.weight
            self.output_proj.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        """The same initialisation as ours: Xavier projections, zero biases, N(0, d^-1/2)
        embeddings with a zero pad row (speed does not depend on it; loss curves would)."""
        std = self.d_model**-0.5
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.MultiheadAttention):
                nn.init.xavier_uniform_(module.in_proj_weight)
                nn.init.zeros_(module.in_proj_bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        nn.init.normal_(self.output_proj.weight, mean=0.0, std=std)
        with torch.no_grad():
            self.src_embed.weight[self.pad_id].zero_()
            self.tgt_embed.weight[self.pad_id].zero_()

    # ----------------------------------------------------------------- weights from ours
    _RENAMES: ClassVar[list[tuple[str, str]]] = [
        (r"^encoder_layers\.", "transformer.encoder.layers."),
        (r"^decoder_layers\.", "transformer.decoder.layers."),
        (r"^encoder_norm\.", "transformer.encoder.norm."),
        (r"^decoder_norm\.", "transformer.decoder.norm."),
        (r"\.cross_attn\.", ".multihead_attn."),
        (r"_attn\.in_proj\.weight$", "_attn.in_proj_weight"),
        (r"_attn\.in_proj\.bias$", "_attn.in_proj_bias"),
        (r"\.ff\.linear", ".linear"),
    ]

    @classmethod
    def peer_key(cls, key: str) -> str:
        """The name in this model of parameter/buffer ``key`` of a ``tinymt`` model."""
        for pattern, repl in cls._RENAMES:
            key = re.sub(pattern, repl, key)
        return key

    @torch.no_grad()
    def load_from_ours(self, model: nn.Module) -> PeerTransformer:
        """Copy every weight of a :class:`tinymt.model.Transformer` of the same shape."""
        state = {}
        for key, value in model.state_dict().items():
            if key.startswith("head_mask_"):  # ours can switch heads off; the peer cannot
                if not bool(value.eq(1).all()):
                    raise TinyMTError(f"this model has pruned heads ({key}); the "
                                      "nn.Transformer peer cannot mask heads")
                continue
            state[self.peer_key(key)] = value
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except RuntimeError as e:  # shapes differ
            first = str(e).strip().splitlines()[-1].strip()[:200]
            raise TinyMTError(f"the peer does not match this model: {first}") from None
        if missing or unexpected:
            raise TinyMTError(
                f"the peer does not match this model: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}"
            )
        return self

    # ----------------------------------------------------------------- helpers
    def _check_length(self, length: int, what: str) -> None:
        if length > self.max_positions:
            raise TinyMTError(
                f"{what} of {length} tokens is longer than model.max_positions="
                f"{self.max_positions}"
            )

    @staticmethod
    def _no_extras(need_weights: bool, head_gates) -> None:
        if need_weights or head_gates is not None:
            raise TinyMTError("the nn.Transformer peer returns no attention weights and has "
                              "no head gates")

    def _embed_src(self, src: Tensor) -> Tensor:
        S = src.size(1)
        self._check_length(S, "a source sentence")
        return self.dropout(self.src_embed(src) * self.embed_scale + self.src_pos(S))

    def _embed_tgt(self, tgt_in: Tensor) -> Tensor:
        T = tgt_in.size(1)
        self._check_length(T, "a target sentence")
        return self.dropout(self.tgt_embed(tgt_in) * self.embed_scale + self.tgt_pos(T))

    @staticmethod
    def _causal(T: int, device) -> Tensor:
        """``(T, T)`` bool, True above the diagonal (= may not attend), as torch wants."""
        return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)

    # ----------------------------------------------------------------- model
    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_pad_mask: Tensor | None = None,
        tgt_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        head_gates=None,
    ) -> tuple[Tensor, None]:
        """``(src (B, S), tgt_in (B, T))`` -> ``(logits (B, T, V_tgt), None)``."""
        self._no_extras(need_weights, head_gates)
        if src_pad_mask is None:
            src_pad_mask = src.eq(self.pad_id)  # (B, S)
        if tgt_pad_mask is None:
            tgt_pad_mask = tgt_in.eq(self.pad_id)  # (B, T)
        T = tgt_in.size(1)
        h = self.transformer(
            self._embed_src(src), self._embed_tgt(tgt_in),
            tgt_mask=self._causal(T, tgt_in.device),
            src_key_padding_mask=src_pad_mask,
            tgt_key_padding_mask=tgt_pad_mask,
            memory_key_padding_mask=src_pad_mask,
            tgt_is_causal=True,
        )  # (B, T, d)
        return self.output_proj(h), None  # (B, T, V_tgt)

    def encode(
        self,
        src: Tensor,
        src_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        head_gates=None,
    ) -> tuple[Tensor, None]:
        """Source tokens ``(B, S)`` -> ``(memory (B, S, d), None)``."""
        self._no_extras(need_weights, head_gates)
        if src_pad_mask is None:
            src_pad_mask = src.eq(self.pad_id)
        memory = self.transformer.encoder(self._embed_src(src), src_key_padding_mask=src_pad_mask)
        return memory, None

    def decode_hidden(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor | None,
        tgt_pad_mask: Tensor | None = None,
    ) -> Tensor:
        """The decoder's output states ``(B, T, d)`` (before the vocabulary projection)."""
        T = tgt_in.size(1)
        return self.transformer.decoder(
            self._embed_tgt(tgt_in), memory,
            tgt_mask=self._causal(T, tgt_in.device),
            tgt_key_padding_mask=tgt_pad_mask,
            memory_key_padding_mask=src_pad_mask,
            tgt_is_causal=True,
        )

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor | None,
        tgt_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        head_gates=None,
        last_only: bool = False,
    ) -> tuple[Tensor, None]:
        """Teacher-forced decoder: ``tgt_in`` ``(B, T)`` -> ``(logits (B, T, V_tgt), None)``
        (``(B, V_tgt)`` of the last position with ``last_only``)."""
        self._no_extras(need_weights, head_gates)
        if tgt_pad_mask is None:
            tgt_pad_mask = tgt_in.eq(self.pad_id)
        hidden = self.decode_hidden(tgt_in, memory, src_pad_mask, tgt_pad_mask)  # (B, T, d)
        if last_only:
            hidden = hidden[:, -1]  # (B, d)
        return self.output_proj(hidden), None

    # ----------------------------------------------------------------- search
    @torch.inference_mode()
    def greedy_decode(
        self,
        src: Tensor,
        src_pad_mask: Tensor | None = None,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        bos_id: int = 2,
        eos_id: int = 3,
    ) -> list[list[int]]:
        """Greedy search that re-runs the decoder on the whole prefix at every step.

        Same conventions as :func:`tinymt.decoding.greedy_decode`: at most
        ``int(max_len_a * src_len + max_len_b)`` tokens (capped by ``max_positions``),
        pad and bos never generated, finished sentences leave the batch, results hold
        neither BOS nor EOS.
        """
        was_training = self.training
        self.eval()
        try:
            if src_pad_mask is None:
                src_pad_mask = src.eq(self.pad_id)  # (B, S)
            memory, _ = self.encode(src, src_pad_mask)  # (B, S, d)
            B, device = src.size(0), src.device
            cap = self.max_positions - 1
            src_lens = (~src_pad_mask).sum(dim=1).tolist()
            max_lens = [max(0, min(int(max_len_a * n + max_len_b), cap)) for n in src_lens]
            results: list[list[int]] = [[] for _ in range(B)]
            alive = [b for b in range(B) if max_lens[b] > 0]
            if not alive:
                return results
            rows = torch.tensor(alive, device=device)
            memory, src_pad_mask = memory[rows], src_pad_mask[rows]
            row_max = torch.tensor([max_lens[b] for b in alive], device=device)  # (N,)
            prefix = torch.full((len(alive), 1), bos_id, dtype=torch.long, device=device)
            banned = [i for i in (self.pad_id, bos_id) if 0 <= i < self.tgt_vocab_size]
            step = 0
            while alive:
                step += 1
                h = self.decode_hidden(prefix, memory, src_pad_mask)[:, -1]  # (N, d)
                logits = self.output_proj(h).float()  # (N, V)
                logits[:, banned] = float("-inf")
                next_tok = logits.argmax(dim=-1)  # (N,)
                prefix = torch.cat([prefix, next_tok[:, None]], dim=1)  # (N, step + 1)
                hit_eos = next_tok.eq(eos_id)
                done = hit_eos | row_max.le(step)
                if not done.any():
                    continue
                done_rows = done.nonzero().flatten().tolist()
                tokens = prefix[done_rows, 1:].tolist()
                for r, toks, ended in zip(done_rows, tokens, hit_eos[done_rows].tolist()):
                    results[alive[r]] = toks[:-1] if ended else toks
                keep = (~done).nonzero().flatten()
                alive = [alive[r] for r in keep.tolist()]
                if alive:
                    prefix, row_max = prefix[keep], row_max[keep]
                    memory, src_pad_mask = memory[keep], src_pad_mask[keep]
            return results
        finally:
            self.train(was_training)
