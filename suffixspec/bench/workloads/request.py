"""One benchmark request (:class:`Request`) and how the workloads write one: a chat through the tokenizer's
template (:func:`chat`), one user message as a chat request (:func:`user_request`), code in a fenced block
(:func:`fence`), a prompt that fits the model's context (:func:`fits`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Request:
    """One benchmark request."""

    prompt: str  # full prompt text (chat template already applied where used)
    max_tokens: int  # generation length cap
    prediction: str | None = None  # code-edit prediction (OpenAI predicted outputs)
    references: list[str] = field(default_factory=list)  # per-request RAG chunks
    answer: str = ""  # what a person would answer (the replay's fixed output)
    # the chat messages ``prompt`` was rendered from (None for a completion prompt): what a client sends to
    # an OpenAI chat endpoint, which applies the template itself (``bench_servers``)
    messages: list[dict[str, str]] | None = None


def chat(tokenizer, messages: list[dict[str, str]]) -> str:
    """``messages`` through the tokenizer's chat template (generation prompt added); a plain
    transcript where it has none."""
    if getattr(tokenizer, "chat_template", None):
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # a template that refuses a role order (Gemma: strictly user/model turns)
            pass
    role = {"system": "System", "user": "User", "assistant": "Assistant"}
    return "".join(f"{role.get(m['role'], m['role'])}: {m['content']}\n\n" for m in messages) + "Assistant:"


def user_request(
    tokenizer, user: str, max_tokens: int, max_prompt_tokens: int | None = None, **fields
) -> Request | None:
    """``user`` as the one user message of a chat request (``prompt`` through the chat template, ``messages``
    kept for a chat endpoint) with the other ``fields`` of :class:`Request`; None where the prompt does not fit
    ``max_prompt_tokens``."""
    messages = [{"role": "user", "content": user}]
    prompt = chat(tokenizer, messages)
    if not fits(tokenizer, prompt, max_prompt_tokens):
        return None
    return Request(prompt, max_tokens, messages=messages, **fields)


def fence(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def fits(tokenizer, prompt: str, max_prompt_tokens: int | None) -> bool:
    return max_prompt_tokens is None or len(tokenizer(prompt)["input_ids"]) <= max_prompt_tokens
