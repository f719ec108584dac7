"""Tokenizer helpers: the chat template as token ids, and a synthetic tokenizer for random-weight models
whose vocabulary no real tokenizer covers (speed work only; its text means nothing)."""
from __future__ import annotations


def chat_token_ids(tokenizer, prompt: str | list[dict[str, str]]) -> list[int]:
    """The prompt (one user turn, or a whole conversation of {role, content} turns) through the model's
    chat template, ready for generation."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys"):  # transformers returns a BatchEncoding in some versions
        out = out["input_ids"]
    return list(out)


class SyntheticTokenizer:
    """Bytes for ids 3..258, a placeholder word for every id above. Ids 0/1/2 are pad/bos/eos."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    _offset = 3

    def __init__(self, vocab_size: int):
        if vocab_size < 259:
            raise ValueError(f"a synthetic tokenizer needs vocab_size >= 259, got {vocab_size}")
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [b + self._offset for b in text.encode("utf-8")]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        raw = bytearray()
        for i in ids:
            i = int(i)
            if i < self._offset:
                if not skip_special_tokens:
                    raw += f"<s{i}>".encode()
            elif i < self._offset + 256:
                raw.append(i - self._offset)
            else:
                raw += f" w{i}".encode()
        return raw.decode("utf-8", errors="replace")

    def batch_decode(self, batch, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        text += "assistant:" if add_generation_prompt else ""
        return [self.bos_token_id, *self.encode(text)] if tokenize else text
