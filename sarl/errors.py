"""The error every command reports as one or two lines and exit code 2: a setting or input that cannot work
as given. The message names the file, key or value and what to do."""


class UserError(ValueError):
    """A setting or input that cannot work as given; the message says which and what to do."""
