"""The documentation and open-ended workloads: ``rag`` (two retrieved chunks in the prompt and as references),
``doc_answers`` (a short snippet in the prompt, the whole pages indexed) and ``open_ended`` (a question about
an installed package)."""

from __future__ import annotations

import random

from suffixspec.bench.workloads.request import Request, chat, fits, user_request
from suffixspec.bench.workloads.sources import Retriever, doc_chunks, doc_files, package_summaries


def _api_sections(
    seed: str,
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]], Retriever, list[int]]:
    """The documentation set, its chunks, a retriever over them, and the chunks to ask about in an order
    drawn from ``seed``: API entries (a heading in backticks) over enough text to quote."""
    files = doc_files()
    chunks = doc_chunks(files)
    api = [i for i, (_, h, c) in enumerate(chunks) if h.startswith("`") and len(c) > 600]
    random.Random(seed).shuffle(api)
    return files, chunks, Retriever(chunks), api


def rag(
    tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
) -> tuple[list[Request], list[tuple[str, str]]]:
    files, chunks, retriever, api = _api_sections("rag")
    reqs, used = [], set()
    for i in api:
        if len(reqs) == n:
            break
        name, heading, chunk = chunks[i]
        question = (
            f"What does {heading} do in Node.js, and how is it used?"
            if name.startswith("nodejs/")
            else f"What does {heading} do, and how is it used?"
        )
        hits = retriever.top(question)
        for k in (2, 1):  # the two best chunks, or the best alone where two do not fit the model's context
            refs = [chunks[j][2] for j in hits[:k]]
            context = "\n\n---\n\n".join(refs)
            user = f"Documentation:\n\n{context}\n\nQuestion: {question} Answer from the documentation above."
            prompt = chat(tokenizer, [{"role": "user", "content": user}])
            if fits(tokenizer, prompt, max_prompt_tokens):
                break
        else:
            continue
        used.update(chunks[j][0] for j in hits[:k])
        body = chunk.split("\n", 1)[1].strip() if "\n" in chunk else chunk
        reqs.append(
            Request(
                prompt,
                max_tokens,
                references=refs,
                answer=f"According to the documentation, {heading}:\n\n{body}",
            )
        )
    docs = [(name, text) for name, text in files if name in used] + [
        (name, text) for name, text in files if name not in used
    ][:8]  # the retrieved files and a few more
    return reqs, docs


def doc_answers(
    tokenizer, n: int, max_tokens: int, max_prompt_tokens: int | None
) -> tuple[list[Request], list[tuple[str, str]]]:
    """Questions about API entries with the first paragraph of the best section as the prompt's snippet;
    every page indexed whole."""
    files, chunks, retriever, api = _api_sections("doc_answers")
    reqs = []
    for i in api:
        if len(reqs) == n:
            break
        name, heading, _ = chunks[i]
        where = " in Node.js" if name.startswith("nodejs/") else ""
        question = f"What does {heading} do{where}, and how is it used? Give an example."
        best = chunks[retriever.top(question, 1)[0]][2]
        prose = [p.strip() for p in best.split("\n\n")[1:] if p.strip()[:1].isalpha() and len(p.strip()) > 80]
        if not prose:  # a section of argument lists and code only
            continue
        snippet = prose[0][:400]
        user = f"Documentation (excerpt):\n\n{snippet}\n\nQuestion: {question}"
        prompt = chat(tokenizer, [{"role": "user", "content": user}])
        if fits(tokenizer, prompt, max_prompt_tokens):
            reqs.append(Request(prompt, max_tokens, answer=best))
    return reqs, files


def open_ended(tokenizer, n: int, max_tokens: int) -> list[Request]:
    from importlib.metadata import metadata

    items = package_summaries()
    random.Random("open_ended").shuffle(items)
    reqs = []
    for name, summary in items[:n]:
        user = (
            f"{name}: {summary}\n\nIn a few paragraphs, what problem does this solve, and who would use it?"
        )
        reqs.append(user_request(tokenizer, user, max_tokens, answer=metadata(name).get_payload() or summary))
    return reqs
