"""A LlamaIndex RAG pipeline over Node.js's API documentation, on suffixspec: the retrieved chunks draft the answer.

The usual LlamaIndex pipeline (read a folder, split the Markdown into sections, embed, retrieve the
top 2, answer with the default QA prompt) answers each question three ways, interleaved:

- ours:  ``SuffixSpecLLM(spec=...)``, whose query engine hands the retrieved chunks over as references;
- plain: LlamaIndex's generic OpenAI-compatible client (``OpenAILike``) against a suffixspec server on
  127.0.0.1 serving the same model: the same pipeline without references (the server still drafts
  from the prompt, which holds the same chunks);
- off:   ``SuffixSpecLLM(spec=..., speculation=False)``: plain decoding.

Greedy, so the three answers are identical (checked); what differs is the time. All three share one
model in this process (the server runs on a thread) and the output history is off. Each question's
prompt is prefilled once, untimed, into the prompt cache, so the three timed pipelines differ only in
decoding (which is all speculation changes). Tokens/s by CPU time (this process, one torch thread),
by wall time and by the engine's own decode time, with the load average, since the machine may be shared.

    pip install 'suffixspec[llama-index]' llama-index-llms-openai-like
    python examples/llama_index_rag.py                      # SmolLM2-135M-Instruct if installed, 10 questions
    python examples/llama_index_rag.py --questions 2 --max-tokens 64 --model suffixspec/demo-target
"""

from __future__ import annotations

from pathlib import Path

from llama_index.core import SimpleDirectoryReader, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.instrumentation.events.llm import LLMChatEndEvent
from llama_index.core.node_parser import MarkdownNodeParser, SentenceSplitter
from rag_common import (
    QUESTIONS,
    compare,
    hashed_embedding,
    parse_args,
    serve_in_process,
)

from suffixspec import SuffixSpec
from suffixspec.integrations.llama_index import SpeculationStats, SuffixSpecLLM


class HashedEmbedding(BaseEmbedding):
    """rag_common.hashed_embedding as a LlamaIndex embedding model (local, no download)."""

    def _get_text_embedding(self, text: str) -> list[float]:
        return hashed_embedding(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        return hashed_embedding(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return hashed_embedding(query)


def build_index(folder: Path) -> VectorStoreIndex:
    docs = SimpleDirectoryReader(str(folder), required_exts=[".md"]).load_data()
    # one node per Markdown section, long sections cut to 512 tokens
    splitters = [MarkdownNodeParser(), SentenceSplitter(chunk_size=512, chunk_overlap=0)]
    return VectorStoreIndex.from_documents(docs, transformations=splitters, embed_model=HashedEmbedding())


def main() -> None:
    args = parse_args(__doc__)
    model = args.model
    index = build_index(args.docs)

    # history off: earlier answers must not draft later ones; the prompt cache keeps each question's
    # prefill (done once, untimed: compare's warm) for the three timed pipelines
    with SuffixSpec(model=model, draft_model=None, db=False, history=False) as spec:
        ours = SuffixSpecLLM(spec=spec, max_tokens=args.max_tokens)
        prefill = index.as_query_engine(llm=SuffixSpecLLM(spec=spec, max_tokens=1), similarity_top_k=args.top_k)
        pipelines = {"ours": ours}
        server = None
        if not args.no_baselines:
            from llama_index.llms.openai_like import OpenAILike

            server = serve_in_process(spec, model)
            pipelines["plain"] = OpenAILike(api_base=server.url + "/v1", api_key="-", model=model,
                                            is_chat_model=True, context_window=spec.max_context,
                                            max_tokens=args.max_tokens, temperature=0.0,
                                            timeout=3600, max_retries=0)  # a retry would run it twice
            pipelines["off"] = SuffixSpecLLM(spec=spec, max_tokens=args.max_tokens, speculation=False)
        try:
            engines = {name: index.as_query_engine(llm=llm, similarity_top_k=args.top_k)
                       for name, llm in pipelines.items()}
            compare({name: ask(e) for name, e in engines.items()}, QUESTIONS[: args.questions], spec.tokenizer,
                    args.json, warm=prefill.query)
        finally:
            if server is not None:
                server.close()


def ask(engine):  # noqa: ANN001, ANN201 - a query engine; rag_common.compare's pipeline
    def answer(question: str) -> tuple[str, dict | None]:
        with LLMResponses() as calls:
            text = str(engine.query(question))
        return text, calls.metadata[-1] if calls.metadata else None

    return answer


class LLMResponses(SpeculationStats):
    """SpeculationStats that also reads a plain OpenAI client's responses: its ``raw`` is the server's
    response object, which keeps the server's ``speculative_decoding`` and ``usage`` fields."""

    metadata: list = []  # per LLM call: its metadata, or None

    def handle(self, event, **kwargs) -> None:  # noqa: ANN001, ANN003
        super().handle(event, **kwargs)
        response = getattr(event, "response", None)
        if isinstance(event, LLMChatEndEvent) and response is not None:
            meta = response.additional_kwargs if "speculative_decoding" in response.additional_kwargs else None
            raw = response.raw
            if meta is None and raw is not None and hasattr(raw, "model_dump"):
                dumped = raw.model_dump()
                meta = {"speculative_decoding": dumped.get("speculative_decoding"), "usage": dumped["usage"]}
            self.metadata.append(meta)


if __name__ == "__main__":
    main()
