"""Model namespacing (``--model-namespacing=true``, Triton's): each repository is a
namespace, so the same model name may be in several (pure functions, no I/O).

A name in one repository only is served under that name, as without namespacing. A name
in several is served once per repository under a *qualified* name, ``<name>@<n>`` (the
n-th ``--model-repository``, from 1): shoal's way to tell them apart. A request that
names such a model without its qualifier is refused with Triton's ambiguity error. An
ensemble's step names a model of its own repository first, else the one model of that
name elsewhere (Triton's resolution); the step is written with the qualified name in
the config every process reads, so the ensemble reaches its own repository's model.
"""

from __future__ import annotations

from typing import Final

from google.protobuf import text_format

SEPARATOR: Final = "@"


def qualified(name: str, index: int) -> str:
    """The name of ``name`` of the repository ``index`` (0-based) when it is in several."""
    return f"{name}{SEPARATOR}{index + 1}"


def plain(served: str) -> str:
    """The model name a served name stands for (itself when it is not qualified)."""
    name, sep, n = served.rpartition(SEPARATOR)
    return name if sep and name and n.isdigit() else served


def ambiguity(name: str, served: list[str]) -> str | None:
    """Triton's error for a request naming ``name`` when only qualified copies of it are
    served (``served``: every served name), else None."""
    count = sum(1 for s in served if s != name and plain(s) == name)
    if count < 2:
        return None
    return (
        f"There are {count} identifiers of model '{name}' in global map, model namespace "
        "must be provided to resolve ambiguity."
    )


def served_names(models: dict[int, set[str]]) -> dict[str, tuple[int, str]]:
    """served name -> (repository index, model name) for the models of each repository."""
    count: dict[str, int] = {}
    for names in models.values():
        for name in names:
            count[name] = count.get(name, 0) + 1
    return {
        (qualified(name, index) if count[name] > 1 else name): (index, name)
        for index, names in models.items()
        for name in names
    }


def rewrite_config(
    text: str | None, served: str, index: int, models: dict[int, set[str]]
) -> str | None:
    """The config the model ``served`` (of the repository ``index``) is read with: its
    name qualified, an ensemble's steps resolved to its own repository's models; None
    when ``text`` (None: the model has no config file) needs no change."""
    from shoal.configs.model_config import parse_config_text
    from shoal.configs.schema import ENSEMBLE_PLATFORM, ConfigError

    name = plain(served)
    if text is None:
        return f'name: "{served}"\n' if served != name else None
    try:
        config = parse_config_text(text, name)
    except ConfigError:
        return None  # (its load reports why)
    changed = served != name
    if changed:
        config.name = served
    if config.platform == ENSEMBLE_PLATFORM:
        duplicated = {n for i, names in models.items() if i != index for n in names}
        own = models.get(index, set())
        for step in config.ensemble_scheduling.step:
            if step.model_name in own and step.model_name in duplicated:
                step.model_name = qualified(step.model_name, index)
                changed = True
    return text_format.MessageToString(config) if changed else None
