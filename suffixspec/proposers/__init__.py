"""Proposers: cheap guessers of the target's next tokens.

Every proposer implements the small interface of :mod:`.base` (re-exported here); one file per
proposer, and :func:`make_proposer` builds them by name. A proposer is a
long-lived object that serves one request at a time and is told when it begins and ends; requests
running at the same time (a batch) each get their own twin (:meth:`Proposer.fork`). The lifecycle of
a request is in :mod:`.base`.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Proposer, RequestContext

__all__ = ["Proposer", "RequestContext", "make_proposer", "proposer_names", "register_proposer"]


def _suffix(**kwargs: object) -> Proposer:
    from .suffix import make_suffix_proposer

    return make_suffix_proposer(**kwargs)  # type: ignore[arg-type]


def _draft_model(**kwargs: object) -> Proposer:
    from .draft_model import make_draft_proposer

    return make_draft_proposer(**kwargs)  # type: ignore[arg-type]


# name -> factory(**settings); the built-in drafters, plus what register_proposer adds
_FACTORIES: dict[str, Callable[..., Proposer]] = {"suffix": _suffix, "draft_model": _draft_model}


def register_proposer(name: str, factory: Callable[..., Proposer]) -> None:
    """Make ``make_proposer(name, **settings)`` build ``factory(**settings)`` (a drafter of your own, or a
    test's double); a name already taken is replaced."""
    _FACTORIES[name] = factory


def proposer_names() -> tuple[str, ...]:
    """The names :func:`make_proposer` knows."""
    return tuple(_FACTORIES)


def make_proposer(name: str, **kwargs: object) -> Proposer:
    """Build a proposer by name; keyword arguments go to that proposer's constructor or factory.

    ``suffix`` -> :func:`suffixspec.proposers.suffix.make_suffix_proposer` (db, tokenizer, settings);
    ``draft_model`` -> :func:`suffixspec.proposers.draft_model.make_draft_proposer` (draft, target, mode);
    others as :func:`register_proposer` registered them.
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown proposer {name!r}; choose one of {', '.join(_FACTORIES)}")
    return factory(**kwargs)
