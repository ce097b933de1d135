"""The scoring graph: a causal LM reduced to one number per sequence, ``logit(yes) - logit(no)``.

It never computes full-vocabulary logits: it takes the final hidden state at the last real token
(sequences are right-padded, so that is ``sum(attention_mask) - 1``) and applies only the two label rows
of the LM head, as vLLM does for LLM rerankers.
"""

from __future__ import annotations

import torch
from torch import nn


class ScorerGraph(nn.Module):
    """Wraps a Hugging Face causal LM: (input_ids, attention_mask) [batch, seq] -> score [batch, 1]."""

    def __init__(self, causal_lm: nn.Module, yes_token_id: int, no_token_id: int):
        super().__init__()
        self.body = causal_lm.get_decoder() if hasattr(causal_lm, "get_decoder") else causal_lm.model
        head = causal_lm.get_output_embeddings()
        rows = head.weight[[yes_token_id, no_token_id]].detach().clone()
        self.label_head = nn.Linear(rows.shape[1], 2, bias=head.bias is not None)
        self.label_head.weight.data.copy_(rows)
        if head.bias is not None:
            self.label_head.bias.data.copy_(head.bias[[yes_token_id, no_token_id]].detach())
        # Some models scale logits (e.g. Gemma soft-capping is not supported; a plain scale is).
        self.logit_scale = float(getattr(causal_lm.config, "logit_scale", 1.0) or 1.0)

    def label_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The two label logits [batch, 2] (yes, no) at the last real token."""
        hidden = self.body(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        last = attention_mask.sum(dim=1) - 1
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return self.label_head(hidden[rows, last]) * self.logit_scale

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.label_logits(input_ids, attention_mask)
        return logits[:, 0:1] - logits[:, 1:2]
