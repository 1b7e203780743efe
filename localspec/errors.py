"""Errors a user can meet, each with a message and a hint; the CLI prints them without a traceback."""

from __future__ import annotations


class LocalspecError(Exception):
    """Base of every error localspec reports to a user: what went wrong, and what to do about it."""

    exit_code: int = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message


class UsageError(LocalspecError):
    """A bad option value or combination."""

    exit_code = 2


class ModelFileError(LocalspecError):
    """A model file that is missing, not GGUF, truncated or unreadable."""


class IncompatiblePairError(LocalspecError):
    """Target and draft do not share a vocabulary, so draft token ids mean nothing to the target."""


class ContextOverflowError(LocalspecError):
    """The prompt (plus what must be generated) does not fit the context window."""


class BackendUnavailableError(LocalspecError):
    """A backend that is not installed or cannot run on this machine."""


class UnsupportedModelError(LocalspecError):
    """A model the backend can load but cannot speculate with (e.g. a cache that cannot be rolled back)."""


class CatalogError(LocalspecError):
    """A malformed catalog file or an unknown pair name."""


class NotDownloadedError(CatalogError):
    """A catalog pair not in the local cache, and not to be downloaded now (--no-pull, HF_HUB_OFFLINE,
    no terminal to ask, or the user said no)."""


class PullError(LocalspecError):
    """A download from the Hugging Face Hub that failed."""


class GenerationError(LocalspecError):
    """The backend failed while generating."""


class Interrupted(LocalspecError):
    """The user stopped a load or a forward pass in flight (Ctrl-C, Esc, a client that went away)."""

    exit_code = 130


def error_text(e: BaseException) -> str:
    """One line for a UI: the message and its hint for our errors, the type and text for anything else."""
    if isinstance(e, LocalspecError):
        return f"{e.message}" + (f" (hint: {e.hint})" if e.hint else "")
    return f"{type(e).__name__}: {e}"
