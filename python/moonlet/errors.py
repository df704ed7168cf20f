"""moonlet.errors - the exception every moonlet call raises for a moonlet error code.

Kept in its own module because the C extension (moonlet._moonlet) imports it
when it loads, before moonlet/__init__.py has finished.
"""

__all__ = ["StoreError"]


class StoreError(Exception):
    """A moonlet call failed with a moonlet error code.

    Attributes:
        code:    the negative error code; the numbers are Mooncake Store's
                 (INVALID_PARAMS -600, OBJECT_NOT_FOUND -704, ...).
        name:    the code's name ("OBJECT_NOT_FOUND").
        message: what failed, with the name and the code.
        results: for a batch call that failed on some keys, every key's
                 outcome in input order: what the call gives for a key that
                 worked (1 / 0 for existence, 0 for a put, the bytes read for
                 a get) or that key's negative code; None otherwise.
    """

    def __init__(self, code, message=None, results=None):
        from . import _moonlet  # loaded by then: only the extension raises these

        self.code = int(code)
        self.name = _moonlet.strerror(self.code)
        self.message = message if message is not None else f"{self.name} ({self.code})"
        self.results = results
        super().__init__(self.code, self.message)

    def __str__(self):
        return self.message

    def __repr__(self):
        return f"StoreError({self.code}, {self.message!r})"

    def __reduce__(self):
        return (type(self), (self.code, self.message, self.results))
