"""Why storage could not be used, when that is the machine's or the account's doing and not the store's:
missing or wrong credentials, no permission, an endpoint that cannot be reached.

Object store clients report these as a chain of exceptions (s3fs turns botocore's HTTP 403 into a
bare `PermissionError: Forbidden`; zarr wraps what fsspec raises). `access_problem` walks the chain
and names the cause in one line, so that a healthy store behind a wrong secret is never called
damaged, and a command prints what to fix instead of a traceback. stdlib only; botocore is consulted
only when it is installed.
"""

from __future__ import annotations

import socket

from ..errors import StoreError

CREDENTIALS = ("set the object store's credentials (for s3://: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
               "AWS_PROFILE)")
# S3 error codes (the body of a refused request) that say the key or its secret is wrong
WRONG_KEY = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "InvalidClientTokenId"}


class StoreAccessError(StoreError):
    """The store's storage refused hsk or could not be reached (credentials, permission, endpoint)."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 32:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _botocore():
    try:
        from botocore import exceptions
    except ImportError:
        return None
    return exceptions


def _refused(exc: BaseException) -> str | None:
    """The line for an object store's HTTP refusal (botocore ClientError), None for other errors."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    if code in WRONG_KEY:
        return f"the object store rejected the credentials ({code}): {CREDENTIALS} to a valid key and secret"
    if code in ("AccessDenied", "AllAccessDisabled") or str(status) == "403" or code == "403":
        shown = code if code and not code.isdigit() else "Forbidden"  # a refused HEAD has no body, hence no code
        return (f"the object store refused access (HTTP 403 {shown}): the credentials are wrong or may not use this "
                f"bucket; {CREDENTIALS} to a key that may")
    return None


def _unreachable(exc: BaseException) -> str | None:
    boto = _botocore()
    if boto is not None and isinstance(exc, (boto.EndpointConnectionError, boto.ConnectTimeoutError)):
        return (f"the object store cannot be reached ({exc}): check the endpoint (for s3://: AWS_ENDPOINT_URL) and "
                "the network")
    if isinstance(exc, socket.gaierror):
        return f"the storage host is unknown ({exc.strerror or exc}): check the URL's host name"
    if isinstance(exc, (ConnectionRefusedError, TimeoutError, ConnectionResetError)):
        return f"the storage endpoint cannot be reached ({exc}): check its address and that it is running"
    return None


def access_problem(exc: BaseException) -> str | None:
    """One line naming what keeps hsk from the storage behind `exc` (credentials, permission, endpoint),
    or None when the error is of another kind (a damaged store, a bug)."""
    boto = _botocore()
    for cause in _chain(exc):
        if boto is not None and isinstance(cause, (boto.NoCredentialsError, boto.PartialCredentialsError)):
            return f"the object store needs credentials ({cause}): {CREDENTIALS}, or use a local path"
        found = _refused(cause) or _unreachable(cause)
        if found:
            return found
    local = next((c for c in _chain(exc) if isinstance(c, PermissionError) and c.filename), None)
    if local is not None:  # a local file or folder this user may not read or write
        return f"permission denied: {local.filename}: check its owner and mode, or choose another path"
    return None


def raise_if_access(exc: BaseException, url: str) -> None:
    """Raise StoreAccessError (one line, naming url) when `exc` is an access problem; else return."""
    problem = access_problem(exc)
    if problem:
        raise StoreAccessError(f"{url}: {problem}") from None
