"""The one base class of the errors that mean bad input.

The command line catches :class:`UserError` and prints its message without a traceback (exit
2). Every exception that a user can cause (a wrong param, a missing file of an earlier stage, a
stale surrogate, an untrusted file) subclasses it, so that its message names the field or file
and the fix. Errors that mean a bug stay plain exceptions and keep their traceback.
"""


class UserError(Exception):
    """Bad input: the message says what is wrong and how to fix it."""


class MeasurementError(UserError, ValueError):
    """Bad measurement request or inconsistent tables; the message says which."""
