"""suffixspec.integrations.llama_index on real LlamaIndex: a query engine over an on-disk corpus.

The answers quote the retrieved file (the demo target copies, see tests/rag_corpus.py); with the
retrieved chunks drafted as references they are exactly the answers with speculation off (greedy).
"""

from __future__ import annotations

import asyncio

import pytest
from rag_corpus import MAX_TOKENS, QUESTION, QUOTED, REFS_ONLY, VARIANTS, demo_spec, served, write_corpus

pytestmark = pytest.mark.slow  # a model answers every query; the model-free checks are in test_integrations.py
pytest.importorskip("llama_index.core")

from llama_index.core import SimpleDirectoryReader, SimpleKeywordTableIndex  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.core.prompts import PromptTemplate  # noqa: E402

from suffixspec.integrations.llama_index import SpeculationStats, SuffixSpecLLM  # noqa: E402

spec = pytest.fixture(scope="module", name="spec")(demo_spec)


@pytest.fixture(scope="module")
def llms(spec):
    return {name: SuffixSpecLLM(spec=spec, max_tokens=MAX_TOKENS, speculation=s) for name, s in VARIANTS.items()}


@pytest.fixture(scope="module")
def index(llms, tmp_path_factory):
    docs = SimpleDirectoryReader(str(write_corpus(tmp_path_factory.mktemp("corpus")))).load_data()
    return SimpleKeywordTableIndex.from_documents(docs, llm=llms["off"])


# The question right after the context: the demo target then goes on quoting the retrieved function
# (under LlamaIndex's default template it copies the template's own separators instead).
QA_TEMPLATE = PromptTemplate("{context_str}\n\n{query_str}")


def engine(index, llm, **kw):
    """A keyword-table query engine retrieving the best-matching file (config.py for QUESTION)."""
    return index.as_query_engine(llm=llm, retriever_mode="simple", num_chunks_per_query=1,
                                 text_qa_template=QA_TEMPLATE, **kw)


@pytest.fixture(scope="module")
def plain_answer(index, llms):
    return str(engine(index, llms["off"]).query(QUESTION))


def test_query_engine_answer_is_plain_decoding_and_drafted_from_the_retrieved_chunk(index, llms, plain_answer):
    assert QUOTED in plain_answer  # the answer quotes the retrieved file
    for name in ("on", "refs"):
        with SpeculationStats() as stats:
            answer = str(engine(index, llms[name]).query(QUESTION))
        assert answer == plain_answer, name
        assert len(stats.calls) == 1
    per_source = stats.calls[0]["speculative_decoding"]["per_source"]
    assert per_source["references"]["drafted"] > 0, per_source  # the synthesizer's context reached us
    assert stats.accepted("references") >= MAX_TOKENS // 2  # references only: most of the answer was drafted
    assert stats.calls[0]["accepted_from_references"] == stats.accepted("references")


def test_streaming_query_yields_the_same_text(index, llms, plain_answer):
    with SpeculationStats() as stats:
        response = engine(index, llms["refs"], streaming=True).query(QUESTION)
        tokens = list(response.response_gen)
    assert "".join(tokens) == plain_answer and len(tokens) > 1
    assert stats.accepted("references") > 0


def test_async_query_and_async_streams(index, llms, plain_answer):
    async def run():
        answer = await engine(index, llms["refs"]).aquery(QUESTION)
        chat = await llms["refs"].astream_chat([ChatMessage(role="user", content=QUESTION)], references=[QUOTED])
        chunks = [c async for c in chat]
        done = await llms["off"].achat([ChatMessage(role="user", content=QUESTION)])
        return str(answer), chunks, done

    answer, chunks, done = asyncio.run(run())
    assert answer == plain_answer
    assert chunks[-1].message.content == done.message.content == "".join(c.delta for c in chunks)
    assert "speculative_decoding" in chunks[-1].additional_kwargs


def test_direct_calls_take_references_and_report_statistics(llms):
    from rag_corpus import CORPUS

    prompt = "def write_config(path, config):\n"
    plain = llms["off"].complete(prompt).text
    refs = llms["refs"].complete(prompt, references=[CORPUS["config.py"]])
    assert refs.text == plain
    assert refs.additional_kwargs["accepted_from_references"] > 0
    assert refs.raw["speculative_decoding"]["per_source"]["references"]["accepted"] > 0
    streamed = list(llms["refs"].stream_complete(prompt, references=[CORPUS["config.py"]]))
    assert streamed[-1].text == "".join(r.delta for r in streamed) == plain
    assert streamed[-1].additional_kwargs["usage"]["completion_tokens"] > 0
    msgs = [ChatMessage(role="user", content=CORPUS["config.py"])]
    chat = llms["refs"].chat(msgs, references=[CORPUS["config.py"]])
    assert chat.message.content == "".join(r.delta for r in llms["off"].stream_chat(msgs))


def test_against_suffixspec_serve(index, llms, plain_answer, tmp_path):
    from llama_index.llms.openai_like import OpenAILike

    with served(tmp_path / "serve.db") as url:
        remote = SuffixSpecLLM(base_url=url, max_tokens=MAX_TOKENS, speculation=REFS_ONLY)
        with SpeculationStats() as stats:
            assert str(engine(index, remote).query(QUESTION)) == plain_answer
            streamed = "".join(engine(index, remote, streaming=True).query(QUESTION).response_gen)
        assert streamed == plain_answer
        assert stats.accepted("references") > 0 and stats.calls[0]["speculative_decoding"]["steps"] > 0
        assert remote.metadata.context_window == llms["off"].metadata.context_window  # asked of /v1/models
        # LlamaIndex's generic OpenAI-compatible client works unchanged (no references: the prompt drafts)
        generic = OpenAILike(api_base=url, api_key="none", model="suffixspec", is_chat_model=True,
                             context_window=2048, max_tokens=MAX_TOKENS, temperature=0.0, timeout=600,
                             max_retries=0)
        assert str(engine(index, generic).query(QUESTION)) == plain_answer
