"""Greedy-decoding parity of an exported generator: PyTorch tokens vs the served ONNX decoding engine.

The ONNX side runs ``slimserve.triton_models.generator.BatchEngine``, the code the Triton model runs,
with every prompt in one batch (different lengths, right-padded KV cache), so the check covers the
batching as well as the graph. End tokens do not stop either side: each prompt yields ``new_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..examples import EXAMPLE_MEMBER, example_candidates
from ..prompts import render_chat_prompt, render_explain_request


@dataclass(frozen=True)
class GreedyParity:
    """How far the ONNX greedy tokens agree with PyTorch's."""

    prompts: int
    new_tokens: int
    identical_sequences: int
    token_agreement: float  # share of positions with the same token
    prefix_agreement: float  # mean share of each sequence before its first differing token

    @property
    def identical(self) -> bool:
        return self.identical_sequences == self.prompts

    def as_dict(self) -> dict:
        return {**asdict(self), "identical": self.identical}


def explanation_prompts(count: int = 8) -> list[str]:
    """``count`` chat prompts asking to explain example jobs to the example member (explain-v1)."""
    return [
        render_chat_prompt(render_explain_request(EXAMPLE_MEMBER, item)) for item in example_candidates(count)
    ]


def encode_prompts(tokenizer_file: Path, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of ``prompts`` as the service makes them (``add_special_tokens=False``)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return [encoding.ids for encoding in tokenizer.encode_batch(list(prompts), add_special_tokens=False)]


def _cache_keyword(model) -> str:
    """The forward argument carrying the KV cache: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def torch_greedy(
    model, sequences: Sequence[Sequence[int]], new_tokens: int, threads: int | None = 1
) -> list[list[int]]:
    """Greedy tokens from the PyTorch model, one prompt at a time, with its own KV cache.

    ``threads`` torch threads while it runs (None: leave torch's setting). One by default: on a busy
    2-core host, SmolLM2's reference took 54 s on one thread and 663 s on two (load average about 10).
    """
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _torch_greedy(model, _cache_keyword(model), sequences, new_tokens)
    finally:
        torch.set_num_threads(previous)


def _torch_greedy(model, keyword: str, sequences, new_tokens: int) -> list[list[int]]:
    import torch

    outputs = []
    with torch.no_grad():
        for prompt in sequences:
            result = model(input_ids=torch.tensor([list(prompt)]), use_cache=True, logits_to_keep=1)
            tokens = []
            for step in range(new_tokens):
                token = int(result.logits[0, -1].argmax())
                tokens.append(token)
                if step + 1 < new_tokens:
                    cache = {keyword: getattr(result, keyword)}
                    result = model(input_ids=torch.tensor([[token]]), use_cache=True, **cache)
            outputs.append(tokens)
    return outputs


def onnx_greedy(
    onnx_path: Path, sequences: Sequence[Sequence[int]], new_tokens: int, intra_op_threads: int = 0
) -> list[list[int]]:
    """Greedy tokens from the ONNX decoder through the Triton model's batching engine, all prompts at once."""
    from ..triton_models.generator import BatchEngine, GenerationRequest, OnnxDecoder, generate

    engine = BatchEngine(OnnxDecoder(onnx_path, intra_op_threads), eos_token_ids=())
    requests = [GenerationRequest(tuple(int(t) for t in s), new_tokens) for s in sequences]
    return generate(engine, requests)


def compare_greedy(reference: Sequence[Sequence[int]], candidate: Sequence[Sequence[int]]) -> GreedyParity:
    """Agreement of two sets of greedy token sequences (same prompts, same lengths)."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(
            f"need the same non-zero number of sequences, got {len(reference)} and {len(candidate)}"
        )
    same = total = identical = 0
    prefixes = []
    for ref, cand in zip(reference, candidate, strict=True):
        if len(ref) != len(cand):
            raise ValueError(f"sequence lengths differ: {len(ref)} and {len(cand)}")
        matches = [a == b for a, b in zip(ref, cand, strict=True)]
        same += sum(matches)
        total += len(ref)
        identical += all(matches)
        prefix = next((i for i, match in enumerate(matches) if not match), len(matches))
        prefixes.append(prefix / max(len(ref), 1))
    return GreedyParity(
        prompts=len(reference),
        new_tokens=len(reference[0]),
        identical_sequences=identical,
        token_agreement=same / max(total, 1),
        prefix_agreement=sum(prefixes) / len(prefixes),
    )
