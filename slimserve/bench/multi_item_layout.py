"""Which multi-item layout is faster on this machine: the prefix run once with its keys and values
shared by a batched pass over the items (``MultiItemScorer``), or SGLang's single packed sequence with a
block attention mask, against the single-sequence baseline (one full sequence per candidate).

All three run in PyTorch FP32 on the same model and the same tokens, so only the layout differs.
``python -m slimserve.bench.multi_item_layout --model <HF dir>|student-shape --prefix 150 --item 40
--items 1,10,50,200``; ``student-shape`` is a random model with the cpu recipe's student sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F


def student_shaped_lm(layers: int = 12, heads: int = 6, kv_heads: int = 3, mlp: int = 768):
    """A random Llama with the cpu recipe's scoring-student sizes (speed does not depend on weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def block_mask_scores(scorer, prefix: torch.Tensor, items: list[torch.Tensor]) -> torch.Tensor:
    """SGLang's layout: prefix and all items packed in one sequence; each item's tokens see the prefix
    and their own earlier tokens (block mask), positions restart after the prefix for every item."""
    from slimserve.models.multi_item import _rope

    body = scorer.body
    plen = prefix.shape[0]
    ids = torch.cat([prefix, *items])[None]
    positions = torch.cat([torch.arange(plen)] + [plen + torch.arange(len(i)) for i in items])[None]
    total = ids.shape[1]
    allowed = torch.zeros(total, total, dtype=torch.bool)
    allowed[:plen, :plen] = torch.ones(plen, plen, dtype=torch.bool).tril()
    ends, start = [], plen
    for item in items:
        end = start + len(item)
        allowed[start:end, :plen] = True
        allowed[start:end, start:end] = torch.ones(len(item), len(item), dtype=torch.bool).tril()
        ends.append(end - 1)
        start = end
    h = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(h, positions)
    group = scorer.heads // scorer.kv_heads
    for layer in body.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(1, total, scorer.heads, scorer.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, total, scorer.kv_heads, scorer.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, total, scorer.kv_heads, scorer.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, total, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    last = body.norm(h[0, ends])
    logits = scorer.scorer.label_head(last) * scorer.scorer.logit_scale
    return logits[:, 0] - logits[:, 1]


def _best_of(fn, seconds: float) -> float:
    fn()  # warm
    best, spent = float("inf"), 0.0
    while spent < seconds or best == float("inf"):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        best, spent = min(best, elapsed), spent + elapsed
    return best


def measure(lm, prefix_len: int, item_len: int, counts: list[int], seconds: float) -> list[dict]:
    """Best-of wall time per layout and item count; checks the layouts agree on the scores."""
    from slimserve.models.multi_item import MultiItemScorer
    from slimserve.models.scorer_graph import ScorerGraph
    from slimserve.tokenization import pad_batch, pad_multi_item

    graph = ScorerGraph(lm, 1, 2).eval()
    scorer = MultiItemScorer(graph).eval()
    generator = torch.Generator().manual_seed(0)
    vocab = lm.config.vocab_size
    rows = []
    for count in counts:
        prefix = torch.randint(1, vocab, (prefix_len,), generator=generator)
        items = [torch.randint(1, vocab, (item_len,), generator=generator) for _ in range(count)]
        tensors = [
            torch.from_numpy(a) for a in pad_multi_item([prefix.tolist()], [[i.tolist() for i in items]])
        ]
        ids, mask = (
            torch.from_numpy(a)
            for a in pad_batch([prefix.tolist() + i.tolist() for i in items], prefix_len + item_len)
        )
        with torch.no_grad():
            single = graph(ids, mask)[:, 0]
            multi = scorer(*tensors)[0]
            block = block_mask_scores(scorer, prefix, items)
        timings = {
            "single_sequence": _best_of(partial(graph, ids, mask), seconds),
            "prefix_kv": _best_of(partial(scorer, *tensors), seconds),
            "block_mask": _best_of(partial(block_mask_scores, scorer, prefix, items), seconds),
        }
        rows.append(
            {
                "items": count,
                **{f"{k}_ms": round(v * 1e3, 1) for k, v in timings.items()},
                "max_abs_diff_prefix_kv": float((multi - single).abs().max()),
                "max_abs_diff_block_mask": float((block - single).abs().max()),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="student-shape", help="HF model directory or student-shape")
    parser.add_argument("--prefix", type=int, default=150, help="Prefix tokens")
    parser.add_argument("--item", type=int, default=40, help="Tokens per item")
    parser.add_argument("--items", default="1,10,50,200", help="Item counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="Seconds per measurement")
    parser.add_argument("--threads", type=int, default=0, help="PyTorch threads (0: its default)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.model == "student-shape":
        lm = student_shaped_lm()
    else:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    counts = [int(c) for c in args.items.split(",")]
    for row in measure(lm, args.prefix, args.item, counts, args.seconds):
        sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
