"""The one seam through which every component talks to the Kubernetes API server.

Why a seam of our own: the decisions (what to publish, what a claim asks for, where to place a pod)
are pure functions over plain JSON-shaped dicts, tested without servers. This module is the only
place that does HTTP; it speaks raw REST paths through the official client's connection handling
(kubeconfig or in-cluster auth, TLS, proxies) and returns dicts exactly as the API serves them
(camelCase). Errors become a small exception hierarchy so callers can react to NotFound/Conflict
without parsing HTTP.

Callers build paths with the helpers below, e.g.
`client.get(path("resource.k8s.io/v1", "resourceclaims", name, namespace=ns))`.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from typing import Any, cast
from urllib.parse import quote, urlencode

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from urllib3.util.retry import Retry

JSON = dict[str, Any]
RESOURCE_API = "resource.k8s.io/v1"
DEFAULT_TIMEOUT_S = 30.0
# urllib3's default (3 retries, read timeouts included) multiplies every timeout by four. Only a
# failed connect is retried here, once (it fails fast); a request that was sent and got no answer
# is not: callers with deadlines (prepare) must be able to trust `timeout_s`, and the slice
# publisher has its own backoff.
AUTH_REFRESH_S = 5.0
NO_READ_RETRIES = Retry(total=1, connect=1, read=0, redirect=0, status=0, other=0)


class KubeError(Exception):
    """An API request failed; `status` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    """404: the object (or its namespace) does not exist."""


class Conflict(KubeError):
    """409 on update: the object changed since it was read (stale resourceVersion)."""


class AlreadyExists(KubeError):
    """409 on create: an object with that name exists."""


class Unreachable(KubeError):
    """No HTTP answer at all (connection refused, TLS failure, timeout)."""


class Gone(KubeError):
    """410: the resourceVersion asked for is too old to watch from; list again."""


class TooDeep(KubeError):
    """The answer is JSON nested deeper than the decoder's recursion limit."""


# Deeper JSON than this is cut from collections and watch events (`decode_json(prune=True)`).
# Built-in objects nest about 20 levels (managedFields included); only a free-form field (a
# claim's opaque config, up to the API's 10 KiB) can go deeper, thousands of levels. The
# standard decoder recurses once per level and stops at the interpreter's recursion limit.
MAX_JSON_DEPTH = 64
# What a cut subtree becomes: a string no valid config holds, so the parsers that read the
# field (VgpuConfig) refuse it with a message that says what happened.
PRUNED = "<vgpu-dra: JSON nested deeper than 64 levels, not read>"
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def decode_json(text: str | bytes, *, prune: bool = False) -> Any:
    """`json.loads`, bounded: JSON deeper than the decoder can take raises TooDeep, or with
    `prune` has every subtree below MAX_JSON_DEPTH replaced by PRUNED.

    Why pruning and not skipping: a list or a watch event holds one hostile object among
    everyone else's; cutting only the deep part keeps the object's identity, status and
    allocation (what the controller's model needs), while the field that was cut fails the one
    claim that carries it. The fast path is the plain decoder; the scan runs only after it
    refused, i.e. only for hostile input. No JSON library bounds depth this way (the C decoders
    raise, orjson included), hence the few lines here.
    """
    try:
        return json.loads(text)
    except RecursionError:
        if not prune:
            raise TooDeep(0, "TooDeep", "the object is nested too deeply to read") from None
    source = text.decode() if isinstance(text, bytes) else text
    return json.loads(_prune_json(source, MAX_JSON_DEPTH))


def _prune_json(text: str, limit: int) -> str:
    """`text` with every array/object opened below depth `limit` replaced by PRUNED."""
    out: list[str] = []
    depth = 0
    kept_until = 0  # text[:kept_until] is decided (copied to `out` or cut)
    cut_from = -1  # where the subtree being cut began, -1 while copying
    for token in _JSON_TOKEN.finditer(text):
        mark = token.group()
        if mark[0] == '"':
            continue
        if mark in "[{":
            depth += 1
            if depth == limit + 1 and cut_from < 0:
                cut_from = token.start()
        else:
            depth -= 1
            if depth == limit and cut_from >= 0:
                out.append(text[kept_until:cut_from])
                out.append(json.dumps(PRUNED))
                kept_until = token.end()
                cut_from = -1
    out.append(text[kept_until:])
    return "".join(out)


def path(
    api_version: str,
    plural: str,
    name: str | None = None,
    *,
    namespace: str | None = None,
    subresource: str | None = None,
) -> str:
    """REST path of a collection or object (`/api/v1/...` for core, `/apis/<group>/<v>/...`)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [prefix]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


class KubeClient:
    """Thin JSON-over-REST client; one instance per process is enough (it pools connections)."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._api = api_client
        self._timeout = timeout_s
        self._auth: dict[str, str] = {}
        self._auth_at = -AUTH_REFRESH_S
        self._auth_lock = threading.Lock()

    def _auth_headers(self) -> dict[str, str]:
        """The Authorization header, re-read from the configuration every AUTH_REFRESH_S.

        The client's auth hook re-applies the whole kubeconfig on every call (for a token user
        that includes re-resolving proxies from the environment, ~0.3 ms of a ~1.5 ms claim GET);
        tokens rotate on a scale of minutes, so asking every few seconds loses nothing.
        """
        now = time.monotonic()
        with self._auth_lock:
            if now - self._auth_at >= AUTH_REFRESH_S:
                headers: dict[str, str] = {}
                self._api.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
                self._auth, self._auth_at = headers, now
            return self._auth

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> KubeClient:
        """Kubeconfig file when given (or $KUBECONFIG), else the in-cluster service account."""
        configuration = k8s.Configuration()
        kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
        if kubeconfig:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)
        configuration.retries = NO_READ_RETRIES
        return cls(k8s.ApiClient(configuration), timeout_s=timeout_s)

    @property
    def api_client(self) -> k8s.ApiClient:
        return self._api

    def credential_strings(self) -> list[str]:
        """The secrets this client authenticates with (bearer token, password), so that the
        log setup can make sure they are never printed (`dra_driver.logsetup.redact`)."""
        conf = self._api.configuration
        found = [str(value) for value in (conf.api_key or {}).values() if value]
        found += [token.split(" ", 1)[-1] for token in found if " " in token]
        if conf.password:
            found.append(str(conf.password))
        return found

    def size_pool(self, connections: int) -> None:
        """Keep up to `connections` connections to the API server for reuse: one per caller
        that may wait for an answer at the same time (urllib3 discards, and warns about, every
        connection returned to a full pool; the next request then opens a new one, TLS
        handshake included). The client's own default is 5 per CPU. Call before the first
        request: pools opened earlier are closed and opened again at their next use."""
        manager = self._api.rest_client.pool_manager
        if int(manager.connection_pool_kw.get("maxsize") or 1) >= connections:
            return
        self._api.configuration.connection_pool_maxsize = connections
        manager.connection_pool_kw["maxsize"] = connections
        manager.clear()

    def close(self) -> None:
        self._api.close()

    def request(
        self,
        method: str,
        resource_path: str,
        *,
        body: Mapping[str, Any] | list[Any] | None = None,
        query: Mapping[str, str | int | bool] | None = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
        prune_deep: bool = False,
    ) -> JSON:
        """Send one request; return the decoded JSON body or raise a KubeError subclass.

        `timeout_s` bounds the whole exchange (connect and answer; default: the client's).
        An answer nested too deeply raises TooDeep, or with `prune_deep` has its deep parts cut
        (`decode_json`).
        """
        if timeout_s is not None and timeout_s <= 0:  # 0 would mean "no timeout" below
            raise Unreachable(0, "Timeout", f"{method} {resource_path}: no time left to ask")
        url = self._api.configuration.host + resource_path
        if query:
            url += "?" + urlencode({k: _query_value(v) for k, v in query.items()})
        headers: dict[str, str] = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        headers.update(self._auth_headers())
        response, raw = self._exchange(
            method, resource_path, url, headers, body=body, timeout_s=timeout_s
        )
        text = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        if not 200 <= response.status < 300:
            raise _error(response.status, response.reason or "", text)
        if not text:
            return {}
        try:
            return cast(JSON, decode_json(text, prune=prune_deep))
        except TooDeep:
            raise TooDeep(
                0, "TooDeep", f"{method} {resource_path}: the object is nested too deeply to read"
            ) from None

    def _exchange(
        self,
        method: str,
        resource_path: str,
        url: str,
        headers: dict[str, str],
        *,
        body: Any,
        timeout_s: float | None,
    ) -> tuple[Any, Any]:
        """One call through the client: (response, raw body). An answer the client raises on
        becomes its KubeError subclass; no answer at all, Unreachable."""
        try:
            response = self._api.call_api(
                method,
                url,
                header_params=headers,
                body=body,
                _request_timeout=self._timeout if timeout_s is None else timeout_s,
            )
            return response, response.read()
        except k8s.ApiException as exc:
            raise _error(exc.status or 0, exc.reason or "", exc.body or "") from exc
        except Exception as exc:  # urllib3 connection errors, TLS, timeouts
            raise Unreachable(0, "Unreachable", f"{method} {resource_path}: {exc}") from exc

    def get(self, resource_path: str, *, timeout_s: float | None = None) -> JSON:
        return self.request("GET", resource_path, timeout_s=timeout_s)

    def get_text(self, resource_path: str, *, timeout_s: float | None = None) -> str:
        """GET a body that is not JSON, e.g. a pod's /metrics through the API server's pod
        proxy (`.../pods/<name>:<port>/proxy/metrics`); KubeError subclasses as `request`."""
        url = self._api.configuration.host + resource_path
        headers = {"Accept": "text/plain, */*", **self._auth_headers()}
        response, raw = self._exchange(
            "GET", resource_path, url, headers, body=None, timeout_s=timeout_s
        )
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")
        if not 200 <= response.status < 300:
            raise _error(response.status, response.reason or "", text[:1024])
        return text

    def list(
        self,
        resource_path: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[JSON]:
        """All items of a collection, following `continue` tokens."""
        items: list[JSON] = []
        for page in self._pages(resource_path, label_selector, field_selector):
            items.extend(page.get("items") or [])
        return items

    def _pages(
        self, resource_path: str, label_selector: str | None, field_selector: str | None
    ) -> Iterator[JSON]:
        query: dict[str, str | int | bool] = {"limit": 500}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            # A collection is everyone's objects: one hostile object must not hide the rest.
            page = self.request("GET", resource_path, query=query, prune_deep=True)
            yield page
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = token

    def list_versioned(
        self, resource_path: str, *, field_selector: str | None = None
    ) -> tuple[builtins.list[JSON], str]:
        """All items of a collection and the collection's resourceVersion (to watch from)."""
        items: builtins.list[JSON] = []
        version = ""
        for page in self._pages(resource_path, None, field_selector):
            items.extend(page.get("items") or [])
            version = str((page.get("metadata") or {}).get("resourceVersion") or version)
        return items, version

    def watch(
        self,
        resource_path: str,
        resource_version: str,
        *,
        timeout_s: int = 300,
        field_selector: str | None = None,
    ) -> Generator[JSON, None, None]:
        """Watch events (`{"type": ADDED|MODIFIED|DELETED|BOOKMARK, "object": {...}}`) from
        `resource_version`, with bookmarks, until the server ends the stream (`timeout_s`).

        Raises Gone when the version is too old (the caller lists again), Unreachable when the
        connection drops, KubeError for any other ERROR event.
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        if field_selector:
            query["fieldSelector"] = field_selector
        url = self._api.configuration.host + resource_path + "?" + urlencode(query)
        headers = {"Accept": "application/json", **self._auth_headers()}
        try:
            # The read timeout outlives the server's own end of the stream by a margin.
            response = self._api.call_api(
                "GET", url, header_params=headers, _request_timeout=(10.0, timeout_s + 30.0)
            )
        except k8s.ApiException as exc:
            raise _error(exc.status or 0, exc.reason or "", exc.body or "") from exc
        except Exception as exc:
            raise Unreachable(0, "Unreachable", f"WATCH {resource_path}: {exc}") from exc
        raw = response.response  # the urllib3 response, not yet read
        try:
            if not 200 <= response.status < 300:
                raise _error(response.status, response.reason or "", raw.data.decode())
            buffer = b""
            try:
                for chunk in raw.stream(65536, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            yield _watch_event(decode_json(line, prune=True))
            except KubeError:
                raise
            except Exception as exc:  # connection reset, read timeout, truncated chunk
                raise Unreachable(0, "Unreachable", f"WATCH {resource_path}: {exc}") from exc
        finally:
            raw.release_conn()

    def create(self, resource_path: str, obj: Mapping[str, Any]) -> JSON:
        return self.request("POST", resource_path, body=obj)

    def replace(self, resource_path: str, obj: Mapping[str, Any]) -> JSON:
        return self.request("PUT", resource_path, body=obj)

    def merge_patch(self, resource_path: str, patch: Mapping[str, Any]) -> JSON:
        return self.request(
            "PATCH", resource_path, body=patch, content_type="application/merge-patch+json"
        )

    def strategic_patch(self, resource_path: str, patch: Mapping[str, Any]) -> JSON:
        """Strategic merge patch (built-in kinds only): lists such as pod conditions merge by
        their key instead of being replaced."""
        return self.request(
            "PATCH",
            resource_path,
            body=patch,
            content_type="application/strategic-merge-patch+json",
        )

    def delete(self, resource_path: str, *, missing_ok: bool = True) -> None:
        try:
            # The answer (the object, or a Status) is not read: its depth must not matter.
            self.request("DELETE", resource_path, prune_deep=True)
        except NotFound:
            if not missing_ok:
                raise


def _query_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _watch_event(event: JSON) -> JSON:
    """Pass data events through; turn an ERROR event (a Status object) into its KubeError."""
    if event.get("type") != "ERROR":
        return event
    status = event.get("object") or {}
    return_code = int(status.get("code") or 0)
    raise _error(return_code, str(status.get("reason") or ""), json.dumps(status))


def _error(status: int, reason: str, body: str) -> KubeError:
    message = body
    try:
        decoded = json.loads(body)
        if isinstance(decoded, dict):
            message = str(decoded.get("message") or body)
            reason = str(decoded.get("reason") or reason)
    except ValueError:
        pass
    if status == 404:
        return NotFound(status, reason, message)
    if status == 410:
        return Gone(status, reason, message)
    if status == 409:
        kind = AlreadyExists if reason == "AlreadyExists" else Conflict
        return kind(status, reason, message)
    return KubeError(status, reason, message)
