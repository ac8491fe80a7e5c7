"""The framework integrations' parts that need no model: the core stays free of the frameworks, and
LangChain's prompt step formats the context and attaches it as references.

The RAG chains and query engines themselves run in test_integrations_langchain.py and
test_integrations_llama_index.py (slow: a model answers); this file keeps the inner loop from importing
LlamaIndex and LangChain into every worker to collect them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_core_never_imports_the_frameworks():
    code = ("import sys, suffixspec, suffixspec.api, suffixspec.integrations, suffixspec.integrations.backend\n"
            "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('llama_index', 'langchain'))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_prompt_with_references_formats_the_context_and_attaches_the_documents():
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate

    from suffixspec.integrations.langchain import prompt_with_references

    prompt = ChatPromptTemplate.from_template("{context}\n\n{question}")  # test_integrations_langchain's PROMPT
    docs = [Document(page_content="a = 1"), Document(page_content="b = 2")]
    value = prompt_with_references(prompt).invoke({"context": docs, "question": "a?"})
    last = value.to_messages()[-1]
    assert last.content == "a = 1\n\nb = 2\n\na?"
    assert last.additional_kwargs["references"] == ["a = 1", "b = 2"]
    as_text = prompt_with_references(prompt).invoke({"context": "given", "question": "q"}).to_messages()[-1]
    assert as_text.content == "given\n\nq" and as_text.additional_kwargs["references"] == ["given"]
