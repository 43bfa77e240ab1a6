"""The one exception an import raises: why it stopped or refused, in one line."""
from __future__ import annotations


class ImportFailed(Exception):
    """The import refused to start or could not go on; the message names the file or
    directory and says what to do."""
