"""suffixspec.integrations.langchain on real LangChain: an LCEL RAG chain over an on-disk corpus.

``retriever | prompt_with_references(prompt) | ChatSuffixSpec`` answers exactly as with speculation
off (greedy) while the retrieved document drafts the answer; langchain-openai's ChatOpenAI works
unchanged against ``suffixspec serve`` and carries references and predictions in ``extra_body``.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from rag_corpus import (
    CORPUS,
    MAX_TOKENS,
    QUESTION,
    QUOTED,
    REFS_ONLY,
    VARIANTS,
    demo_spec,
    served,
    write_corpus,
)

pytestmark = pytest.mark.slow  # a model answers every chain; the model-free checks are in test_integrations.py
pytest.importorskip("langchain_core")

from langchain_core.callbacks import CallbackManagerForRetrieverRun  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402

from suffixspec.integrations.langchain import ChatSuffixSpec, prompt_with_references  # noqa: E402

PROMPT = ChatPromptTemplate.from_template("{context}\n\n{question}")  # the demo target then quotes the context


class FolderRetriever(BaseRetriever):
    """The files of a folder sharing the most words with the query (a real LangChain retriever)."""

    folder: Path
    k: int = 1

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        words = set(re.findall(r"\w+", query))
        docs = [Document(page_content=p.read_text(), metadata={"source": str(p)}) for p in sorted(self.folder.iterdir())]
        return sorted(docs, key=lambda d: -len(words & set(re.findall(r"\w+", d.page_content))))[: self.k]


def rag_chain(retriever, llm):
    return {"context": retriever, "question": RunnablePassthrough()} | prompt_with_references(PROMPT) | llm


spec = pytest.fixture(scope="module", name="spec")(demo_spec)


@pytest.fixture(scope="module")
def llms(spec):
    return {name: ChatSuffixSpec(spec=spec, max_tokens=MAX_TOKENS, speculation=s) for name, s in VARIANTS.items()}


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    return FolderRetriever(folder=write_corpus(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="module")
def plain_answer(retriever, llms):
    return rag_chain(retriever, llms["off"]).invoke(QUESTION).content


def test_chain_answer_is_plain_decoding_and_drafted_from_the_retrieved_document(retriever, llms, plain_answer):
    assert QUOTED in plain_answer  # the answer quotes the retrieved file
    for name in ("on", "refs"):
        message = rag_chain(retriever, llms[name]).invoke(QUESTION)
        assert message.content == plain_answer, name
    per_source = message.response_metadata["speculative_decoding"]["per_source"]
    assert per_source["references"]["drafted"] > 0, per_source  # the documents reached the model
    assert message.response_metadata["accepted_from_references"] >= MAX_TOKENS // 2
    assert message.usage_metadata["output_tokens"] == MAX_TOKENS
    assert message.response_metadata["finish_reason"] == "length"


def test_stream_and_batch_give_the_same_text(retriever, llms, plain_answer):
    chunks = list(rag_chain(retriever, llms["refs"]).stream(QUESTION))
    assert len(chunks) > 1 and "".join(c.content for c in chunks) == plain_answer
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert whole.response_metadata["accepted_from_references"] > 0  # on the last chunk, merged in
    other = "def fibonacci(n):"
    batch = rag_chain(retriever, llms["refs"]).batch([QUESTION, other])
    assert [m.content for m in batch] == [plain_answer, rag_chain(retriever, llms["off"]).invoke(other).content]
    # per-call references and prediction, outside a chain
    direct = llms["refs"].invoke([("user", QUESTION)], references=[CORPUS["config.py"]], max_tokens=16)
    assert direct.content == llms["off"].invoke([("user", QUESTION)], max_tokens=16).content
    assert direct.response_metadata["accepted_from_references"] > 0
    predicted = llms["refs"].invoke([("user", QUESTION)], prediction=direct.content, max_tokens=16)
    assert predicted.content == direct.content
    assert predicted.response_metadata["speculative_decoding"]["per_source"]["prediction"]["accepted"] > 0


def test_async_invoke_stream_and_batch(retriever, llms, plain_answer):
    chain = rag_chain(retriever, llms["refs"])

    async def run():
        one = await chain.ainvoke(QUESTION)
        chunks = [c async for c in chain.astream(QUESTION)]
        many = await chain.abatch([QUESTION, QUESTION])
        return one, chunks, many

    one, chunks, many = asyncio.run(run())
    assert one.content == "".join(c.content for c in chunks) == plain_answer
    assert [m.content for m in many] == [plain_answer] * 2
    assert one.response_metadata["accepted_from_references"] > 0


def test_against_suffixspec_serve(retriever, llms, plain_answer, tmp_path):
    from langchain_openai import ChatOpenAI

    with served(tmp_path / "serve.db") as url:
        remote = ChatSuffixSpec(base_url=url, max_tokens=MAX_TOKENS, speculation=REFS_ONLY)
        message = rag_chain(retriever, remote).invoke(QUESTION)
        assert message.content == plain_answer and message.response_metadata["accepted_from_references"] > 0
        assert "".join(c.content for c in rag_chain(retriever, remote).stream(QUESTION)) == plain_answer

        # langchain-openai, unchanged: the same chain (the references key is ignored) ...
        openai = ChatOpenAI(base_url=url, api_key="none", model="suffixspec", temperature=0, max_tokens=MAX_TOKENS,
                            timeout=600, max_retries=0)
        assert rag_chain(retriever, openai).invoke(QUESTION).content == plain_answer
        # ... and the extensions through extra_body, per call
        messages = [("user", CORPUS["config.py"] + "\n\n" + QUESTION)]
        expected = llms["off"].invoke(messages).content
        with_refs = openai.invoke(messages, extra_body={"references": [CORPUS["config.py"]],
                                                        "speculation": REFS_ONLY})
        assert with_refs.content == expected
        predicted = openai.invoke(messages, extra_body={"prediction": {"type": "content", "content": expected},
                                                        "speculation": REFS_ONLY})  # the prediction's switch
        assert predicted.content == expected
        details = predicted.response_metadata["token_usage"]["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0
