"""Explanation prompts from the dataset, and text generated for them (batched, KV cache, cached on disk).

Prompts are ``render_chat_prompt(render_explain_request(member, item))`` tokenized without added special
tokens, as the served generator sees them. ``generate`` runs Hugging Face ``generate`` on left-padded,
length-sorted batches (the KV cache makes each new token one step); with ``top_k`` it also keeps the
model's ``top_k`` log-probabilities at every generated position: the teacher's targets for off-policy
distillation come from the generation pass itself, at no extra cost. ``Sampling.precision`` bf16 runs
the decoder on a BF16 copy of the weights (``precision.decoding_copy``; the LM head and the log-probs
stay FP32).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .precision import Precision, decoding_copy

END_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class Sampling:
    """How continuations are drawn: greedy when ``temperature`` is 0; the decoder's weights at
    ``precision`` (resolved on the model's device; ``precision.decoding_copy``)."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    precision: Precision = "fp32"


def chat_prompts(user_texts: Sequence[str], tokenizer_file: Path, max_tokens: int) -> list[list[int]]:
    """Token ids of ``render_chat_prompt(text)`` for each user text (head and tail kept when too long)."""
    from tokenizers import Tokenizer

    from ..prompts import render_chat_prompt
    from ..tokenization import truncate_head_tail

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    encodings = tokenizer.encode_batch([render_chat_prompt(t) for t in user_texts], add_special_tokens=False)
    return [truncate_head_tail(e.ids, max_tokens) for e in encodings]


def explain_prompts(examples: Sequence, tokenizer_file: Path, max_tokens: int) -> list[list[int]]:
    """Token ids of each example's explanation chat prompt (head and tail kept when too long)."""
    from ..prompts import render_explain_request

    return chat_prompts(
        [render_explain_request(e.member, e.item) for e in examples], tokenizer_file, max_tokens
    )


def end_token_ids(tokenizer_file: Path) -> list[int]:
    """Ids of the end-of-turn and end-of-text tokens (those the tokenizer has)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ids = [tokenizer.token_to_id(token) for token in END_TOKENS]
    ids = [i for i in ids if i is not None]
    if not ids:
        raise ValueError(f"{tokenizer_file}: none of the end tokens {END_TOKENS} is in the vocabulary")
    return ids


def pick(examples: Sequence, count: int, seed: int) -> list:
    """``count`` examples drawn without replacement by a seeded generator (all when fewer)."""
    order = np.random.default_rng(seed).permutation(len(examples))[:count]
    return [examples[i] for i in sorted(order)]


def pick_balanced(examples: Sequence, count: int, seed: int, group: Callable[[object], str]) -> list:
    """``count`` examples drawn without replacement, as evenly over ``group(example)`` as the groups
    allow (a small group is taken whole, the others share the rest); seeded, in the input's order."""
    rng = np.random.default_rng(seed)
    groups: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        groups.setdefault(group(example), []).append(i)
    queues = [list(rng.permutation(members)) for _, members in sorted(groups.items())]
    chosen: list[int] = []
    while len(chosen) < count and any(queues):
        for queue in queues:
            if queue and len(chosen) < count:
                chosen.append(int(queue.pop()))
    return [examples[i] for i in sorted(chosen)]


def pad_left(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) int64, left-padded to the longest sequence (for generation)."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, length - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, length - len(seq) :] = 1
    return ids, mask


def cut_at_end(tokens: Sequence[int], end_ids: Sequence[int]) -> list[int]:
    """Tokens up to and including the first end token (the padding after it dropped)."""
    out = []
    for token in tokens:
        out.append(int(token))
        if token in end_ids:
            break
    return out


@dataclass
class Generated:
    """Continuations per prompt and, when asked for, the generator's top-k log-probs at each of their
    positions (rows ``offsets[i]:offsets[i+1]`` belong to continuation ``i``)."""

    responses: list[list[int]]
    topk_logprobs: np.ndarray | None = None  # [tokens, k] float32
    topk_ids: np.ndarray | None = None  # [tokens, k] int64

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(r) for r in self.responses])]).astype(np.int64)

    def targets(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-k log-probs, token ids) at the positions of continuation ``index``."""
        start, stop = self.offsets[index], self.offsets[index + 1]
        return torch.from_numpy(self.topk_logprobs[start:stop]), torch.from_numpy(self.topk_ids[start:stop])


@torch.no_grad()
def generate(
    model,
    prompts: Sequence[Sequence[int]],
    sampling: Sampling,
    end_ids: Sequence[int],
    batch_size: int = 16,
    top_k: int | None = None,
    progress: Callable[[int], object] | None = None,
) -> Generated:
    """Continue every prompt (batched, left-padded, KV cache, on the model's device); each batch is seeded
    from ``sampling.seed`` and its position, so the result does not depend on anything but the inputs."""
    from transformers import GenerationConfig

    sample = sampling.temperature > 0
    config = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        do_sample=sample,
        temperature=sampling.temperature if sample else None,
        top_p=sampling.top_p if sample else None,
        top_k=0 if sample else None,
        pad_token_id=end_ids[-1],
        eos_token_id=list(end_ids),
        output_logits=top_k is not None,
        return_dict_in_generate=True,
    )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    responses: list[list[int]] = [[] for _ in prompts]
    topk: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(prompts)
    was_training = model.training
    model.eval()
    decoder = decoding_copy(model, sampling.precision)
    try:
        for number, start in enumerate(range(0, len(order), batch_size)):
            chunk = order[start : start + batch_size]
            ids, mask = pad_left([prompts[i] for i in chunk], end_ids[-1])
            torch.manual_seed(sampling.seed * 100_003 + number)
            out = decoder.generate(
                input_ids=ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config
            )
            new = out.sequences[:, ids.shape[1] :].cpu()
            for row, index in enumerate(chunk):
                responses[index] = cut_at_end(new[row].tolist(), end_ids)
            if top_k is not None:
                logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
                values, indices = (t.cpu() for t in logprobs.topk(top_k, dim=-1))
                for row, index in enumerate(chunk):
                    length = len(responses[index])
                    topk[index] = (values[row, :length].numpy(), indices[row, :length].numpy())
            if progress is not None:
                progress(len(chunk))
    finally:
        model.train(was_training)
    if top_k is None:
        return Generated(responses)
    return Generated(
        responses,
        np.concatenate([t[0] for t in topk]).astype(np.float32),
        np.concatenate([t[1] for t in topk]).astype(np.int64),
    )


@dataclass
class TeacherText:
    """Prompts, the teacher's text for them, and (for training) its top-k log-probs per text token."""

    keys: list[str]  # member_id/item_id of each prompt
    prompts: list[list[int]]
    generated: Generated

    @property
    def responses(self) -> list[list[int]]:
        return self.generated.responses

    def save(self, directory: Path, name: str, decode: Callable[[list[int]], str] | None = None) -> None:
        """``<name>.json`` (ids, and the decoded text when ``decode`` is given) and ``<name>_topk.npz``."""
        rows = []
        for key, prompt, response in zip(self.keys, self.prompts, self.responses, strict=True):
            row = {"key": key, "prompt": prompt, "response": response}
            if decode is not None:
                row["text"] = decode(response)
            rows.append(row)
        (directory / f"{name}.json").write_text(json.dumps(rows) + "\n")
        if self.generated.topk_logprobs is not None:
            np.savez(
                directory / f"{name}_topk.npz",
                logprobs=self.generated.topk_logprobs,
                ids=self.generated.topk_ids,
            )

    @classmethod
    def load(cls, directory: Path, name: str) -> TeacherText:
        rows = json.loads((directory / f"{name}.json").read_text())
        generated = Generated([r["response"] for r in rows])
        topk = directory / f"{name}_topk.npz"
        if topk.is_file():
            with np.load(topk) as arrays:
                generated.topk_logprobs, generated.topk_ids = arrays["logprobs"], arrays["ids"]
        return cls([r["key"] for r in rows], [r["prompt"] for r in rows], generated)
