"""Triton python-backend model ``generator``: streaming text generation with iteration-level batching.

Copied by the export as ``<repo>/generator/<version>/model.py`` next to ``model.onnx`` (a decoder with a
KV cache built by ONNX Runtime GenAI's model builder: ``GroupQueryAttention`` layers, inputs
``input_ids``, ``attention_mask``, ``past_key_values.<i>.key/value``; outputs ``logits`` [batch, 1, vocab]
for the last position and ``present.<i>.key/value``). Self-contained on purpose (numpy, onnxruntime and
the standard library only): it runs in Triton's python stub, possibly where slimserve is not installed.

The model is decoupled. ``execute`` only validates and enqueues; one background thread runs the decoding
loop: at every step it admits queued requests into free slots (a prefill of the prompt, whose logits give
the first token), then decodes one token for every active sequence in one ONNX Runtime run, and streams
each sequence's token through its response sender. Every round trip to the Triton process (sending a
response, asking whether a request was cancelled) runs on a second thread, the ``Messenger``, while
ONNX Runtime computes the next step. The batched KV cache is right-padded: row ``b`` holds
``lengths[b]`` valid positions and the attention mask tells the GQA kernel each row's length, so rows of
different lengths decode together. A sequence that stops (end token, stop id, ``max_tokens``,
cancellation) leaves the batch at once without holding the others.

The pure parts (``OnnxDecoder``, ``KVBatch``, ``Sampler``, ``BatchEngine``, ``parse_request``) import
and run outside Triton; the export's parity check drives the same ``BatchEngine``.
"""

import collections
import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

try:  # Only inside Triton's python stub.
    import triton_python_backend_utils as pb_utils
except ImportError:  # pragma: no cover - exercised outside Triton (unit tests, parity)
    pb_utils = None

DEFAULT_ONNX_FILE = "model.onnx"
GENAI_CONFIG_FILE = "genai_config.json"
# Written beside a graph whose LM head scores a shortlist (``slimserve.export.output_vocab``):
# {"vocab_size": V, "token_ids": [...]}; such a graph also takes the ids of ``EXTRA_TOKENS_INPUT``.
OUTPUT_VOCAB_FILE = "output_vocab.json"
EXTRA_TOKENS_INPUT = "extra_token_ids"
# Optional request input: token ids of the prompt's names, each ended by NAME_END (``NameCopier``).
COPY_NAMES_INPUT = "copy_names"
NAME_END = -1
MAX_COPY_NAME_IDS = 2048
TOKENIZER_FILE = os.path.join("bundle", "tokenizer.json")
GENERATION_FILE = os.path.join("bundle", "generation.json")
MAX_TEMPERATURE = 5.0
MAX_REPETITION_PENALTY = 10.0
FINISH_RUNNING = ""
FINISH_REASONS = ("stop", "length", "cancelled", "error")


_NO_TOKENS = np.zeros(0, dtype=np.int64)
# Spare KV positions an in-place cache grows by at a time (one copy of the cache per this many steps).
KV_HEADROOM = 64


class RequestError(ValueError):
    """A request's inputs are unusable; the message names the field."""


# -- the ONNX decoder ----------------------------------------------------------------------------------


class OnnxDecoder:
    """One ONNX Runtime session over the decoder graph, with its KV-cache tensor names and shapes."""

    def __init__(self, path, intra_op_threads=0, allow_spinning=False, providers=("CPUExecutionProvider",)):
        import onnxruntime as ort

        options = ort.SessionOptions()
        if intra_op_threads:
            options.intra_op_num_threads = int(intra_op_threads)
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
        self.session = ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.past_names = sorted(n for n in inputs if n.startswith("past_key_values."))
        if "input_ids" not in inputs or "attention_mask" not in inputs or not self.past_names:
            raise ValueError(f"{path}: not a decoder with a KV cache (inputs {sorted(inputs)})")
        self.present_names = [n.replace("past_key_values.", "present.", 1) for n in self.past_names]
        shape = inputs[self.past_names[0]].shape  # [batch, kv_heads, past_sequence, head_size]
        self.kv_heads = int(shape[1])
        self.head_size = shape[3] if isinstance(shape[3], int) else _genai_head_size(path)
        self.shortlist, vocab_size = _read_output_vocab(path)
        self.vocab_size = vocab_size or int(self.session.get_outputs()[0].shape[-1])
        self.takes_extra = EXTRA_TOKENS_INPUT in inputs
        self.output_names = ["logits", *self.present_names]
        # On the CPU provider a decode step binds each past and present KV tensor to one buffer, so the
        # GQA kernel appends the new position in place instead of copying the whole cache (``decode``).
        self.in_place = list(providers) == ["CPUExecutionProvider"]

    @property
    def kv_headroom(self):
        """Spare positions its ``KVBatch`` keeps: room for in-place steps, none for copying ones."""
        return KV_HEADROOM if self.in_place else 0

    def empty_cache(self, batch):
        return {n: np.zeros((batch, self.kv_heads, 0, self.head_size), np.float32) for n in self.past_names}

    def extra_tokens(self, tokens):
        """The ids among ``tokens`` the shortlist lacks (sorted, unique): scored as extra rows."""
        if self.shortlist is None:
            return _NO_TOKENS
        ids = np.unique(np.asarray(tokens, dtype=np.int64))
        return ids[~np.isin(ids, self.shortlist, assume_unique=True)]

    def output_columns(self, extra):
        """The logit columns of a step that scores ``extra`` (None without a shortlist: column = id)."""
        return None if self.shortlist is None else OutputColumns(self.shortlist, extra)

    def run(self, input_ids, attention_mask, cache, extra=_NO_TOKENS):
        """One forward pass; returns (last-position logits [batch, outputs], the new cache). With a
        shortlist the outputs are its tokens then ``extra``'s (``output_columns``)."""
        feed = {"input_ids": input_ids, "attention_mask": attention_mask, **cache}
        if self.takes_extra:
            feed[EXTRA_TOKENS_INPUT] = extra
        outputs = self.session.run(self.output_names, feed)
        logits = outputs[0].reshape(input_ids.shape[0], -1)
        return logits, dict(zip(self.past_names, outputs[1:], strict=True))

    def decode(self, tokens, batch, extra=_NO_TOKENS):
        """One token for each row of ``batch`` (a ``KVBatch``); returns the logits [rows, outputs]. Its cache
        gains the new position: written in place into its buffers where ``in_place``, else replaced."""
        if not self.in_place:
            logits, batch.cache = self.run(tokens, batch.step_mask(), batch.cache, extra)
            return logits
        batch.reserve(batch.width + 1)
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", tokens)
        binding.bind_cpu_input("attention_mask", batch.step_mask())
        if self.takes_extra:
            binding.bind_cpu_input(EXTRA_TOKENS_INPUT, extra)
        binding.bind_output("logits", "cpu")  # the first output (outputs come in binding order)
        for past, present in zip(self.past_names, self.present_names, strict=True):
            buffer = batch.cache[past]  # same pointer in and out: GQA's past-present shared buffer
            binding.bind_input(past, "cpu", 0, np.float32, buffer.shape, buffer.ctypes.data)
            binding.bind_output(present, "cpu", 0, np.float32, buffer.shape, buffer.ctypes.data)
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy().reshape(tokens.shape[0], -1)

    def prefill(self, prompt, extra=_NO_TOKENS):
        """Run one prompt alone; returns (logits [outputs], its cache of ``len(prompt)`` positions)."""
        ids = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
        logits, cache = self.run(ids, np.ones_like(ids), self.empty_cache(1), extra)
        return logits[0], cache


class OutputColumns:
    """The logit columns of a shortlisted head: the shortlist's ids, then the extra ids (each sorted)."""

    def __init__(self, shortlist, extra):
        self.parts = ((shortlist, 0), (extra, len(shortlist)))
        self.ids = np.concatenate([shortlist, extra])

    def token(self, column):
        return int(self.ids[column])

    def of(self, ids):
        """The columns of those ``ids`` that have one (binary search in each sorted part)."""
        found = []
        for part, offset in self.parts:
            if part.size:
                at = np.minimum(np.searchsorted(part, ids), part.size - 1)
                found.append(at[part[at] == ids] + offset)
        return np.concatenate(found) if found else _NO_TOKENS


def _read_output_vocab(onnx_path):
    """(shortlist ids, input vocabulary size) from ``output_vocab.json`` beside the graph, or (None, None)."""
    path = os.path.join(os.path.dirname(str(onnx_path)), OUTPUT_VOCAB_FILE)
    if not os.path.isfile(path):
        return None, None
    with open(path) as handle:
        vocab = json.load(handle)
    return np.asarray(vocab["token_ids"], dtype=np.int64), int(vocab["vocab_size"])


def _genai_head_size(onnx_path):
    """The head size from the builder's ``genai_config.json`` (the graph leaves that dim symbolic)."""
    config_path = os.path.join(os.path.dirname(str(onnx_path)), GENAI_CONFIG_FILE)
    with open(config_path) as handle:
        return int(json.load(handle)["model"]["decoder"]["head_size"])


class KVBatch:
    """The running batch's KV cache: arrays [rows, kv_heads, capacity, head_size], each row right-padded.

    Row ``b`` holds ``lengths[b]`` valid positions; ``width`` is the longest row. Without ``headroom``
    (the copying decode step, which replaces ``cache``) the capacity is always the width and a join or
    leave copies the cache. With it (the in-place step) the arrays are views of buffers with spare rows
    and ``headroom`` spare positions: a step writes its position in place, a join writes its own row, a
    leave moves only the rows after the first that left, and the buffers are copied only to grow."""

    MIN_ROWS = 4  # rows the in-place buffers start with (doubled when a join needs more)

    def __init__(self, names, headroom=0):
        self.names = list(names)
        self.headroom = int(headroom)
        self.cache = None
        self.lengths = np.zeros(0, dtype=np.int64)
        self._buffers = None  # in place: name -> [row capacity, kv_heads, capacity, head_size]

    @property
    def rows(self):
        return len(self.lengths)

    @property
    def width(self):
        return int(self.lengths.max()) if self.rows else 0

    @property
    def capacity(self):
        return 0 if self.cache is None else self.cache[self.names[0]].shape[2]

    def append(self, row_cache, length):
        """Add one sequence's cache (width ``length``) as the last row."""
        if self.headroom:
            self._append_in_place(row_cache, length)
        elif self.cache is None:
            self.cache, self.lengths = row_cache, np.array([length], dtype=np.int64)
        else:
            capacity = max(self.capacity, length)
            self.cache = {
                name: np.concatenate(
                    [_pad_width(self.cache[name], capacity), _pad_width(row_cache[name], capacity)]
                )
                for name in self.names
            }
            self.lengths = np.append(self.lengths, np.int64(length))

    def _append_in_place(self, row_cache, length):
        row = self.rows
        row_capacity = 0 if self._buffers is None else self._buffers[self.names[0]].shape[0]
        if row == row_capacity or length > self.capacity:
            self._grow(
                max(self.MIN_ROWS, 2 * row_capacity) if row == row_capacity else row_capacity,
                length + self.headroom if length > self.capacity else self.capacity,
                row_cache,
            )
        for name in self.names:
            buffer = self._buffers[name]
            buffer[row, :, :length] = row_cache[name][0, :, :length]
            buffer[row, :, length:] = 0
        self.lengths = np.append(self.lengths, np.int64(length))
        self._view()

    def _grow(self, row_capacity, capacity, like):
        """New buffers of that many rows and positions (heads and head size as ``like``'s arrays),
        holding the rows so far."""
        old, rows, width = self._buffers, self.rows, self.capacity
        self._buffers = {}
        for name in self.names:
            _, kv_heads, _, head_size = like[name].shape
            self._buffers[name] = np.zeros((row_capacity, kv_heads, capacity, head_size), np.float32)
            if old is not None:
                self._buffers[name][:rows, :, :width] = old[name][:rows, :, :width]

    def _view(self):
        self.cache = {name: self._buffers[name][: self.rows] for name in self.names}

    def reserve(self, positions):
        """Make room for ``positions`` positions in every row (grown ``headroom`` beyond, when short)."""
        if self.capacity >= positions:
            return
        capacity = positions + self.headroom
        if self._buffers is not None:
            self._grow(self._buffers[self.names[0]].shape[0], capacity, self._buffers)
            self._view()
        else:
            self.cache = {name: _pad_width(self.cache[name], capacity) for name in self.names}

    def keep(self, rows):
        """Keep only ``rows`` (indices, in order); without headroom drop the columns no row needs any more."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            self.cache, self._buffers, self.lengths = None, None, np.zeros(0, dtype=np.int64)
            return
        self.lengths = self.lengths[rows]
        if self._buffers is not None:
            moved = np.flatnonzero(rows != np.arange(rows.size))
            if moved.size:  # rows only move down: each lands where one that left or moved was
                first = int(moved[0])
                for buffer in self._buffers.values():
                    buffer[first : rows.size] = buffer[rows[first:]]
            self._view()
            return
        capacity = self.width
        self.cache = {name: np.ascontiguousarray(self.cache[name][rows, :, :capacity]) for name in self.names}

    def step_mask(self):
        """Attention mask of a one-token step: row b attends to its ``lengths[b]`` positions plus the new one."""
        positions = np.arange(self.width + 1)
        return (positions[None, :] <= self.lengths[:, None]).astype(np.int64)


def _pad_width(array, width):
    missing = width - array.shape[2]
    return array if missing == 0 else np.pad(array, ((0, 0), (0, 0), (0, missing), (0, 0)))


# -- requests and sampling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request: prompt ids, length limit, sampling settings and extra stop ids."""

    input_ids: tuple
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset = frozenset()
    repetition_penalty: float = 1.0
    copy_names: tuple = ()  # token-id tuples of the prompt's names (``NameCopier``)


@dataclass(frozen=True)
class Limits:
    """What the served model accepts."""

    vocab_size: int
    max_context: int
    max_new_tokens_limit: int


def _scalar(array, name, kind, cast):
    if array is None:
        return None
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise RequestError(f"input {name!r} must hold one {kind} value, got {values.size}")
    return cast(values[0])


def _token_ids(array, name, vocab_size):
    values = np.asarray(array).reshape(-1)
    if values.dtype.kind not in "iu":
        raise RequestError(f"input {name!r} must be INT64 token ids, got {values.dtype}")
    bad = values[(values < 0) | (values >= vocab_size)]
    if bad.size:
        raise RequestError(
            f"input {name!r}: token id {int(bad[0])} is outside the vocabulary [0, {vocab_size})"
        )
    return tuple(int(v) for v in values)


def _copy_names(array, vocab_size):
    """The names of input ``copy_names``: token ids, each name ended by ``NAME_END``."""
    values = np.asarray(array).reshape(-1)
    field = COPY_NAMES_INPUT
    if values.size > MAX_COPY_NAME_IDS:
        raise RequestError(f"input {field!r} holds {values.size} values, at most {MAX_COPY_NAME_IDS}")
    if values.size and values[-1] != NAME_END:
        raise RequestError(f"input {field!r} must end each name with {NAME_END}")
    ids = _token_ids(values[values != NAME_END], field, vocab_size)
    separators = np.flatnonzero(values == NAME_END)
    ends = separators - np.arange(separators.size)  # each name's end in ``ids``
    names = [ids[start:end] for start, end in zip(np.r_[0, ends][:-1], ends, strict=True)]
    if not all(names):
        raise RequestError(f"input {field!r} holds an empty name ({NAME_END} twice in a row)")
    return tuple(names)


def parse_request(tensors, limits):
    """Check one request's tensors (name -> numpy array or None); raise ``RequestError`` naming the field."""
    if tensors.get("input_ids") is None:
        raise RequestError("missing input 'input_ids'")
    prompt = _token_ids(tensors["input_ids"], "input_ids", limits.vocab_size)
    if not prompt:
        raise RequestError("input 'input_ids' is empty: the prompt needs at least one token")
    max_tokens = _scalar(tensors.get("max_tokens"), "max_tokens", "INT32", int)
    if max_tokens is None:
        raise RequestError("missing input 'max_tokens'")
    if not 1 <= max_tokens <= limits.max_new_tokens_limit:
        raise RequestError(
            f"input 'max_tokens' is {max_tokens}, must be in [1, {limits.max_new_tokens_limit}]"
        )
    if len(prompt) + max_tokens > limits.max_context:
        raise RequestError(
            f"input 'input_ids' has {len(prompt)} tokens: with max_tokens {max_tokens} that exceeds "
            f"max_context {limits.max_context}"
        )
    temperature = _scalar(tensors.get("temperature"), "temperature", "FP32", float)
    temperature = 0.0 if temperature is None else temperature
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # also rejects NaN
        raise RequestError(f"input 'temperature' is {temperature}, must be in [0, {MAX_TEMPERATURE}]")
    top_p = _scalar(tensors.get("top_p"), "top_p", "FP32", float)
    top_p = 1.0 if top_p is None else top_p
    if not 0.0 < top_p <= 1.0:
        raise RequestError(f"input 'top_p' is {top_p}, must be in (0, 1]")
    seed = _scalar(tensors.get("seed"), "seed", "UINT64", int)
    penalty = _scalar(tensors.get("repetition_penalty"), "repetition_penalty", "FP32", float)
    penalty = 1.0 if penalty is None else penalty
    if not 1.0 <= penalty <= MAX_REPETITION_PENALTY:  # also rejects NaN
        raise RequestError(
            f"input 'repetition_penalty' is {penalty}, must be in [1, {MAX_REPETITION_PENALTY}]"
        )
    stops = tensors.get("stop_token_ids")
    stop_ids = (
        frozenset(_token_ids(stops, "stop_token_ids", limits.vocab_size))
        if stops is not None
        else frozenset()
    )
    names = tensors.get(COPY_NAMES_INPUT)
    names = _copy_names(names, limits.vocab_size) if names is not None else ()
    return GenerationRequest(prompt, max_tokens, temperature, top_p, seed, stop_ids, penalty, names)


def penalize_repeats(logits, seen, penalty, columns=None):
    """``logits`` with the tokens in ``seen`` (ids already generated) made less likely: positive logits
    divided by ``penalty``, negative ones multiplied (CTRL / Hugging Face semantics); a copy.
    ``columns`` (``OutputColumns``) places each id in a shortlisted head (None: the column is the id)."""
    if penalty == 1.0 or not seen:
        return logits
    ids = np.fromiter(seen, dtype=np.int64, count=len(seen))
    columns = ids if columns is None else columns.of(ids)
    out = logits.copy()
    values = out[columns]
    out[columns] = np.where(values > 0, values / penalty, values * penalty)
    return out


class TokenTexts:
    """The text of every token id, in its vocabulary's own alphabet (byte-level BPE spells a space ``Ġ``,
    SentencePiece ``▁``: both above U+00FF), and the id of every text."""

    def __init__(self, vocab, vocab_size):
        self.texts = [""] * vocab_size
        self.ids = {}
        for text, token in vocab.items():
            if 0 <= token < vocab_size:
                self.texts[token] = text
                self.ids[text] = token

    @classmethod
    def of_tokenizer(cls, tokenizer_path, vocab_size):
        """From a ``tokenizer.json`` (BPE and WordPiece: {text: id}; Unigram: [[text, score], ...] in id order)."""
        with open(tokenizer_path, encoding="utf-8") as handle:
            vocab = json.load(handle)["model"]["vocab"]
        if not isinstance(vocab, dict):
            vocab = {entry[0]: token for token, entry in enumerate(vocab)}
        return cls(vocab, vocab_size)

    def opens_word(self, token):
        """The token starts with a space or line mark: the word before it is over."""
        text = self.texts[token]
        return bool(text) and ord(text[0]) >= 0x100

    def continues_word(self, token):
        """The token starts with a letter or digit: it goes on with the word before it."""
        text = self.texts[token]
        return bool(text) and ord(text[0]) < 0x100 and text[0].isalnum()


class NameCopier:
    """Keeps one sequence's copies of its prompt's names whole.

    ``names`` are token-id tuples, each a word as the prompt spells it (the space before it included), for
    example the ids of " postgresql". While the word being written (its text since the last token that opens
    a word) is the beginning of a name, a token that continues the word must keep it the beginning of a
    name, so a copy cannot drift into "postresql" or, for a name of one token, into "audt" for "audit":
    otherwise the pieces of text that go on with a name begun are allowed instead. A token that ends the
    word (a space, punctuation) is left alone, and so is every token after a whole name ("java" may stay
    "java" though "javascript" begins alike).
    """

    def __init__(self, names, texts):
        self.texts = texts
        self.names = tuple(dict.fromkeys("".join(texts.texts[t] for t in name) for name in names if name))
        self.word = ""

    def allowed_instead(self, token):
        """The tokens allowed in place of ``token`` when it would miscopy a name begun; empty when it may stay."""
        if len(self.word) < 2 or not self.texts.continues_word(token):
            return frozenset()  # no word begun: a space alone (before a digit, say) begins every name
        begun = [name for name in self.names if name.startswith(self.word)]
        if not begun or self.word in begun:
            return frozenset()
        written = self.word + self.texts.texts[token]
        if any(name.startswith(written) for name in begun):
            return frozenset()
        rests = (name[len(self.word) :] for name in begun)
        pieces = (rest[:end] for rest in rests for end in range(1, len(rest) + 1))
        return frozenset(self.texts.ids[piece] for piece in pieces if piece in self.texts.ids)

    def wrote(self, token):
        text = self.texts.texts[token]
        self.word = text if self.texts.opens_word(token) else self.word + text


def _column_token(column, columns):
    """The token id of a logit column (``columns``: ``OutputColumns``, None when the column is the id)."""
    return column if columns is None else columns.token(column)


class Sampler:
    """Chooses next tokens for one request: argmax at temperature 0, else temperature + top-p sampling;
    tokens it chose before are penalized by ``repetition_penalty`` (1: off); a ``copier`` (``NameCopier``)
    keeps the prompt's names whole: a token that would miscopy one is chosen again, among the pieces of
    text that go on with the names begun."""

    def __init__(self, temperature=0.0, top_p=1.0, seed=None, repetition_penalty=1.0, copier=None):
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.rng = np.random.default_rng(seed)
        self.repetition_penalty = float(repetition_penalty)
        self.seen = set()
        self.copier = copier

    def __call__(self, logits, columns=None):
        """The next token id; ``columns`` (``OutputColumns``) maps logit columns to ids (None: the
        column is the id)."""
        logits = penalize_repeats(logits, self.seen, self.repetition_penalty, columns)
        token = _column_token(self._choose(logits), columns)
        if self.copier is not None:
            allowed = np.array(sorted(self.copier.allowed_instead(token)), dtype=np.int64)
            among = allowed if columns is None else columns.of(allowed)
            if among.size:
                token = _column_token(int(among[self._choose(logits[among])]), columns)
            self.copier.wrote(token)
        if self.repetition_penalty != 1.0:
            self.seen.add(token)
        return token

    def _choose(self, logits):
        if self.temperature <= 0.0:
            return int(np.argmax(logits))
        scaled = logits.astype(np.float64) / self.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if self.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = order[: int(np.searchsorted(cumulative, self.top_p)) + 1]
            return int(keep[self.rng.choice(len(keep), p=probs[keep] / probs[keep].sum())])
        return int(self.rng.choice(len(probs), p=probs))


# -- the batching engine -------------------------------------------------------------------------------


@dataclass
class Sequence:
    """One running request."""

    key: object
    request: GenerationRequest
    sampler: Sampler
    stop_ids: frozenset
    extra: np.ndarray = field(
        default_factory=lambda: _NO_TOKENS
    )  # its prompt's ids outside the decoder's shortlist
    generated: int = 0
    last_token: int = -1


@dataclass(frozen=True)
class StepEvent:
    """What one sequence produced in a step: a token (None when it stopped on a stop id) and why it ended."""

    key: object
    token: int | None
    finish_reason: str = FINISH_RUNNING


@dataclass
class EngineStats:
    steps: int = 0
    tokens: int = 0
    counts: dict = field(default_factory=dict)


class BatchEngine:
    """Iteration-level batching over an ``OnnxDecoder``: ``start`` adds a sequence, ``step`` decodes all."""

    def __init__(self, decoder, eos_token_ids=(), token_texts=None):
        self.decoder = decoder
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.token_texts = token_texts  # ``TokenTexts``; None: names are not copied
        self.batch = KVBatch(decoder.past_names, decoder.kv_headroom)
        self.sequences = []  # row order of self.batch
        self.stats = EngineStats()
        self._columns = None  # the running prompts' extra ids and their columns (None: to compute)

    @property
    def active(self):
        return len(self.sequences)

    def _advance(self, sequence, token):
        """Record ``token`` for ``sequence``; return its event (a stop id ends it and is not emitted or counted)."""
        sequence.generated += 1
        if token in sequence.stop_ids:
            return StepEvent(sequence.key, None, "stop")
        self.stats.tokens += 1
        sequence.last_token = token
        finish = "length" if sequence.generated >= sequence.request.max_tokens else FINISH_RUNNING
        return StepEvent(sequence.key, token, finish)

    def start(self, key, request):
        """Prefill ``request`` and choose its first token; the sequence joins the batch unless it ended."""
        copier = None
        if request.copy_names and self.token_texts is not None:
            copier = NameCopier(request.copy_names, self.token_texts)
        sequence = Sequence(
            key,
            request,
            Sampler(request.temperature, request.top_p, request.seed, request.repetition_penalty, copier),
            self.eos_token_ids | request.stop_token_ids,
            self.decoder.extra_tokens([*request.input_ids, *(t for n in request.copy_names for t in n)]),
        )
        logits, cache = self.decoder.prefill(request.input_ids, sequence.extra)
        self.stats.steps += 1
        columns = self.decoder.output_columns(sequence.extra)
        event = self._advance(sequence, sequence.sampler(logits, columns))
        if not event.finish_reason:
            self.batch.append(cache, len(request.input_ids))
            self.sequences.append(sequence)
            self._columns = None
        return event

    def _running_columns(self):
        """(extra ids of every running prompt, the step's logit columns): any sequence may write a
        token its own prompt holds."""
        if self._columns is None:
            extra = self.decoder.extra_tokens(np.concatenate([s.extra for s in self.sequences]))
            self._columns = extra, self.decoder.output_columns(extra)
        return self._columns

    def step(self):
        """Decode one token for every active sequence; finished ones leave the batch."""
        if not self.sequences:
            return []
        tokens = np.array([[s.last_token] for s in self.sequences], dtype=np.int64)
        extra, columns = self._running_columns()
        logits = self.decoder.decode(tokens, self.batch, extra)
        self.batch.lengths = self.batch.lengths + 1
        self.stats.steps += 1
        events = [
            self._advance(s, s.sampler(row, columns)) for s, row in zip(self.sequences, logits, strict=True)
        ]
        self._keep([i for i, e in enumerate(events) if not e.finish_reason])
        return events

    def drop(self, keys):
        """Remove sequences (cancelled) at once; their slots are free for the next admission."""
        keys = set(keys)
        self._keep([i for i, s in enumerate(self.sequences) if s.key not in keys])

    def _keep(self, rows):
        if len(rows) != len(self.sequences):
            self.sequences = [self.sequences[i] for i in rows]
            self.batch.keep(rows)
            self._columns = None

    def reset(self):
        self.sequences = []
        self.batch = KVBatch(self.decoder.past_names, self.decoder.kv_headroom)
        self._columns = None


def generate(engine, requests):
    """Run ``requests`` (all admitted at once) to the end; returns each one's tokens (helper for checks)."""
    outputs = {index: [] for index in range(len(requests))}

    def record(event):
        if event.token is not None:
            outputs[event.key].append(event.token)

    for index, request in enumerate(requests):
        record(engine.start(index, request))
    while engine.active:
        for event in engine.step():
            record(event)
    return [outputs[i] for i in range(len(requests))]


# -- Triton glue ---------------------------------------------------------------------------------------


def config_parameter(model_config, key, default=None):
    """A string parameter from a Triton model config (JSON form), or ``default`` when absent/empty."""
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value != "" else default


@dataclass(eq=False)  # identity: removed from the queue by ``deque.remove``
class Pending:
    """A request between ``execute`` and its last response."""

    request: object
    sender: object
    job: GenerationRequest
    arrived: float
    unsent: list = field(default_factory=list)  # tokens held back by ``stream_interval``
    sent_first: bool = False
    cancelled: bool = False  # set by the ``Messenger``'s checks; the decoding loop then drops it


def _is_cancelled(pending):
    for owner in (pending.sender, pending.request):
        check = getattr(owner, "is_cancelled", None)
        if check is not None:
            try:
                if check():
                    return True
            except Exception:  # the request may already be released
                return False
    return False


class Messenger:
    """The decoding loop's round trips to the Triton process, on a thread of their own: it makes the
    posted calls (sending responses) in order, and every ``check_interval_s`` while there is work asks
    each request ``watched()`` returns whether it was cancelled (setting ``Pending.cancelled``). Each of
    those calls waits for the Triton process; here they overlap the ONNX Runtime step instead of
    delaying it."""

    _STOP = object()

    def __init__(self, watched, check_interval_s):
        self.watched = watched  # () -> the Pending requests to check (running and queued)
        self.check_interval_s = check_interval_s
        self.outbox = queue.SimpleQueue()
        self.busy = threading.Event()  # set while requests run or wait: cancellation checks are due
        self.thread = threading.Thread(target=self._run, name="generator-messenger", daemon=True)
        self.thread.start()

    def post(self, call, *args):
        """Queue ``call(*args)`` (made after every call posted before it)."""
        self.outbox.put((call, args))

    def close(self, timeout=30):
        """Send what is queued, then stop the thread."""
        self.outbox.put(self._STOP)
        self.busy.set()
        self.thread.join(timeout=timeout)

    def _run(self):
        due = 0.0
        while True:
            # Idle: block until a response comes (the loop posts one soon after it takes work).
            wait = max(0.0, due - time.monotonic()) if self.busy.is_set() else None
            try:
                message = self.outbox.get(timeout=wait)
            except queue.Empty:
                message = None
            if message is self._STOP:
                return
            if message is not None:
                self._make(*message)
            if self.busy.is_set() and time.monotonic() >= due:
                due = time.monotonic() + self.check_interval_s
                for pending in self.watched():
                    if not pending.cancelled and _is_cancelled(pending):
                        pending.cancelled = True

    @staticmethod
    def _make(call, args):
        try:
            call(*args)
        except Exception as exc:  # keep the thread alive for the other requests
            if pb_utils is not None:
                pb_utils.Logger.log_error(f"generator: {call.__name__} failed: {exc}")


def _read_tensors(request):
    names = (
        "input_ids",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop_token_ids",
        "repetition_penalty",
        COPY_NAMES_INPUT,
    )
    tensors = {}
    for name in names:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        tensors[name] = None if tensor is None else tensor.as_numpy()
    return tensors


def execution_providers(name, device_id=0, available=None):
    """ONNX Runtime providers for the model's ``execution_provider`` parameter (``cpu`` or ``cuda``)."""
    if name == "cpu":
        return ["CPUExecutionProvider"]
    if name != "cuda":
        raise ValueError(f"parameter execution_provider: expected 'cpu' or 'cuda', got {name!r}")
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ValueError(
            "parameter execution_provider 'cuda': this ONNX Runtime has no CUDAExecutionProvider "
            f"(available: {', '.join(available)}); install onnxruntime-gpu in Triton's Python environment"
        )
    return [("CUDAExecutionProvider", {"device_id": int(device_id)}), "CPUExecutionProvider"]


def _error(message, code_name):
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class TritonPythonModel:
    """Triton python-backend entry point (decoupled)."""

    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        if not model_config.get("model_transaction_policy", {}).get("decoupled", False):
            raise ValueError("the generator model must be decoupled (model_transaction_policy.decoupled)")
        version_dir = os.path.join(args["model_repository"], str(args["model_version"]))
        with open(os.path.join(version_dir, GENERATION_FILE)) as handle:
            generation = json.load(handle)
        param = lambda key, default: config_parameter(model_config, key, default)  # noqa: E731
        path = os.path.join(version_dir, param("onnx_file", DEFAULT_ONNX_FILE))
        threads = int(param("intra_op_threads", "0"))
        providers = execution_providers(
            param("execution_provider", "cpu"), args.get("model_instance_device_id", "0") or 0
        )
        self.decoder = OnnxDecoder(path, threads, param("allow_spinning", "0") == "1", providers)
        tokenizer_path = os.path.join(version_dir, TOKENIZER_FILE)
        texts = (
            TokenTexts.of_tokenizer(tokenizer_path, self.decoder.vocab_size)
            if os.path.isfile(tokenizer_path)
            else None  # no names copied (input copy_names is then ignored)
        )
        self.engine = BatchEngine(self.decoder, generation["eos_token_ids"], texts)
        self.limits = Limits(
            vocab_size=self.decoder.vocab_size,
            # The bundle's max_context fits the model's positions: a config value may only lower it.
            max_context=min(
                int(param("max_context", generation["max_context"])), int(generation["max_context"])
            ),
            max_new_tokens_limit=int(param("max_new_tokens_limit", generation["max_new_tokens_limit"])),
        )
        self.max_active = int(param("max_active_sequences", "8"))
        self.max_queued = int(param("max_queued_requests", "64"))
        self.log_every = int(param("log_every_steps", "200"))
        self.stream_interval = max(1, int(param("stream_interval", "1")))
        self.metrics_interval_s = float(param("metrics_interval_s", "0.5"))
        self.queue = collections.deque()
        self.running = {}  # key -> Pending; changed by the decoding loop under ``cond``
        self.cond = threading.Condition()
        # Each is_cancelled() is a round trip to the Triton process: the messenger asks every 50 ms
        # (a cancelled request then holds its slot that long at most, beyond the step that runs).
        self.messenger = Messenger(self._watched, float(param("cancel_check_interval_s", "0.05")))
        self.stopping = False
        self._next_key = 0
        self._next_log = 0
        self._make_metrics(args)
        self._counted = (0, 0)  # engine (steps, tokens) already added to the counters
        self._metrics_due = 0.0
        self.thread = threading.Thread(target=self._loop, name="generator-decode", daemon=True)
        self.thread.start()
        pb_utils.Logger.log_info(
            f"generator {args.get('model_name', '')} v{args['model_version']}: {path}, {self.limits}, "
            f"max_active_sequences={self.max_active}, max_queued_requests={self.max_queued}, "
            f"stream_interval={self.stream_interval}, intra_op_threads={threads or 'default'}"
        )

    def _make_metrics(self, args):
        labels = {"model": args.get("model_name", "generator"), "version": str(args["model_version"])}
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.metric_families = [
            pb_utils.MetricFamily("slimserve_generator_steps_total", "Decoding steps (ONNX runs)", counter),
            pb_utils.MetricFamily("slimserve_generator_tokens_total", "Tokens generated", counter),
            pb_utils.MetricFamily("slimserve_generator_requests_total", "Finished requests", counter),
            pb_utils.MetricFamily("slimserve_generator_active_sequences", "Sequences in the batch", gauge),
        ]
        steps, tokens, requests, active = self.metric_families
        self.steps_metric = steps.Metric(labels=labels)
        self.tokens_metric = tokens.Metric(labels=labels)
        self.active_metric = active.Metric(labels=labels)
        self.finish_metrics = {
            reason: requests.Metric(labels={**labels, "finish_reason": reason}) for reason in FINISH_REASONS
        }

    # -- execute: validate and enqueue -------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = parse_request(_read_tensors(request), self.limits)
            except RequestError as exc:
                self._fail(sender, str(exc), "INVALID_ARG")
                continue
            with self.cond:
                if len(self.queue) >= self.max_queued:
                    full = True
                else:
                    full = False
                    self.queue.append(Pending(request, sender, job, time.monotonic()))
                    self.cond.notify()
            if full:
                self._fail(sender, f"queue full: {self.max_queued} requests already waiting", "UNAVAILABLE")
        return None

    def _fail(self, sender, message, code_name):
        self.finish_metrics["error"].increment(1)
        try:
            response = pb_utils.InferenceResponse(output_tensors=[], error=_error(message, code_name))
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            pb_utils.Logger.log_warn(f"generator: could not send an error response: {exc}")

    # -- the decoding loop -------------------------------------------------------------------------
    def _loop(self):
        while True:
            with self.cond:
                idle = not self.stopping and not self.queue and not self.running
            if idle:
                self.messenger.busy.clear()
                self._update_metrics(force=True)  # exact counters whenever the model is idle
            with self.cond:
                while not self.stopping and not self.queue and not self.running:
                    self.cond.wait()
                if self.stopping:
                    return
            self.messenger.busy.set()
            try:
                self._iteration()
            except Exception as exc:  # an ORT failure: end every running request, keep serving
                pb_utils.Logger.log_error(f"generator: decoding step failed: {type(exc).__name__}: {exc}")
                with self.cond:
                    failed = list(self.running.values())
                    self.running.clear()
                message = f"generation failed: {type(exc).__name__}: {exc}"
                for pending in failed:
                    self.messenger.post(self._fail, pending.sender, message, "INTERNAL")
                self.engine.reset()
            self._update_metrics()

    def _watched(self):
        """The requests the messenger checks for cancellation: running, then queued."""
        with self.cond:
            return [*self.running.values(), *self.queue]

    def _update_metrics(self, force=False):
        """Add new steps and tokens to the counters and set the gauge: at most every
        ``metrics_interval_s`` while decoding (each update is a message to the Triton process)."""
        now = time.monotonic()
        if not force and now < self._metrics_due:
            return
        self._metrics_due = now + self.metrics_interval_s
        stats = self.engine.stats
        steps, tokens = self._counted
        if stats.steps != steps:
            self.steps_metric.increment(stats.steps - steps)
        if stats.tokens != tokens:
            self.tokens_metric.increment(stats.tokens - tokens)
        self._counted = (stats.steps, stats.tokens)
        self.active_metric.set(self.engine.active)

    def _iteration(self):
        self._drop_cancelled()
        while self.engine.active < self.max_active:
            with self.cond:
                if not self.queue:
                    break
                pending = self.queue.popleft()
            if pending.cancelled:
                self._finish(pending, "cancelled")
                continue
            key = self._next_key
            self._next_key += 1
            with self.cond:
                self.running[key] = pending
            self._emit(self.engine.start(key, pending.job))
        batch = self.engine.active
        for event in self.engine.step():
            self._emit(event)
        stats = self.engine.stats
        if batch and self.log_every and stats.steps >= self._next_log:
            self._next_log = stats.steps + self.log_every
            pb_utils.Logger.log_info(
                f"generator: step {stats.steps}, batch {batch}, queued {len(self.queue)}, tokens {stats.tokens}"
            )

    def _drop_cancelled(self):
        """End the requests the messenger found cancelled, running or queued."""
        with self.cond:
            cancelled = [key for key, pending in self.running.items() if pending.cancelled]
            dropped = [self.running.pop(key) for key in cancelled]
            waiting = [p for p in self.queue if p.cancelled]
            for pending in waiting:
                self.queue.remove(pending)
        if cancelled:
            self.engine.drop(cancelled)
        for pending in dropped + waiting:
            self._finish(pending, "cancelled")

    def _emit(self, event):
        """Send a sequence's new token: the first at once, then every ``stream_interval`` tokens, and
        whatever is held back with the final response."""
        pending = self.running[event.key]
        if event.token is not None:
            pending.unsent.append(event.token)
        if event.finish_reason:
            with self.cond:
                del self.running[event.key]
        elif pending.sent_first and len(pending.unsent) < self.stream_interval:
            return
        tokens, pending.unsent, pending.sent_first = pending.unsent, [], True
        self.messenger.post(self._send, pending, tokens, event.finish_reason)

    def _finish(self, pending, reason):
        self.messenger.post(self._send, pending, [], reason)

    def _send(self, pending, tokens, reason):
        """One response (on the messenger's thread): ``tokens``, and ``reason`` when it is the last."""
        outputs = [
            pb_utils.Tensor("token_ids", np.asarray(tokens, dtype=np.int64)),
            pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
        ]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if reason else 0
        if reason:
            self.finish_metrics[reason].increment(1)
        try:
            pending.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)
        except Exception as exc:  # the client went away; its sequence is dropped at the next check
            if reason != "cancelled":
                pb_utils.Logger.log_warn(f"generator: could not send a response: {exc}")

    def finalize(self):
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)
        with self.cond:
            leftover = list(self.running.values()) + list(self.queue)
            self.running.clear()
            self.queue.clear()
        for pending in leftover:
            self.messenger.post(self._fail, pending.sender, "the generator model is unloading", "UNAVAILABLE")
        self.messenger.close()
        self.engine = None
        self.decoder = None
