"""A user's own prompt set (`quality=jsonl quality.path=FILE`), in any of three shapes, told apart row by row:

- prompt rows: `{"id", "prompt", "references", "task"?}` (the built-in set's own format);
- Alpaca rows: `{"instruction", "input"?, "output", "id"?}`: prompt = instruction, then the input after a
  blank line where there is one; the output is the one reference (a list of strings gives several);
- chat rows: `{"id"?, "prompt": [messages], "references"}`, or `{"id"?, "messages": [...]}` whose last
  message is the assistant's answer (the reference) and the ones before it the conversation. Messages are
  `{"role": system|user|assistant, "content": text}`; the conversation ends with a user turn and goes
  through the model's chat template whole, so multi-turn prompts keep their history.

The file is JSONL (one row a line) or one JSON list of rows. Every row is checked before anything runs:
a bad one names the file and line (JSONL) or entry (JSON list, counted from 1), and its id, unless
`on_bad_row=skip` skips and counts it. Rows without an id are named `<file stem>-<position>`, the position
counted from 1 over the rows (blank lines of a JSONL file not counted), so the id says which row it is.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from optladder.paths import refuse_directory
from optladder.quality.item import PromptItem

ROLES = ("system", "user", "assistant")
ON_BAD_ROW = ("error", "skip")


class BadRow(Exception):
    """One row that cannot be a prompt; becomes a ValueError naming file and line, or is skipped."""


def read_user_set(path: Path, on_bad_row: str = "error") -> tuple[list[PromptItem], int]:
    """(the prompts in file order, rows skipped)."""
    refuse_directory(f"quality.path {str(path)!r}", path)
    if not path.is_file():
        raise FileNotFoundError(f"quality.path: prompt set not found: {path}")
    items: list[PromptItem] = []
    seen: set[str] = set()
    skipped = 0
    for where, pos, raw in read_rows(path):
        default_id = f"{path.stem}-{pos:05d}"
        try:
            item = parse_row(raw, default_id)
            if item.id in seen:
                raise BadRow(f"duplicate id {item.id!r}")
        except BadRow as e:
            if on_bad_row == "skip":
                skipped += 1
                continue
            raise ValueError(f"{path}:{where} (id {row_id(raw, default_id)!r}): {e} "
                             f"(quality.on_bad_row=skip skips such rows)") from None
        seen.add(item.id)
        items.append(item)
    if not items:
        raise ValueError(f"{path}: no usable prompts ({skipped} bad rows skipped)" if skipped
                         else f"{path}: the prompt set is empty")
    return items, skipped


def read_rows(path: Path) -> Iterator[tuple[str, int, Any]]:
    """(where, for messages: 'line N' or 'entry N'; position from 1; the decoded row)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); is it the right file?") from None
    if text.lstrip().startswith("["):  # one JSON document: a list of rows
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
        for i, row in enumerate(rows):
            yield f"entry {i + 1}", i + 1, row  # counted from 1, as the ids of rows without one
        return
    pos = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        pos += 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if _one_json_object(text):
                raise ValueError(f"{path}: one JSON object; a prompt set is a JSON list of rows, or JSONL with "
                                 f"one row a line") from None
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}, column {e.colno}); each line of a "
                             f"JSONL prompt set is one JSON object") from None
        yield str(lineno), pos, row


def _one_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def row_id(row: Any, default_id: str) -> str:
    """The id a row names itself by, else the one it gets from its position: what its error calls it."""
    rid = row.get("id") if isinstance(row, dict) else None
    valid = isinstance(rid, (str, int)) and not isinstance(rid, bool) and str(rid) != ""
    return str(rid) if valid else default_id


def parse_row(row: Any, default_id: str) -> PromptItem:
    if not isinstance(row, dict):
        raise BadRow(f"expected a JSON object, got {type(row).__name__}")
    rid = row.get("id", default_id)
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or str(rid) == "":
        raise BadRow(f"id {rid!r} must be a non-empty string or number")
    task = str(row.get("task") or row.get("dataset") or "")
    if "instruction" in row:
        return _alpaca(row, str(rid), task)
    if "messages" in row:
        return _messages_row(row, str(rid), task)
    if "prompt" in row:
        prompt = row["prompt"]
        refs = _references(row.get("references"), "references")
        if isinstance(prompt, list):
            return _chat_item(str(rid), _messages(prompt), refs, task)
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadRow("prompt must be non-empty text or a list of chat messages")
        return PromptItem(str(rid), prompt, refs, task)
    raise BadRow(f"keys {sorted(row)}: a row needs 'prompt' + 'references', 'instruction' + 'output' "
                 f"(Alpaca), or 'messages' (chat)")


def _alpaca(row: dict, rid: str, task: str) -> PromptItem:
    inst, extra = row.get("instruction"), row.get("input") or ""
    if not isinstance(inst, str) or not inst.strip() or not isinstance(extra, str):
        raise BadRow("instruction must be non-empty text (and input, where given, text)")
    refs = _references(row.get("output"), "output")
    return PromptItem(rid, inst + ("\n\n" + extra if extra.strip() else ""), refs, task)


def _messages_row(row: dict, rid: str, task: str) -> PromptItem:
    msgs = _messages(row["messages"], prompt_only=False)
    if "references" in row:
        return _chat_item(rid, msgs, _references(row["references"], "references"), task)
    if len(msgs) < 2 or msgs[-1]["role"] != "assistant":
        raise BadRow("'messages' without 'references' must end with the assistant's answer (the reference)")
    return _chat_item(rid, msgs[:-1], _references(msgs[-1]["content"], "the last assistant message"), task)


def _chat_item(rid: str, msgs: list[dict[str, str]], refs: list[str], task: str) -> PromptItem:
    if not msgs or msgs[-1]["role"] != "user":
        raise BadRow("a chat prompt must end with a user turn: the answer to it is what gets scored")
    return PromptItem(rid, render(msgs), refs, task, messages=msgs)


def _messages(value: Any, prompt_only: bool = True) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise BadRow("messages must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(value):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if role not in ROLES or not isinstance(content, str):
            raise BadRow(f"message {i} must be {{role: {'|'.join(ROLES)}, content: text}}, got {m!r:.80}")
        out.append({"role": role, "content": content})
    return out


def _references(value: Any, key: str) -> list[str]:
    refs = [value] if isinstance(value, str) else value
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise BadRow(f"{key} must be a non-empty string or list of non-empty strings (a prompt needs a "
                     f"reference to be scored), got {value!r:.80}")
    return refs


def render(msgs: list[dict[str, str]]) -> str:
    """A conversation as readable text, for review pages and quality_outputs.jsonl."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in msgs)
