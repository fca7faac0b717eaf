"""Colab's error base class (google/colab/errors.py)."""


class Error(Exception):
    """Base class for Colab errors."""


class AuthorizationError(Error):
    """Authorization failed."""
