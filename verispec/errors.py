"""The base of every error a user can cause, so entry points report them in one way.

``UserError``: bad input or a missing resource that the user can fix (an unknown drafter, a
prompt longer than the context, a sampling parameter out of range, a model that will not
load, a bad benchmark or training setting). Its message says what was wrong and how to put
it right; the CLI prints it and the server answers 400 with it, where any other exception
is a bug. Each such error is declared next to the check that raises it and derives from
``UserError`` (besides ``ValueError`` or ``RuntimeError`` as before).

A leaf module: it imports nothing, so the pure core (``accept``, ``sampling``) and the
server can depend on it without depending on anything else.
"""


class UserError(Exception):
    """An error the user caused and can fix; the message is meant for them."""
