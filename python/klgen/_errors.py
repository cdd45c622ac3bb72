"""klgen's exceptions."""


class Error(Exception):
    """Base class of klgen's own errors."""


class SpecError(Error, ValueError):
    """A spec that is malformed, invalid, or does not fit.

    str() is the command line's message, 'file:line: field: what is wrong';
    `file`, `line` and `field` are its parts (None where the message has none).
    """

    def __init__(self, message, file=None, line=None, field=None):
        super().__init__(message)
        self.file = file
        self.line = line
        self.field = field


class DeviceError(Error, RuntimeError):
    """No usable GPU or driver, a CUDA failure, or a peer that timed out."""
