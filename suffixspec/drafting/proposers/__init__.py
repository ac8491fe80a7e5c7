"""Proposers: cheap guessers of the target's next tokens.

Every proposer implements the small interface of :mod:`.base` (re-exported here); one file per
drafter, each declaring itself (``DRAFTER = Drafter(...)``, :mod:`suffixspec.drafting.registry`), and
:func:`make_proposer` builds them by name. A proposer is a long-lived object that serves one request at
a time and is told when it begins and ends; requests running at the same time (a batch) each get their
own twin (:meth:`Proposer.fork`). The lifecycle of a request is in :mod:`.base`.
"""

from __future__ import annotations

from collections.abc import Callable

from suffixspec.drafting.proposers.base import Proposer, RequestContext
from suffixspec.drafting.registry import Drafter, drafter_names, make, register

__all__ = ["Proposer", "RequestContext", "make_proposer", "proposer_names", "register_proposer"]


def register_proposer(name: str, factory: Callable[..., Proposer]) -> None:
    """Make ``make_proposer(name, **settings)`` build ``factory(**settings)`` (a test's double, or a drafter
    built by name only); a name already taken is replaced. A drafter that the API and the runtimes should
    build declares itself instead (:class:`~suffixspec.drafting.registry.Drafter`)."""
    register(Drafter(name, (), build=factory, offered=False))


def proposer_names() -> tuple[str, ...]:
    """The names :func:`make_proposer` knows."""
    return drafter_names()


def make_proposer(name: str, **kwargs: object) -> Proposer:
    """Build a proposer by name; keyword arguments go to that drafter's factory (its ``DRAFTER.build``).

    ``suffix`` -> :func:`suffixspec.drafting.proposers.suffix.make_suffix_proposer` (db, tokenizer, settings);
    ``draft_model`` -> :func:`suffixspec.drafting.proposers.draft_model.make_draft_proposer` (draft, target, mode);
    others as their declarations say. An unknown name raises ``ValueError``.
    """
    return make(name, **kwargs)
