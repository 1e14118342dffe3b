"""Reading YAML input fast: libyaml's parser where PyYAML has it, and catalogues parsed once.

PyYAML is imported only when a file has to be parsed; a catalogue whose files have not
changed since the last run comes from the cache (``sim.cache``) without importing it.
"""

from __future__ import annotations

from pathlib import Path

from sim.cache import cached
from sim.errors import InputError, read_text_input


def safe_load(text: str):
    """``yaml.safe_load(text)``, parsed by libyaml when available (the same documents,
    several times faster); raises ``yaml.YAMLError`` on malformed input."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


_STRICT: dict = {}


def strict_load(text: str):
    """:func:`safe_load` that refuses a mapping key given twice (YAML keeps the last one
    silently), raising ``yaml.YAMLError`` with the key's line. Merge keys (``<<: *x``)
    may still be overridden, as YAML intends."""
    import yaml

    loader = _STRICT.get("loader")
    if loader is None:
        base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base constructor refuses it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice (lines {first} and {line}); "
                        "give it once", key_node.start_mark)
                seen[key] = line
            return base.construct_mapping(self, node, deep)

        loader = _STRICT["loader"] = type("StrictLoader", (base,), {})
        loader.add_constructor("tag:yaml.org,2002:map", construct_mapping)
    return yaml.load(text, Loader=loader)


def yaml_problem(exc: Exception) -> str:
    """A YAML parse error in one line: where (line, column) and what PyYAML found."""
    mark = getattr(exc, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["?"])[0]
    return at + " ".join(str(problem).split())


def load_yaml_files(kind: str, files: list[Path]) -> list:
    """The documents of ``files`` in order (each parsed as :func:`safe_load`), from the
    cache when none has changed. A malformed file raises InputError naming it."""
    def build() -> list:
        import yaml

        docs = []
        for f in files:
            text = read_text_input(f, f"a {kind} entry", "a YAML")
            try:
                docs.append(strict_load(text))
            except yaml.YAMLError as exc:
                raise InputError(f"malformed YAML ({yaml_problem(exc)})", source=str(f)) \
                    from None
            except (RecursionError, ValueError) as exc:  # ValueError: an int of 4300+ digits
                raise InputError(f"malformed YAML ({exc or 'nested too deeply'})",
                                 source=str(f)) from None
        return docs

    return cached(kind, files, build)
