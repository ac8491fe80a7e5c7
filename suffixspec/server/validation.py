"""Request validation for the OpenAI-compatible routes.

Unknown fields are ignored (as OpenAI does); known fields with the wrong type or an out-of-range
value, unsupported options (``n > 1``, ``echo``, tools) and prompts longer than the context each get
a 400 whose message names the field and says what is allowed.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import SamplingParams, SpeculationConfig
from ..draft import DRAFTERS, PREDICTION_RULE
from .config import ServerConfig
from .errors import APIError, invalid

_MISSING = object()
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class GenRequest:
    """A validated generation request, ready for the engine."""

    kind: str  # "completion" or "chat"
    model: str  # the model id the client named (echoed back)
    prompt_ids: list[int]  # target-tokenizer ids of the prompt (chat template applied for chat)
    sampling: SamplingParams  # the request's sampling settings
    speculation: SpeculationConfig | None  # None = server defaults
    references: list[str] | None  # per-request reference chunks (RAG)
    prediction: str | None  # code-edit prediction text
    stream: bool  # answer with server-sent events
    include_usage: bool  # streaming: send a final chunk with usage
    logprobs: int | None  # top-N logprobs per token (0 = only the chosen token's), None = off


# -- field readers --------------------------------------------------------------------------------

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def get_number(body: dict, name: str, default: Any, lo: float | None = None, hi: float | None = None,
               lo_open: bool = False) -> Any:
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        return default
    if not _is_number(v):
        raise invalid(f"'{name}' must be a number, got {type(v).__name__} {v!r}", name, "invalid_type")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise invalid(f"'{name}' must be {'>' if lo_open else '>='} {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise invalid(f"'{name}' must be <= {hi}, got {v}", name)
    return float(v)


def get_int(body: dict, name: str, default: Any, lo: int | None = None, hi: int | None = None) -> Any:
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise invalid(f"'{name}' must be an integer, got {type(v).__name__} {v!r}", name, "invalid_type")
    if lo is not None and v < lo:
        raise invalid(f"'{name}' must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise invalid(f"'{name}' must be <= {hi}, got {v}", name)
    return v


def get_bool(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(f"'{name}' must be true or false, got {v!r}", name, "invalid_type")
    return v


def get_str(body: dict, name: str, default: Any) -> Any:
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        return default
    if not isinstance(v, str):
        raise invalid(f"'{name}' must be a string, got {type(v).__name__}", name, "invalid_type")
    return v


# -- shared fields ----------------------------------------------------------------------------------

def _stop(body: dict, cfg: ServerConfig) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise invalid("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(v) > cfg.max_stop:
        raise invalid(f"'stop' may hold at most {cfg.max_stop} strings, got {len(v)}", "stop")
    if any(s == "" for s in v):
        raise invalid("'stop' strings must not be empty", "stop")
    return v


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float]:
    v = body.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise invalid("'logit_bias' must be an object mapping token ids to numbers", "logit_bias", "invalid_type")
    out: dict[int, float] = {}
    for k, b in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise invalid(f"'logit_bias' keys must be token ids, got {k!r}", "logit_bias", "invalid_type") from None
        if not 0 <= tid < vocab_size:
            raise invalid(f"'logit_bias' token id {tid} is outside the vocabulary (0..{vocab_size - 1})", "logit_bias")
        if not _is_number(b) or not -100 <= b <= 100:
            raise invalid(f"'logit_bias' values must be numbers between -100 and 100, got {b!r}", "logit_bias")
        out[tid] = float(b)
    return out


def _n(body: dict) -> None:
    n = get_int(body, "n", 1, lo=1)
    if n != 1:
        raise invalid("only n=1 is supported (one completion per request); send separate requests", "n",
                      "unsupported_value")


def _speculation(body: dict) -> SpeculationConfig | None:
    v = body.get("speculation", _MISSING)
    if v is _MISSING or v is None or v is True:
        return None
    if v is False:
        return SpeculationConfig(enabled=False)
    if not isinstance(v, dict):
        raise invalid("'speculation' must be false, true or an object like "
                      '{"drafters": ["prompt", "references"], "max_draft_tokens": 32}', "speculation",
                      "invalid_type")
    drafters = v.get("drafters")
    if drafters is not None:
        if not isinstance(drafters, list) or not all(isinstance(d, str) for d in drafters):
            raise invalid("'speculation.drafters' must be a list of drafter names", "speculation.drafters",
                          "invalid_type")
        unknown = [d for d in drafters if d not in DRAFTERS]
        if unknown:
            raise invalid(f"unknown drafter(s) {unknown} in 'speculation.drafters'; choose from {list(DRAFTERS)} "
                          f"({PREDICTION_RULE})",
                          "speculation.drafters")
    kw: dict[str, Any] = {}
    if drafters is not None:
        kw["drafters"] = tuple(drafters)
    mdt = get_int(v, "max_draft_tokens", None, lo=0, hi=256)
    if mdt is not None:
        kw["max_draft_tokens"] = mdt
    if v.get("enabled") is not None:
        kw["enabled"] = get_bool(v, "enabled", True)
    if v.get("adaptive") is not None:
        kw["adaptive"] = get_bool(v, "adaptive", True)
    try:
        return SpeculationConfig(**kw)
    except ValueError as e:
        raise invalid(str(e), "speculation") from None


def _references(body: dict, cfg: ServerConfig) -> list[str] | None:
    v = body.get("references")
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
        raise invalid("'references' must be a list of strings (retrieved chunks)", "references", "invalid_type")
    if len(v) > cfg.max_references:
        raise invalid(f"'references' may hold at most {cfg.max_references} chunks, got {len(v)}", "references")
    return [r for r in v if r] or None


def _text_content(v: Any, param: str) -> str:
    """OpenAI content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        texts = []
        for part in v:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"'{param}' parts must be {{\"type\": \"text\", \"text\": \"...\"}}; "
                              "images, audio and files are not supported", param, "unsupported_value")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"'{param}' must be a string or a list of text parts", param, "invalid_type")


def _prediction(body: dict) -> str | None:
    v = body.get("prediction")
    if v is None:
        return None
    if not isinstance(v, dict) or v.get("type", "content") != "content" or "content" not in v:
        raise invalid('\'prediction\' must be {"type": "content", "content": "..."}', "prediction", "invalid_type")
    return _text_content(v["content"], "prediction.content") or None


def _stream(body: dict) -> tuple[bool, bool]:
    stream = get_bool(body, "stream", False)
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise invalid("'stream_options' must be an object", "stream_options", "invalid_type")
        if not stream:
            raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = get_bool(so, "include_usage", False)
    return stream, include_usage


def _sampling(body: dict, cfg: ServerConfig, vocab_size: int, max_tokens: int, logprobs: int | None) -> SamplingParams:
    top_k = get_int(body, "top_k", 0, lo=-1)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=get_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=get_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=max(top_k, 0),
            presence_penalty=get_number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=get_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            logit_bias=_logit_bias(body, vocab_size),
            seed=get_int(body, "seed", None, lo=0, hi=2**63 - 1),
            stop=_stop(body, cfg),
            ignore_eos=get_bool(body, "ignore_eos", False),
            logprobs=logprobs,
        )
    except ValueError as e:  # SamplingParams' own checks, should the ranges above ever drift
        raise invalid(str(e)) from None


def _max_tokens(body: dict, cfg: ServerConfig, default: int, prompt_len: int, context: int) -> int:
    """The request's max_tokens; an explicit value that does not fit the context is a 400."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    asked = get_int(body, name, None, lo=1, hi=cfg.max_tokens_limit)
    room = context - prompt_len
    if asked is None:
        return max(1, min(default, room))
    if asked > room:
        raise invalid(f"this model's maximum context length is {context} tokens, but you requested "
                      f"{prompt_len + asked} tokens ({prompt_len} in the prompt, {asked} for the completion); "
                      f"reduce the prompt or '{name}'", name, "context_length_exceeded")
    return asked


def _prompt_limit(cfg: ServerConfig, context: int) -> int:
    return min(context - 1, cfg.max_prompt_tokens or context)


# -- bounds before tokenizing -------------------------------------------------------------------------
# Tokenizing is the costly part of validation: a 7.9 MB prompt took 40 s of CPU and 3.5 GB to find
# out it was too long. Two cheap bounds refuse such prompts first:
# 1. characters: no token covers more than ``max_chars_per_token(tok)`` characters, so a text longer
#    than (limit + 1) * that many characters cannot fit, whatever it holds;
# 2. pieces: a long text is tokenized in pieces of about PIECE_CHARS characters cut after a newline,
#    stopping as soon as the count passes the limit (plus PIECE_SLACK tokens per cut, for a token that
#    the whole text would have merged across the cut). Only a text that may fit is tokenized whole.
# Example: context 2048, longest token 16 characters: a 40,000-character prompt is refused by (1)
# without tokenizing; a 30,000-character one is counted piece by piece and refused after about 2,100
# tokens' worth of pieces, holding one piece's tokens at a time.
PIECE_CHARS = 16_384
PIECE_SLACK = 8


@functools.lru_cache(maxsize=8)
def max_chars_per_token(tokenizer: Any) -> int:
    """An upper bound on the characters one token can stand for, from the vocabulary's strings.

    Byte-level vocabularies spell each byte as one character (a character is >= 1 byte), SentencePiece
    ones spell a space as one "\u2581": the longest vocabulary string bounds a token's text. A
    normalizer may fold several input characters into one (NFC, stripping accents): x4 for those."""
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    except Exception:  # a tokenizer without a vocabulary listing: no character bound
        return 1 << 30
    backend = getattr(tokenizer, "backend_tokenizer", None)
    folds = backend is not None and getattr(backend, "normalizer", None) is not None
    return max(1, longest) * (4 if folds else 1)


def _too_long(n: str, limit: int, context: int, param: str) -> APIError:
    return invalid(f"the prompt is {n} tokens long; this server accepts at most {limit} "
                   f"(model context {context}); shorten '{param}'", param, "context_length_exceeded")


def check_text_fits(text_chars: int, tokenizer: Any, cfg: ServerConfig, context: int, param: str) -> None:
    """Bound 1: refuse a text that cannot fit the prompt limit, from its length alone."""
    limit = _prompt_limit(cfg, context)
    per_token = max_chars_per_token(tokenizer)
    if text_chars > (limit + 1) * per_token:
        raise _too_long(f"more than {text_chars // per_token}", limit, context, param)


def encode_bounded(text: str, encode: Callable[[str], list[int]], tokenizer: Any, cfg: ServerConfig,
                   context: int, param: str) -> list[int]:
    """``encode(text)``, after the two cheap bounds (see above) have let the text through."""
    check_text_fits(len(text), tokenizer, cfg, context, param)
    if len(text) > PIECE_CHARS:
        limit = _prompt_limit(cfg, context)
        count, start, cuts = 0, 0, 0
        while start < len(text):
            end = min(len(text), start + PIECE_CHARS)
            if end < len(text):
                nl = text.rfind("\n", start + PIECE_CHARS // 2, end)
                end = nl + 1 if nl >= 0 else end
            count += len(tokenizer(text[start:end], add_special_tokens=False)["input_ids"])
            cuts += 1
            if count > limit + PIECE_SLACK * cuts:
                raise _too_long(f"more than {limit}", limit, context, param)
            start = end
    return list(encode(text))


def _check_prompt_len(n: int, cfg: ServerConfig, context: int, param: str) -> None:
    limit = _prompt_limit(cfg, context)
    if n == 0:
        raise invalid(f"'{param}' is empty; give at least one token of prompt", param)
    if n > limit:
        raise _too_long(str(n), limit, context, param)


# -- the two routes ---------------------------------------------------------------------------------

def _unsupported(body: dict, checks: list[tuple[str, Any, str]]) -> None:
    for name, ok, msg in checks:
        if body.get(name) is not None and not ok(body[name]):
            raise invalid(msg, name, "unsupported_value")


def parse_completion(body: dict, spec: Any, cfg: ServerConfig) -> GenRequest:
    """Validate a ``POST /v1/completions`` body."""
    model = get_str(body, "model", "")
    _n(body)
    _unsupported(body, [
        ("best_of", lambda v: v == 1, "only best_of=1 is supported"),
        ("echo", lambda v: v is False, "'echo' is not supported; the response holds only the completion"),
        ("suffix", lambda v: v == "", "'suffix' (insertion) is not supported"),
    ])
    if "prompt" not in body or body["prompt"] is None:
        raise invalid("'prompt' is required: a string (or a list of token ids)", "prompt", "missing_required")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    references, prediction = _extra_texts(body, cfg)  # size-checked before any tokenizing
    context = spec.max_context
    if isinstance(prompt, str):
        ids = encode_bounded(prompt, spec.encode, spec.tokenizer, cfg, context, "prompt")
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(spec.tokenizer)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise invalid(f"'prompt' token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})", "prompt")
        ids = list(prompt)
    elif isinstance(prompt, list):
        raise invalid("'prompt' holds several prompts; send one prompt per request", "prompt", "unsupported_value")
    else:
        raise invalid("'prompt' must be a string or a list of token ids", "prompt", "invalid_type")
    _check_prompt_len(len(ids), cfg, context, "prompt")
    logprobs = get_int(body, "logprobs", None, lo=0, hi=20)
    stream, include_usage = _stream(body)
    max_tokens = _max_tokens(body, cfg, cfg.default_completion_max_tokens, len(ids), context)
    return GenRequest("completion", model, ids, _sampling(body, cfg, len(spec.tokenizer), max_tokens, logprobs),
                      _speculation(body), references, prediction, stream, include_usage, logprobs)


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise invalid("'messages' is required: a list of {\"role\", \"content\"} objects", "messages",
                      "missing_required")
    if not isinstance(msgs, list) or not msgs:
        raise invalid("'messages' must be a non-empty list", "messages", "invalid_type")
    out = []
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"'{p}' must be an object with 'role' and 'content'", p, "invalid_type")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise invalid(f"'{p}.role' must be one of {list(CHAT_ROLES)}, got {role!r}", f"{p}.role")
        content = m.get("content")
        if content is None:
            if m.get("tool_calls"):
                raise invalid("tool calls are not supported", f"{p}.tool_calls", "unsupported_value")
            content = ""
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text_content(content, f"{p}.content")})
    return out


def parse_chat(body: dict, spec: Any, cfg: ServerConfig) -> GenRequest:
    """Validate a ``POST /v1/chat/completions`` body."""
    model = get_str(body, "model", "")
    _n(body)
    _unsupported(body, [
        ("tools", lambda v: v == [], "'tools' (function calling) is not supported by this server"),
        ("functions", lambda v: v == [], "'functions' (function calling) is not supported by this server"),
        ("response_format", lambda v: isinstance(v, dict) and v.get("type") == "text",
         "only response_format {\"type\": \"text\"} is supported"),
        ("audio", lambda v: False, "'audio' output is not supported"),
    ])
    messages = _messages(body)
    references, prediction = _extra_texts(body, cfg)  # size-checked before any tokenizing
    context = spec.max_context
    tok = spec.tokenizer
    check_text_fits(sum(len(m["content"]) for m in messages), tok, cfg, context, "messages")
    try:
        text = spec.render_chat(messages)
    except Exception as e:  # a template that rejects the conversation (e.g. roles out of order)
        raise invalid(f"the model's chat template rejected these messages: {e}", "messages") from None
    # as SuffixSpec.encode_chat: the template already holds the special tokens
    ids = encode_bounded(text, lambda t: tok(t, add_special_tokens=False)["input_ids"], tok, cfg, context,
                         "messages")
    _check_prompt_len(len(ids), cfg, context, "messages")
    want_lp = get_bool(body, "logprobs", False)
    top = get_int(body, "top_logprobs", None, lo=0, hi=20)
    if top is not None and not want_lp:
        raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if want_lp else None
    stream, include_usage = _stream(body)
    max_tokens = _max_tokens(body, cfg, cfg.default_max_tokens, len(ids), context)
    return GenRequest("chat", model, ids, _sampling(body, cfg, len(spec.tokenizer), max_tokens, logprobs),
                      _speculation(body), references, prediction, stream, include_usage, logprobs)


def _extra_texts(body: dict, cfg: ServerConfig) -> tuple[list[str] | None, str | None]:
    """``references`` and ``prediction``, refused when together longer than ``max_reference_chars``."""
    references, prediction = _references(body, cfg), _prediction(body)
    total = sum(len(r) for r in references or []) + len(prediction or "")
    if total > cfg.max_reference_chars:
        raise APIError(f"references and prediction hold {total} characters; the limit is "
                       f"{cfg.max_reference_chars}", 400, "references", "invalid_value")
    return references, prediction
