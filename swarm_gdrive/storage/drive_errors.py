"""What the Drive backend makes of Drive's errors: which ones a retry can fix, and a message for each
one it cannot that names the cause and the fix.

Reasons and their meaning follow Google's Drive v3 guide "Resolve errors"
(https://developers.google.com/workspace/drive/api/guides/handle-errors) and "Usage limits"
(https://developers.google.com/workspace/drive/api/guides/limits). Retried: 429, 5xx, 403 with a rate-limit
or backend reason, dropped connections, and a token refresh that failed for a transient reason (a
network error, or a 5xx / 429 / ``server_error`` from the token endpoint, which google-auth marks
``retryable``). Everything else fails at once.
"""

from __future__ import annotations

import json
from typing import Any

from swarm_gdrive.storage.base import FileTooLargeError, StorageError

RATE_REASONS = frozenset({"userRateLimitExceeded", "rateLimitExceeded"})
_RETRY_REASONS = RATE_REASONS | {"backendError", "internalError"}
#: Drive's message for the undocumented 750 GB-a-day upload limit (per rclone's authors); a plain per-user
#: rate limit says "User Rate Limit Exceeded".
_UPLOAD_LIMIT_MESSAGE = "User rate limit exceeded."
_DOCS = "docs/storage.md"


class DriveError(StorageError):
    """A Drive error that retrying cannot fix; the message says what to do."""

    def __init__(self, message: str, status: int | None = None, reasons: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.status, self.reasons = status, reasons


class DriveAuthError(DriveError):
    """No usable credentials; the message says how to get some."""


class DrivePermissionError(DriveError):
    """Drive answered 403 for want of a permission (not a quota or a rate limit)."""


class DriveQuotaError(DriveError):
    """Drive refused for a quota or a limit: storage full, too many items, the project's daily quota."""


def http_status(exc: BaseException) -> int | None:
    resp = getattr(exc, "resp", None)
    return int(resp.status) if resp is not None and getattr(resp, "status", None) else None


def error_details(exc: BaseException) -> tuple[set[str], str]:
    """The reasons of a Drive JSON error and its first message ('' when the body is not one)."""
    try:
        payload = json.loads(exc.content.decode("utf-8"))  # type: ignore[attr-defined]
        error = payload.get("error", {})
        errors = [e for e in error.get("errors", []) if isinstance(e, dict)]
        message = str(errors[0].get("message") if errors else error.get("message") or "")
        return {str(e.get("reason", "")) for e in errors}, message
    except Exception:  # noqa: BLE001 - an unparseable body simply has no reasons
        return set(), ""


def _is_transient_auth_error(exc: BaseException) -> bool | None:
    """True/False for an error of refreshing the credentials, None for any other error."""
    from google.auth.exceptions import RefreshError, TransportError

    if isinstance(exc, TransportError):  # the token endpoint could not be reached
        return True
    if isinstance(exc, RefreshError):
        return bool(getattr(exc, "retryable", False))
    try:  # PyDrive2's credentials are oauth2client's
        from oauth2client.client import HttpAccessTokenRefreshError
    except ImportError:  # pragma: no cover - oauth2client comes with PyDrive2 only
        return None
    if isinstance(exc, HttpAccessTokenRefreshError):
        status = getattr(exc, "status", None)
        return status is not None and (status == 429 or status >= 500)
    return None


def is_transient_drive_error(exc: BaseException) -> bool:
    """Rate limits, 5xx, dropped connections, transient token-refresh failures: worth retrying with backoff."""
    from googleapiclient.errors import HttpError

    if isinstance(exc, HttpError):
        status = http_status(exc)
        if status == 429 or (status is not None and status >= 500):
            return True
        return status == 403 and bool(error_details(exc)[0] & _RETRY_REASONS)
    if isinstance(exc, (FileNotFoundError, FileTooLargeError, DriveError)):
        return False
    auth = _is_transient_auth_error(exc)
    if auth is not None:
        return auth
    import http.client

    import httplib2

    return isinstance(
        exc,
        (ConnectionError, TimeoutError, http.client.HTTPException, httplib2.HttpLib2Error, BrokenPipeError, OSError),
    )


def _is_auth_refusal(exc: BaseException) -> bool:
    from google.auth.exceptions import RefreshError

    if isinstance(exc, RefreshError):
        return True
    try:
        from oauth2client.client import AccessTokenRefreshError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, AccessTokenRefreshError)


def explain(exc: BaseException, location: str, account: str) -> BaseException:
    """The error to raise for ``exc`` (left as it is when transient or not Drive's): a 404 becomes
    FileNotFoundError, the rest a DriveError subclass whose message names the cause and the fix.

    ``location`` names the setting (``GDRIVE_PATH=gdrive://...``), ``account`` who the node signs in as.
    """
    from googleapiclient.errors import HttpError

    if is_transient_drive_error(exc):
        return exc
    if _is_auth_refusal(exc):
        return DriveAuthError(
            f"{location}: the Google credentials were refused when refreshed ({exc}): the grant was revoked or has "
            "expired (invalid_grant: a token older than 7 days while the OAuth consent screen is in Testing, a "
            f"changed password) or the key was deleted: create a new token or key ({_DOCS})"
        )
    if not isinstance(exc, HttpError):
        return exc
    status, (reasons, message) = http_status(exc), error_details(exc)
    found = frozenset(reasons)
    if status == 404:
        return FileNotFoundError(f"Drive answered 404 ({', '.join(sorted(reasons)) or 'notFound'})")
    if status == 401:
        return DriveAuthError(
            f"{location}: Drive refused the credentials (401): refresh or recreate the token", status, found
        )
    quota = quota_message(reasons, message, account)
    if quota is not None:
        return DriveQuotaError(quota, status, found)
    if status == 403:
        return DrivePermissionError(
            f"{location}: Drive refused access (403 {', '.join(sorted(reasons)) or 'forbidden'}): share the folder "
            f"with {account} as Editor (Manager in a shared drive), or check the folder id",
            status,
            found,
        )
    return DriveError(f"Drive rejected the request ({status} {', '.join(sorted(reasons))}): {exc}", status, found)


def quota_message(reasons: set[str], message: str, account: str) -> str | None:
    """A message that tells the causes of a quota refusal apart, or None if ``reasons`` name none."""
    if "storageQuotaExceeded" in reasons and "service account" in message.lower():
        return (
            f"Drive refused to store a file (403 storageQuotaExceeded: {message}): {account} is a service account, "
            "which has no Drive storage of its own: put the folder in a shared drive with the service account as a "
            "member (Manager), or use GDRIVE_TOKEN_FILE (a person's OAuth token)"
        )
    if "storageQuotaExceeded" in reasons:
        return (
            "Drive refused to store a file (403 storageQuotaExceeded): the storage the file counts against is full "
            "(the Drive of the account that creates it; in a shared drive, the organisation's pooled storage): "
            "free space: empty Drive's trash (deleted and replaced files stay there 30 days and still count), "
            f"delete old experiments or checkpoints, or buy storage ({_DOCS}, 'Drive's trash and your quota')"
        )
    if "teamDriveFileLimitExceeded" in reasons:
        return (
            "Drive refused to add a file (teamDriveFileLimitExceeded): the shared drive holds as many items as Drive "
            "allows (400,000, trashed ones included): delete old experiments and empty the shared drive's trash, "
            "turn on ROLLOUT_CLEANUP_ENABLED, or use another shared drive"
        )
    if "numChildrenInNonRootLimitExceeded" in reasons:
        return (
            "Drive refused to add a file (numChildrenInNonRootLimitExceeded): a folder holds as many items as Drive "
            "allows (500,000): delete old rounds (ROLLOUT_CLEANUP_ENABLED) or start a new experiment"
        )
    if reasons & {"dailyLimitExceeded", "quotaExceeded"}:
        reason = "dailyLimitExceeded" if "dailyLimitExceeded" in reasons else "quotaExceeded"
        return (
            f"Drive refused the request (403 {reason}: {message or 'usage limit'}): the Google Cloud project of "
            "these credentials used up a Drive API quota (a limit on requests, not on storage): wait for it to "
            "reset (daily quotas reset every day), or raise it in the Cloud console (APIs & Services, Google "
            "Drive API, Quotas), or use credentials of another project"
        )
    return None


def exhausted_message(exc: BaseException, attempts: int, seconds: float, upload: bool) -> str:
    """Why a transient error outlasted the retries, told apart by cause."""
    from googleapiclient.errors import HttpError

    if _is_transient_auth_error(exc):
        return (
            f"the Google credentials could not be refreshed for {seconds:.0f} s ({attempts} attempts; last: {exc}): "
            "the token endpoint was unreachable or failing (a network problem or an outage at Google, not the "
            "credentials); the node tries again at its next storage call"
        )
    reasons, message = error_details(exc) if isinstance(exc, HttpError) else (set(), "")
    if reasons & RATE_REASONS or http_status(exc) == 429:
        text = (
            f"Drive kept answering {http_status(exc)} {', '.join(sorted(reasons)) or 'Too Many Requests'} for "
            f"{seconds:.0f} s ({attempts} attempts): too many requests for this account (every node signed in as "
            "one account shares one per-user limit: raise HEARTBEAT_INTERVAL and POLL_INTERVAL_MAX, or give nodes "
            "accounts of their own)"
        )
        if upload and message == _UPLOAD_LIMIT_MESSAGE:
            text += (
                "; on uploads Drive answers so as well once the account has uploaded 750 GB in a day: "
                "uploads work again within 24 hours"
            )
        return text
    return f"Drive kept failing after {attempts} attempts ({seconds:.0f} s): {exc}"


def describe_account(credentials: Any) -> str:
    """Who the node signs in as, for messages: a service account's e-mail when the credentials have one."""
    email = getattr(credentials, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        return f"the service account {email}"
    return "this node's Google account"
