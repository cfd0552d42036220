"""Values under secret names (engine.secret_names, serve's rule) wherever text assigns them: `NAME=value`, `export
NAME='a b'`, `NAME = rest of the line`, `NAME: value`, `"NAME": "value"`, a YAML key whose value runs over the lines
indented below it (folded `>`, literal `|`, a double-quoted value continued, a list, a mapping, `!!binary`), and
command-line flags: `--api-key VALUE`, `--hf-token=VALUE`, `"--api-key", "VALUE"` in a JSON or Python list.

Linear in the text: a name is looked for only where one can begin (not inside a word), a value's end is found by
scans that never look back, and the next search starts after the value; a quote or bracket that never closes takes
the rest of the text rather than being looked for again."""

from __future__ import annotations

import re

from ..secret_names import is_secret_name
from .marks import SCRUBBED, Tally

# A name where one can begin, optionally quoted (JSON, Python's repr), then `:` or `=` (not `==`).
NAME_AT = re.compile(r"""(?<![\w.-])(?P<q>["']?)(?P<name>[A-Za-z_][\w.-]{0,127}+)(?P=q)"""
                     r"""(?P<before>[ \t]*+)(?P<sep>[:=])(?!=)(?P<after>[ \t]*+)""")
# A flag and what separates it from its value: `--api-key=`, `--api-key `, `"--api-key", ` (a list's next item).
FLAG_AT = re.compile(r"""(?<![\w-])--(?P<name>[A-Za-z0-9][\w-]{0,63}+)"""
                     r"""(?:(?P<eq>=)|(?P<item>["'][ \t]*+,\s{0,64}+)(?=["'])|[ \t]++(?=[^\s-]|-[^-]))""")
DOUBLE_QUOTED = re.compile(r'"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+"?')  # escapes kept; unclosed: to the end
SINGLE_QUOTED = re.compile(r"'[^']*+'?")  # YAML's 'it''s' and the shell's 'it'\''s' are pieces side by side
SHELL_WORD = re.compile(r"""(?:[^\s"'\\]++|"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+"?|'[^']*+'?|\\[\s\S]?)++""")
JSON_BARE = re.compile(r"[^\s,}\]]*+")
INSIDE_QUOTES = {'"': re.compile(r'[^"\\\n]*+(?:\\.[^"\\\n]*+)*+'), "'": re.compile(r"[^'\n]*+")}  # to the closing quote
WORD_INSIDE_QUOTES = {'"': re.compile(r'[^"\s]*+'), "'": re.compile(r"[^'\s]*+")}
TO_LINE_END = re.compile(r"[^\n]*+")
TAGS_AND_ANCHORS = re.compile(r"(?:[!&][^\s]*+[ \t]++)*+")  # YAML's `!!binary `, `&anchor ` before the value
BRACKETS_OR_QUOTES = re.compile(r"""[\[\]{}"']""")
# The schemes of an Authorization header, kept so the reader knows which one was sent.
SCHEME = re.compile(r"(?i)(basic|bearer|token|digest|negotiate|ntlm)[ \t]++(?=\S)")
SCHEME_KINDS = {"bearer": "a bearer token", "basic": "a Basic authorization", "token": "an authorization token"}
NOT_A_SECRET = frozenset({"", "null", "~", "true", "false", "none", "yes", "no"})
INDENT_CHARS = " \t-"  # what may stand before a YAML key on its line: indentation and list dashes


def _end(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where `pattern`, matched at `pos`, ends (`pos` where it does not match)."""
    found = pattern.match(text, pos)
    return found.end() if found is not None else pos


def _flow_end(text: str, start: int) -> int:
    """The end of the flow collection (`[...]`, `{...}`) opening at `start`, nested and quoted as YAML and JSON
    write them; the end of the text where it never closes."""
    depth = 0
    pos = start
    while (found := BRACKETS_OR_QUOTES.search(text, pos)) is not None:
        char = found[0]
        if char in "\"'":
            pos = _end(DOUBLE_QUOTED if char == '"' else SINGLE_QUOTED, text, found.start())
            continue
        depth += 1 if char in "[{" else -1
        pos = found.end()
        if depth <= 0:
            return pos
    return len(text)


def _key_column(text: str, start: int) -> int | None:
    """The column of a key that begins its line (after indentation and list dashes), else None. Looks back at most
    a line's indentation, so long lines full of names cost nothing more."""
    pos = start
    while pos > 0 and text[pos - 1] in INDENT_CHARS and start - pos < 256:
        pos -= 1
    if pos > 0 and text[pos - 1] != "\n":
        return None
    return start - pos


def _indented_below(text: str, pos: int, column: int) -> int:
    """From the end of a key's line: the end of the lines after it that are blank or indented deeper than the key
    (the rest of its YAML value), or `pos` where there are none."""
    end = pos
    while pos < len(text) and text[pos] == "\n":
        newline = text.find("\n", pos + 1)
        newline = len(text) if newline < 0 else newline
        line = text[pos + 1:newline]
        body = line.lstrip(" \t")
        if body and len(line) - len(body) <= column:
            break
        if body:
            end = newline
        pos = newline
    return end


def _enclosing_quote(text: str, match: re.Match[str]) -> str:
    """The quote an unquoted name stands right after (`"HF_TOKEN=x"`, `'Authorization: ...'`): its value ends at
    that quote's twin. "" where there is none."""
    before = text[match.start() - 1:match.start()]
    return before if before in ("'", '"') and not match.groupdict().get("q") else ""


def _value_end(text: str, match: re.Match[str]) -> int:
    """Where the value after an assignment's separator ends."""
    start = match.end()
    colon = match["sep"] == ":"
    if colon:
        start = _end(TAGS_AND_ANCHORS, text, start)
    first = text[start:start + 1]
    enclosing = _enclosing_quote(text, match)
    if enclosing:  # inside a string ("HF_TOKEN=x" in a JSON list, -H 'Authorization: ...')
        end = _end(INSIDE_QUOTES[enclosing], text, start)
    elif not colon:  # the shell's NAME=value is one word, quoted pieces and escapes included; INI's runs on
        spaced = bool(match["before"] or match["after"]) and first not in ("'", '"')
        end = _end(TO_LINE_END if spaced else SHELL_WORD, text, start)
    elif first == '"':
        end = _end(DOUBLE_QUOTED, text, start)
    elif first == "'":
        end = _adjacent_single_quotes(text, start)
    elif first in ("[", "{"):
        end = _flow_end(text, start)
    elif match["q"]:  # a JSON or Python key: its bare value is a number or a literal, up to , } or ]
        end = _end(JSON_BARE, text, start)
    else:  # YAML's plain scalar, a log's `name: value`
        end = _end(TO_LINE_END, text, start)
    if colon and not enclosing and (column := _key_column(text, match.start())) is not None:
        line_end = text.find("\n", end)
        if line_end >= 0:
            end = max(end, _indented_below(text, line_end, column))
    return end


def _adjacent_single_quotes(text: str, start: int) -> int:
    end = start
    while text.startswith("'", end):
        end = _end(SINGLE_QUOTED, text, end)
    return end


def _replacement(value: str, name: str, as_string: bool, tally: Tally) -> str:
    """What stands for `value`; counted unless it was scrubbed already (an earlier pass's mark inside it).
    `as_string`: a YAML or JSON value, replaced by a quoted string so that the file still parses, and alike
    (a bare `[scrubbed]` would be a list)."""
    body = value.strip()
    quote = body[0] if body[:1] in ("'", '"') else ""
    inner = body.strip("'\"").strip()
    scheme = SCHEME.match(inner)
    if SCRUBBED in body:
        kind = ""
    elif scheme is not None:
        kind = SCHEME_KINDS.get(scheme[1].lower(), f"the value of {name}")
    else:
        kind = f"the value of {name}"
    if kind:
        tally[kind] += 1
    shown = f"{scheme[1]} {SCRUBBED}" if scheme is not None else SCRUBBED
    if quote or (as_string and scheme is None):
        quote = quote or '"'
        return f"{quote}{shown}{quote}"
    return shown


def _scrub_matches(text: str, pattern: re.Pattern[str], tally: Tally, flags: bool) -> str:
    out: list[str] = []
    pos = done = 0
    while (match := pattern.search(text, pos)) is not None:
        name = match["name"]
        pos = match.end()
        if not is_secret_name(name):
            continue
        end = _value_end(text, match) if not flags else _flag_value_end(text, match)
        value = text[pos:end]
        if value.strip().strip("'\"").strip().lower() in NOT_A_SECRET or value.strip().strip("'\"") == SCRUBBED:
            continue  # no value (null, an empty string), or one an earlier pass scrubbed and counted
        yaml_or_json = not flags and match["sep"] == ":" and not _enclosing_quote(text, match)
        shown = _replacement(value, f"--{name}" if flags else name, yaml_or_json, tally)
        if value[:1] in ("\n", "\r") and not text[pos - 1:pos].isspace():
            shown = " " + shown  # the value stood on the lines below its key (`key:` then `- item`)
        out += [text[done:pos], shown]
        pos = done = end
    out.append(text[done:])
    return "".join(out)


def _flag_value_end(text: str, match: re.Match[str]) -> int:
    start = match.end()
    first = text[start:start + 1]
    enclosing = _enclosing_quote(text, match)
    if match["item"]:  # the next item of a list: one quoted string
        return _end(DOUBLE_QUOTED if first == '"' else SINGLE_QUOTED, text, start)
    if enclosing:  # inside a string: "--api-key=VALUE" is one argument, "... --api-key VALUE ..." a line
        inside = INSIDE_QUOTES[enclosing] if match["eq"] else WORD_INSIDE_QUOTES[enclosing]
        return _end(inside, text, start)
    return _end(SHELL_WORD, text, start)


def assignments(text: str, tally: Tally) -> str:
    return _scrub_matches(text, NAME_AT, tally, flags=False)


def flag_values(text: str, tally: Tally) -> str:
    return _scrub_matches(text, FLAG_AT, tally, flags=True)
