"""Response bodies in OpenAI's shapes, plus this project's extensions.

Extensions (top level, so OpenAI clients ignore them): ``speculative_decoding`` (the request's
RequestStats) on final responses and ``provenance`` (``[{"text", "source"}]``, concatenating to
the chunk's text) on streaming chunks and non-streaming choices.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from suffixspec.drafting.draft import SOURCE_PREDICTION

# Engine finish reasons -> OpenAI finish reasons ("cancelled" only reaches clients on shutdown).
_FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


def finish_reason(reason: str | None) -> str | None:
    return None if reason is None else _FINISH.get(reason, reason)


def sse(obj: Any) -> bytes:
    """One server-sent event: ``data: {json}\\n\\n``."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = b"data: [DONE]\n\n"


def stats_dict(result: Any) -> dict:
    stats = result.stats
    return stats.to_dict() if hasattr(stats, "to_dict") else dict(stats)


def usage(result: Any, prediction_len: int | None) -> dict:
    """OpenAI ``usage``; with a prediction, the accepted/rejected prediction token counts as OpenAI reports.

    accepted = prediction-sourced draft tokens the target kept; rejected = the prediction's other tokens.
    """
    prompt, completion = len(result.prompt_token_ids), len(result.token_ids)
    out: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion}
    if prediction_len is not None:
        per_source = stats_dict(result).get("per_source") or {}
        accepted = int((per_source.get(SOURCE_PREDICTION) or {}).get("accepted", 0))
        out["completion_tokens_details"] = {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": max(0, prediction_len - accepted),
        }
    return out


def merge_pieces(pieces: list[tuple[str, str]]) -> list[dict]:
    """``[(text, source)]`` -> ``[{"text", "source"}]`` with neighbouring same-source runs joined."""
    out: list[dict] = []
    for text, src in pieces:
        if not text:
            continue
        if out and out[-1]["source"] == src:
            out[-1]["text"] += text
        else:
            out.append({"text": text, "source": src})
    return out


def provenance_of(result: Any, tokenizer: Any) -> list[dict]:
    """Provenance runs of a finished result (non-streaming): text per source, from its tokens."""
    runs: list[tuple[str, str]] = []
    toks: list[int] = []
    src_now: str | None = None
    for tok, src in zip(result.token_ids, result.token_sources, strict=False):
        if src != src_now and toks:
            runs.append((src_now or "target", toks))  # type: ignore[arg-type]
            toks = []
        src_now = src
        toks.append(tok)
    if toks:
        runs.append((src_now or "target", toks))  # type: ignore[arg-type]
    # Decode cumulatively so multi-token characters are attributed once, then cut at result.text.
    out: list[tuple[str, str]] = []
    done: list[int] = []
    prev = ""
    for src, ids in runs:
        done += ids
        text = tokenizer.decode(done, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        out.append((text[len(prev):], src))
        prev = text
    final = result.text
    cut: list[tuple[str, str]] = []
    used = 0
    for text, src in out:
        take = text[: max(0, len(final) - used)]
        if take:
            cut.append((take, src))
            used += len(take)
    return merge_pieces(cut)


# -- logprobs ---------------------------------------------------------------------------------------

def _tok_text(tokenizer: Any, tid: int) -> str:
    return tokenizer.decode([int(tid)], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def completion_logprobs(entries: list[dict], tokenizer: Any, offset0: int = 0) -> dict:
    """Legacy completions format: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    off = offset0
    for e in entries:
        t = _tok_text(tokenizer, e["token"])
        tokens.append(t)
        lps.append(e["logprob"])
        tops.append({_tok_text(tokenizer, i): lp for i, lp in e.get("top") or []} or None)
        offsets.append(off)
        off += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries: list[dict], tokenizer: Any) -> dict:
    """Chat format: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``."""
    content = []
    for e in entries:
        t = _tok_text(tokenizer, e["token"])
        top = []
        for i, lp in e.get("top") or []:
            s = _tok_text(tokenizer, i)
            top.append({"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))})
        content.append({"token": t, "logprob": e["logprob"], "bytes": list(t.encode("utf-8")), "top_logprobs": top})
    return {"content": content}


# -- bodies ---------------------------------------------------------------------------------------

@dataclass
class ResponseBuilder:
    """Builds the bodies of one response (completion or chat, streaming or not)."""

    kind: str  # "completion" or "chat"
    model: str  # model id to report
    tokenizer: Any
    prediction_len: int | None = None  # tokens in the request's prediction, for usage details
    logprobs: int | None = None  # top-N requested, None = off
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    lp_sent: int = 0  # streaming: logprob entries already sent
    lp_offset: int = 0  # streaming: text_offset of the next logprob token (completions)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]

    def _lp(self, entries: list[dict]) -> dict | None:
        if self.logprobs is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(entries, self.tokenizer)
        out = completion_logprobs(entries, self.tokenizer, self.lp_offset)
        if out["tokens"]:
            self.lp_offset = out["text_offset"][-1] + len(out["tokens"][-1])
        return out

    def full(self, result: Any) -> dict:
        """A non-streaming response."""
        reason = finish_reason(result.finish_reason)
        lp = self._lp(result.logprobs or [])
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text, "refusal": None},
                      "logprobs": lp, "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": result.text, "logprobs": lp, "finish_reason": reason}
            obj = "text_completion"
        choice["provenance"] = provenance_of(result, self.tokenizer)
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": [choice],
                "usage": usage(result, self.prediction_len), "speculative_decoding": stats_dict(result)}

    def _chunk(self, choices: list[dict], **extra: Any) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
               "system_fingerprint": None, "choices": choices}
        out.update(extra)
        return out

    def first_chunk(self) -> dict | None:
        """Chat streams open with the assistant role (as OpenAI does)."""
        if self.kind != "chat":
            return None
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}], provenance=[])

    def chunk(self, text: str, pieces: list[tuple[str, str]], lp_entries: list[dict] | None = None,
              result: Any = None) -> dict:
        """A streaming chunk; with ``result`` it is the last one (finish_reason + speculative_decoding)."""
        lp = self._lp(lp_entries) if lp_entries else None
        reason = finish_reason(result.finish_reason) if result is not None else None
        if self.kind == "chat":
            choice = {"index": 0, "delta": {"content": text} if text else {}, "logprobs": lp,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": reason}
        if lp_entries:
            self.lp_sent += len(lp_entries)
        extra: dict[str, Any] = {"provenance": merge_pieces(pieces)}
        if result is not None:
            extra["speculative_decoding"] = stats_dict(result)
        return self._chunk([choice], **extra)

    def usage_chunk(self, result: Any) -> dict:
        """``stream_options.include_usage``: a last chunk with empty choices and the usage."""
        return self._chunk([], usage=usage(result, self.prediction_len), speculative_decoding=stats_dict(result))
