"""User-facing errors: one line, naming the field, exit code 2."""


class UserError(Exception):
    """A mistake in what the user gave us (recipe, flag, path).

    The CLI prints ``str(err)`` as a single line and exits with code 2;
    no traceback is shown.
    """

    def __init__(self, field: str | None, message: str):
        self.field = field
        self.message = " ".join(message.split())  # always one line
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message
