"""User errors: a mistake in the config or the data, told to the user in one line, without a traceback.

Everything that can be checked before an engine starts is checked inside `as_user_error()`: the config's
dataclasses, every data file a run reads, the engine's refusals of settings it cannot run. A ValueError or
an OSError raised there is the user's to fix, and its message already names the bad value and the fix.
Anything raised later, or of another type, is a bug and keeps its traceback. run.py prints a UserError as
`optladder: error: <message>` and exits with USER_ERROR_EXIT (3: 0, 1 and 2 are an A/B's pass, fail and
inconclusive); `--verbose` or HYDRA_FULL_ERROR=1 show the traceback instead.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from hydra.errors import CompactHydraException

USER_ERROR_EXIT = 3
PREFIX = "optladder: error: "


class UserError(Exception):
    """A bad config or bad data: the message is for the user and names what to change."""


@contextmanager
def as_user_error() -> Iterator[None]:
    try:
        yield
    except UserError:
        raise
    except (ValueError, OSError, CompactHydraException) as e:  # Hydra's compact ones: a config that won't compose
        raise UserError(one_line(e)) from e


# the parts of Hydra's and OmegaConf's messages that are about their own machinery, not the user's mistake
_NOISE = ("full_key:", "reference_type=", "object_type=", "Config search path:", "provider=")


def one_line(e: BaseException) -> str:
    """The message on one line; a Hydra composition error gets the OmegaConf cause that explains it."""
    text = str(e).strip() or type(e).__name__
    cause = e.__cause__
    if cause is not None and type(e).__module__.startswith("hydra") and str(cause).strip():
        text = f"{text}: {str(cause).strip()}"
    lines = [part.strip() for part in text.splitlines() if part.strip()]
    return " ".join(line for line in lines if not line.startswith(_NOISE))
