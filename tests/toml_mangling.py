"""Hypothesis strategy: a TOML file as an operator's careless edit might leave it."""

from __future__ import annotations

from hypothesis import strategies as st

_EDITS = ("drop", "blank_value", "swap_type", "uncomment", "dup_table", "negate", "huge")


def _edit(lines: list[str], index: int, edit: str) -> None:
    line = lines[index]
    if edit == "drop":
        lines[index] = ""
    elif edit == "blank_value" and "=" in line:
        lines[index] = line.split("=", 1)[0] + '= ""'
    elif edit == "swap_type" and "=" in line:
        lines[index] = line.split("=", 1)[0] + "= [1, {a = 2}]"
    elif edit == "uncomment":
        lines[index] = line.lstrip("# ")
    elif edit in ("negate", "huge") and "=" in line:
        # A number out of (almost any) key's range: negative, or far too large.
        key, value = line.split("=", 1)
        if value.strip()[:1].isdigit():
            new = f"-{value.strip()}" if edit == "negate" else "1e300"
            lines[index] = f"{key}= {new}"
    elif edit == "dup_table" and line.startswith("["):
        lines.insert(index, line.replace("[[", "[").replace("]]", "]"))


def mangled_toml(text: str) -> st.SearchStrategy[str]:
    """``text`` with up to four lines dropped, emptied, retyped, uncommented, duplicated, or
    with a number made negative or huge."""
    lines = text.splitlines()

    def apply(edits: list[tuple[int, str]]) -> str:
        edited = list(lines)
        for index, edit in edits:
            _edit(edited, min(index, len(edited) - 1), edit)
        return "\n".join(edited)

    edits = st.tuples(st.integers(0, len(lines) - 1), st.sampled_from(_EDITS))
    return st.lists(edits, max_size=4).map(apply)
