"""Trace loaders: production request logs as `TraceRow`s, sorted by time, timestamps in seconds from 0.

Formats (`load_trace(kind, ...)`):

- `azure`: the Azure LLM inference trace CSV (AzurePublicDataset, `AzureLLMInferenceTrace_{conv,code}.csv`).
  Header `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP like `2023-11-16 18:15:46.6805900`
  (UTC, up to 9 fractional digits; parsed as integer nanoseconds, so no precision is lost).
- `mooncake`: the Mooncake trace JSONL, one object a line: `timestamp` (ms), `input_length`,
  `output_length`, `hash_ids` (one id per 512-token block of the prompt; rows whose lists share a
  leading run share that prompt prefix).
- `jsonl`: a generic request log, one object a line: `timestamp` (seconds, optional: when no row has
  one, the trace has no timing), `prompt` (text) or `input_tokens` (count), and `output_tokens`
  (count) or `output` (text). Text without a count is measured with the tokenizer passed in.
- `sharegpt`: ShareGPT-style JSON, a list of `{"id", "conversations": [{"from": "human", "value"}, ...]}`.
  The first human turn is the prompt; the turn after it (from gpt/assistant), where there is one, the
  output. No timing; `output_len` is 0 when the entry has no reply.

Bad input: a malformed row (or one with a negative token count) stops the load naming file and line
(lines counted from 1; a ShareGPT entry as `entry N`, also from 1, with its own `id` where it has one),
unless `on_bad_row="skip"`, which skips and counts it. Rows out of time order are sorted and counted
(`reordered`: rows earlier than some row before them in the file); the caller warns.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from optladder.traffic.data_root import resolve_data_path

KINDS = ("azure", "mooncake", "jsonl", "sharegpt")
ON_BAD_ROW = ("error", "skip")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass
class TraceRow:
    timestamp_s: float
    input_len: int
    output_len: int
    hash_ids: list[int] | None = None
    prompt_text: str | None = None
    output_text: str | None = None


@dataclass
class LoadedTrace:
    rows: list[TraceRow]
    skipped: int
    reordered: int
    path: str
    has_timing: bool = True
    warnings: list[str] = field(default_factory=list)


class _BadRow(Exception):
    """One row that cannot be read; turned into a ValueError naming file and line, or skipped."""


def load_trace(kind: str, path: str, on_bad_row: str = "error", *, data_root: str | None = None,
               tokenizer: Any = None) -> LoadedTrace:
    """Read a trace of one of KINDS. `tokenizer` (HF-style `encode`) measures rows given as text."""
    if kind not in KINDS:
        raise ValueError(f"trace kind {kind!r} is not one of {', '.join(KINDS)}")
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row={on_bad_row!r}: valid values are {', '.join(ON_BAD_ROW)}")
    full = resolve_data_path(path, data_root)
    parsed: list[tuple[int | None, TraceRow]] = []
    skipped = 0
    read, build = _FORMATS[kind]
    try:
        for where, raw in read(full):
            try:
                ts_ns, row = build(raw, tokenizer)
                if row.input_len < 0 or row.output_len < 0:
                    raise _BadRow(f"negative token count (input {row.input_len}, output {row.output_len})")
            except _BadRow as e:
                if on_bad_row == "skip":
                    skipped += 1
                    continue
                raise ValueError(f"{full}:{where}: {e} (workload.on_bad_row=skip skips such rows)") from None
            parsed.append((ts_ns, row))
    except UnicodeDecodeError as e:
        raise ValueError(f"{full}: not UTF-8 text ({e.reason} at byte {e.start}); is it the right file?") from None
    if len(parsed) < 2:
        note = f" ({skipped} bad rows skipped)" if skipped else ""
        raise ValueError(f"{full}: the trace has {len(parsed) or 'no'} usable row{'s' * (len(parsed) != 1)}"
                         f"{note}; a workload needs at least 2")
    warnings = [f"{full}: the last line has no line ending, so the file may have been cut short and its last "
                f"row may be incomplete; check it"] if kind == "azure" and _cut_short(full) else []
    untimed = sum(ts is None for ts, _ in parsed)
    if untimed == len(parsed):
        return LoadedTrace([r for _, r in parsed], skipped, 0, str(full), has_timing=False, warnings=warnings)
    if untimed:
        raise ValueError(f"{full}: {untimed} of {len(parsed)} rows have no timestamp; "
                         f"give every row one, or none (then the trace has no timing)")
    rows, reordered = _sort_by_time(parsed)
    return LoadedTrace(rows, skipped, reordered, str(full), warnings=warnings)


def _cut_short(path: Path) -> bool:
    """Last byte not a newline: a truncated CSV still parses, its last number possibly wrong."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) not in (b"\n", b"\r")


def _sort_by_time(parsed: list[tuple[int, TraceRow]]) -> tuple[list[TraceRow], int]:
    """Stable sort on integer ns, then seconds from the earliest row: exact until the one float cast."""
    ts = [t for t, _ in parsed]
    reordered = sum(t < latest for t, latest in zip(ts[1:], itertools.accumulate(ts, max)))
    parsed = sorted(parsed, key=lambda p: p[0])
    for t, row in parsed:
        row.timestamp_s = (t - parsed[0][0]) / 1e9
    return [row for _, row in parsed], reordered


# --- readers: yield (line or entry number, raw row) ---
def _read_csv(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        if header and tuple(header[:3]) != AZURE_COLUMNS:  # no header at all: an empty trace
            raise ValueError(f"{path}:1: header {header} is not the Azure trace's {list(AZURE_COLUMNS)}")
        for fields in reader:
            if fields:
                yield reader.line_num, fields


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                yield line_no, line


def _read_sharegpt(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    for i, entry in enumerate(data, 1):  # counted from 1, as lines are; the entry's own id beside it
        own = entry.get("id") if isinstance(entry, dict) else None
        yield f"entry {i}" + (f" (id {own!r})" if own is not None else ""), entry


# --- builders: raw row -> (timestamp in ns or None, TraceRow) ---
def _azure_row(fields: list[str], _tok: Any) -> tuple[int, TraceRow]:
    """TIMESTAMP becomes integer ns: datetime alone would drop the 7th fractional digit."""
    if len(fields) < 3:
        raise _BadRow(f"expected 3 fields {list(AZURE_COLUMNS)}, got {len(fields)}: {fields}")
    whole, _, frac = fields[0].strip().partition(".")
    try:
        if frac and not frac.isdigit():
            raise ValueError(frac)
        secs = int(datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp())
    except ValueError:
        raise _BadRow(f"bad TIMESTAMP {fields[0]!r} (want YYYY-MM-DD HH:MM:SS.fffffff)") from None
    n_in, n_out = _int(fields[1], "ContextTokens"), _int(fields[2], "GeneratedTokens")
    return secs * 10**9 + int((frac + "000000000")[:9]), TraceRow(0.0, n_in, n_out)


def _mooncake_row(line: str, _tok: Any) -> tuple[int, TraceRow]:
    d = _json_obj(line)
    hashes = d.get("hash_ids")
    if hashes is not None and not (isinstance(hashes, list) and all(isinstance(h, int) for h in hashes)):
        raise _BadRow(f"hash_ids must be a list of integers, got {hashes!r}")
    ts_ms = _number(d.get("timestamp"), "timestamp")
    return round(ts_ms * 1e6), TraceRow(0.0, _int(d.get("input_length"), "input_length"),
                                        _int(d.get("output_length"), "output_length"), hash_ids=hashes)


def _jsonl_row(line: str, tok: Any) -> tuple[int | None, TraceRow]:
    d = _json_obj(line)
    n_in, prompt = _length(d, "input_tokens", "prompt", tok)
    n_out, output = _length(d, "output_tokens", "output", tok)
    ts = None if d.get("timestamp") is None else round(_number(d["timestamp"], "timestamp") * 1e9)
    return ts, TraceRow(0.0, n_in, n_out, prompt_text=prompt, output_text=output)


def _length(d: dict, count_key: str, text_key: str, tok: Any) -> tuple[int, str | None]:
    """(token count, text). A recorded count wins over the text: the log's own tokenizer made it."""
    text = d.get(text_key)
    if text is not None and not isinstance(text, str):
        raise _BadRow(f"{text_key} must be text, got {type(text).__name__}")
    if count_key in d:
        return _int(d[count_key], count_key), text
    if text is not None:
        return _count_tokens(text, tok, text_key), text
    raise _BadRow(f"needs '{count_key}' (a count) or '{text_key}' (text)")


def _sharegpt_row(entry: Any, tok: Any) -> tuple[None, TraceRow]:
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        raise _BadRow("expected an object with a 'conversations' list")
    turns = [t if isinstance(t, dict) else {} for t in turns] + [{}]
    for t, nxt in zip(turns, turns[1:]):  # the first human turn, and the reply after it if any
        if t.get("from") in ("human", "user") and isinstance(t.get("value"), str):
            reply = nxt.get("value") if nxt.get("from") in ("gpt", "assistant", "chatgpt") else None
            reply = reply if isinstance(reply, str) else None
            n_out = 0 if reply is None else _count_tokens(reply, tok, "output")
            return None, TraceRow(0.0, _count_tokens(t["value"], tok, "prompt"), n_out,
                                  prompt_text=t["value"], output_text=reply)
    raise _BadRow("no human turn in the conversation")


def _count_tokens(text: str, tokenizer: Any, what: str) -> int:
    if tokenizer is None:
        raise ValueError(f"a row gives '{what}' as text without a token count: pass tokenizer= to count")
    return len(tokenizer.encode(text, add_special_tokens=False))


# --- field parsing ---
def _json_obj(line: str) -> dict:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise _BadRow(f"not valid JSON ({e.msg})") from None
    if not isinstance(d, dict):
        raise _BadRow(f"expected a JSON object, got {type(d).__name__}")
    return d


def _int(value: Any, name: str) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
        return int(value)  # 52.0 from a JSON writer is still a count
    raise _BadRow(f"{name} {value!r} is not an integer" if value is not None else f"missing {name}")


def _number(value: Any, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise _BadRow(f"{name} {value!r} is not a number" if value is not None else f"missing {name}")


_FORMATS: dict[str, tuple[Callable[[Path], Iterator], Callable[[Any, Any], tuple[int | None, TraceRow]]]] = {
    "azure": (_read_csv, _azure_row), "mooncake": (_read_jsonl, _mooncake_row),
    "jsonl": (_read_jsonl, _jsonl_row), "sharegpt": (_read_sharegpt, _sharegpt_row)}
