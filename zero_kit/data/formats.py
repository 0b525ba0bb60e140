"""The three training formats (alpaca, chat, text): row checks and tokenization with prompt masking.

Each encoder turns one row into (input_ids, labels); labels are -100 where the loss must not look (prompt
tokens for alpaca, everything but assistant turns for chat). A row that cannot be used raises `BadRow` with a
reason that `DataStats` counts: missing_field, wrong_type, empty, too_long.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100
FORMATS: dict[str, tuple[str, ...]] = {"alpaca": ("instruction", "output"), "chat": ("messages",), "text": ("text",)}
CHAT_ROLES = ("system", "user", "assistant")
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"


class BadRow(Exception):
    """One row cannot be trained on; `reason` is the counter key, the message says what is wrong."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _field(row: Any, name: str, *, required: bool = True) -> str:
    if not isinstance(row, dict):
        raise BadRow("wrong_type", f"expected an object with field {name!r}, got {type(row).__name__}")
    value = row.get(name)
    if value is None:
        if required:
            raise BadRow("missing_field", f"missing field {name!r}")
        return ""
    if not isinstance(value, str):
        raise BadRow("wrong_type", f"field {name!r} must be a string, got {type(value).__name__}")
    _check_encodable(value, f"field {name!r}")
    if required and not value.strip():
        raise BadRow("empty", f"field {name!r} is empty")
    return value


def _check_encodable(text: str, what: str) -> None:
    # JSON may carry lone surrogate escapes ("\\ud800"): valid Python str, but not text the tokenizer accepts.
    if text.isascii():  # the common case, ~20x cheaper than encoding
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRow("wrong_type", f"{what} holds a lone surrogate escape, which is not valid text") from None


def specials(tokenizer) -> tuple[list[int], list[int]]:
    """([bos], [eos]) or empty lists where the tokenizer has none; read once per batch (attribute access is slow)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return bos, eos


@dataclass
class Prepared:
    """A checked row as texts to tokenize, and how to turn their tokens into (input_ids, labels).

    Tokenizing many rows' texts in one batched call is ~10x faster than one call per text.
    """

    texts: list[str]
    build: Callable[[list[Any]], tuple[list[int], list[int]]]


def prepare_alpaca(row: Any, tokenizer, bos_eos: tuple[list[int], list[int]]) -> Prepared:
    instruction, output = _field(row, "instruction"), _field(row, "output")
    extra = _field(row, "input", required=False)
    template = ALPACA_PROMPT_WITH_INPUT if extra.strip() else ALPACA_PROMPT
    bos, eos = bos_eos

    def build(encoded: list[Any]) -> tuple[list[int], list[int]]:
        prompt, response = bos + encoded[0].ids, encoded[1].ids + eos
        return prompt + response, [IGNORE_INDEX] * len(prompt) + response

    return Prepared([template.format(instruction=instruction, input=extra), output], build)


def prepare_text(row: Any, tokenizer, bos_eos: tuple[list[int], list[int]]) -> Prepared:
    bos, eos = bos_eos

    def build(encoded: list[Any]) -> tuple[list[int], list[int]]:
        if not encoded[0].ids:
            raise BadRow("empty", "field 'text' is empty after tokenization")
        ids = bos + encoded[0].ids + eos
        return ids, list(ids)

    return Prepared([_field(row, "text")], build)


def check_message(message: Any, label: str) -> None:
    """One chat message: a dict with a known role and string content that encodes (`label` names it in the error)."""
    if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
        raise BadRow("wrong_type", f"{label} needs a 'role' from {list(CHAT_ROLES)}")
    if not isinstance(message.get("content"), str):
        raise BadRow("wrong_type", f"{label} needs a string 'content'")
    _check_encodable(message["content"], f"{label} content")


def chat_messages(row: Any) -> list[dict]:
    """The row's messages, checked: roles from CHAT_ROLES, string contents, at least one assistant turn."""
    if not isinstance(row, dict):
        raise BadRow("wrong_type", f"expected an object with field 'messages', got {type(row).__name__}")
    messages = row.get("messages")
    if messages is None:
        raise BadRow("missing_field", "missing field 'messages'")
    if isinstance(messages, str):  # CSV and some Parquet files carry the list as a JSON string
        try:
            messages = json.loads(messages)
        except (ValueError, RecursionError):
            raise BadRow("wrong_type", "field 'messages' is a string that is not a JSON list") from None
    if not isinstance(messages, list) or not messages:
        raise BadRow("wrong_type", "field 'messages' must be a non-empty list of {role, content} objects")
    checked = []
    for number, message in enumerate(messages, 1):
        check_message(message, f"message {number}")
        checked.append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "assistant" and m["content"].strip() for m in checked):
        raise BadRow("empty", "no non-empty assistant message to train on")
    return checked


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except TemplateError as err:  # templates raise_exception() on e.g. roles that do not alternate
        raise BadRow("wrong_type", f"the chat template rejected this conversation: {err}") from None


def check_tokenizer(tokenizer, fmt: str) -> str | None:
    """Why this tokenizer cannot encode fmt (None if it can): chat needs a template and character offsets."""
    if fmt != "chat":
        return None
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template"
    if not getattr(tokenizer, "is_fast", False):
        return "the chat format needs a fast tokenizer (tokenizer.json) to map turns to tokens"
    return None


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of assistant turns.

    Rendering prefix by prefix works with any chat template that renders a conversation as the
    concatenation of its turns (all LLaMA/Mistral/Qwen2 templates do); no {% generation %} tags needed.
    """
    full = _render(tokenizer, messages)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(_render(tokenizer, messages[:index], add_generation_prompt=True)) if index else 0
        end_text = _render(tokenizer, messages[: index + 1])
        if not full.startswith(end_text) or start > len(end_text):
            raise BadRow("wrong_type", "the chat template does not render this conversation turn by turn")
        spans.append((start, len(end_text)))
    return full, spans


def prepare_chat(row: Any, tokenizer, bos_eos: tuple[list[int], list[int]]) -> Prepared:
    del bos_eos  # the chat template places its own special tokens
    full, spans = assistant_spans(tokenizer, chat_messages(row))

    def build(encoded: list[Any]) -> tuple[list[int], list[int]]:
        ids = encoded[0].ids
        labels = [
            token if any(lo <= start < hi for lo, hi in spans) else IGNORE_INDEX
            for token, (start, _end) in zip(ids, encoded[0].offsets, strict=True)
        ]
        return ids, labels

    return Prepared([full], build)


PREPARERS = {"alpaca": prepare_alpaca, "chat": prepare_chat, "text": prepare_text}


@dataclass
class Encoded:
    """One tokenized text: ids, and character offsets when the tokenizer gives them."""

    ids: list[int]
    offsets: list[tuple[int, int]]


def tokenize_texts(tokenizer, texts: list[str], with_offsets: bool) -> list[Encoded]:
    """One batched call for many texts; specials come from the format, never from the tokenizer."""
    if not texts:
        return []
    # verbose=False: not the tokenizer's "longer than the specified maximum" warning: `finish` judges the length
    out = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=with_offsets, verbose=False)
    offsets = out["offset_mapping"] if with_offsets else [[]] * len(texts)
    return [Encoded(list(ids), list(spans)) for ids, spans in zip(out["input_ids"], offsets, strict=True)]


def finish(prepared: Prepared, encoded: list[Encoded], max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels) from a prepared row's tokens, or BadRow (nothing trained, too long)."""
    ids, labels = prepared.build(encoded)
    if all(label == IGNORE_INDEX for label in labels):
        raise BadRow("empty", "nothing left to train on after tokenization")
    if len(ids) > max_length:
        raise BadRow("too_long", f"{len(ids)} tokens is longer than the max length {max_length}")
    return ids, labels


def encode_row(row: Any, tokenizer, fmt: str, max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels) for one row, or BadRow. `zero_kit.data.dataset` batches many rows the same way."""
    prepared = PREPARERS[fmt](row, tokenizer, specials(tokenizer))
    return finish(prepared, tokenize_texts(tokenizer, prepared.texts, fmt == "chat"), max_length)


def check_row(row: Any, fmt: str) -> None:
    """The checks of `encode_row` that need no tokenizer (fields there, strings, not empty): BadRow if one fails.
    `zero-kit train` runs it on a file's first rows before any rank starts."""
    if fmt == "chat":
        chat_messages(row)
        return
    for name in FORMATS[fmt]:
        _field(row, name)
    if fmt == "alpaca":
        _field(row, "input", required=False)
