"""From a request body to the engine's arguments: what needs the model after ``schema.py``'s checks.

``schema.py``'s models check each field on its own (types, ranges, limits, unsupported options);
here the prompt is tokenized (chat template applied) under cheap length bounds, and ``max_tokens``
is fitted to the context. Every refusal is a 400 that names the field and says what is allowed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from suffixspec.config import SamplingParams, SpeculationConfig
from suffixspec.errors import RequestError
from suffixspec.server.config import ServerConfig
from suffixspec.server.errors import APIError, invalid
from suffixspec.server.schema import parse, request_models, text_of


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


def check_bounds(text: str, tokenizer: Any, cfg: ServerConfig, context: int, param: str) -> None:
    """The two cheap bounds (see above): refuse ``text`` when it cannot fit, before it is tokenized whole."""
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


def _check_prompt_len(n: int, cfg: ServerConfig, context: int, param: str) -> None:
    limit = _prompt_limit(cfg, context)
    if n == 0:
        raise invalid(f"'{param}' is empty; give at least one token of prompt", param)
    if n > limit:
        raise _too_long(str(n), limit, context, param)


# -- the two routes ---------------------------------------------------------------------------------

def _speculation(v: Any) -> SpeculationConfig | None:
    """The request's ``speculation`` (schema.Speculation) as the engine's config; None = server defaults."""
    if v is None:
        return None
    kw = {k: getattr(v, k) for k in ("enabled", "max_draft_tokens", "adaptive") if getattr(v, k) is not None}
    if v.drafters is not None:
        kw["drafters"] = tuple(v.drafters)
    try:
        return SpeculationConfig(**kw)
    except RequestError as e:
        raise invalid(str(e), "speculation") from None


def _sampling(req: Any, max_tokens: int, logprobs: int | None) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0),
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            logit_bias={int(k): v for k, v in req.logit_bias.items()}, seed=req.seed, stop=req.stop_list,
            ignore_eos=req.ignore_eos, logprobs=logprobs)
    except RequestError as e:  # SamplingParams' own checks, should the schema's ranges ever drift from them
        raise invalid(str(e), e.param) from None


def _max_tokens(req: Any, default: int, prompt_len: int, context: int) -> int:
    """The request's max_tokens; an explicit value that does not fit the context is a 400."""
    asked, name = req.asked_max_tokens, req.max_tokens_field
    room = context - prompt_len
    if asked is None:
        return max(1, min(default, room))
    if asked > room:
        raise invalid(f"this model's maximum context length is {context} tokens, but you requested "
                      f"{prompt_len + asked} tokens ({prompt_len} in the prompt, {asked} for the completion); "
                      f"reduce the prompt or '{name}'", name, "context_length_exceeded")
    return asked


def _extras(req: Any) -> tuple[list[str] | None, str | None]:
    """(references without empty chunks, prediction text) of a validated request."""
    references = [r for r in req.references or [] if r] or None
    prediction = (text_of(req.prediction.content) or None) if req.prediction is not None else None
    return references, prediction


def _gen_request(kind: str, req: Any, ids: list[int], default_max: int, context: int,
                 logprobs: int | None) -> GenRequest:
    references, prediction = _extras(req)
    max_tokens = _max_tokens(req, default_max, len(ids), context)
    stream_usage = bool(req.stream_options and req.stream_options.include_usage)
    return GenRequest(kind, req.model, ids, _sampling(req, max_tokens, logprobs), _speculation(req.speculation),
                      references, prediction, req.stream, stream_usage, logprobs)


def parse_completion(body: dict, spec: Any, cfg: ServerConfig) -> GenRequest:
    """Validate a ``POST /v1/completions`` body."""
    req = parse(request_models(cfg).completion, body, vocab_size=len(spec.tokenizer))
    context = spec.max_context
    if isinstance(req.prompt, str):
        check_bounds(req.prompt, spec.tokenizer, cfg, context, "prompt")
        ids = spec.encode(req.prompt)
    else:
        ids = list(req.prompt)
    _check_prompt_len(len(ids), cfg, context, "prompt")
    return _gen_request("completion", req, ids, cfg.default_completion_max_tokens, context, req.logprobs)


def parse_chat(body: dict, spec: Any, cfg: ServerConfig) -> GenRequest:
    """Validate a ``POST /v1/chat/completions`` body."""
    req = parse(request_models(cfg).chat, body, vocab_size=len(spec.tokenizer))
    messages = [{"role": m.role, "content": m.text} for m in req.messages]
    context = spec.max_context
    tok = spec.tokenizer
    check_text_fits(sum(len(m["content"]) for m in messages), tok, cfg, context, "messages")
    # as the Python API encodes them (a template that refuses them raises RequestError: a 400), bounded
    ids = spec.encode_chat(messages, check=lambda text: check_bounds(text, tok, cfg, context, "messages"))
    _check_prompt_len(len(ids), cfg, context, "messages")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return _gen_request("chat", req, ids, cfg.default_max_tokens, context, logprobs)
