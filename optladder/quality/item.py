"""One prompt of a quality set: what is asked, and the answers it is scored against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class PromptItem:
    id: str
    prompt: str  # the text; for a chat prompt, the conversation rendered as "role: content" lines
    references: list[str]
    task: str = ""
    messages: Optional[list[dict[str, str]]] = None  # a chat prompt's turns, through the chat template whole

    def chat(self) -> list[dict[str, str]]:
        """The turns the model sees: a plain prompt is one user turn."""
        return self.messages or [{"role": "user", "content": self.prompt}]
