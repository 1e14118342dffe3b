"""The README's field reference, generated from the declarations it documents.

    python -m dse.reference            # print the generated sections
    python -m dse.reference --write    # rewrite them in README.md
    python -m dse.reference --check    # exit 1 if README.md is out of date

Three sections: every simulator option (``sim/options.py``: its ``llmsim run`` flag, whether
a cluster file's instance may set it, its dse knob), every field of a cluster file
(the pydantic models in ``sim/cluster_schema.py``, which the loader enforces) and every field of a
search-space file (the pydantic models in ``dse/schema.py``). Each lies between ``<!-- BEGIN GENERATED: name``
and ``<!-- END GENERATED: name -->`` lines in the README.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def sections() -> dict[str, str]:
    """Section name -> its generated markdown."""
    from dse.schema import markdown_reference as space_reference
    from sim.cluster import markdown_reference as cluster_reference
    from sim.options import markdown_reference as options_reference

    return {"options": options_reference(), "cluster": cluster_reference(),
            "space": space_reference()}


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- BEGIN GENERATED: {name}[^\n]*-->\n)(.*?)(<!-- END GENERATED: "
                      rf"{name} -->)", re.S)


def render(text: str) -> str:
    """``text`` (the README) with every generated section replaced by its current form."""
    for name, body in sections().items():
        pat = _pattern(name)
        if not pat.search(text):
            raise ValueError(f"README has no generated section {name!r}")
        text = pat.sub(lambda m, body=body: m.group(1) + body + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        README.write_text(render(README.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    if argv == ["--check"]:
        text = README.read_text(encoding="utf-8")
        if render(text) != text:
            print(f"{README}: the field reference is out of date; run python -m dse.reference "
                  "--write", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name, body in sections().items():
        print(f"## {name}\n\n{body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
