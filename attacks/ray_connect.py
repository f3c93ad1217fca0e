"""Reaching Ray: a private local Ray on loopback, or a cluster checked before Ray is asked to join it.

``ray.init()`` on its own attaches to whatever an earlier Ray left behind (``RAY_ADDRESS``, or the address file
``<Ray's temp dir>/ray_current_cluster``, Ray's temp dir being ``$RAY_TMPDIR/ray``, ``$TMPDIR/ray`` or
``/tmp/ray``), retries an address where nothing answers for many minutes, and starts servers that listen on every
interface. Here instead:

- :func:`start_local` starts a private Ray in this process (``address="local"``: no address file or running
  cluster is ever looked at) in a temporary directory of its own (removed when it stops), without dashboard,
  whose servers listen on ``127.0.0.1`` only unless another ``bind_host`` is asked for;
- :func:`connect` joins a cluster only at the address the user named, after checking that something listens
  there and answers in gRPC (HTTP/2), the protocol of Ray's GCS and of the Ray Client server; it turns on token
  authentication when a token is available (as Ray does for ``auto``), and any failure is one line naming the
  address and the cause (nothing listening, a web server, the auth token, another Ray version, ...).

:func:`redact_address` is what results record: the address without credentials.

>>> redact_address("ray://alice:s3cret@head.example:10001/?token=abc")
'ray://head.example:10001'
>>> redact_address("10.0.0.5:6379"), describe_local("127.0.0.1")
('10.0.0.5:6379', 'local (127.0.0.1)')
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from urllib.parse import urlsplit

from foundation.errors import UserError

__all__ = ["LOOPBACK", "PROBE_TIMEOUT_S", "check_bind_host", "connect", "describe_local", "probe",
           "redact_address", "start_local"]

LOOPBACK = "127.0.0.1"
PROBE_TIMEOUT_S = 5.0
GCS_ATTEMPTS = 5  # Ray's tries (about 1 s each) to reach a GCS that listens and speaks gRPC; Ray's own: 20
#: the HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its own SETTINGS frame
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04
_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray takes 127.0.0.1 as this node's address
_TOKEN_HELP = ("copy the cluster's token (ray get-auth-token on its head node) to ~/.ray/auth_token, or set "
               "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH to a file holding it), and set RAY_AUTH_MODE=token")


def redact_address(address: str) -> str:
    """``address`` without user, password, path or query (what may be written into results and logs)."""
    if "://" not in address:
        return address.rsplit("@", 1)[-1]
    parts = urlsplit(address)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def describe_local(bind_host: str) -> str:
    """How a local Ray is recorded: ``local (<the address its servers listen on>)``."""
    return f"local ({bind_host})"


def check_bind_host(bind_host: str) -> str:
    """``bind_host`` if it is an IP address a local Ray can use for its servers (any loopback address:
    ``127.0.0.1``), else a ValueError.

    >>> check_bind_host("0.0.0.0")
    Traceback (most recent call last):
    ...
    ValueError: ray_bind_host must be 127.0.0.1 or an IP address of this machine that other nodes reach (e.g. 10.0.0.5); got '0.0.0.0' (Ray advertises it to the other nodes)
    """
    try:
        ip = ipaddress.ip_address(bind_host)
    except (TypeError, ValueError):
        ip = None
    if ip is None or ip.is_unspecified or ip.is_multicast:
        raise ValueError(f"ray_bind_host must be 127.0.0.1 or an IP address of this machine that other nodes "
                         f"reach (e.g. 10.0.0.5); got {bind_host!r} (Ray advertises it to the other nodes)")
    return LOOPBACK if ip.is_loopback else str(ip)


@contextmanager
def _loopback_node() -> Iterator[None]:
    """While Ray starts or connects: take 127.0.0.1 as this node's address (Ray otherwise replaces a loopback
    address by the machine's network address, and its servers then listen on every interface)."""
    from ray._private import ray_constants

    saved_env, saved = os.environ.get(_CLUSTER_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_CLUSTER_ENV] = "0"  # inherited by the Ray processes started now
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(_CLUSTER_ENV, None)
        else:
            os.environ[_CLUSTER_ENV] = saved_env


def start_local(ray: Any, *, num_cpus: int, bind_host: str = LOOPBACK, log_to_driver: bool = True,
                runtime_env: dict[str, Any] | None = None) -> Callable[[], None]:
    """Start a private Ray in this process; return the function that stops it and removes its files.

    Args:
        ray: the ``ray`` module.
        num_cpus: CPUs Ray may schedule tasks on.
        bind_host: ``127.0.0.1`` (servers on loopback only), or an IP address of this machine that other nodes
            reach (Ray then advertises it and its servers listen on every interface).
        log_to_driver: show the workers' output here.
        runtime_env: Ray's ``runtime_env`` of the workers (environment variables, ...).

    Raises:
        UserError: Ray could not start.
    """
    temp = tempfile.mkdtemp(prefix="dp-audit-ray-")
    loopback = ipaddress.ip_address(check_bind_host(bind_host)).is_loopback
    extra = {} if runtime_env is None else {"runtime_env": runtime_env}
    try:  # Ray's notice that token authentication is on (a private Ray on loopback: nothing to opt out of)
        with _loopback_node() if loopback else nullcontext(), _quiet("ray._private.authentication"):
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver,
                     configure_logging=False, _temp_dir=temp, _node_ip_address=LOOPBACK if loopback else bind_host,
                     **extra)
    except Exception as exc:  # Ray raises many kinds; none may leave processes or files behind
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        raise UserError(f"could not start a local Ray on {bind_host}: {exc}") from None

    def stop() -> None:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)

    return stop


def _host_port(address: str) -> tuple[str, int]:
    hostport = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = hostport.port
    except ValueError:
        port = None
    if not hostport.hostname or port is None:
        raise UserError(f"Ray address {redact_address(address)!r} has no host:port (e.g. 10.0.0.5:6379 or "
                        f"ray://10.0.0.5:10001)")
    return hostport.hostname, port


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def probe(host: str, port: int, *, shown: str, client: bool = False, timeout: float = PROBE_TIMEOUT_S,
          tls: bool = False) -> None:
    """Check that something listens at ``host:port`` and answers in gRPC; a one-line UserError if not.

    ``shown`` is the address as the message names it; ``client``: a Ray Client (``ray://``) address. With
    ``tls`` only the TCP connection is checked.
    """
    start = (f"ray start --head --ray-client-server-port {port}" if client else f"ray start --head --port {port}")
    right = ("the head's Ray Client port (10001 unless ray start --ray-client-server-port said otherwise)" if client
             else "the head's GCS port (6379 unless ray start --port said otherwise)")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:
        raise UserError(f"Ray address {shown}: cannot resolve the host {host!r} ({exc.strerror})") from None
    except ConnectionRefusedError:
        raise UserError(f"nothing is listening at {shown} (connection refused): start the cluster there "
                        f"({start}) or name another --ray-address") from None
    except (TimeoutError, socket.timeout):
        raise UserError(f"no answer from {shown} within {timeout:.0f} s (a host that is down, or a firewall "
                        f"dropping the connection)") from None
    except OSError as exc:
        raise UserError(f"cannot reach {shown}: {exc.strerror or exc}") from None
    if tls:
        sock.close()
        return
    with sock:
        sock.settimeout(timeout)
        try:
            sock.sendall(_H2_HELLO)
            head = _recv(sock, 9)
        except (TimeoutError, socket.timeout):
            raise UserError(f"{shown} accepted the connection but sent no gRPC answer within {timeout:.0f} s: "
                            f"not a Ray cluster address; name {right}") from None
        except OSError as exc:
            head = b"" if isinstance(exc, ConnectionResetError) else None
            if head is None:
                raise UserError(f"cannot talk to {shown}: {exc.strerror or exc}") from None
    if head.startswith(b"HTTP/") or head.lstrip().lower().startswith((b"<!doc", b"<html", b"<head")):
        raise UserError(f"{shown} speaks HTTP/1, not the gRPC of a Ray cluster: a web server, or Ray's "
                        f"dashboard (8265), whose port is not the cluster's; name {right}") from None
    if len(head) < 9 or head[3] != _H2_SETTINGS:
        what = "closed the connection" if not head else f"answered {head[:9]!r}"
        raise UserError(f"{shown} {what} instead of speaking gRPC: not a Ray cluster address; name "
                        f"{right}") from None


def _auto_address(ray: Any) -> tuple[str, str]:
    """The cluster ``auto`` means, and where it was found (as Ray looks: RAY_ADDRESS, the address file, a
    running GCS of this machine)."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env, "RAY_ADDRESS"
    from ray._common.utils import get_ray_address_file
    from ray._private.services import find_gcs_addresses

    path = get_ray_address_file(None)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            found = fh.read().strip()
        if found:
            return found, path
    running = sorted(find_gcs_addresses())
    if len(running) == 1:
        return running[0], "a running Ray of this machine"
    if running:
        raise UserError(f"--ray-address auto: several Ray clusters run on this machine ({', '.join(running)}); "
                        f"name one with --ray-address HOST:PORT")
    raise UserError(f"--ray-address auto: no Ray cluster on this machine (no RAY_ADDRESS, no {path}, no running "
                    f"GCS): start one with ray start --head, or name its address")


def _loopback_cluster(host: str, port: int) -> bool:
    """Whether a cluster named by a loopback address listens on loopback only (Ray would otherwise dial the
    machine's network address instead, as it does for a loopback address)."""
    try:
        if not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return False
    except (OSError, ValueError):
        return False
    from ray._raylet import node_ip_address_from_perspective

    try:
        with socket.create_connection((node_ip_address_from_perspective(), port), timeout=PROBE_TIMEOUT_S):
            return False
    except OSError:
        return True


def _token_available() -> bool:
    from ray._raylet import AuthenticationTokenLoader

    try:
        return bool(AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True))
    except Exception:  # an unreadable token file: Ray says why when it connects
        return False


def connect(ray: Any, address: str) -> tuple[Callable[[], None], str]:
    """Join the Ray cluster at ``address`` (``auto``, ``host:port`` or ``ray://host:port``).

    Returns:
        The function that disconnects, and the address as results record it (``auto`` resolved, no secrets).

    Raises:
        UserError: one line naming the address and why it cannot be used.
    """
    shown_as = address
    if address == "auto":
        address, source = _auto_address(ray)
        shown_as = f"auto ({redact_address(address)}, from {source})"
    shown = redact_address(address) if shown_as == address else shown_as
    host, port = _host_port(address)
    client = "://" in address
    try:
        probe(host, port, shown=shown, client=client,
              tls=os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"))
    except UserError as exc:
        if shown_as != address and os.path.isfile(source):  # "auto" read a stale address file
            raise UserError(f"{exc} ({source} was left by a Ray that ended without ray stop: run ray stop, or "
                            f"delete the file)") from None
        raise
    token_mode = os.environ.get("RAY_AUTH_MODE")
    if token_mode is None and _token_available():
        os.environ["RAY_AUTH_MODE"] = "token"  # as ray.init does for "auto": the token found here is sent
        from ray._raylet import Config

        Config.initialize("")
    try:
        with _loopback_node() if not client and _loopback_cluster(host, port) else nullcontext(), \
                _env(RAY_gcs_server_port_wait_time_s=str(GCS_ATTEMPTS)):
            ray.init(address=address, log_to_driver=True, configure_logging=False)
    except Exception as exc:  # ConnectionError, RuntimeError, AuthenticationError, grpc errors, ...
        ray.shutdown()
        raise UserError(_why(exc, shown, token=os.environ.get("RAY_AUTH_MODE") == "token")) from None
    return ray.shutdown, redact_address(address) if shown_as == address else shown_as


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """No warnings from ``logger`` (and its children) in the ``with`` block."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@contextmanager
def _env(**defaults: str) -> Iterator[None]:
    """These environment variables, unless the user set them, for the ``with`` block."""
    added = [k for k in defaults if k not in os.environ]
    os.environ.update({k: defaults[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _plain(text: str) -> str:
    """``text`` on one line, without the tracebacks Ray puts in its messages (their last line kept)."""
    kept, in_traceback = [], False
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
            continue
        if in_traceback and (line.startswith(" ") or not line.strip()):
            continue
        in_traceback = False
        kept.append(line)
    return " ".join(" ".join(kept).split())


def _why(exc: BaseException, shown: str, *, token: bool) -> str:
    """One line: why joining ``shown`` failed (Ray's whole message kept, with what to do when known)."""
    messages: list[str] = []
    while exc is not None and len(messages) < 4:  # Ray wraps the cause: keep each distinct message
        text = _plain(str(exc))
        if text and all(text not in m for m in messages):
            messages.append(text)
        exc = exc.__cause__ or exc.__context__
    text = "; ".join(messages) or "no reason given"
    low = text.lower()
    if "auth" in low or "token" in low or "unauthenticated" in low:
        found = "the token sent was refused" if token else "no token was found here"
        said = re.search(r"\w*Auth\w*: [^.;]*", text)
        return (f"the Ray cluster at {shown} requires token authentication and {found}"
                f"{f' ({said.group(0)})' if said else ''}: {_TOKEN_HELP}")
    if "version" in low and ("mismatch" in low or "match" in low):
        return (f"the Ray cluster at {shown} runs another Ray or Python version ({text}): install the cluster's "
                f"Ray (and Python) version here")
    return f"could not join the Ray cluster at {shown}: {text}"
