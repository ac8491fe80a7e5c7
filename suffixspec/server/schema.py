"""The HTTP contract: one pydantic model per request body, for validation and for ``/openapi.json``.

A model checks what a request says on its own (types, ranges, the server's limits, unsupported
options); ``validation.py`` then checks what needs the model (token ids in the vocabulary, the
prompt's length in tokens, the context). A field sent as ``null`` counts as not sent. An unknown
field of a generation request (or of its ``speculation``, ``prediction``, ``stream_options``) is a
400 naming it and the nearest known field, as OpenAI refuses an unrecognized argument: a typo such as
``max_token`` or ``temprature`` would otherwise run with the default. OpenAI's fields that change
nothing here (``user``, ``metadata``, ``store``, ...: :data:`OPENAI_IGNORED`) are accepted and
ignored, and so are unknown keys of a message (clients send back the messages they were given).

The limits a server enforces (``ServerConfig``: ``max_tokens_limit``, ``max_stop``, ...) are part
of its schema, so the models are built per set of limits by ``request_models(cfg)`` (cached).
Every refusal becomes one ``APIError`` (400) naming the field where it happened, e.g.
``{"messages": [{"role": "wizard"}]}`` -> ``param: "messages[0].role"``, ``message: "'messages[0].role'
must be one of ['system', 'developer', 'user', 'assistant', 'tool'], got 'wizard'"``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from suffixspec.drafting.draft import PREDICTION_RULE
from suffixspec.drafting.registry import source_names
from suffixspec.server.errors import APIError, invalid

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_LOGPROBS = 20  # top-N log-probabilities a request may ask for
MAX_DRAFT_TOKENS = 256  # largest per-request draft budget (speculation.max_draft_tokens)
MAX_SEED = 2**63 - 1
MAX_LOGIT_BIAS = 100.0  # |bias| per token, as OpenAI
# Codes a validator may raise with PydanticCustomError(code, message): the message is shown as is.
OWN_CODES = ("invalid_type", "invalid_value", "unsupported_value", "missing_required")
# OpenAI request fields accepted and ignored (they change nothing a server without accounts, tools or
# storage does); anything else unknown is refused (``Strict``)
OPENAI_IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "tool_choice", "modalities",
                  "reasoning_effort", "prompt_cache_key", "safety_identifier", "verbosity", "web_search_options",
                  "function_call")
MISSING = {"prompt": ": a string (or a list of token ids)", "messages": ': a list of {"role", "content"} objects',
           "documents": ': a non-empty list of strings or {"text", "source", "metadata"} objects'}


# -- field types --------------------------------------------------------------------------------------

def _integral(v: Any) -> Any:
    """``10.0`` is the integer 10 (JSON has one number type); ``10.5`` stays a float and is refused."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def Int(ge: int | None = None, le: int | None = None) -> Any:  # noqa: N802 - a type, used as one
    """An integer field in [ge, le]; the bounds sit beside ``int`` so the JSON schema says minimum/maximum."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_integral)]


def _refuse(code: str, message: str) -> WrapValidator:
    """Any error of the inner type becomes one error with this message (a union's N errors read as one)."""

    def wrap(v: Any, handler: Any) -> Any:
        try:
            return handler(v)
        except ValidationError:
            raise PydanticCustomError(code, message) from None

    return WrapValidator(wrap)


def _unsupported(message: str) -> WrapValidator:
    return _refuse("unsupported_value", message)


class Body(BaseModel):
    """A request object: unknown fields ignored, ``null`` = not sent, no coercion of strings to numbers."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class Strict(Body):
    """A request object whose unknown fields are refused (``unknown_parameter``: the field and the nearest
    known one), except those it lists in ``ignored``."""

    ignored: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = [*cls.model_fields, *cls.ignored]
            unknown = [str(k) for k in data if k not in known]
            if unknown:
                import difflib

                near = [next(iter(difflib.get_close_matches(k, known, n=1, cutoff=0.6)), None) for k in unknown]
                raise PydanticCustomError("unknown_parameter", "unrecognized request argument {field}",
                                          {"field": unknown[0], "unknown": unknown, "nearest": near,
                                           "known": sorted(cls.model_fields)})
        return data


class TextPart(Body):
    type: Literal["text"]
    text: str


def _content_shape(v: Any) -> Any:
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in v):
            return v
        raise PydanticCustomError("unsupported_value", "'{param}' parts must be "
                                  '{"type": "text", "text": "..."}; images, audio and files are not supported')
    raise PydanticCustomError("invalid_type", "'{param}' must be a string or a list of text parts")


# OpenAI content: a string, or a list of {"type": "text", "text": ...} parts.
Content = Annotated[str | list[TextPart], BeforeValidator(_content_shape)]


def text_of(content: str | list[TextPart] | None) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(p.text for p in content)


class Prediction(Strict):
    """OpenAI's predicted output: the text the answer is expected to (mostly) be."""

    type: Literal["content"] = "content"
    content: Content


def _prediction_shape(v: Any) -> Any:
    if not isinstance(v, dict) or v.get("type", "content") != "content" or "content" not in v:
        raise PydanticCustomError("invalid_type", '\'prediction\' must be {"type": "content", "content": "..."}')
    return v


def _drafters(v: Any) -> Any:
    if not isinstance(v, list) or not all(isinstance(d, str) for d in v):
        raise PydanticCustomError("invalid_type", "'speculation.drafters' must be a list of drafter names")
    known = source_names()
    unknown = [d for d in v if d not in known]
    if unknown:
        raise PydanticCustomError("invalid_value", f"unknown drafter(s) {unknown} in 'speculation.drafters'; "
                                  f"choose from {list(known)} ({PREDICTION_RULE})")
    return v


class _DrafterName:
    """A drafter name's JSON schema: an enum of the registered drafters' sources, read when the schema is
    made (a drafter registered after this module was imported is in it)."""

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        return {"type": "string", "enum": list(source_names())}


class Speculation(Strict):
    """Per-request speculation: which drafters, how many draft tokens (``false`` = plain decoding)."""

    drafters: Annotated[list[Annotated[str, _DrafterName()]], BeforeValidator(_drafters)] | None = Field(
        None, description="drafters to use; default: every drafter the server loaded (GET /v1/models lists "
                          f"them); {PREDICTION_RULE}")
    max_draft_tokens: Int(0, MAX_DRAFT_TOKENS) = Field(None, description="draft tree node budget")
    enabled: bool | None = None
    adaptive: bool | None = Field(None, description="let the budget follow measured acceptance and costs")


def _speculation_shape(v: Any) -> Any:
    """``true`` = the server's defaults (as not sent), ``false`` = plain decoding (``{"enabled": false}``)."""
    if isinstance(v, bool):
        return None if v else {"enabled": False}
    if not isinstance(v, dict):
        raise PydanticCustomError("invalid_type", "'speculation' must be false, true or an object like "
                                  '{"drafters": ["prompt", "references"], "max_draft_tokens": 32}')
    return v


class StreamOptions(Strict):
    ignored: ClassVar[tuple[str, ...]] = ("include_obfuscation",)  # OpenAI's; nothing here obfuscates

    include_usage: bool = False


class Message(Body):
    role: Literal[CHAT_ROLES]  # type: ignore[valid-type]
    content: Content | None = None
    tool_calls: list[Any] | None = Field(None, description="not supported (ignored beside a content)",
                                         json_schema_extra={"maxItems": 0})

    @field_validator("tool_calls", mode="after")
    @classmethod
    def _no_tool_calls(cls, v: Any, info: ValidationInfo) -> Any:
        if v and info.data.get("content") is None:  # a message that is only a tool call: nothing to render
            raise PydanticCustomError("unsupported_value", "tool calls are not supported")
        return v

    @property
    def text(self) -> str:
        return text_of(self.content)


def _message_shape(v: Any) -> Any:
    if not isinstance(v, list):
        raise PydanticCustomError("invalid_type", "'messages' must be a non-empty list")
    if not v:
        raise PydanticCustomError("invalid_value", "'messages' must be a non-empty list")
    return v


# -- the request bodies, per set of limits --------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """What a server accepts beyond the OpenAI ranges (ServerConfig's fields of the same names)."""

    max_tokens_limit: int
    max_stop: int
    max_references: int
    max_reference_chars: int
    max_documents_per_request: int

    @classmethod
    def of(cls, cfg: Any) -> Limits:
        return cls(cfg.max_tokens_limit, cfg.max_stop, cfg.max_references, cfg.max_reference_chars,
                   cfg.max_documents_per_request)


@dataclass(frozen=True)
class RequestModels:
    completion: type[BaseModel]  # POST /v1/completions
    chat: type[BaseModel]  # POST /v1/chat/completions
    add_documents: type[BaseModel]  # POST /v1/index/documents
    delete_documents: type[BaseModel]  # DELETE /v1/index/documents


@functools.lru_cache(maxsize=16)
def _models(limits: Limits) -> RequestModels:
    """The four request models for these limits (built once per distinct set)."""
    lim = limits
    tokens_field = Field(None, description="tokens to generate at most; must fit the context with the prompt")
    stop_item = Annotated[str, Field(min_length=1)]
    stop_msg = "'stop' must be a string or a list of strings"  # checked by stop_shape, then by the type

    def stop_shape(v: Any) -> Any:
        if isinstance(v, list) and len(v) > lim.max_stop and all(isinstance(s, str) for s in v):
            raise PydanticCustomError("invalid_value", f"'stop' may hold at most {lim.max_stop} strings, got {len(v)}")
        if (isinstance(v, str) and not v) or (isinstance(v, list) and any(s == "" for s in v)):
            raise PydanticCustomError("invalid_value", "'stop' strings must not be empty")
        return v

    def refs_shape(v: Any) -> Any:
        if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
            raise PydanticCustomError("invalid_type", "'references' must be a list of strings (retrieved chunks)")
        if len(v) > lim.max_references:
            raise PydanticCustomError("invalid_value", f"'references' may hold at most {lim.max_references} "
                                      f"chunks, got {len(v)}")
        return v

    def only_n1(v: Any, handler: Any) -> Any:
        v = handler(v)
        if v != 1:
            raise PydanticCustomError("unsupported_value", "only n=1 is supported (one completion per request); "
                                      "send separate requests")
        return v

    class Sampling(Strict):
        """The fields both generation routes share (OpenAI's, then this project's extensions)."""

        ignored: ClassVar[tuple[str, ...]] = OPENAI_IGNORED

        model: str = Field("", description="a model name the server serves (see GET /v1/models); "
                                           "'suffixspec' always works")
        n: Annotated[Int(1), Field(json_schema_extra={"enum": [1]}), WrapValidator(only_n1)] = 1
        references: Annotated[list[str], Field(max_length=lim.max_references), BeforeValidator(refs_shape)] \
            | None = Field(None, description=f"retrieved chunks the output may copy from (at most "
                                             f"{lim.max_reference_chars} characters with the prediction)")
        prediction: Annotated[Prediction, BeforeValidator(_prediction_shape)] | None = Field(
            None, description="the expected output (a code edit's new file): drafted from, usage reports "
                              "accepted/rejected prediction tokens")
        speculation: Annotated[Speculation | None, BeforeValidator(
            _speculation_shape, json_schema_input_type=bool | Speculation)] = Field(
            None, description="false = plain decoding; an object chooses drafters and budget")
        stream: bool = False
        stream_options: StreamOptions | None = None
        max_tokens: Int(1, lim.max_tokens_limit) = tokens_field
        max_completion_tokens: Int(1, lim.max_tokens_limit) = tokens_field
        temperature: float = Field(1.0, ge=0, le=2, description="0 = greedy")
        top_p: float = Field(1.0, gt=0, le=1)
        top_k: Int(-1) = Field(0, description="0 or -1 = off")
        presence_penalty: float = Field(0.0, ge=-2, le=2)
        frequency_penalty: float = Field(0.0, ge=-2, le=2)
        logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]], _refuse(
            "invalid_value", f"'logit_bias' values must be numbers between -{MAX_LOGIT_BIAS:g} and "
                             f"{MAX_LOGIT_BIAS:g}")] = Field(
            default_factory=dict, description="token id (as a string) -> bias added to its logit",
            json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}})
        seed: Int(0, MAX_SEED) = Field(None, description=(
            "fixes the sampled tokens: with the model-free drafters (and a text-mode bridged draft model, or a "
            "same-vocabulary one that does not sample) the output equals speculation off token for token, up "
            "to float rounding; drafters that sample keep the distribution, not the tokens"))
        stop: Annotated[str | Annotated[list[stop_item], Field(max_length=lim.max_stop)],
                        _refuse("invalid_type", stop_msg), BeforeValidator(stop_shape)] | None = None
        ignore_eos: bool = False

        @field_validator("logit_bias", mode="after")
        @classmethod
        def _bias_keys(cls, v: dict[str, float], info: ValidationInfo) -> dict[str, float]:
            vocab = (info.context or {}).get("vocab_size")
            for k in v:
                try:
                    tid = int(k)
                except ValueError:
                    raise PydanticCustomError("invalid_type", f"'logit_bias' keys must be token ids, got {k!r}") from None
                if vocab is not None and not 0 <= tid < vocab:
                    raise PydanticCustomError("invalid_value", f"'logit_bias' token id {tid} is outside the "
                                              f"vocabulary (0..{vocab - 1})")
            return v

        @model_validator(mode="after")
        def _together(self) -> Any:
            if self.stream_options is not None and not self.stream:
                raise invalid("'stream_options' is only allowed when 'stream' is true", "stream_options")
            total = sum(len(r) for r in self.references or []) + len(text_of(self.prediction.content)
                                                                    if self.prediction else "")
            if total > lim.max_reference_chars:
                raise invalid(f"references and prediction hold {total} characters; the limit is "
                              f"{lim.max_reference_chars}", "references")
            return self

        @property
        def stop_list(self) -> list[str]:
            return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

        @property
        def max_tokens_field(self) -> str:
            """Which of the two names the request used (error messages name it)."""
            return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

        @property
        def asked_max_tokens(self) -> int | None:
            return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def prompt_shape(v: Any) -> Any:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]  # a batch of one
        if isinstance(v, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            if all(isinstance(t, (str, list)) for t in v):
                raise PydanticCustomError("unsupported_value", "'prompt' holds several prompts; send one prompt "
                                          "per request")
            raise PydanticCustomError("invalid_type", "'prompt' must be a string or a list of token ids")
        if not isinstance(v, (str, list)):
            raise PydanticCustomError("invalid_type", "'prompt' must be a string or a list of token ids")
        if isinstance(v, list) and any(t < 0 for t in v):  # the vocabulary's upper end: _ids_in_vocab
            raise PydanticCustomError("invalid_value", f"'prompt' token ids {[t for t in v if t < 0][:5]} are "
                                      "outside the vocabulary")
        return v

    class CompletionRequest(Sampling):
        """``POST /v1/completions``."""

        best_of: Annotated[Literal[1], _unsupported("only best_of=1 is supported")] = 1
        echo: Annotated[Literal[False], _unsupported("'echo' is not supported; the response holds only the "
                                                     "completion")] = False
        suffix: Annotated[Literal[""], _unsupported("'suffix' (insertion) is not supported")] = ""
        prompt: Annotated[Annotated[str, Field(json_schema_extra={"minLength": 1})]
                          | Annotated[list[Annotated[int, Field(ge=0)]], Field(json_schema_extra={"minItems": 1})],
                          BeforeValidator(prompt_shape)] = Field(
            description="the prompt text, or its token ids; at most the server's prompt limit in tokens")
        logprobs: Int(0, MAX_LOGPROBS) = Field(None, description="top-N log-probabilities per token")

        @field_validator("prompt", mode="after")
        @classmethod
        def _ids_in_vocab(cls, v: Any, info: ValidationInfo) -> Any:
            vocab = (info.context or {}).get("vocab_size")
            if isinstance(v, list) and vocab is not None:
                bad = [t for t in v if not 0 <= t < vocab]
                if bad:
                    raise PydanticCustomError("invalid_value", f"'prompt' token ids {bad[:5]} are outside the "
                                              f"vocabulary (0..{vocab - 1})")
            return v

    class ChatRequest(Sampling):
        """``POST /v1/chat/completions`` (the model's chat template renders the messages)."""

        tools: Annotated[list[Any], Field(max_length=0), _unsupported(
            "'tools' (function calling) is not supported by this server")] | None = None
        functions: Annotated[list[Any], Field(max_length=0), _unsupported(
            "'functions' (function calling) is not supported by this server")] | None = None
        response_format: Annotated[TextFormat, _unsupported(
            'only response_format {"type": "text"} is supported')] | None = None
        audio: Annotated[Literal[None], _unsupported("'audio' output is not supported")] = None
        messages: Annotated[list[Message], BeforeValidator(_message_shape), Field(min_length=1)]
        logprobs: bool = False
        top_logprobs: Int(0, MAX_LOGPROBS) = Field(None, description="needs logprobs: true")

        @model_validator(mode="after")
        def _top_needs_logprobs(self) -> Any:
            if self.top_logprobs is not None and not self.logprobs:
                raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            return self

    def documents_shape(v: Any) -> Any:
        if not isinstance(v, list) or not v:
            raise PydanticCustomError("invalid_type", '\'documents\' must be a non-empty list of strings or '
                                      '{"text", "source", "metadata"} objects')
        if len(v) > lim.max_documents_per_request:
            raise PydanticCustomError("invalid_value", f"at most {lim.max_documents_per_request} documents per "
                                      f"request, got {len(v)}")
        return [{"text": d} if isinstance(d, str) else d for d in v]

    class AddDocuments(Body):
        """``POST /v1/index/documents``: ``{"documents": [...]}``, or one ``{"text", ...}`` object."""

        documents: Annotated[list[Document], BeforeValidator(documents_shape),
                             Field(min_length=1, max_length=lim.max_documents_per_request)]

        @model_validator(mode="before")
        @classmethod
        def _one_document(cls, data: Any) -> Any:
            if isinstance(data, dict) and data.get("documents") is None and isinstance(data.get("text"), str):
                return {"documents": [data]}
            return data

    return RequestModels(CompletionRequest, ChatRequest, AddDocuments, DeleteDocuments)


class TextFormat(Body):
    type: Literal["text"]


class Document(Body):
    """A document to index: its text itself (a path is never read), a name, metadata."""

    text: Annotated[str, Field(min_length=1, description="the document's text itself (never read from a path)")]
    source: str | None = Field(None, description="a name for the document (not read)")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _text_first(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise PydanticCustomError("invalid_type", "'{param}' must be a string or an object with a 'text' "
                                      "string")
        return data


def _document_id(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise PydanticCustomError("invalid_type", f"document ids must be integers or strings, got {_shown(v)}")
    return v


def _ids_shape(v: Any) -> Any:
    if not isinstance(v, list):
        raise PydanticCustomError("invalid_type", "'ids' must be a list of document ids")
    return v


class DeleteDocuments(Body):
    """``DELETE /v1/index/documents`` body (ids may also come as ``?id=``)."""

    ids: Annotated[list[Annotated[int | str, BeforeValidator(_document_id)]], BeforeValidator(_ids_shape)] = Field(
        default_factory=list)


def request_models(cfg: Any) -> RequestModels:
    """The request models for a server's limits (``ServerConfig``)."""
    return _models(Limits.of(cfg))


# -- errors ---------------------------------------------------------------------------------------------

def _is_union_tag(part: str) -> bool:
    """A step pydantic adds for a union member (``str``, ``list[int]``, ``function-after[...]``, a model
    name), not a field: request fields are snake_case."""
    return part in ("str", "int", "float", "bool", "none") or "[" in part or part[:1].isupper()


def param_of(loc: tuple) -> str | None:
    """``("messages", 0, "role")`` -> ``"messages[0].role"``; pydantic's own steps (union members) dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and not _is_union_tag(part):
            out += f".{part}" if out else part
    return out or None


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _got(v: Any) -> str:
    return f"got {type(v).__name__} {_shown(v)}"


def to_api_error(exc: ValidationError, where: str | None = None) -> APIError:
    """The first error of a ValidationError as a 400 naming its field (``where`` prefixes the location)."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    param = param_of(((where,) if where else ()) + loc)
    t, v, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    name = f"'{param}'" if param else "the request"
    if t == "unknown_parameter":  # the fields are the unknown keys, inside the object that refused them
        return _unknown_fields(param, ctx)
    if t in OWN_CODES:  # our validators' messages; "{param}" where they cannot know the list index
        return invalid(err["msg"].replace("{param}", param or "the request"), param, t)
    if t == "missing":
        return invalid(f"{name} is required{MISSING.get(param or '', '')}", param, "missing_required")
    words = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
             "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
             "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
             "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object"}
    if t in words:
        return invalid(f"{name} must be {words[t]}, {_got(v)}", param, "invalid_type")
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
              "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
    if t in bounds:
        op, key = bounds[t]
        bound = ctx.get(key)
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return invalid(f"{name} must be {op} {bound}, got {_shown(v)}", param)
    if t == "too_long":
        return invalid(f"{name} may hold at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}",
                       param)
    if t == "too_short":
        return invalid(f"{name} must not be empty", param)
    if t == "string_too_short":
        return invalid(f"{name} must not be empty", param)
    if t == "literal_error":
        return invalid(f"{name} must be one of {ctx.get('expected')}, got {_shown(v)}", param)
    return invalid(f"{name}: {err['msg']}", param)


def _unknown_fields(within: str | None, ctx: dict) -> APIError:
    """The 400 for unknown fields: each named, with the nearest known field or else the list of them.
    Example: ``{"max_token": 8, "temprature": 0}`` -> "unrecognized request arguments 'max_token' (did you
    mean 'max_tokens'?), 'temprature' (did you mean 'temperature'?)", param ``max_token``."""
    prefix = f"{within}." if within else ""
    named = [f"'{prefix}{k}'" + (f" (did you mean '{prefix}{near}'?)" if near else "")
             for k, near in zip(ctx["unknown"], ctx["nearest"], strict=True)]
    known = "" if all(ctx["nearest"]) else f"; the known fields are {', '.join(ctx['known'])}"
    plural = "s" if len(named) > 1 else ""
    return invalid(f"unrecognized request argument{plural} {', '.join(named)}{known} (docs/api.md lists every "
                   "field)", prefix + ctx["field"], "unknown_parameter")


def parse(model: type[BaseModel], body: Any, where: str | None = None, **context: Any) -> Any:
    """``model`` validated from a parsed JSON body, or the APIError that names the first wrong field."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as e:
        raise to_api_error(e, where) from None


# -- what the server answers on an error (for the OpenAPI description) ------------------------------------

class ErrorDetail(BaseModel):
    message: str = Field(description="what is wrong and, where it helps, what to do")
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, server_error, ...")
    param: str | None = Field(description="the request field at fault, e.g. messages[0].role")
    code: str | None = Field(description="invalid_value, invalid_type, missing_required, unsupported_value, "
                                         "context_length_exceeded, model_not_found, queue_full, ...")


class Error(BaseModel):
    error: ErrorDetail
