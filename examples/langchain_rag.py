"""A LangChain RAG chain over Node.js's API documentation, on suffixspec: the retrieved documents draft the answer.

The chain of LangChain's RAG tutorial (a vector-store retriever, the tutorial's prompt, a chat model),
with ``prompt_with_references`` in the prompt's place so the retrieved documents reach the model as
references. Each question is answered three ways, interleaved:

- ours:  ``ChatSuffixSpec(spec=...)`` with the documents as references;
- plain: ``langchain-openai``'s ``ChatOpenAI(base_url=...)`` against a suffixspec server on 127.0.0.1
  serving the same model (the same chain; the server gets no references; ChatOpenAI keeps no
  ``speculative_decoding``, so its "decode" time is its wall time);
- off:   ``ChatSuffixSpec(spec=..., speculation=False)``: plain decoding.

Greedy: the three answers are identical (checked). History is off; each question's prompt is
prefilled once, untimed, into the prompt cache, so the timed pipelines differ only in decoding.
Tokens/s by this process's CPU time (one torch thread), by wall time and by the engine's decode
time, with the load average.

    pip install 'suffixspec[langchain]' langchain-openai
    python examples/langchain_rag.py                       # SmolLM2-135M-Instruct if installed
    python examples/langchain_rag.py --questions 2 --model suffixspec/demo-target
"""

from __future__ import annotations

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from rag_common import (
    QUESTIONS,
    compare,
    hashed_embedding,
    markdown_sections,
    parse_args,
    serve_in_process,
)

from suffixspec import SuffixSpec
from suffixspec.integrations.langchain import ChatSuffixSpec, prompt_with_references

# LangChain's RAG tutorial prompt
PROMPT = ChatPromptTemplate.from_messages([
    ("system", "You are an assistant for question-answering tasks. Use the following pieces of retrieved "
               "context to answer the question. If you don't know the answer, say that you don't know. "
               "Use three sentences maximum and keep the answer concise.\n\n{context}"),
    ("human", "{question}"),
])


class HashedEmbeddings(Embeddings):
    """rag_common.hashed_embedding as LangChain embeddings (local, no download)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [hashed_embedding(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return hashed_embedding(text)


def main() -> None:
    args = parse_args(__doc__)
    model = args.model
    docs = [Document(page_content=text, metadata={"source": src}) for src, text in markdown_sections(args.docs)]
    retriever = InMemoryVectorStore.from_documents(docs, HashedEmbeddings()).as_retriever(search_kwargs={"k": args.top_k})

    # history off: earlier answers must not draft later ones; the prompt cache keeps each question's
    # prefill (done once, untimed: compare's warm) for the three timed pipelines
    with SuffixSpec(model=model, draft_model=None, db=False, history=False) as spec:
        llms = {"ours": ChatSuffixSpec(spec=spec, max_tokens=args.max_tokens)}
        prefill = rag_chain(retriever, ChatSuffixSpec(spec=spec, max_tokens=1))
        server = None
        if not args.no_baselines:
            from langchain_openai import ChatOpenAI

            server = serve_in_process(spec, model)
            llms["plain"] = ChatOpenAI(base_url=server.url + "/v1", api_key="-", model=model, temperature=0,
                                       max_tokens=args.max_tokens, timeout=3600, max_retries=0)
            llms["off"] = ChatSuffixSpec(spec=spec, max_tokens=args.max_tokens, speculation=False)
        try:
            compare({name: ask(rag_chain(retriever, llm)) for name, llm in llms.items()},
                    QUESTIONS[: args.questions], spec.tokenizer, args.json, warm=prefill.invoke)
        finally:
            if server is not None:
                server.close()


def rag_chain(retriever, llm):  # noqa: ANN001, ANN201 - LCEL runnables
    """The tutorial's chain, ``prompt_with_references`` in the prompt's place."""
    return {"context": retriever, "question": RunnablePassthrough()} | prompt_with_references(PROMPT) | llm


def ask(chain):  # noqa: ANN001, ANN201 - an LCEL chain; rag_common.compare's pipeline
    def answer(question: str) -> tuple[str, dict | None]:
        message = chain.invoke(question)
        meta = message.response_metadata
        return message.content, (meta if "speculative_decoding" in meta else None)

    return answer


if __name__ == "__main__":
    main()
