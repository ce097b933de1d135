"""Multi-item scoring: one member prefix, many item suffixes, one pass over the prefix.

For a prefix of P tokens and N item suffixes, item i's score equals the single-sequence score of
``prefix + item_i``: item tokens sit at positions P.., attend to the (real) prefix tokens and to their
own earlier tokens, never to other items. Per decoder layer the prefix is computed once; its keys and
values are shared by every item (no copy: the items' queries are laid out as one long row per KV head
and multiplied against the prefix keys in one matmul), and the items attend to themselves in a batched
causal pass. The two score blocks are joined before one softmax, so the result is exact.

Shapes (B members, each with its own prefix; right padding everywhere):
``prefix_ids``/``prefix_mask`` [B, P], ``item_ids``/``item_mask`` [B, N, L] -> ``score`` [B, N].

The decoder layers are the Hugging Face modules themselves (norms, projections, MLP, rotary
embedding); only the attention wiring is ours. Llama-style decoders (Llama, Mistral, Qwen2) are
supported; others raise ``ValueError`` at construction.
"""

from __future__ import annotations

import torch
from torch import nn

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

# Added to the attention scores of masked keys: exp() of it is 0 in FP32, and it stays finite in FP16 and
# BF16 (float32's lowest value overflows them to -inf, and a fully masked padding row then turns to NaN
# and spreads through the Q/DQ graph's FP16 layers).
MASKED_SCORE = -1.0e4


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` [rows, heads, seq, d] with cos/sin [rows, seq, d]."""
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


class MultiItemScorer(nn.Module):
    """A ``ScorerGraph``'s decoder and label head, run as prefix-once multi-item scoring.

    Shares the graph's modules (training it trains the graph).
    """

    def __init__(self, graph: nn.Module):
        super().__init__()
        config = graph.body.config
        model_type = getattr(config, "model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"multi-item scoring supports {', '.join(SUPPORTED_MODEL_TYPES)} decoders, got {model_type!r}"
            )
        self.scorer = graph  # not "graph": torch.export reserves that attribute name
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5

    @property
    def body(self) -> nn.Module:
        return self.scorer.body

    @property
    def layers(self) -> nn.ModuleList:
        return self.scorer.body.layers

    # -- the public graph -------------------------------------------------------------------------

    def forward(
        self,
        prefix_ids: torch.Tensor,
        prefix_mask: torch.Tensor,
        item_ids: torch.Tensor,
        item_mask: torch.Tensor,
    ) -> torch.Tensor:
        """``score`` [B, N] = logit(yes) - logit(no) of every item."""
        logits = self.label_logits(prefix_ids, prefix_mask, item_ids, item_mask)
        return logits[..., 0] - logits[..., 1]

    def label_logits(
        self,
        prefix_ids: torch.Tensor,
        prefix_mask: torch.Tensor,
        item_ids: torch.Tensor,
        item_mask: torch.Tensor,
    ) -> torch.Tensor:
        """(yes, no) logits [B, N, 2] at each item's last real token."""
        embed = self.body.embed_tokens
        _, item_h = self.run_layers(
            embed(prefix_ids), prefix_mask, embed(item_ids), item_mask, self.layers, prefix_out=False
        )
        return self.head_logits(item_h, item_mask)

    def head_logits(self, item_h: torch.Tensor, item_mask: torch.Tensor) -> torch.Tensor:
        """Final norm and the two label rows at each item's last real token: [B, N, 2]."""
        batch, items, length, hidden = item_h.shape
        last = (item_mask.sum(dim=-1) - 1).clamp(min=0).reshape(batch * items)
        flat = item_h.reshape(batch * items, length, hidden)
        rows = torch.arange(batch * items, device=item_h.device)
        picked = self.body.norm(flat[rows, last])
        # Two rows: FP32 costs nothing here, and under BF16 autocast a logit's rounding (about 0.1 at the
        # label logits' size) would be as large as the margins the losses learn from.
        with torch.autocast(picked.device.type, enabled=False):
            logits = self.scorer.label_head(picked.float()) * self.scorer.logit_scale
        return logits.reshape(batch, items, 2)

    # -- layers -----------------------------------------------------------------------------------

    def run_layers(
        self,
        prefix_h: torch.Tensor,
        prefix_mask: torch.Tensor,
        item_h: torch.Tensor,
        item_mask: torch.Tensor,
        layers,
        *,
        prefix_out: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states of prefix [B, P, D] and items [B, N, L, D] after ``layers`` (no final norm).

        ``prefix_out`` False skips what only the prefix's output needs (the last layer's prefix
        attention output and MLP); the returned prefix states are then those before the last layer.
        """
        batch, items, length, hidden = item_h.shape
        prefix_len = prefix_mask.sum(dim=-1)  # [B]
        positions = torch.arange(prefix_h.shape[1], device=prefix_h.device).unsqueeze(0)
        prefix_pos = positions.expand(batch, -1)
        item_pos = (
            prefix_len[:, None, None] + torch.arange(length, device=item_h.device)[None, None, :]
        ).expand(batch, items, length)
        rotary = self.body.rotary_emb
        prefix_rot = rotary(prefix_h, prefix_pos)
        item_rot = rotary(item_h, item_pos.reshape(batch * items, length))
        masks = self._masks(prefix_mask, length)
        flat_items = item_h.reshape(batch * items, length, hidden)
        layers = list(layers)
        for index, layer in enumerate(layers):
            last = index == len(layers) - 1 and not prefix_out
            prefix_h, flat_items = self._layer(
                layer, prefix_h, flat_items, prefix_rot, item_rot, masks, items, update_prefix=not last
            )
        return prefix_h, flat_items.reshape(batch, items, length, hidden)

    def _masks(self, prefix_mask: torch.Tensor, length: int):
        """Additive masks: prefix self-attention [B,1,P,P] (causal, padding), items on the prefix
        [B,1,1,1,P] (padding) and items on themselves [1,1,L,L] (causal)."""
        dtype = torch.float32
        neg = MASKED_SCORE
        plen = prefix_mask.shape[1]
        device = prefix_mask.device
        causal_p = torch.ones(plen, plen, dtype=torch.bool, device=device).tril()
        keys_real = prefix_mask.bool()[:, None, None, :]
        prefix_self = (~(causal_p[None, None] & keys_real)).to(dtype) * neg
        on_prefix = (~prefix_mask.bool()).to(dtype)[:, None, None, None, :] * neg
        causal_i = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        item_self = (~causal_i).to(dtype)[None, None] * neg
        return prefix_self, on_prefix, item_self

    def _project(self, attn: nn.Module, h: torch.Tensor, rot):
        rows, seq, _ = h.shape
        q = attn.q_proj(h).view(rows, seq, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(rows, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(rows, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rot
        return _rope(q, cos, sin), _rope(k, cos, sin), v

    def _grouped(self, q: torch.Tensor) -> torch.Tensor:
        """[rows, H, S, d] -> [rows, Hkv, g*S, d]: query heads grouped by the KV head they read."""
        rows, _, seq, dim = q.shape
        group = self.heads // self.kv_heads
        return q.reshape(rows, self.kv_heads, group * seq, dim)

    def _layer(self, layer, prefix_h, item_h, prefix_rot, item_rot, masks, items: int, update_prefix: bool):
        prefix_self, on_prefix, item_self = masks
        attn = layer.self_attn
        group = self.heads // self.kv_heads
        batch, plen, _ = prefix_h.shape
        rows, length, _ = item_h.shape

        # Prefix: ordinary causal self-attention.
        p_in = layer.input_layernorm(prefix_h)
        qp, kp, vp = self._project(attn, p_in, prefix_rot)
        # The prefix's own keys and values are what the items need; its attention output only feeds
        # the next layer.

        # Items: scores against the shared prefix keys and against their own keys, one softmax.
        i_in = layer.input_layernorm(item_h)
        qi, ki, vi = self._project(attn, i_in, item_rot)  # [B*N, H, L, d], [B*N, Hkv, L, d]
        # Prefix part: every item's queries of one member in one row per KV head.
        qi_m = qi.view(batch, items, self.kv_heads, group, length, self.head_dim)
        qi_m = qi_m.permute(0, 2, 3, 1, 4, 5).reshape(batch, self.kv_heads, group * items * length, -1)
        s_pre = torch.matmul(qi_m, kp.transpose(-1, -2)) * self.scaling  # [B, Hkv, g*N*L, P]
        s_pre = s_pre.view(batch, self.kv_heads, group, items, length, plen).permute(0, 3, 1, 2, 4, 5)
        s_pre = s_pre.reshape(batch, items, self.heads, length, plen) + on_prefix
        s_own = torch.matmul(self._grouped(qi), ki.transpose(-1, -2)) * self.scaling  # [B*N, Hkv, g*L, L]
        s_own = s_own.view(batch, items, self.heads, length, length) + item_self
        probs = torch.softmax(torch.cat([s_pre, s_own], dim=-1), dim=-1)
        a_pre, a_own = probs[..., :plen], probs[..., plen:]
        a_pre = a_pre.reshape(batch, items, self.kv_heads, group, length, plen).permute(0, 2, 3, 1, 4, 5)
        o_pre = torch.matmul(a_pre.reshape(batch, self.kv_heads, group * items * length, plen), vp)
        o_pre = o_pre.view(batch, self.kv_heads, group, items, length, self.head_dim)
        o_pre = o_pre.permute(0, 3, 1, 2, 4, 5).reshape(rows, self.heads, length, self.head_dim)
        a_own = a_own.reshape(rows, self.kv_heads, group * length, length)
        o_own = torch.matmul(a_own, vi).view(rows, self.heads, length, self.head_dim)
        oi = (o_pre + o_own).transpose(1, 2).reshape(rows, length, self.heads * self.head_dim)

        if update_prefix:
            sp = torch.matmul(self._grouped(qp), kp.transpose(-1, -2)) * self.scaling
            ap = torch.softmax(sp.view(batch, self.heads, plen, plen) + prefix_self, dim=-1)
            op = torch.matmul(ap.view(batch, self.kv_heads, group * plen, plen), vp)
            op = op.view(batch, self.heads, plen, self.head_dim).transpose(1, 2)
            prefix_h = prefix_h + attn.o_proj(op.reshape(batch, plen, self.heads * self.head_dim))
            prefix_h = prefix_h + layer.mlp(layer.post_attention_layernorm(prefix_h))
        item_h = item_h + attn.o_proj(oi)
        item_h = item_h + layer.mlp(layer.post_attention_layernorm(item_h))
        return prefix_h, item_h
